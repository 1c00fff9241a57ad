"""The measurement of `specdrive bench`: every mode on the same scenes, in one process.

Order: warm-up cycles of every mode (discarded, and their timings forgotten by the planner),
then `repeats` rounds; in each round every scene goes through every mode in turn (in an order
drawn per scene and round, bench.common.stats.mode_order), so all modes see the same machine
load (other processes on a shared CPU), which a ratio needs more than
absolute accuracy. Each cycle is one `Planner.plan` with the garbage collector collected before
and disabled inside; the decode phase (reasoning tokens) is the planner's own "reasoning" stage,
vision and prefill are its other stages, never mixed in. The budget is off by default so that
every mode decodes the same tokens (a budget cut would change the text being timed); cycles
longer than `deadline_ms` are counted as misses.
"""
from __future__ import annotations

import dataclasses
import gc
import os
import platform
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from core.config import ConfigError, check_range
from runtime.budget import wall_ms
from runtime.config import K_MAX_LIMIT, PlannerConfig, tree_shape
from runtime.planner import Planner
from bench.common import accept_map
from bench.common.modes import greedy_spec, mode_config
from bench.common.stats import (cost_terms, decode_speedups, ideal_speedup, latency, limiting_note,
                               loss_factors, mode_order, spread)

SCHEMA = "specdrive-bench/1"
AA_SUFFIX = " (A/A)"     # the name of an A/A control: its original's, with this after it


@dataclass(frozen=True)
class BenchConfig:
    """What to measure. ks: fixed draft lengths; adaptive: also the adaptive-k policy; trees:
    token-tree shapes "N,d,K" (runtime/tree.py), each a fixed-tree mode (and, with adaptive, the
    adaptive choice between that tree and the best chain)."""
    scenes: int = 16
    seed: int = 0
    split: str = "test"
    data: Path | None = None      # a dataset folder: its split's first `scenes` scenes (seed unused)
    repeats: int = 3
    warmup: int = 1
    ks: tuple = (4, 8)
    adaptive: bool = True
    trees: tuple = ()
    aa: bool = False              # A/A control: a second, identical copy of each draft's longest fixed chain
    budget_ms: float = 0.0        # the planner's budget in the timed cycles (0 = off)
    deadline_ms: float = 1000.0   # a cycle longer than this counts as a deadline miss
    max_reasoning_tokens: int | None = None
    picture_scene: int = 0
    raw: bool = False             # each call kind's floor beside its in-loop time (on by default on CUDA)

    def __post_init__(self):
        check_range("scenes", self.scenes, lo=1)
        check_range("repeats", self.repeats, lo=1)
        check_range("seed", self.seed, lo=0)
        check_range("warmup", self.warmup, lo=0)
        if not self.ks and not self.adaptive:
            raise ConfigError("no speculative mode: give at least one k (--ks) or keep adaptive k")
        if self.aa and not self.ks:
            raise ConfigError("--aa copies the longest fixed chain: give at least one k (--ks)")
        for k in self.ks:
            check_range("ks", k, lo=1, hi=K_MAX_LIMIT)
        for t in self.trees:
            tree_shape(t, "trees")
        check_range("budget_ms", self.budget_ms, lo=0.0)
        check_range("deadline_ms", self.deadline_ms, lo=0.0)
        check_range("picture_scene", self.picture_scene, lo=0, hi=self.scenes - 1)


@dataclass
class Mode:
    name: str            # "plain", "flat k=4", "flat adaptive", "flat tree 16,8,4"
    draft: str           # draft label ("none" for plain decoding)
    k: int               # 0 = plain decoding; a fixed tree: its depth (the chain it falls back to)
    adaptive: bool
    backend: object                                    # runtime.backend.Backend
    steps: list = field(default_factory=list)          # this cycle's StepRecords (the observer's)
    tree: str = ""       # spec.tree "N,d,K" ("": chains only)


@dataclass
class BenchScene:
    name: str
    family: str
    images: np.ndarray          # (4, 2, H, W, 3) uint8
    history: np.ndarray         # (16, 3)
    n_routine: int              # routine words in the scene's own CoC (scenes/coc.py)
    future: np.ndarray | None = None   # (64, 3) the expert planner's future (ADE), if known


