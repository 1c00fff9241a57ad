"""`specdrive bench --drives DIR`: whole drives through the planner, with and without reuse, in
one process (the library of tools/bench.py's drives mode).

Modes (each its own Planner, so each keeps its own cache): plain decoding, plain + vision reuse,
speculative (the draft, adaptive k unless --no-adaptive: then the first --ks), speculative +
vision reuse, speculative + vision reuse + lookup drafting. The drives run in order, cycle by
cycle; at every cycle every mode plans it in turn, in an order drawn per cycle
(bench.common.stats.mode_order; all modes see the same machine load), with
the frames' identities (camera, time) given, and each planner forgets its cache when a new
drive starts. Per mode: cycle p50/p99, the vision stage (p50 and the cut against plain
decoding without reuse), prefill, reasoning and trajectory p50, tau, tokens proposed and
accepted by lookup and by the draft model, frames reused, cycles whose reasoning equals plain
decoding's (every cycle is checked) and the largest trajectory difference, and the cycle
speedup over plain decoding without reuse (p50 over p50, same run). The budget is off so every
mode decodes the same text. Per speculative mode also alpha on routine and on commitment tokens
(bench/common/accept_map.py: accepted / judged proposals, the first rejection of a step included; the
routine clauses of each cycle's own reasoning by the language's grammar), the runtime's
acceptance on the drive's cycles, also split by phase (cycles whose label names a cause against
clear-road cycles, `phase_of`) and by the drive's family. `--modes` runs a subset (plain always:
it is the reference every cycle is checked against). spec+tree (with `tree`, `--trees`'s first
shape; in the default set only then): speculative with that token tree (runtime/tree.py), the
adaptive choice between the tree and the best chain per step (with a fixed k: the tree every
step); a tree step's proposals judged are its path's (accepted nodes, then the best-scored child
where the path stopped), so its alpha reads as a chain's.
"""
from __future__ import annotations

import dataclasses
import gc
import json
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from core.config import ConfigError, check_range
from runtime.config import PlannerConfig, ReuseConfig, tree_shape
from runtime.planner import Planner
from bench.common import accept_map
from bench.common.modes import greedy_spec, mode_config
from bench.common.stats import latency, mode_order

SCHEMA = "specdrive-bench-drives/1"
MODES = ("plain", "plain+vision", "spec", "spec+vision", "spec+vision+lookup", "spec+vision+stream",
         "spec+vision+lookup+stream", "spec+vision+lookup+approx", "spec+tree")
STREAM_MODES = MODES[5:7]       # streaming prefill: a frame_local target only (by default where it is one)
APPROX_MODES = MODES[7:8]       # APPROXIMATE prefill reuse (a causal target): only when asked for by name
TREE_MODES = MODES[8:]          # token trees: with a tree shape (--trees)
GOAL_SPEEDUP, GOAL_VISION_CUT = 2.5, 0.40      # issue 26's bar
MAX_WARMUP = 100
GOAL_STREAM_SPEEDUP, GOAL_PREFILL_CUT = 2.3, 0.40   # streaming prefill's bar (every exact reuse)


@dataclass(frozen=True)
class DriveBenchConfig:
    drives: int = 4                   # the first N drives of the split
    cycles: int | None = None         # cycles per drive at most (None: the whole drive)
    split: str = "test"
    warmup: int = 1
    k: int | None = None              # None: adaptive k (the profile's k_max); else this fixed k
    max_reasoning_tokens: int | None = None
    modes: tuple | None = None        # None: every mode (MODES); else these, plain always (the reference)
    tree: str | None = None           # spec+tree's token tree "N,d,K" (None: no tree mode)

    def __post_init__(self):
        from scenes.config import DT, MAX_DRIVE_SECONDS, MAX_DRIVES

        if self.modes is not None:
            unknown = [m for m in self.modes if m not in MODES]
            if unknown or not self.modes:
                raise ConfigError(f"--modes {','.join(self.modes)!r}: unknown {', '.join(unknown) or 'empty list'}; "
                                  f"allowed: {', '.join(MODES)}")
            if self.tree is None and any(m in TREE_MODES for m in self.modes):
                raise ConfigError("--modes spec+tree needs the tree it runs: give --trees N,d,K (nodes, depth, "
                                  "top-K), e.g. 16,8,4")
        if self.tree is not None:
            tree_shape(self.tree, "--trees")
        check_range("--drive-count", self.drives, lo=1, hi=MAX_DRIVES)
        if self.cycles is not None:
            check_range("--cycles", self.cycles, lo=1, hi=round(MAX_DRIVE_SECONDS / DT))
        check_range("--warmup", self.warmup, lo=0, hi=MAX_WARMUP)
        if self.k is not None:
            check_range("k", self.k, lo=1, hi=16)
        if self.max_reasoning_tokens is not None:
            check_range("--max-reasoning", self.max_reasoning_tokens, lo=1, hi=4096)


