"""The accuracy report: quantized graphs through the real speculative loop, against fp32.

    specdrive calibrate report --engines DIR [--precisions int8,fp8] [--scenes 16] [--out DIR/report]

Every variant runs the planner (ONNX Runtime backend, greedy, the budget off so every variant
decodes to the end) on the same held-out scenes:

    fp32                 the exported graphs
    P                    the target's graphs (prefill, step) in precision P
    P +draft             the target's and the draft's graphs in P (the draft's acceptance when
                         both are quantized, against P where only the target is)
    P only G             one graph group G in P (prefill, step, draft, vision, action): which
                         graph is to blame when P misses the goal, and whether the vision tower
                         and the action expert could leave higher precision

Per variant: tau (tokens per target forward), cause and decision accuracy of the reasoning,
trajectory ADE against the scene's expert future, the rate at which its greedy reasoning differs
from fp32's, and the largest trajectory difference to fp32. Goal: tau within 3% of fp32 and ADE
within 5% (GOAL). Writes report.json, report.md and report.png.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from calibration.quantize import NothingToQuantize
from calibration.variants import graphs_of, quantize_folder, select
from core.artifacts import EnginesMeta
from core.config import ConfigError
from runtime.config import with_overrides

GOAL = {"tau": 0.03, "ade": 0.05}       # relative to fp32
BLAME = ("prefill", "step", "draft", "vision", "action")
SPLIT = "heldout"


@dataclass
class Variant:
    name: str
    precision: str
    graphs: list

    def plan(self) -> dict:
        return {g: self.precision for g in self.graphs}


def variants(meta: EnginesMeta, precisions, blame: bool = True) -> list[Variant]:
    out = [Variant("fp32", "fp32", [])]
    for p in precisions:
        if p == "fp32":
            continue
        out.append(Variant(p, p, graphs_of(meta, ["target"])))
        if graphs_of(meta, ["draft"]):
            out.append(Variant(f"{p} +draft", p, graphs_of(meta, ["target", "draft"])))
        if blame:
            out += [Variant(f"{p} only {g}", p, graphs_of(meta, [g])) for g in BLAME if graphs_of(meta, [g])]
    return out


def offline_config(cfg, k: int | None = None):
    """The planner profile as the report and calibration run it: no budget (every variant decodes
    to <|cot_end|>), greedy, a fixed k (the profile's, else 4: adaptive k follows measured times,
    and tau must not depend on how busy the machine was), the expert only on failure (a CPU runs
    one thing at a time)."""
    k = k or cfg.spec.k or min(4, cfg.spec.k_max)
    spec = {"decoding": "greedy", "relax_r": 0, "k": k, "adaptive": False, "k_max": max(k, cfg.spec.k_max)}
    return with_overrides(cfg, {"spec": spec, "budget": {"budget_ms": 0.0}, "fallback": "on_failure"},
                          "offline config")


def heldout_scenes(n: int, seed: int = 0) -> list:
    from scenes.dataset import scene_seed
    from scenes.world import make_scene
    return [make_scene(scene_seed(seed, SPLIT, i), split=SPLIT) for i in range(n)]


def run_variant(folder: Path, meta: EnginesMeta, tokenizer, cfg, scenes, threads: int = 1) -> list[dict]:
    """One planner cycle per scene on the graphs `meta` names -> per-scene records."""
    from runtime.backends.onnxruntime import OrtBackend
    from runtime.planner import Planner
    from scenes.grade import ade, commitment_correct

    backend = OrtBackend(folder, meta, "cpu", cfg.max_len, threads)
    planner = Planner(backend, tokenizer, cfg)
    out = []
    try:
        for i, s in enumerate(scenes):
            res = planner.plan(np.asarray(s.images), np.asarray(s.history, np.float32), scene=f"{SPLIT}-{i}")
            cause, decision = commitment_correct(res.reasoning.split(), s)
            out.append({"scene": i, "family": s.family, "ids": [int(t) for t in res.reasoning_ids],
                        "tau": float(res.decode.get("tau", 0.0)), "cause": bool(cause), "decision": bool(decision),
                        "ade": None if res.trajectory is None else ade(res.trajectory, s.future),
                        "trajectory": None if res.trajectory is None else np.asarray(res.trajectory, np.float64),
                        "source": res.source, "error": res.error})
    finally:
        planner.close()
    return out


def summarize(rows: list[dict], ref: list[dict] | None) -> dict:
    ades = [r["ade"] for r in rows if r["ade"] is not None]
    out = {"scenes": len(rows), "tau": float(np.mean([r["tau"] for r in rows])),
           "cause_acc": float(np.mean([r["cause"] for r in rows])),
           "decision_acc": float(np.mean([r["decision"] for r in rows])),
           "ade": float(np.mean(ades)) if ades else None,
           "errors": sum(r["error"] is not None for r in rows)}
    if ref is not None:
        out["differs_from_fp32"] = float(np.mean([r["ids"] != q["ids"] for r, q in zip(rows, ref)]))
        diffs = [float(np.abs(r["trajectory"] - q["trajectory"]).max()) for r, q in zip(rows, ref)
                 if r["trajectory"] is not None and q["trajectory"] is not None]
        out["trajectory_diff_max_m"] = max(diffs) if diffs else None
    return out


def judge(s: dict, fp32: dict) -> dict:
    """Relative change of tau and ADE against fp32 and whether each is within GOAL."""
    tau = (s["tau"] - fp32["tau"]) / fp32["tau"] if fp32["tau"] else 0.0
    ade = (s["ade"] - fp32["ade"]) / fp32["ade"] if s["ade"] is not None and fp32["ade"] else None
    return {"tau_change": tau, "ade_change": ade, "tau_ok": abs(tau) <= GOAL["tau"],
            "ade_ok": ade is not None and ade <= GOAL["ade"]}


def accuracy_report(folder: Path, meta: EnginesMeta, tokenizer, cfg, calib, precisions, scenes: int = 16,
                    seed: int = 0, blame: bool = True, method=None, threads: int = 1,
                    progress=print) -> dict:
    """Quantize what the variants need (reusing files already made), run them, -> the report."""
    if scenes < 1:
        raise ConfigError(f"--scenes {scenes}: at least 1")
    cfg = offline_config(cfg)
    todo = variants(meta, precisions, blame)
    need = {}
    for v in todo:
        for g in v.graphs:
            need.setdefault((g, v.precision), True)
    progress(f"calibrate report: {len(todo)} variants x {scenes} {SPLIT} scenes; "
             f"quantizing {len(need)} graph/precision pairs first")
    entries, skipped = {p: {} for _, p in need}, {}
    for g, p in need:
        try:
            entries[p].update(quantize_folder(folder, meta, calib, {g: p}, method, progress))
        except NothingToQuantize as e:
            skipped[(g, p)] = str(e)
    dropped = {v.name: "; ".join(skipped[(g, v.precision)] for g in v.graphs if (g, v.precision) in skipped)
               for v in todo}
    todo = [v for v in todo if not dropped[v.name]]
    dropped = {k: why for k, why in dropped.items() if why}
    for name, why in dropped.items():
        progress(f"  variant {name!r} left out: {why}")
    held = heldout_scenes(scenes, seed)
    results, ref, t0 = {}, None, time.perf_counter()
    for v in tqdm(todo, desc="calibrate report: variants"):
        m = select(meta, {g: entries[v.precision][g] for g in v.graphs})
        rows = run_variant(folder, m, tokenizer, cfg, held, threads)
        ref = rows if v.name == "fp32" else ref
        results[v.name] = {"precision": v.precision, "graphs": v.graphs, **summarize(rows, None if v.name == "fp32" else ref)}
    fp32 = results["fp32"]
    for name, r in results.items():
        if name != "fp32":
            r.update(judge(r, fp32))
    from core.stamp import engines_stamp

    return {"format": "specdrive-accuracy-report", "stamp": engines_stamp(folder), "goal": GOAL, "split": SPLIT, "scenes": scenes, "seed": seed,
            "calibration_sha256": calib.sha256, "calibration_scenes": len(calib.scenes),
            "planner": {"k": cfg.spec.k, "adaptive": False,
                        "max_len": cfg.max_len, "decoding": "greedy", "budget": "off"},
            "seconds": round(time.perf_counter() - t0, 1), "variants": results, "left_out": dropped,
            "verdicts": verdicts(results)}


def verdicts(results: dict) -> list[str]:
    """Plain sentences: each precision against the goal, and the graph to blame where it misses."""
    out = []
    for name, r in results.items():
        if r["precision"] == "fp32" or " " in name:
            continue
        tau, ade = r["tau_change"], r["ade_change"]
        line = f"{name} (target graphs): tau {tau:+.1%}, ADE {_pct(ade)} against fp32"
        if r["tau_ok"] and r["ade_ok"]:
            out.append(line + ": within the goal (tau 3%, ADE 5%).")
            continue
        missed = [w for w, ok in (("tau", r["tau_ok"]), ("ADE", r["ade_ok"])) if not ok]
        singles = {k.split(" only ")[1]: s for k, s in results.items()
                   if k.startswith(f"{name} only ") and set(s["graphs"]) <= set(r["graphs"])}
        worst = sorted(singles.items(), key=lambda kv: -_badness(kv[1]))
        blame = (f"; one graph at a time, {worst[0][0]} moves it most (tau {worst[0][1]['tau_change']:+.1%}, "
                 f"ADE {_pct(worst[0][1]['ade_change'])})") if worst else ""
        out.append(line + f": misses the goal on {' and '.join(missed)}{blame}.")
    for name, r in results.items():
        if " only " in name and name.split(" only ")[1] in ("vision", "action"):
            ok = r["tau_ok"] and r["ade_ok"]
            out.append(f"{name}: {'safe by this measure' if ok else 'not safe'} (tau {r['tau_change']:+.1%}, "
                       f"ADE {_pct(r['ade_change'])}, reasoning differs from fp32 on "
                       f"{r['differs_from_fp32']:.0%} of scenes)")
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _badness(r: dict) -> float:
    return abs(r["tau_change"]) / GOAL["tau"] + max(r["ade_change"] or 0.0, 0.0) / GOAL["ade"]


def write_report(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.json", out / "report.md"]
    files[0].write_text(json.dumps(report, indent=2) + "\n")
    files[1].write_text(markdown(report))
    png = plot(report, out / "report.png")
    return files + ([png] if png else [])


def markdown(report: dict) -> str:
    lines = [f"# Accuracy by precision ({report['scenes']} {report['split']} scenes, greedy, budget off)", "",
             f"Calibration set {report['calibration_sha256'][:12]} ({report['calibration_scenes']} train scenes). "
             f"Goal: tau within {GOAL['tau']:.0%} of fp32, ADE within {GOAL['ade']:.0%}.", "",
             variants_table(report)]
    lines += ["", "## Verdicts", ""] + [f"- {v}" for v in report["verdicts"]] + [""]
    return "\n".join(lines)


def variants_table(report: dict) -> str:
    """One row per variant against fp32 (report.md; docs/engines.md renders it via `specdrive report`)."""
    lines = ["| variant | quantized graphs | tau | cause | decision | ADE (m) | differs from fp32 | max traj. diff (m) | goal |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["variants"].items():
        goal = "reference" if name == "fp32" else ("met" if r["tau_ok"] and r["ade_ok"] else "missed")
        change = "" if name == "fp32" else f" (tau {r['tau_change']:+.1%}, ADE {_pct(r['ade_change'])})"
        lines.append(f"| {name} | {', '.join(r['graphs']) or '-'} | {r['tau']:.3f} | {r['cause_acc']:.0%} | "
                     f"{r['decision_acc']:.0%} | {_num(r['ade'])} | {_frac(r.get('differs_from_fp32'))} | "
                     f"{_num(r.get('trajectory_diff_max_m'))} | {goal}{change} |")
    lines += [f"| {name} | left out: {why} | | | | | | | |" for name, why in report.get("left_out", {}).items()]
    return "\n".join(lines)


def _num(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _frac(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def plot(report: dict, path: Path) -> Path | None:
    """tau and ADE change against fp32 per variant, with the goal band. None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [(n, r) for n, r in report["variants"].items() if n != "fp32"]
    if not rows:
        return None
    names = [n for n, _ in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.35 * len(rows) + 1.6), sharey=True)
    for ax, key, goal, title in ((axes[0], "tau_change", GOAL["tau"], "tau vs fp32"),
                                 (axes[1], "ade_change", GOAL["ade"], "ADE vs fp32")):
        vals = [100 * (r[key] or 0.0) for _, r in rows]
        ok = [r["tau_ok"] if key == "tau_change" else r["ade_ok"] for _, r in rows]
        ax.barh(range(len(rows)), vals, color=["#4c9a2a" if o else "#c0392b" for o in ok])
        ax.axvspan(-100 * goal if key == "tau_change" else -100, 100 * goal, color="#dddddd", zorder=0)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(f"{title} (%), goal band grey")
        ax.set_xlim(min(min(vals) - 1, -100 * goal - 1), max(max(vals) + 1, 100 * goal + 1))
    axes[0].set_yticks(range(len(rows)), names)
    axes[0].invert_yaxis()
    fig.suptitle(f"Quantized graphs through the speculative loop: {report['scenes']} {report['split']} scenes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