@dataclass
class TimedCycle:
    """One measured cycle of one mode: which repeat and scene, the planner's CycleResult."""
    repeat: int
    scene: int
    res: object                 # runtime.cycle.CycleResult
    steps: list = field(default_factory=list)


def make_modes(draft_backends: dict, plain_backend, cfg: BenchConfig) -> list[Mode]:
    """plain on `plain_backend`, then for each {draft label: backend} every fixed k and adaptive,
    then every tree: fixed, and adaptive (a backend may serve several modes: an engines folder's
    plain is k = 0 on it); with cfg.aa, last, each draft's longest chain again (AA_SUFFIX)."""
    modes = [Mode("plain", "none", 0, False, plain_backend)]
    for label, be in draft_backends.items():
        modes += [Mode(f"{label} k={k}", label, k, False, be) for k in cfg.ks]
        if cfg.adaptive:
            modes.append(Mode(f"{label} adaptive", label, 0, True, be))
        for t in cfg.trees:
            depth = min(tree_shape(t).depth, K_MAX_LIMIT)
            modes.append(Mode(f"{label} tree {t}", label, depth, False, be, tree=t))
            if cfg.adaptive:
                modes.append(Mode(f"{label} adaptive tree {t}", label, 0, True, be, tree=t))
    if cfg.aa:
        k = max(cfg.ks)
        modes += [Mode(f"{label} k={k}{AA_SUFFIX}", label, k, False, be) for label, be in draft_backends.items()]
    return modes


def aa_gaps(modes: list) -> list:
    """The A/A controls of a record's modes: each copy against its original, the same work in the
    same run. Their gap is the run's own noise: a difference between two modes no larger than it
    is not one this run can tell from none."""
    by_name = {m["name"]: m for m in modes}
    out = []
    for m in modes:
        if not m["name"].endswith(AA_SUFFIX):
            continue
        orig = by_name[m["name"][:-len(AA_SUFFIX)]]
        a, b = orig["decode_speedup"]["all"], m["decode_speedup"]["all"]
        out.append({"mode": orig["name"], "speedup": a, "copy_speedup": b,
                    "gap": round(abs(a / b - 1.0), 4) if a and b else None})
    return out


def mode_changes(base: PlannerConfig, mode: Mode, cfg: BenchConfig) -> dict:
    """This mode's k, greedy decoding and the bench's budget; the fallback as the profile says
    (the cycle users run)."""
    return {"spec": greedy_spec(base.spec, mode.k, mode.adaptive, mode.tree), "budget": {"budget_ms": cfg.budget_ms}}


def timed_cycle(planner: Planner, scene: BenchScene):
    """One planning cycle with the garbage collector kept out of it."""
    gc.collect()
    gc.disable()
    try:
        return planner.plan(scene.images, scene.history, scene=scene.name)
    finally:
        gc.enable()


def run_bench(modes: list[Mode], scenes: list[BenchScene], tok, base: PlannerConfig,
              cfg: BenchConfig, clock=wall_ms, progress: bool = False) -> dict:
    """Run every mode on every scene (module docstring) -> the bench record (JSON-ready)."""
    if modes[0].k != 0 or modes[0].adaptive:
        raise ConfigError("the first mode must be plain decoding (k = 0): speedups are relative to it")
    configs = {m.name: mode_config(base, m.name, mode_changes(base, m, cfg), cfg.max_reasoning_tokens) for m in modes}
    planners = {m.name: Planner(m.backend, tok, configs[m.name], clock=clock, observer=m.steps.append)
                for m in modes}
    for m in modes:       # first calls; the planner then forgets their timings (Planner.warmup)
        planners[m.name].warmup(scenes[0].images, scenes[0].history, cycles=cfg.warmup)
    cycles: dict[str, list[TimedCycle]] = {m.name: [] for m in modes}
    bar = tqdm(total=cfg.repeats * len(scenes) * len(modes), desc="bench cycles", disable=not progress)
    for r in range(cfg.repeats):
        for i, scene in enumerate(scenes):
            for m in mode_order(modes, cfg.seed, r, i):
                m.steps.clear()
                res = timed_cycle(planners[m.name], scene)
                steps = m.steps[:res.decode.get("steps", 0)]
                cycles[m.name].append(TimedCycle(r, i, res, steps))
                bar.update()          # between cycles, outside the timed region
    bar.close()
    record = summarize(modes, scenes, cycles, tok, cfg)
    if cfg.raw:
        for m, out in zip(modes, record["modes"]):
            out["calls"] = in_loop_vs_raw(m.backend, [s for c in cycles[m.name] for s in c.steps])
    return record


