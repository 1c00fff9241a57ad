"""`specdrive plan`: run planning cycles over scenes, log them, draw them. (the library of tools/plan.py)

Writes OUT/cycles.jsonl (one line per cycle, failures included), OUT/summary.json and
bird's-eye SVGs OUT/cycle_NNNN.svg for the first --pictures cycles; prints a live table.
What an artifact is comes from its meta.json (runtime.artifacts), never from its path.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from prompt.artifacts import read_manifest
from prompt.config import ConfigError
from runtime.artifacts import open_backend
from runtime.config import load_planner_config
from runtime.planner import Planner
from bench.accept_map import routine_tokens
from bench.cycle_report import TABLE_HEADER, JsonLog, birdseye_svg, table_row
from bench.sources import default_tokenizer, model_source, scene_source
from bench.threads import torch_threads


def default_profile(args) -> str:
    """The planner profile an engines build was made for (its manifest.json), else cpu."""
    manifest = getattr(args, "engines", None) and Path(args.engines) / "manifest.json"
    if manifest and manifest.is_file():
        name = read_manifest(args.engines).planner
        if name:
            print(f"planner profile {name!r} (from {manifest}; --profile NAME for another)", flush=True)
            return name
    return "cpu"


def planner_config(args):
    """The profile with the command line's overrides (re-validated by the dataclasses)."""
    cfg = load_planner_config(args.profile or default_profile(args))
    spec, budget = cfg.spec, cfg.budget
    if args.k is not None:
        spec = dataclasses.replace(spec, k=args.k, adaptive=False)
    if args.draft == "none":
        spec = dataclasses.replace(spec, k=0, adaptive=False)
    if args.decoding:
        spec = dataclasses.replace(spec, decoding=args.decoding)
    if args.budget_ms is not None:
        budget = dataclasses.replace(budget, budget_ms=args.budget_ms)
    changes = {"spec": spec, "budget": budget}
    if args.trajectory:
        changes["trajectory"] = args.trajectory
    if args.max_reasoning is not None:
        changes["max_reasoning_tokens"] = args.max_reasoning
    return dataclasses.replace(cfg, **changes)


def run(args) -> int:
    cfg = planner_config(args)
    if args.preset and args.random_init is None:
        raise ConfigError("--preset needs --random-init SEED (random weights); "
                          "trained models come with --checkpoint DIR")
    if args.scenes is not None and args.scenes < 1:
        raise ConfigError(f"--scenes={args.scenes} must be >= 1")
    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed} must be >= 0 (scene seeds are non-negative)")
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {str(args.out)!r} is a file; give a folder (it is created if missing)")
    if args.threads < 0:
        raise ConfigError(f"--threads={args.threads} must be >= 0 (0 = torch's default)")
    src = model_source(args)
    backend, tok = open_backend(src, cfg.max_len, default_tokenizer, k_max=cfg.spec.k_max)
    args.out.mkdir(parents=True, exist_ok=True)
    planner = Planner(backend, tok, cfg)
    with torch_threads(args.threads):
        results = run_cycles(args, planner, tok)
    summary = summarize(results)
    summary["budget_premise"] = planner.premise
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)
    return 0


def run_cycles(args, planner: Planner, tok) -> list:
    """Warm-up, then one logged (and drawn) cycle per scene -> the results."""
    log = JsonLog(args.out / "cycles.jsonl")
    results = []
    try:
        if not args.quiet:
            print(TABLE_HEADER, flush=True)
        for i, scene in enumerate(scene_source(args, tok)):
            if i == 0 and args.warmup:
                premise = planner.warmup(scene.images, scene.history, args.warmup)
                if not premise["ok"]:
                    print(f"WARNING: the budget ({premise['budget_ms']:g} ms) cannot hold vision + prefill "
                          f"+ trajectory + margin at their measured worst cases ({premise['need_ms']:.0f} ms): "
                          "cycles are flagged budget_too_small and may miss", flush=True)
            res = planner.plan(scene.images, scene.history, scene=scene.name)
            log.write({**res.to_json(), "expert": _rounded(scene.future), "family": scene.family,
                       "routine_tokens": routine_tokens(tok, res.reasoning)})
            results.append(res)
            if not args.quiet:
                print(table_row(res), flush=True)
            if i < args.pictures:
                birdseye_svg(args.out / f"cycle_{res.cycle:04d}.svg", res, scene.history, scene.future)
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