@dataclass
class DriveMode:
    name: str
    speculative: bool
    reuse: ReuseConfig
    steps: list = dataclasses.field(default_factory=list)
    tree: bool = False          # spec.tree = the config's tree


def make_modes(cfg: DriveBenchConfig, streaming: bool = False) -> list[DriveMode]:
    """The modes asked for (cfg.modes; None: all, the streaming ones where the target is
    frame_local: `streaming`, the tree one where cfg has a tree). A streaming mode asked of a causal
    target is refused by its Planner, a tree of a backend that cannot verify it too."""
    modes = [DriveMode("plain", False, ReuseConfig()),
             DriveMode("plain+vision", False, ReuseConfig(vision=True)),
             DriveMode("spec", True, ReuseConfig()),
             DriveMode("spec+vision", True, ReuseConfig(vision=True)),
             DriveMode("spec+vision+lookup", True, ReuseConfig(vision=True, lookup=True)),
             DriveMode("spec+vision+stream", True, ReuseConfig(vision=True, prefill=True)),
             DriveMode("spec+vision+lookup+stream", True, ReuseConfig(vision=True, lookup=True, prefill=True)),
             DriveMode("spec+vision+lookup+approx", True,
                       ReuseConfig(vision=True, lookup=True, approximate_prefill=True)),
             DriveMode("spec+tree", True, ReuseConfig(), tree=True)]
    if cfg.modes is not None:
        return [m for m in modes if m.name == "plain" or m.name in cfg.modes]
    return [m for m in modes if (streaming or m.name not in STREAM_MODES) and m.name not in APPROX_MODES
            and (cfg.tree or m.name not in TREE_MODES)]


def mode_changes(base: PlannerConfig, mode: DriveMode, cfg: DriveBenchConfig) -> dict:
    """Plain (k = 0) or speculative (cfg.k fixed, else adaptive) greedy decoding, this mode's reuse
    and tree, the budget off."""
    k = (cfg.k or 0) if mode.speculative else 0
    spec = greedy_spec(base.spec, k, mode.speculative and cfg.k is None, cfg.tree if mode.tree else "")
    return {"spec": spec, "budget": {"budget_ms": 0.0}, "reuse": dataclasses.asdict(mode.reuse)}


def load(root, cfg: DriveBenchConfig) -> list:
    """The first cfg.drives drives of the split, each cut to cfg.cycles (ConfigError on a bad shard)."""
    from scenes.dataset import load_drives

    ds = load_drives(root, cfg.split)
    if len(ds) < cfg.drives:
        raise ConfigError(f"--drive-count {cfg.drives}: {root} has {len(ds)} {cfg.split!r} drives")
    drives = [ds[i] for i in range(cfg.drives)]
    for d in drives:
        d.cycles = d.cycles[:cfg.cycles] if cfg.cycles else d.cycles
    return drives


def frames_of(cycle, cams) -> list:
    """(cameras, frames) (camera, time_s) pairs of a drive cycle: each camera at t - 0.5 s and t."""
    from scenes.config import DT, FRAME_OFFSETS

    return [[(cam, round(float(cycle.time) - k * DT, 6)) for k in FRAME_OFFSETS] for cam in cams]


def run_drives(plain_backend, spec_backend, tok, base: PlannerConfig, drives: list, cfg: DriveBenchConfig,
               progress: bool = False) -> dict:
    """Every mode on every cycle of every drive (module docstring) -> the record (JSON-ready)."""
    modes = make_modes(cfg, spec_backend.image_attention == "frame_local" and spec_backend.streams_prefill)
    configs = {m.name: mode_config(base, m.name, mode_changes(base, m, cfg), cfg.max_reasoning_tokens) for m in modes}
    planners = {m.name: Planner(spec_backend if m.speculative else plain_backend, tok, configs[m.name],
                                observer=m.steps.append) for m in modes}
    first = drives[0].cycles[0]
    for m in modes:
        planners[m.name].warmup(first.images, first.history, cycles=cfg.warmup)
    log = {m.name: [] for m in modes}
    bar = tqdm(total=sum(len(d.cycles) for d in drives) * len(modes), desc="drive cycles", disable=not progress)
    for di, d in enumerate(drives):
        for p in planners.values():
            p.forget()
        for ci, c in enumerate(d.cycles):
            for m in mode_order(modes, 0, di, ci):
                m.steps.clear()
                res = _timed(planners[m.name], c, f"drive{di}/{ci}")
                log[m.name].append(_cycle_row(di, ci, res, m.steps, tok)
                                    | {"phase": phase_of(c), "family": c.family, "ade_m": ade_of(res, c)})
                bar.update()
    bar.close()
    return summarize(modes, log, cfg)