def in_loop_vs_raw(backend, steps) -> dict | None:
    """Per call kind (verify of a width, a draft call of k) its mean time inside the loop against
    its floor on the same backend (Backend.raw_costs: the calls back to back, no loop), and the
    ratio: what the loop's host work adds to that call. None where the backend has no floor."""
    def means(pairs):
        groups: dict = {}
        for key, ms in pairs:
            groups.setdefault(key, []).append(ms)
        return {key: float(np.mean(v)) for key, v in groups.items()}
    chains = [s for s in steps if not s.nodes]
    verify = means((s.width, s.verify_ms) for s in chains)
    draft = means((s.k, s.draft_ms) for s in chains if s.k and s.source == "model")
    raw = backend.raw_costs(sorted(verify), sorted(draft))
    if raw is None:
        return None
    row = lambda loop, floor: {"in_loop_ms": round(loop, 4), "raw_ms": round(floor, 4),  # noqa: E731
                               "ratio": round(loop / floor, 3) if floor > 0 else None}
    return {"verify": {str(w): row(verify[w], raw["verify"][w]) for w in sorted(verify)},
            "draft": {str(k): row(draft[k], raw["draft"][k]) for k in sorted(draft) if k in raw["draft"]}}


def summarize(modes, scenes, cycles: dict, tok, cfg: BenchConfig) -> dict:
    plain = cycles["plain"]
    t1_calls = [s.verify_ms for c in plain for s in c.steps if s.width == 1]
    if not t1_calls:
        raise RuntimeError("plain decoding made no decode step: nothing to compare against")
    t1 = float(np.mean(t1_calls))
    records = {m.name: _records(cycles[m.name], scenes, tok) for m in modes}
    out = [_mode_summary(m, cycles[m.name], plain, t1, cfg, scenes) for m in modes]
    where = {m.name: accept_map.where_accepted(_by_family(records[m.name], scenes)) for m in modes[1:]}
    return {"schema": SCHEMA, "target_step_ms": round(t1, 4), "modes": out, "where_accepted": where,
            "aa": aa_gaps(out), "cycles": _cycle_log(modes, cycles, records, scenes, tok)}


def cycle_speedup(plain_rep: list, per_rep: list) -> dict:
    """Whole-cycle speedup: plain's cycle p50 over this mode's, pooled and per repeat."""
    def p50(cycles):
        return float(np.median([c.res.timing.get("total_ms", 0.0) for c in cycles]))
    pooled = p50([c for rep in plain_rep for c in rep]) / p50([c for rep in per_rep for c in rep])
    return {"p50": round(pooled, 4), **spread(p50(a) / p50(b) for a, b in zip(plain_rep, per_rep))}


def _ade(mine: list[TimedCycle], scenes) -> float | None:
    """Mean displacement error (m, 6.4 s) of the delivered trajectories against the scenes' futures."""
    errs = [float(np.linalg.norm(c.res.trajectory[:, :2] - scenes[c.scene].future[:, :2], axis=-1).mean())
            for c in mine if c.res.trajectory is not None and scenes[c.scene].future is not None]
    return round(float(np.mean(errs)), 4) if errs else None


