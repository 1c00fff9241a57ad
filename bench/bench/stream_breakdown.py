"""`specdrive bench --stream-breakdown`: where a streaming prefill's time goes, cycle by cycle on
one synthetic drive, for a planner that prefills in full and one that streams (reuse.prefill),
each alone on its own backend. (the library of tools/bench.py's --stream-breakdown)

Both planners reuse vision features; the budget is off, so both decode the same tokens. Per
cycle: the planner's own stage times (CycleResult.timing: prompt, vision, prefill, reasoning,
trajectory, and what no stage counted) and the backend's draft and verify calls of the decode
steps, as the planner's observer sees them (runtime.step.StepRecord: draft_ms, verify_ms).
Summaries are medians over the cycles after the first SKIP = 5 (a drive's first cycles keep no
frame of an earlier cycle: nothing to stream yet). Needs a frame_local target (checkpoints/tiny).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common.modes import mode_config
from bench.common.threads import torch_threads
from core.config import check_range
from runtime.artifacts import ModelSource, open_backend
from runtime.config import PlannerConfig, ReuseConfig, load_planner_config
from scenes.config import DT, FRAME_OFFSETS

PLANNERS = {"full": ReuseConfig(vision=True), "stream": ReuseConfig(vision=True, prefill=True)}
SKIP = max(FRAME_OFFSETS)       # a drive's first cycles keep no frame of an earlier one


@dataclass(frozen=True)
class BreakdownRun:
    """One `specdrive bench --stream-breakdown` run: the drive of `seed` over `cycles` cycles."""
    source: ModelSource
    json: Path
    seed: int = 11
    cycles: int = 20
    profile: str = "cpu"
    threads: int = 1
    command: str = "specdrive bench --stream-breakdown"

    def __post_init__(self):
        check_range("--cycles", self.cycles, lo=SKIP + 1)


def breakdown_config(base: PlannerConfig, planner: str) -> PlannerConfig:
    """The profile with the budget off and this planner's reuse (PLANNERS)."""
    changes = {"budget": {"budget_ms": 0.0}, "reuse": dataclasses.asdict(PLANNERS[planner])}
    return mode_config(base, planner, changes)


def cycle_row(res, steps: list) -> dict:
    """One cycle: its total, its stages and the decode steps' calls the observer saw (ms)."""
    timing = res.timing
    return {"total": timing["total_ms"], **timing["stages_ms"], "unaccounted": timing["unaccounted_ms"],
            "steps": len(steps), "draft_calls": sum(r.draft_ms for r in steps),
            "verify_calls": sum(r.verify_ms for r in steps), "prompt_rows": res.prompt_len,
            "blocks": res.reuse.get("prefill")}


def drive_planner(source: ModelSource, cfg: PlannerConfig, drive, threads: int) -> list[dict]:
    """Every cycle of `drive` through one planner of `cfg` on a backend of its own, on `threads`
    torch CPU threads -> cycle rows."""
    from runtime.planner import Planner

    backend, tok = open_backend(source, cfg.max_len, k_max=cfg.spec.k_max)
    steps: list = []
    planner, rows = Planner(backend, tok, cfg, observer=steps.append), []
    try:
        with torch_threads(threads):
            for c in drive.cycles:
                steps.clear()
                frames = [[(cam, c.time - k * DT) for k in FRAME_OFFSETS] for cam in cfg.cameras]
                rows.append(cycle_row(planner.plan(c.images, c.history, frames=frames), steps))
    finally:
        planner.close()
    return rows


def medians(rows: list[dict], skip: int) -> dict:
    """The median of every timed column over the rows after the first `skip`."""
    kept = rows[skip:]
    keys = [k for k, v in kept[0].items() if isinstance(v, (int, float))] if kept else []
    return {k: round(float(np.median([r.get(k, 0.0) for r in kept])), 2) for k in keys}


def breakdown(source: ModelSource, base: PlannerConfig, seed: int, cycles: int, skip: int, threads: int = 1) -> dict:
    """Both planners (PLANNERS) on the drive of `seed`: {planner: {"cycles": rows, "ms_p50": medians}}."""
    from scenes.world import make_drive

    drive = make_drive(seed, None, "test", cycles * DT)
    out = {}
    for name in PLANNERS:
        rows = drive_planner(source, breakdown_config(base, name), drive, threads)
        out[name] = {"cycles": rows, "ms_p50": medians(rows, skip)}
    return out


def run(cfg: BreakdownRun) -> int:
    """Measure both planners, write the record to cfg.json, print one line per planner."""
    base = load_planner_config(cfg.profile)
    planners = breakdown(cfg.source, base, cfg.seed, cfg.cycles, SKIP, cfg.threads)
    record = {"command": cfg.command, "seed": cfg.seed, "cycles": cfg.cycles, "skipped": SKIP,
              "threads": cfg.threads, "planners": planners}
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    cfg.json.write_text(json.dumps(record, indent=1) + "\n")
    for name, got in planners.items():
        print(json.dumps({"planner": name, "ms_p50": got["ms_p50"]}), flush=True)
    print(f"wrote {cfg.json}", flush=True)
    return 0