def ade_of(res, cycle) -> float | None:
    """Mean L2 (m) over the waypoints between the delivered trajectory and the drive's own future
    (the expert's path); None without a trajectory."""
    if res.trajectory is None:
        return None
    pred, fut = np.asarray(res.trajectory, float)[:, :2], np.asarray(cycle.future, float)[:, :2]
    return float(np.linalg.norm(pred - fut, axis=1).mean())


def phase_of(cycle) -> str:
    """'clear' where the cycle's label names no cause (the road looks clear: before an event is
    in view, or after it), else 'named' (the commitment names what the cameras show)."""
    return "clear" if cycle.cause_kind == "free_cruise" else "named"


def _timed(planner: Planner, cycle, name: str):
    gc.collect()
    gc.disable()
    try:
        return planner.plan(cycle.images, cycle.history, scene=name, frames=frames_of(cycle, planner.cfg.cameras))
    finally:
        gc.enable()


def _judged(res, steps, tok) -> dict:
    """{class: [accepted, judged]} proposals of one cycle's reasoning (routine / commitment)."""
    if res.error is not None or not any(s.k for s in steps):
        return {c: [0, 0] for c in accept_map.CLASSES}
    return accept_map.class_acceptance(accept_map.result_record(res, steps, tok))


def _cycle_row(drive: int, cycle: int, res, steps, tok) -> dict:
    st, d = res.timing.get("stages_ms", {}), res.decode
    model = [s for s in steps if s.source == "model"]
    return {"drive": drive, "cycle": cycle, "total_ms": res.timing.get("total_ms", 0.0),
            **{f"{k}_ms": float(st.get(k, 0.0)) for k in ("vision", "prefill", "reasoning", "trajectory")},
            "steps": d.get("steps", 0), "emitted": d.get("emitted", 0),
            "lookup_proposed": d.get("looked_up", 0), "lookup_accepted": d.get("looked_up_accepted", 0),
            "model_proposed": sum(s.k for s in model), "model_accepted": sum(s.accepted for s in model),
            "tree_steps": d.get("trees", 0),
            "reused": res.reuse.get("vision", {}).get("reused", 0),
            "blocks_kept": res.reuse.get("prefill", {}).get("reused", 0), "error": res.error,
            "judged": _judged(res, steps, tok),
            "flags": list(res.flags), "reasoning_ids": [int(i) for i in res.reasoning_ids],
            "trajectory": None if res.trajectory is None else np.asarray(res.trajectory, float)}


def summarize(modes, log: dict, cfg: DriveBenchConfig) -> dict:
    plain = log["plain"]
    p50 = latency(r["total_ms"] for r in plain)["p50"]
    vision0 = latency(r["vision_ms"] for r in plain)["p50"]
    plain_ok = any(r["error"] is None for r in plain)
    out = [_mode(m.name, log[m.name], plain, p50 if plain_ok else None, vision0 if plain_ok else None) for m in modes]
    best = next((m for m in out if m["name"] == "spec+vision+lookup"), out[-1])   # issue 26's mode
    goal = {"speedup": best["cycle_speedup_p50"], "speedup_goal": GOAL_SPEEDUP,
            "vision_cut": best["vision_cut"], "vision_cut_goal": GOAL_VISION_CUT,
            "identical_every_cycle": all(m["identical"]["equal"] == m["identical"]["cycles"] for m in out),
            "tau_lookup_over_model": _tau_ratio(out)}
    goal["met"] = bool((goal["speedup"] or 0.0) >= GOAL_SPEEDUP and (goal["vision_cut"] or 0.0) >= GOAL_VISION_CUT
                       and goal["identical_every_cycle"] and (goal["tau_lookup_over_model"] or 0.0) > 1.0)
    by = {m["name"]: m for m in out}
    for m in out:                  # the prefill stage against the same mode without streaming
        base = by.get(m["name"].removesuffix("+stream")) if m["name"].endswith("+stream") else None
        m["prefill_cut"] = (round(1.0 - m["prefill_ms_p50"] / base["prefill_ms_p50"], 4)
                            if base and base["prefill_ms_p50"] else None)
    stream = by.get("spec+vision+lookup+stream")
    if stream is not None:
        goal["streaming"] = {"mode": stream["name"], "speedup": stream["cycle_speedup_p50"],
                             "speedup_goal": GOAL_STREAM_SPEEDUP, "prefill_cut": stream["prefill_cut"],
                             "prefill_cut_goal": GOAL_PREFILL_CUT,
                             "identical": stream["identical"]["equal"] == stream["identical"]["cycles"]}
        goal["streaming"]["met"] = bool((stream["cycle_speedup_p50"] or 0) >= GOAL_STREAM_SPEEDUP
                                        and (stream["prefill_cut"] or 0) >= GOAL_PREFILL_CUT
                                        and goal["streaming"]["identical"])
    cycles = [{k: v for k, v in r.items() if k not in ("trajectory", "reasoning_ids")} | {"mode": name}
              for name, rows in log.items() for r in rows]
    return {"schema": SCHEMA, "config": dataclasses.asdict(cfg), "modes": out, "goal": goal, "cycles": cycles}