def _mode_summary(m: Mode, mine: list[TimedCycle], plain: list[TimedCycle], t1: float, cfg: BenchConfig,
                  scenes) -> dict:
    per_rep = [[c for c in mine if c.repeat == r] for r in range(cfg.repeats)]
    plain_rep = [[c for c in plain if c.repeat == r] for r in range(cfg.repeats)]
    ms = [sum(_stage(c, "reasoning") for c in rep) for rep in per_rep]
    toks = [sum(c.res.decode.get("emitted", 0) for c in rep) for rep in per_rep]
    plain_ms = [sum(_stage(c, "reasoning") for c in rep) for rep in plain_rep]
    plain_toks = [sum(c.res.decode.get("emitted", 0) for c in rep) for rep in plain_rep]
    speedups = decode_speedups(plain_ms, ms, plain_toks, toks)
    pooled = decode_speedups([sum(plain_ms)], [sum(ms)], [sum(plain_toks)], [sum(toks)])
    steps = [s for c in mine for s in c.steps]
    emitted = sum(c.res.decode.get("emitted", 0) for c in mine)
    tau = emitted / len(steps) if steps else 0.0
    out = {"name": m.name, "draft": m.draft, "k": "adaptive" if m.adaptive else m.k, "tau": round(tau, 4),
           "tokens_per_s": spread(n / (t / 1e3) for n, t in zip(toks, ms) if t > 0),
           "decode_speedup": {"all": round(pooled[0], 4) if pooled else None, **spread(speedups)},
           "decode_ms_per_token": round(sum(ms) / max(sum(toks), 1), 4),
           "vision_ms": latency(_stage(c, "vision") for c in mine),
           "prefill_ms": latency(_stage(c, "prefill") for c in mine),
           "cycle_ms": latency(c.res.timing.get("total_ms", 0.0) for c in mine),
           "cycle_speedup": cycle_speedup(plain_rep, per_rep),
           "trajectory_ms": latency(_stage(c, "trajectory") for c in mine),
           "ade_m": _ade(mine, scenes),
           "deadline_misses": sum(_missed(c, cfg) for c in mine),
           "budget_cuts": sum("budget_cut" in c.res.flags for c in mine),
           "errors": sum(c.res.error is not None for c in mine),
           "identical": _identical(mine, plain),
           "trajectory_max_diff_m": _traj_diff(mine, plain),
           **host_terms(steps)}
    if m.k or m.adaptive:
        out.update(_spec_terms(m, steps, tau, t1, ms, out["decode_speedup"]["all"]))
    if m.k:
        out["free_running"] = free_running(steps)
    if m.tree:
        out["tree"] = m.tree
        trees = [s for s in steps if s.nodes]
        out["tree_steps"] = len(trees)
        out["tree_nodes_mean"] = round(float(np.mean([s.nodes for s in trees])), 3) if trees else None
    return out


def host_terms(steps) -> dict:
    """Which path the steps took ("device": the backend's device-resident greedy step, "host": the
    loop's draft/verify/accept), the backend's device-to-host reads a step (each a host sync on a
    GPU; None where the backend does not count them), and the host's share of a step: 1 - (its
    calls' time) / (its wall time). On the device path the calls' times are device times (CUDA
    events), so the share is what the host adds; on a CPU device and host are one and it is the
    loop's bookkeeping."""
    syncs = [s.syncs for s in steps if s.syncs is not None]
    wall = sum(s.wall_ms for s in steps)
    busy = sum(s.draft_ms + s.verify_ms for s in steps)
    return {"paths": dict(Counter(s.path for s in steps)),
            "syncs_per_step": round(float(np.mean(syncs)), 3) if syncs else None,
            "step_wall_ms": round(wall / len(steps), 4) if steps else None,
            "step_calls_ms": round(busy / len(steps), 4) if steps else None,
            "host_share": round(1.0 - busy / wall, 4) if wall > 0 else None}


def _spec_terms(m: Mode, steps, tau: float, t1: float, ms, measured) -> dict:
    """The cost terms (bench/common/stats.py), a tree step priced as its draft calls (the tree's
    depth: one per depth) and its one verify pass of its width."""
    if m.tree:
        depth = tree_shape(m.tree).depth
        steps = [dataclasses.replace(s, k=depth) if s.nodes else s for s in steps]
    terms = cost_terms(steps, t1)
    v = terms["verify_ratio"]
    ideal = ideal_speedup(tau, terms["ks"], terms["c"], lambda w: v[w], [s.width for s in steps])
    eff = measured / ideal if ideal and measured else 0.0
    factors = loss_factors(tau, terms["k_mean"], terms["c"], terms["v_mean"], eff)
    busy = sum(s.draft_ms + s.verify_ms for s in steps)
    return {"k_mean": round(terms["k_mean"], 3), "c": round(terms["c"], 4),
            "draft_step_ms": round(terms["draft_step_ms"], 4),
            "verify_ratio": {str(w): round(x, 4) for w, x in v.items()},
            "ideal_speedup": round(ideal, 4), "efficiency": round(eff, 4),
            "loop_overhead_share": round(1.0 - busy / sum(ms), 4) if sum(ms) > 0 else None,
            "factors": factors, "note": limiting_note(m.name, factors, measured or 0.0, ideal, tau, terms["c"])}


