"""`specdrive bench --drives DIR` (tools/bench.py): open the backends, run the whole drives
(bench/bench/drives/measure.py), write the record and print its table."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.common.compared_backends import open_bench_backends
from bench.common.sources import announce_fingerprints, check_scene_cameras, default_tokenizer, source_stamp
from bench.common.threads import torch_threads
from bench.bench.drives.measure import DriveBenchConfig, check_out, load, run_drives, table, write
from runtime.artifacts import ModelSource
from runtime.config import load_planner_config


@dataclass(frozen=True)
class DrivesRun:
    """One `specdrive bench --drives` run: what runs, which drives and modes, where the record goes."""
    source: ModelSource
    drives_dir: Path
    measure: DriveBenchConfig
    json: Path
    drafts: str | None = None       # the draft to run (default: flat, else the first found)
    profile: str = "cpu"
    threads: int = 1                # torch CPU threads (0 = torch's default)
    command: str = "specdrive bench"    # how to rerun it (the record's setup)
    expect_drives_fingerprint: str | None = None    # the drives folder's pinned fingerprint


def run(cfg: DrivesRun) -> int:
    check_out(cfg.json)                                # where the record goes, before the work
    profile = load_planner_config(cfg.profile)
    check_scene_cameras(profile)
    fingerprints = announce_fingerprints(cfg.source, profile.fingerprint, cfg.drives_dir,
                                         cfg.expect_drives_fingerprint)
    stamp = source_stamp(cfg.source, fingerprints, cfg.command)
    drives = load(cfg.drives_dir, cfg.measure)         # a bad shard stops here, before any model loads
    tok, plain, drafts, source = open_bench_backends(cfg.source, cfg.drafts, profile.max_len, default_tokenizer)
    label = "flat" if "flat" in drafts and not cfg.drafts else next(iter(drafts))
    try:
        with torch_threads(cfg.threads):
            record = run_drives(plain, drafts[label], tok, profile, drives, cfg.measure, progress=True)
    finally:
        for be in {id(b): b for b in [plain, *drafts.values()]}.values():
            be.close()
    record["setup"] = {"source": source, "fingerprints": fingerprints, "draft": label, "backend": plain.name,
                       "device": cfg.source.device,
                       "profile": str(cfg.profile), "drives_dir": str(cfg.drives_dir), "threads": cfg.threads,
                       "command": cfg.command}
    record["stamp"] = stamp
    write(cfg.json, record)
    print(table(record), flush=True)
    print(f"wrote {cfg.json} (and .md)", flush=True)
    return 0