def _mode(name: str, rows: list, plain: list, plain_p50: float | None, vision0: float | None) -> dict:
    """One mode's summary; its speedup and vision cut are None (printed "-") when it or plain
    decoding had no successful cycle (then `failed` says why: the first error)."""
    ok = [r for r in rows if r["error"] is None]
    failed = None if ok else (f"no successful cycle of {len(rows)}" + (f"; the first error: {rows[0]['error']}"
                                                                         if rows else ""))
    if not ok:
        plain_p50 = vision0 = None
    cyc, vis = latency(r["total_ms"] for r in rows), latency(r["vision_ms"] for r in rows)
    steps, emitted = sum(r["steps"] for r in rows), sum(r["emitted"] for r in rows)
    differ = [(r["drive"], r["cycle"]) for r, q in zip(rows, plain) if r["reasoning_ids"] != q["reasoning_ids"]]
    diffs = [float(np.abs(r["trajectory"] - q["trajectory"]).max()) for r, q in zip(rows, plain)
             if r["trajectory"] is not None and q["trajectory"] is not None]
    tot = {k: sum(r[k] for r in rows) for k in ("lookup_proposed", "lookup_accepted", "model_proposed",
                                                 "model_accepted", "reused", "blocks_kept", "tree_steps")}
    return {"name": name, "cycles": len(rows), "cycle_ms": cyc, "vision_ms": vis, **_alpha(rows),
            "alpha_by_phase": _alpha_by(rows, "phase"), "alpha_by_family": _alpha_by(rows, "family"),
            **{f"{k}_ms_p50": latency(r[f"{k}_ms"] for r in rows)["p50"]
               for k in ("prefill", "reasoning", "trajectory")},
            "vision_cut": round(1.0 - vis["p50"] / vision0, 4) if vision0 else None,
            "cycle_speedup_p50": round(plain_p50 / cyc["p50"], 4) if cyc["p50"] and plain_p50 else None,
            "tau": round(emitted / steps, 4) if steps else 0.0, **tot,
            "frames_reused_per_cycle": round(tot["reused"] / max(len(rows), 1), 3),
            "blocks_kept_per_cycle": round(tot["blocks_kept"] / max(len(rows), 1), 3),
            "errors": sum(r["error"] is not None for r in rows), "ok_cycles": len(ok), "failed": failed,
            "ade_m": _mean([r.get("ade_m") for r in rows]),
            "ade_change_m": _ade_change(rows, plain),
            "flagged_approximate": sum("approximate_prefill" in r["flags"] for r in rows),
            "identical": {"cycles": len(rows), "equal": len(rows) - len(differ), "differing": differ[:20]},
            "trajectory_max_diff_m": round(max(diffs), 6) if diffs else None}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(float(np.mean(values)), 4) if values else None


def _ade_change(rows: list, plain: list) -> float | None:
    """Mean over the cycles both delivered of this mode's ADE minus plain decoding's (m)."""
    pairs = [(r["ade_m"], q["ade_m"]) for r, q in zip(rows, plain)
             if r.get("ade_m") is not None and q.get("ade_m") is not None]
    return round(float(np.mean([a - b for a, b in pairs])), 4) if pairs else None


