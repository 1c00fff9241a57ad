"""`specdrive trajectory-cost`: displacement error against cost for the action expert's settings. (the library of tools/trajectory_cost.py)

Per test scene the planner reasons once (greedy, budget off); then, on that same cache, the
trajectory stage runs with every (Euler steps, draws, combine) setting, each timed `repeats`
times (median), and its waypoints are scored against the scene's expert future (ADE, FDE over
6.4 s). Settings are interleaved per scene, so every one sees the same machine load. Also
measured: how far the mean of 8 one-draw paths lies from the nearest of them (the mean of two
modes is a path nobody drew) against the spread of the draws. Writes JSON, a markdown table
(stdout) and a plot of ADE against ms.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from core.config import ConfigError
from runtime.artifacts import find_checkpoints, load_tokenizer
from runtime.backend import load_backend
from runtime.checks import ego_speed
from runtime.config import ExpertRequest, load_planner_config, with_overrides
from runtime.planner import Planner
from scenes import world
from train.metrics import ade

GAP_DRAWS = 8


@dataclass(frozen=True)
class TrajectoryCostRun:
    """One `specdrive trajectory-cost` run: the checkpoint, the scenes, the grid of expert settings."""
    checkpoint: Path
    json: Path
    draft: str | None = None        # draft variant for the reasoning (None: the folder's)
    scenes: int = 32
    seed: int = 0
    split: str = "test"
    steps: tuple[int, ...] = (2, 4, 6, 10)      # Euler steps
    samples: tuple[int, ...] = (1, 2, 4, 8)     # expert draws per trajectory
    repeats: int = 3                # timed calls per setting and scene (the least counts)
    threads: int = 1                # torch CPU threads (0 = torch's default)
    plot: Path | None = None        # default: json with .png

    def __post_init__(self):
        for name, values, hi in (("steps", self.steps, 100), ("samples", self.samples, 64)):
            if not values or min(values) < 1 or max(values) > hi:
                raise ConfigError(f"--{name} {','.join(map(str, values))!r}: give integers in [1, {hi}]")
        if self.scenes < 1 or self.repeats < 1:
            raise ConfigError("--scenes and --repeats must be >= 1")


def settings(steps: list[int], samples: list[int]) -> list[tuple[int, int, str]]:
    """(steps, samples, combine): one draw has nothing to combine."""
    return [(e, s, c) for e in steps for s in samples for c in (("mean",) if s == 1 else ("mean", "medoid"))]


def measure(planner: Planner, scene, name: str, grid, repeats: int) -> dict:
    """One scene: reason once, then every setting on the same cache -> {setting: (ade, fde, ms)}."""
    res = planner.plan(scene.images, scene.history)
    if res.error is not None or res.source not in ("reasoning", "cut_reasoning"):
        raise RuntimeError(f"scene {name}: the planner did not reason ({res.error or res.flags})")
    be, v0 = planner.backend, ego_speed(scene.history)
    coc = np.asarray(list(res.reasoning_ids) + [planner.tok.cot_end], np.int64)
    out = {}
    for e, s, c in grid:
        times, traj = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            traj = be.action(coc, res.prompt_len, v0, 1234, ExpertRequest(samples=s, steps=e, combine=c))
            times.append((time.perf_counter() - t0) * 1e3)
        fde = float(np.linalg.norm(traj[-1, :2] - scene.future[-1, :2]))
        out[(e, s, c)] = (ade(traj, scene.future), fde, float(min(times)))
    draws = np.stack([be.action(coc, res.prompt_len, v0, 1234 + i) for i in range(GAP_DRAWS)])
    return {"settings": out, "gap": mode_gap(draws[..., :2])}


def mode_gap(paths: np.ndarray) -> dict:
    """paths (S, 64, 2): ADE from their mean path to the nearest one, and the draws' spread
    (mean pairwise ADE). A gap near the spread means the mean is a path nobody drew."""
    mean = paths.mean(0)
    to_mean = np.linalg.norm(paths - mean, axis=-1).mean(-1)
    pair = np.linalg.norm(paths[:, None] - paths[None], axis=-1).mean(-1)
    n = len(paths)
    return {"mean_to_nearest_draw_m": float(to_mean.min()),
            "draw_spread_m": float(pair.sum() / (n * (n - 1)))}


def summarize(per_scene: list[dict], grid) -> dict:
    rows = []
    for key in grid:
        vals = np.array([s["settings"][key] for s in per_scene])      # (scenes, 3)
        rows.append({"steps": key[0], "samples": key[1], "combine": key[2],
                     "ade_m": round(float(vals[:, 0].mean()), 4), "fde_m": round(float(vals[:, 1].mean()), 4),
                     "ms_p50": round(float(np.median(vals[:, 2])), 2)})
    gaps = np.array([[s["gap"]["mean_to_nearest_draw_m"], s["gap"]["draw_spread_m"]] for s in per_scene])
    ratio = gaps[:, 0] / np.maximum(gaps[:, 1], 1e-9)
    return {"rows": rows, "mode_gap": {
        "draws": GAP_DRAWS, "mean_to_nearest_draw_m_p50": round(float(np.median(gaps[:, 0])), 4),
        "mean_to_nearest_draw_m_max": round(float(gaps[:, 0].max()), 4),
        "draw_spread_m_p50": round(float(np.median(gaps[:, 1])), 4),
        "scenes_gap_over_half_spread": int((ratio > 0.5).sum()), "scenes": len(per_scene)}}


def table(summary: dict) -> str:
    lines = ["| Euler steps | draws | combine | ADE m | FDE m | trajectory stage ms (p50) |",
             "|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(f"| {r['steps']} | {r['samples']} | {r['combine']} | {r['ade_m']:.3f} | "
                     f"{r['fde_m']:.3f} | {r['ms_p50']:.1f} |")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for combine, marker in (("mean", "o"), ("medoid", "s")):
        rows = [r for r in summary["rows"] if r["combine"] == combine or r["samples"] == 1]
        for e in sorted({r["steps"] for r in rows}):
            pts = sorted((r["ms_p50"], r["ade_m"], r["samples"]) for r in rows if r["steps"] == e)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, alpha=0.8,
                    label=f"{e} steps, {combine}")
            for x, y, s in pts:
                ax.annotate(str(s), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("trajectory stage, ms (p50, this machine)")
    ax.set_ylabel("ADE over 6.4 s, m")
    ax.set_title("action expert: displacement error against cost (labels: draws)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(setup: TrajectoryCostRun) -> int:
    grid = settings(sorted(set(setup.steps)), sorted(set(setup.samples)))
    tok = load_tokenizer(setup.checkpoint)
    be = load_backend("torch", checkpoints=find_checkpoints(setup.checkpoint, setup.draft), tokenizer=tok)
    cfg = with_overrides(load_planner_config("cpu"), {"budget": {"budget_ms": 0.0}, "fallback": "on_failure",
                                                      "trajectory_samples": 1})
    planner = Planner(be, tok, cfg)
    per_scene = []
    if setup.threads:
        import torch
        torch.set_num_threads(setup.threads)
    try:
        for i in tqdm(range(setup.scenes), desc="trajectory cost"):
            scene = world.make_scene(setup.seed + i, split=setup.split)
            per_scene.append(measure(planner, scene, f"seed{setup.seed + i}", grid, setup.repeats))
    finally:
        planner.close()
    summary = {"setup": {"checkpoint": str(setup.checkpoint), "scenes": setup.scenes, "seed": setup.seed,
                         "split": setup.split, "repeats": setup.repeats, "threads": setup.threads}, **summarize(per_scene, grid)}
    setup.json.parent.mkdir(parents=True, exist_ok=True)
    setup.json.write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary, setup.plot or setup.json.with_suffix(".png"))
    print(table(summary))
    print(json.dumps(summary["mode_gap"]))
    return 0
