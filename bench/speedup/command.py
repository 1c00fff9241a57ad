"""`specdrive bench`: speculative vs plain decoding in one process, on the same scenes. (the library of tools/bench.py)

Modes: plain target decoding, then every draft with each fixed k and adaptive k (greedy). Per
mode: tau, reasoning tokens/s, decode-phase speedup over plain (median and min-max over the
repeats; vision and prefill reported separately), the scenes whose reasoning equals plain
decoding's, cycle latency p50/p99/max, deadline misses, the measured draft cost ratio c and
verify-width costs, the ideal speedup tau / (k c + v(k+1)) and the efficiency against it; and
where the draft is accepted (routine vs commitment words, scenario families). Writes OUT (JSON),
a speedup plot and a picture of one scene's reasoning colored by who produced each word.
Drafts of a checkpoint folder are found by their meta.json (kind "draft"), never by folder name.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from prompt.config import ConfigError
from bench.common.compared_backends import open_bench_backends
from runtime.artifacts import ModelSource
from runtime.config import load_planner_config
from bench.speedup import report
from bench.common.sources import default_tokenizer
from bench.common.threads import torch_threads
from bench.speedup.measure import BenchConfig, BenchScene, machine_info, make_modes, run_bench


def bench_config(args, profile) -> BenchConfig:
    try:
        ks = tuple(int(k) for k in args.ks.split(",") if k.strip())
    except ValueError:
        raise ConfigError(f"--ks {args.ks!r} must be comma-separated integers, e.g. 4,8") from None
    deadline = profile.budget.budget_ms if args.deadline_ms is None else args.deadline_ms
    return BenchConfig(scenes=args.scenes, seed=args.seed, split=args.split, repeats=args.repeats,
                       warmup=args.warmup, ks=ks, adaptive=not args.no_adaptive, budget_ms=args.budget_ms,
                       deadline_ms=deadline, max_reasoning_tokens=args.max_reasoning,
                       picture_scene=args.picture_scene)


def bench_scenes(cfg: BenchConfig) -> list[BenchScene]:
    from scenes.world import make_scene

    out = []
    for i in range(cfg.scenes):
        s = make_scene(cfg.seed + i, split=cfg.split)
        out.append(BenchScene(f"seed{cfg.seed + i}", s.family, np.asarray(s.images),
                              np.asarray(s.history, np.float32), int(sum(s.coc_routine)),
                              np.asarray(s.future, np.float32)))
    return out


def run(args) -> int:
    if getattr(args, "drives", None) is not None:     # whole drives, reuse against none
        from bench.whole_drives import measure as drives
        return drives.command(args)
    profile = load_planner_config(args.profile)
    cfg = bench_config(args, profile)
    if args.threads < 0:
        raise ConfigError(f"--threads={args.threads} must be >= 0 (0 = torch's default)")
    src = ModelSource(engines=args.engines, checkpoint=args.checkpoint, preset=args.preset,
                      random_init=args.random_init, backend=args.backend, device=args.device,
                      eager=args.eager, threads=args.threads)
    tok, plain, drafts, source = open_bench_backends(src, args.drafts, profile.max_len, default_tokenizer)
    modes = make_modes(drafts, plain, cfg)
    with torch_threads(args.threads):
        try:
            record = run_bench(modes, bench_scenes(cfg), tok, profile, cfg, progress=True)
            record["machine"] = machine_info(args.device)
        finally:
            for be in {id(m.backend): m.backend for m in modes}.values():
                be.close()
    record["setup"] = {"source": source, "backend": plain.name, "device": args.device,
                       "profile": str(args.profile), "command": command_line(args),
                       **{k: v for k, v in vars(cfg).items()}, "threads": args.threads,
                       "fallback": profile.fallback, "decoding": "greedy",
                       "gc": "collected before, disabled inside every timed cycle"}
    write_outputs(args, record)
    return 0


def command_line(args) -> str:
    """How to rerun this bench: `specdrive bench` and the arguments it was given."""
    argv = getattr(args, "argv", None)
    if argv is None:
        argv = sys.argv[1:]
        argv = argv[argv.index("bench") + 1:] if "bench" in argv else argv
    return " ".join(["specdrive bench", *argv])


def write_outputs(args, record: dict) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    plot = args.plot or args.json.with_suffix(".png")
    accept = args.accept_plot or args.json.with_name(args.json.stem + "_accept.png")
    best = report.best_mode(record) or record["modes"][-1]["name"]
    record["best"] = best
    record["criterion"] = report.criterion(record)
    record["pictures"] = {"speedup": str(plot), "where_accepted": str(accept),
                          "where_accepted_mode": best}
    try:
        report.plot_bench(plot, record)
        record["pictures"]["where_accepted_scene"] = report.plot_where(accept, record, best,
                                                                             args.picture_scene)
    except ModuleNotFoundError as e:     # a vehicle-side install has no plotting library
        if e.name != "matplotlib":
            raise
        record["pictures"] = None
        print("pictures skipped: matplotlib is not installed (pip install '.[plots]')", flush=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    args.json.with_suffix(".md").write_text(report.markdown_report(record))
    print(report.table(record), flush=True)
    print(f"issue 6 bar (>= 2.5x, same output, >= 85% of ideal): {record['criterion']}", flush=True)
    pictures = f", {plot}, {accept}" if record["pictures"] else ""
    print(f"best: {best}; wrote {args.json} (and .md){pictures}", flush=True)