def _tau_ratio(out: list):
    """tau of speculative + vision + lookup over plain speculative's (None unless both modes ran)."""
    by = {m["name"]: m for m in out}
    if "spec" not in by or "spec+vision+lookup" not in by or not by["spec"]["tau"]:
        return None
    return round(by["spec+vision+lookup"]["tau"] / by["spec"]["tau"], 4)


def _alpha(rows: list) -> dict:
    """{alpha_routine, alpha_commitment}: accepted / judged proposals over the rows (None: none judged)."""
    out = {}
    for c in accept_map.CLASSES:
        acc, judged = (sum(r["judged"][c][i] for r in rows) for i in (0, 1))
        out[f"alpha_{c}"] = round(acc / judged, 4) if judged else None
    return out


def _alpha_by(rows: list, key: str) -> dict:
    """{value of row[key]: {cycles, alpha_routine, alpha_commitment}} over the rows with that value."""
    groups = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    return {v: {"cycles": len(sel)} | _alpha(sel) for v, sel in sorted(groups.items())}


def _f(value, spec: str, width: int) -> str:
    """`value` formatted, or "-" (right-aligned to width) where there is none."""
    return f"{'-':>{width}s}" if value is None else format(value, spec)


def markdown_table(record: dict) -> str:
    """The modes as a Markdown table (docs/bench.md, via `specdrive report`), then the goals."""
    rows = ["| mode | cycle p50 ms | p99 ms | speedup | vision p50 ms | vision cut | prefill p50 ms | prefill cut "
            "| blocks kept / cycle | tau | lookup acc/prop | model acc/prop | same text | alpha routine / commitment |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in record["modes"]:
        failed = m.get("failed")
        cyc, vis = (m["cycle_ms"], m["vision_ms"]) if not failed else ({"p50": None, "p99": None}, {"p50": None})
        sp = m["cycle_speedup_p50"]
        look = f"{m['lookup_accepted']}/{m['lookup_proposed']}" if m["lookup_proposed"] else "-"
        model = f"{m['model_accepted']}/{m['model_proposed']}" if m["model_proposed"] else "-"
        alpha = (f"{m['alpha_routine']:.1%} / {m['alpha_commitment']:.1%}"
                 if m["alpha_routine"] is not None and m["alpha_commitment"] is not None else "-")
        rows.append(f"| {m['name']} | {_f(cyc['p50'], '.1f', 0)} | {_f(cyc['p99'], '.1f', 0)} "
                    f"| {'-' if sp is None else f'{sp:.2f}x'} | {_f(vis['p50'], '.2f', 0)} | {_f(m['vision_cut'], '.1%', 0)} "
                    f"| {_f(None if failed else m['prefill_ms_p50'], '.2f', 0)} | {_f(m.get('prefill_cut'), '.1%', 0)} "
                    f"| {_f(m.get('blocks_kept_per_cycle'), '.2f', 0)} | {m['tau']:.2f} | {look} | {model} | {m['identical']['equal']}/{m['identical']['cycles']} "
                    f"| {alpha} |")
    notes = table(record).split("\n")[len(record["modes"]) + 1:]
    return "\n".join(rows + [""] + [f"- {n}" for n in notes])


def phase_table(record: dict, mode: str) -> str:
    """One mode's acceptance on all cycles and by phase (cycles whose label names a cause, cycles
    on a road that looks clear), routine against commitment, and by family (docs/bench.md)."""
    m = next(x for x in record["modes"] if x["name"] == mode)

    def row(label, tau, a):
        r, c = a["alpha_routine"], a["alpha_commitment"]
        gap = "-" if r is None or c is None else f"{100 * (r - c):.1f} points"
        return f"| {label} | {tau} | {_f(r, '.1%', 0)} | {_f(c, '.1%', 0)} | {gap} |"
    rows = ["| cycles | tau | alpha routine | alpha commitment | gap |", "|---|---|---|---|---|",
            row(f"all {m['identical']['cycles']:,}", f"{m['tau']:.2f}", m)]
    ph = m.get("alpha_by_phase", {})
    for key, what in (("named", "whose label names a cause"), ("clear", "on a road that looks clear")):
        if key in ph:
            rows.append(row(f"{ph[key]['cycles']:,} {what}", "", ph[key]))
    fam = m.get("alpha_by_family", {})
    if fam:
        rows += ["", "| family | cycles | alpha routine | alpha commitment |", "|---|---|---|---|"]
        rows += [f"| {f} | {a['cycles']} | {_f(a['alpha_routine'], '.1%', 0)} | {_f(a['alpha_commitment'], '.1%', 0)} |"
                 for f, a in sorted(fam.items())]
    return "\n".join(rows + ["", f"Same text as plain decoding: {m['identical']['equal']:,} of "
                                  f"{m['identical']['cycles']:,} cycles; cycle speedup "
                                  f"{_f(m['cycle_speedup_p50'], '.2f', 0)}x at the p50."])


def table(record: dict) -> str:
    """The record's table; a mode with no successful cycle (or no plain reference) prints "-"
    where a number would need one, and a line says why."""
    head = (f"{'mode':26s} {'p50 ms':>8s} {'p99 ms':>8s} {'speedup':>7s} {'vision':>7s} {'cut':>6s} {'prefill':>7s} "
            f"{'cut':>6s} {'tau':>6s} {'lookup':>11s} {'model':>11s} {'same':>9s} {'alpha r/c':>11s}")
    lines = [head]
    for m in record["modes"]:
        failed, cut = m.get("failed"), m.get("prefill_cut")
        cyc, vis = (m["cycle_ms"], m["vision_ms"]) if not failed else ({"p50": None, "p99": None}, {"p50": None})
        prefill = None if failed else m["prefill_ms_p50"]
        speedup = _f(m["cycle_speedup_p50"], "6.2f", 6) + ("x" if m["cycle_speedup_p50"] is not None else " ")
        lines.append(f"{m['name']:26s} {_f(cyc['p50'], '8.1f', 8)} {_f(cyc['p99'], '8.1f', 8)} "
                     f"{speedup} {_f(vis['p50'], '7.2f', 7)} {_f(m['vision_cut'], '6.1%', 6)} "
                     f"{_f(prefill, '7.2f', 7)} {_f(cut, '6.1%', 6)} "
                     f"{m['tau']:6.2f} {m['lookup_accepted']:>5d}/{m['lookup_proposed']:<5d} "
                     f"{m['model_accepted']:>5d}/{m['model_proposed']:<5d} "
                     f"{m['identical']['equal']:>4d}/{m['identical']['cycles']:<4d} "
                     + (f"{m['alpha_routine']:5.1%}/{m['alpha_commitment']:5.1%}"
                        if m['alpha_routine'] is not None and m['alpha_commitment'] is not None else f"{'-':>11s}"))
    for m in record["modes"]:
        if m.get("failed"):
            lines.append(f"{m['name']}: - where no number can be given: {m['failed']}")
    for m in record["modes"]:
        parts = [f"{ph} ({a['cycles']} cycles) {a['alpha_routine']:.1%}/{a['alpha_commitment']:.1%}"
                 for ph, a in m.get("alpha_by_phase", {}).items()
                 if a["alpha_routine"] is not None and a["alpha_commitment"] is not None]
        if parts:
            lines.append(f"alpha r/c by phase, {m['name']}: " + ", ".join(parts))
    g = record["goal"]
    lines.append(f"goal (>= {g['speedup_goal']}x cycle p50, vision cut >= {g['vision_cut_goal']:.0%}, same text every "
                 f"cycle, lookup raises tau): speedup {_f(g['speedup'], '', 1)}x, vision cut "
                 f"{_f(g['vision_cut'], '.1%', 1)}, identical "
                 f"{g['identical_every_cycle']}, tau ratio {g['tau_lookup_over_model']}: "
                 f"{'met' if g['met'] else 'NOT met'}")
    st = g.get("streaming")
    if st:
        lines.append(f"streaming goal (>= {st['speedup_goal']}x cycle p50 with every exact reuse, prefill cut >= "
                     f"{st['prefill_cut_goal']:.0%} against the mode without streaming, same text every cycle): "
                     f"{st['mode']} {st['speedup']}x, prefill cut {st['prefill_cut']}, identical {st['identical']}: "
                     f"{'met' if st['met'] else 'NOT met'}")
    return "\n".join(lines)


def check_out(path) -> None:
    """Before the run: `path` (and its .md beside it) can be written as files, so a long run is not
    lost at the end (ConfigError naming what is in the way)."""
    from pathlib import Path

    path = Path(path)
    for p in (path, path.with_suffix(".md")):
        if p.is_dir():
            raise ConfigError(f"--json {str(path)!r}: {str(p)!r} is a folder; give a file path (the record and "
                              "its .md table are written there)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"--json {str(path)!r}: {str(parent)!r} is a file, not a folder")
            break


def write(path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    path.with_suffix(".md").write_text("```\n" + table(record) + "\n```\n")