def _stage(c: TimedCycle, name: str) -> float:
    return float(c.res.timing.get("stages_ms", {}).get(name, 0.0))


def _missed(c: TimedCycle, cfg: BenchConfig) -> bool:
    over = cfg.deadline_ms > 0 and c.res.timing.get("total_ms", 0.0) > cfg.deadline_ms
    return "miss" in c.res.flags or over


def _identical(mine: list[TimedCycle], plain: list[TimedCycle]) -> dict:
    """Scenes whose reasoning equals plain decoding's in every repeat."""
    ref = {(c.repeat, c.scene): c.res.reasoning_ids for c in plain}
    bad = {c.scene for c in mine if c.res.reasoning_ids != ref[(c.repeat, c.scene)]}
    n = len({c.scene for c in mine})
    return {"scenes": n, "equal": n - len(bad), "fraction": round((n - len(bad)) / n, 4),
            "differing_scenes": sorted(bad)}


def _traj_diff(mine: list[TimedCycle], plain: list[TimedCycle]) -> float | None:
    ref = {(c.repeat, c.scene): c.res.trajectory for c in plain}
    diffs = [float(np.abs(c.res.trajectory - ref[(c.repeat, c.scene)]).max()) for c in mine
             if c.res.trajectory is not None and ref[(c.repeat, c.scene)] is not None]
    return round(max(diffs), 6) if diffs else None


def _records(mine: list[TimedCycle], scenes, tok) -> list[dict]:
    out = []
    for c in mine:
        if c.res.error is not None:        # no reasoning to explain (counted as an error)
            out.append(None)
            continue
        words = [piece(tok, i) for i in list(c.res.reasoning_ids) + [tok.cot_end]]
        rec = accept_map.result_record(c.res, c.steps, tok)
        out.append({**rec, "scene": c.scene, "repeat": c.repeat, "words": words})
    return out


def piece(tok, i: int) -> str:
    """How token i reads in text: its decoded piece (a subword's leading space dropped), or its
    name for a special token."""
    name = tok.token(int(i))
    if name.startswith("<"):
        return name
    return tok.decode([int(i)]).strip() or name


def free_running(steps) -> dict | None:
    """Drafted tokens accepted per step at this fixed k, and the share of steps where every
    drafted token was accepted (the draft might have gone further: k was the cap)."""
    drafted = [s for s in steps if s.k]
    if not drafted:
        return None
    return {"accepted_per_step": round(float(np.mean([s.accepted for s in drafted])), 4),
            "at_cap": round(float(np.mean([s.accepted == s.k for s in drafted])), 4)}


def _by_family(records, scenes) -> dict:
    groups: dict[str, list] = {}
    for r in (r for r in records if r is not None):
        groups.setdefault(scenes[r["scene"]].family, []).append(r)
    return groups


def _cycle_log(modes, cycles, records, scenes, tok) -> list[dict]:
    """Repeat 0 of every mode and scene: the text, who produced each word, the stats."""
    log = []
    for m in modes:
        for c, r in zip(cycles[m.name], records[m.name]):
            if c.repeat:
                continue
            r = r or {"words": [], "labels": [], "classes": []}
            log.append({"mode": m.name, "scene": scenes[c.scene].name, "family": scenes[c.scene].family,
                        "reasoning": c.res.reasoning, "stop_reason": c.res.stop_reason,
                        "error": c.res.error, "words": r["words"], "labels": r["labels"],
                        "classes": r["classes"],
                        "decode": {k: c.res.decode.get(k) for k in ("steps", "emitted", "accepted", "tau", "ks", "ns",
                                                                     "branches")},
                        "stages_ms": c.res.timing.get("stages_ms", {}), "flags": list(c.res.flags)})
    return log


def machine_info(device: str = "cpu") -> dict:
    """CPU model and threads; on CUDA the GPU name, clocks and power state (nvidia-smi), and the
    Jetson power mode (nvpmodel) when present."""
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpu": _cpu_model(), "cpu_count": os.cpu_count(), "numpy": np.__version__}
    try:
        import torch
        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(torch.device(device))
            info["gpu_query"] = _run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,"
                                      "power.draw,power.limit,pstate,driver_version", "--format=csv"])
            info["power_mode"] = _run(["nvpmodel", "-q"])
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _run(cmd) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
