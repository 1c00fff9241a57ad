"""`specdrive plan`: run planning cycles over scenes, log them, draw them. (the library of tools/plan.py)

Writes OUT/cycles.jsonl (one line per cycle, failures included), OUT/summary.json and
bird's-eye SVGs OUT/cycle_NNNN.svg for the first --pictures cycles; prints a live table.
What an artifact is comes from its meta.json (runtime.artifacts), never from its path.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.artifacts import read_manifest
from runtime.artifacts import ModelSource, open_backend
from runtime.config import load_planner_config, with_overrides
from runtime.planner import Planner
from bench.common.accept_map import routine_tokens
from bench.common.cycle_report import TABLE_HEADER, JsonLog, birdseye_svg, table_row
from bench.common.sources import (SceneSource, announce_fingerprints, check_scene_cameras, default_tokenizer,
                                  scene_source)
from bench.common.threads import torch_threads


@dataclass(frozen=True)
class PlanRun:
    """One `specdrive plan` run: the models, the scenes, the profile and its overrides, the outputs."""
    source: ModelSource
    scenes: SceneSource
    out: Path
    profile: str | None = None      # None: the engines folder's manifest.json names it, else cpu
    k: int | None = None            # a fixed draft length (adaptive off; 0 = plain decoding)
    decoding: str | None = None
    trajectory: str | None = None
    budget_ms: float | None = None
    max_reasoning: int | None = None
    threads: int = 1                # torch / onnxruntime CPU threads (0 = the library's default)
    warmup: int = 1                 # unlogged warm-up cycles on the first scene
    pictures: int = 8               # bird's-eye SVGs of the first N cycles
    quiet: bool = False             # no live table


def default_profile(source: ModelSource) -> str:
    """The planner profile an engines build was made for (its manifest.json), else cpu."""
    manifest = source.engines and Path(source.engines) / "manifest.json"
    if manifest and manifest.is_file():
        name = read_manifest(source.engines).planner
        if name:
            print(f"planner profile {name!r} (from {manifest}; --profile NAME for another)", flush=True)
            return name
    return "cpu"


def planner_config(setup: PlanRun):
    """The profile with the command line's overrides (re-validated by the dataclasses)."""
    cfg = load_planner_config(setup.profile or default_profile(setup.source))
    spec, changes = {}, {}
    if setup.k is not None:
        spec.update(k=setup.k, adaptive=False)
    if setup.source.draft == "none":
        spec.update(k=0, adaptive=False)
    if setup.decoding:
        spec["decoding"] = setup.decoding
    if setup.budget_ms is not None:
        changes["budget"] = {"budget_ms": setup.budget_ms}
    if setup.trajectory:
        changes["trajectory"] = setup.trajectory
    if setup.max_reasoning is not None:
        changes["max_reasoning_tokens"] = setup.max_reasoning
    return with_overrides(cfg, {"spec": spec, **changes}, "planner")


def run(setup: PlanRun) -> int:
    cfg = planner_config(setup)
    check_scene_cameras(cfg)
    announce_fingerprints(setup.source, cfg.fingerprint, vehicle=setup.source.engines is not None,
                          require_pin=cfg.require_pin)
    backend, tok = open_backend(setup.source, cfg.max_len, default_tokenizer, k_max=cfg.spec.k_max)
    setup.out.mkdir(parents=True, exist_ok=True)
    planner = Planner(backend, tok, cfg)
    with torch_threads(setup.threads):
        results = run_cycles(setup, planner, tok)
    summary = summarize(results)
    summary["budget_premise"] = planner.premise
    (setup.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)
    return 0


def run_cycles(setup: PlanRun, planner: Planner, tok) -> list:
    """Warm-up, then one logged (and drawn) cycle per scene -> the results."""
    log = JsonLog(setup.out / "cycles.jsonl")
    results = []
    try:
        if not setup.quiet:
            print(TABLE_HEADER, flush=True)
        for i, scene in enumerate(scene_source(setup.scenes, tok)):
            if i == 0 and setup.warmup:
                premise = planner.warmup(scene.images, scene.history, setup.warmup)
                if not premise["ok"]:
                    print(f"WARNING: the budget ({premise['budget_ms']:g} ms) cannot hold vision + prefill "
                          f"+ trajectory + margin at their measured worst cases ({premise['need_ms']:.0f} ms): "
                          "cycles are flagged budget_too_small and may miss", flush=True)
            res = planner.plan(scene.images, scene.history, scene=scene.name)
            log.write({**res.to_json(), "expert": _rounded(scene.future), "family": scene.family,
                       "routine_tokens": routine_tokens(tok, res.reasoning)})
            results.append(res)
            if not setup.quiet:
                print(table_row(res), flush=True)
            if i < setup.pictures:
                birdseye_svg(setup.out / f"cycle_{res.cycle:04d}.svg", res, scene.history, scene.future)
    finally:
        log.close()
        planner.close()
    return results


SOURCES = ("reasoning", "cut_reasoning", "prefill", "stop", "none")   # what made each trajectory


def summarize(results) -> dict:
    taus = [r.decode.get("tau", 0.0) for r in results if r.decode.get("steps")]
    count = lambda flag: sum(flag in r.flags for r in results)  # noqa: E731
    return {"cycles": len(results), "ok": sum(r.ok for r in results),
            "sources": {s: sum(r.source == s for r in results) for s in SOURCES},
            "errors": sum(r.error is not None for r in results),
            "misses": count("miss"), "budget_cuts": count("budget_cut"),
            "mean_tau": round(float(np.mean(taus)), 3) if taus else None}


def _rounded(a):
    return None if a is None else np.round(np.asarray(a, float), 3).tolist()
