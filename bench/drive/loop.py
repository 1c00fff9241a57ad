"""`specdrive drive`: closed-loop drives, where a late plan is followed late. (the library of tools/closed_loop.py)

Closed loop (bench/drive/ego_path.py moves the ego and scores the path):
    - before the first cycle the ego is where the expert was (the first history is the expert's);
      until the first plan arrives it holds its speed and heading ("hold-speed start")
    - a cycle starts at grid step n (time t_n) and sees the cameras and history of the path the
      ego actually drove; its plan, computed with latency L, is followed from the first 0.1 s tick
      at or after t_n + L (the controller runs at 10 Hz: a plan delivered inside a tick takes over
      at the next one); until then the previous plan is followed
    - the next cycle starts at that same tick (at least one tick later): a planner slower than
      100 ms plans less often; a cycle that delivers no trajectory leaves the previous plan in force
    - the agents follow their scripts (non-reactive)

Modes are rows of MODES (name -> PlannerConfig overrides on the cpu profile); a mode with k = 0
runs on the target without a draft, the others on the shipped flat draft. The budget modes take
`--budget-ms` (their vision / prefill priors are zero: warm-up measures them, in the latency's
time). Outputs under OUT/LATENCY: drives.json (every drive x mode: metrics, cycles), table.md,
and a GIF per drive with one panel per mode (bench/drive/gif.py). The command itself
(backends, outputs): bench/drive/command.py.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from core.config import ConfigError
from runtime.config import PlannerConfig
from bench.drive.ego_path import compose, drive_metrics, hold_plan, plan_step, speeds
from scenes.config import DT

BUDGET = "BUDGET"           # filled with --budget-ms
BUDGETED = {"budget_ms": BUDGET, "prior_prompt_ms": 0.0, "prior_vision_ms": 0.0, "prior_prefill_ms": 0.0}
REUSE = {"vision": True, "lookup": True}     # runtime/reuse.py: exact, keyed by the frames' content
STREAM = {**REUSE, "prefill": True}          # + streaming prefill: a frame_local target only
MODES = {   # name -> PlannerConfig overrides
    "plain": {"spec": {"k": 0, "adaptive": False}, "budget": {"budget_ms": 0.0}},
    "speculative": {"budget": {"budget_ms": 0.0}},
    "speculative+reuse": {"budget": {"budget_ms": 0.0}, "reuse": REUSE},
    "plain+budget": {"spec": {"k": 0, "adaptive": False}, "budget": BUDGETED},
    "speculative+budget": {"budget": BUDGETED},
    "speculative+reuse+budget": {"budget": BUDGETED, "reuse": REUSE},
    "speculative+stream": {"budget": {"budget_ms": 0.0}, "reuse": STREAM},
    "speculative+stream+budget": {"budget": BUDGETED, "reuse": STREAM},
    "speculative+approx": {"budget": {"budget_ms": 0.0}, "reuse": {**REUSE, "approximate_prefill": True}},
}
STREAM_MODES = ("speculative+stream", "speculative+stream+budget")   # run by default on a frame_local target
APPROX_MODES = ("speculative+approx",)      # APPROXIMATE (a causal target): only when asked for by name
DEFAULT_BUDGET_MS = 250.0
MAX_BUDGET_MS = 60_000.0
TICK_MS = DT * 1e3


def mode_changes(mode: str, budget_ms: float) -> dict:
    """One mode's row of MODES, its budget filled in (bench.common.modes.mode_config applies it)."""
    if mode not in MODES:
        raise ConfigError(f"--modes: {mode!r} is not a mode; modes: {list(MODES)}")
    return {key: {k: budget_ms if v == BUDGET else v for k, v in value.items()} if isinstance(value, dict)
            else value for key, value in MODES[mode].items()}


def parse_modes(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in MODES]
    if bad or not names:
        raise ConfigError(f"--modes {text!r}: unknown {bad or 'empty'}; modes: {list(MODES)}")
    return names


