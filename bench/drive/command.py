"""`specdrive drive` (tools/closed_loop.py): every drive x mode x latency spec through the closed
loop (bench/drive/loop.py); drives.json, table.md and GIFs under OUT/LATENCY."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from bench.drive.gif import draw_case
from bench.drive.latency import parse_latency
from bench.drive.loop import APPROX_MODES, DEFAULT_BUDGET_MS, MODES, STREAM_MODES, drive_cases, mode_changes, parse_budgets, parse_modes, run_case
from bench.drive.report import table
from bench.common.modes import mode_config
from bench.common.sources import announce_fingerprints, check_scene_cameras, default_tokenizer, source_stamp
from bench.common.threads import torch_threads
from runtime.artifacts import ModelSource, open_backend
from core.config import ConfigError
from runtime.config import PlannerConfig, load_planner_config


@dataclass(frozen=True)
class ClosedLoopRun:
    """One `specdrive drive` run. modes, latency and budget_ms are comma lists (loop.parse_modes,
    latency.parse_latency, loop.parse_budgets check them: a budget per latency spec, or one)."""
    out: Path
    checkpoint: Path = Path("checkpoints/tiny")
    drives: Path | int = 4          # a drives folder (its split) or N new drives from seed
    split: str = "test"
    seed: int = 0
    seconds: float | None = None    # drive length (None: the drive's own)
    modes: str = ""                 # '' = every mode the checkpoint runs (the streaming ones on a frame_local target)
    latency: str = "measured"
    budget_ms: str = str(DEFAULT_BUDGET_MS)
    profile: str = "cpu"
    threads: int = 1
    gifs: int = 20                  # GIFs of the first N drives
    quiet: bool = False             # no progress bars
    expect_fingerprint: str | None = None           # the checkpoint folder's pinned fingerprint
    expect_drives_fingerprint: str | None = None    # the drives folder's (when --drives is a folder)


def open_backends(checkpoint: Path, cfg: PlannerConfig, modes: list[str], budget_ms: float,
                  expect_fingerprint: str | None = None) -> tuple:
    """(tokenizer, {"plain": backend without a draft, "flat": the shipped flat draft})."""
    kinds = {"flat" if mode_config(cfg, m, mode_changes(m, budget_ms)).spec.k > 0 else "plain" for m in modes}
    out, tok = {}, None
    for kind in sorted(kinds):
        src = ModelSource(checkpoint=Path(checkpoint), draft="none" if kind == "plain" else "flat",
                          expect_fingerprint=expect_fingerprint)
        out[kind], tok = open_backend(src, cfg.max_len, default_tokenizer, k_max=cfg.spec.k_max)
    return tok, out


def run(setup: ClosedLoopRun) -> int:
    """The command: every drive x mode x latency spec; JSON, table and GIFs under OUT/LATENCY."""
    base = load_planner_config(setup.profile)
    check_scene_cameras(base)
    asked = parse_modes(setup.modes) if setup.modes else None
    latencies = [parse_latency(s, base) for s in setup.latency.split(",")]
    twice = sorted({lat.label for lat in latencies if [x.label for x in latencies].count(lat.label) > 1})
    if twice:
        raise ConfigError(f"--latency {setup.latency!r} names {', '.join(twice)} more than once; each spec writes "
                          "its own folder under --out: name each once")
    budgets = parse_budgets(setup.budget_ms, len(latencies))
    if setup.expect_drives_fingerprint is not None and not isinstance(setup.drives, Path):
        raise ConfigError("--expect-drives-fingerprint pins a drives folder; --drives is a count of new drives")
    source = ModelSource(checkpoint=Path(setup.checkpoint), expect_fingerprint=setup.expect_fingerprint)
    fingerprints = announce_fingerprints(source, base.fingerprint,
                                         setup.drives if isinstance(setup.drives, Path) else None,
                                         setup.expect_drives_fingerprint, vehicle=True,
                                         require_pin=base.require_pin)
    stamp = source_stamp(source, fingerprints)
    cases = drive_cases(setup.drives, setup.split, setup.seconds, setup.seed)
    tok, backends = open_backends(setup.checkpoint, base, asked or list(MODES), budgets[0], setup.expect_fingerprint)
    streaming = next(iter(backends.values())).image_attention == "frame_local"   # one target for all
    modes = asked or [m for m in MODES if (streaming or m not in STREAM_MODES) and m not in APPROX_MODES]
    configs = [{m: mode_config(base, m, mode_changes(m, b)) for m in modes} for b in budgets]
    for lat, budget_ms, cfgs in zip(latencies, budgets, configs):
        out = Path(setup.out) / lat.label
        (out / "gif").mkdir(parents=True, exist_ok=True)
        records = []
        bar = tqdm(total=len(cases) * len(modes), desc=f"drive {lat.spec}", unit="drive", disable=setup.quiet)
        with torch_threads(setup.threads):
            for case in cases:
                for m in modes:
                    records.append(run_case(case, m, cfgs[m], lat, backends, tok))
                    bar.update()
        bar.close()
        text = table(records, modes, lat.spec, budget_ms)
        (out / "drives.json").write_text(json.dumps({"stamp": stamp, "fingerprints": fingerprints,
                                                     "latency": lat.spec, "budget_ms": budget_ms,
                                                     "modes": {m: MODES[m] for m in modes},
                                                     "records": records}) + "\n")
        (out / "table.md").write_text(text)
        print(text, flush=True)
        for case in tqdm(cases[: setup.gifs], desc="gifs", unit="gif", disable=setup.quiet):
            draw_case(case, [r for r in records if r["drive"] == case.name], out / "gif" / f"{case.name}.gif")
    return 0