def parse_budgets(text, n: int) -> list[float]:
    """--budget-ms: one budget for every latency spec, or one per spec (comma list, ms, finite >= 0)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and 0 <= v <= MAX_BUDGET_MS for v in values) or len(values) not in (1, n):
        raise ConfigError(f"--budget-ms {text!r}: give one budget (ms, 0..{MAX_BUDGET_MS:g}) or one per --latency "
                          f"spec ({n})")
    return values * n if len(values) == 1 else values


# --- the loop ------------------------------------------------------------------------------------
def render(scen, ego_world, step):
    from scenes.drive import render_cycle
    return render_cycle(scen, ego_world, step)


def in_force_step(start: int, latency_ms: float) -> int:
    """The tick from which a plan computed at `start` with `latency_ms` is followed."""
    return start + math.ceil(latency_ms / TICK_MS - 1e-9)


def advance(ego: np.ndarray, a: int, b: int, plan: np.ndarray, origin: int) -> None:
    """Move the ego from step a to b along `plan` (made at step `origin`), increment by increment."""
    for j in range(a, b):
        ego[j + 1] = compose(ego[j], plan_step(plan, j - origin))


def closed_loop(scen, expert_world: np.ndarray, first: int, last: int, planner, sense=render):
    """Drive steps [first, last] with `planner` (anything with `plan(images, history, scene)` that
    returns a CycleResult-like object: trajectory, timing["total_ms"], reasoning, flags, source)
    -> (ego_world (N_STEPS, 3), [cycle records])."""
    ego = np.array(expert_world, dtype=np.float64)
    ego[first + 1:] = np.nan
    plan, origin = hold_plan(float(speeds(ego[: first + 1])[first])), first
    n, cycles = first, []
    while n <= last:
        images, history = sense(scen, ego, n)
        res = planner.plan(images, history, scene=f"step{n}")
        latency = float(res.timing.get("total_ms", 0.0))
        force = in_force_step(n, latency)
        advance(ego, n, min(force, last), plan, origin)
        if res.trajectory is not None:
            plan, origin = np.asarray(res.trajectory, np.float64), n
        nxt = max(force, n + 1)
        advance(ego, min(force, last), min(nxt, last), plan, origin)
        cycles.append(loop_record(res, n, force, latency, ego[n]))
        n = nxt
    return ego, cycles


def loop_record(res, start: int, force: int, latency: float, origin) -> dict:
    """One closed-loop cycle: when it started, when its plan took over, its latency and plan."""
    traj = None if res.trajectory is None else np.round(np.asarray(res.trajectory, float), 3).tolist()
    return {"start": start, "in_force": force, "latency_ms": round(latency, 3), "source": res.source,
            "flags": list(res.flags), "coc": res.reasoning, "origin": np.round(origin, 4).tolist(),
            "tokens": len(getattr(res, "reasoning_ids", [])), "trajectory": traj}


def summary(cycles: list[dict]) -> dict:
    lat = np.array([c["latency_ms"] for c in cycles]) if cycles else np.zeros(1)
    return {"cycles": len(cycles), "latency_p50_ms": round(float(np.percentile(lat, 50)), 2),
            "latency_p99_ms": round(float(np.percentile(lat, 99)), 2),
            "budget_cuts": sum("budget_cut" in c["flags"] for c in cycles),
            "misses": sum("miss" in c["flags"] for c in cycles),
            "mean_tokens": round(float(np.mean([c["tokens"] for c in cycles])), 2) if cycles else 0.0}


# --- drives --------------------------------------------------------------------------------------
@dataclasses.dataclass
class DriveCase:
    """One drive to run: its scenario, the expert's path and the window of cycles."""
    name: str
    seed: int
    family: str
    scenario: object
    expert_world: np.ndarray
    first: int
    last: int


def drive_cases(source, split: str, seconds: float | None, seed: int = 0) -> list[DriveCase]:
    """DriveCases of a drives folder (shards checked, each scenario rebuilt from its seed and
    checked against the stored expert path) or of N new drives (seeds seed..seed+N-1)."""
    from scenes import world
    from scenes.config import MAX_DRIVE_SECONDS
    from scenes.dataset import load_drives

    if seconds is not None and not DT <= seconds <= MAX_DRIVE_SECONDS:     # below one tick: no cycle at all
        raise ConfigError(f"--seconds {seconds!r} is out of range; allowed [{DT:g}, {MAX_DRIVE_SECONDS:g}] "
                          f"(at least one {DT:g} s cycle)")
    if isinstance(source, int) and not (1 <= source and 0 <= seed and seed + source <= 2 ** 32):
        raise ConfigError(f"--drives {source} from --seed {seed}: seeds must stay in [0, 2**32 - 1]")
    out = []
    if isinstance(source, int):
        metas = [(seed + i, None, seconds or 8.0, None) for i in range(source)]
    else:
        ds = load_drives(source, split)
        metas = []
        for i in range(len(ds)):
            d = ds[i]
            metas.append((d.seed, d.family, d.seconds, d.ego_world))
    for s, family, secs, stored in metas:
        d = world.make_drive(int(s), family, split, float(secs), render=False)
        if stored is not None and not np.allclose(d.ego_world, stored, atol=1e-4):
            raise ConfigError(f"drive seed {s}: the stored expert path differs from this world's; "
                              "regenerate the drives with `specdrive scenes generate --drives N`")
        n = len(d.steps) if seconds is None else min(len(d.steps), max(int(round(seconds / DT)), 1))
        out.append(DriveCase(f"{d.family}-{d.seed}", int(d.seed), d.family, d.scenario, d.ego_world,
                             int(d.steps[0]), int(d.steps[n - 1])))
    return out


def run_case(case: DriveCase, mode: str, cfg: PlannerConfig, latency, backends: dict, tok) -> dict:
    """One drive in one mode: a fresh planner (warmed up on the drive's first cycle) in the loop."""
    from runtime.planner import Planner

    clock = latency.clock()
    with_draft = cfg.spec.k > 0
    backend = latency.wrap(backends["flat" if with_draft else "plain"], clock, with_draft)
    planner = Planner(backend, tok, cfg, clock=clock)
    ego0 = np.array(case.expert_world, np.float64)
    images, history = render(case.scenario, ego0, case.first)
    premise = planner.warmup(images, history)
    try:
        ego, cycles = closed_loop(case.scenario, case.expert_world, case.first, case.last, planner)
    finally:
        planner.fallback.close()
    metrics = drive_metrics(case.scenario, ego, case.expert_world, case.first, case.last)
    return {"drive": case.name, "seed": case.seed, "family": case.family, "mode": mode,
            "latency": latency.spec, "metrics": metrics, **summary(cycles), "premise": premise,
            "ego_world": np.round(ego[case.first: case.last + 1], 4).tolist(), "cycle_log": cycles}
