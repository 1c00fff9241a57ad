"""`specdrive bench`: speculative vs plain decoding in one process, on the same scenes.

    specdrive bench (--checkpoint DIR | --engines DIR | --preset NAME --random-init SEED)
                    [--drafts a,b] [--backend torch] [--ks 4,8] [--no-adaptive]
                    [--scenes N --seed S] [--repeats R] [--warmup W] [--threads T]
                    --json OUT [--plot PNG] [--accept-plot PNG]

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

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from prompt.config import ConfigError
from bench.backends import open_bench_backends
from runtime.artifacts import ModelSource
from runtime.config import load_planner_config
from tools import bench_report
from tools.sources import default_tokenizer
from tools.threads import torch_threads
from tools.bench_run import BenchConfig, BenchScene, machine_info, make_modes, run_bench

def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="speculative vs plain decoding: speedup, identity, where accepted",
                              description=__doc__.splitlines()[0])
    configure(p)


def configure(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help="trained planner folder (tokenizer.json, target, "
                     "expert, one or more drafts)")
    src.add_argument("--engines", type=Path, help="built engines folder (meta.json names the backend)")
    src.add_argument("--preset", help="random-weight models from configs/models/NAME.yaml or a path")
    p.add_argument("--random-init", type=int, metavar="SEED", help="seed of the random weights (--preset)")
    p.add_argument("--drafts", default=None, help="comma list: with --checkpoint the draft variants to "
                   "run (default all); with --preset any of self, noised:SIGMA, routine "
                   "(default self,noised:0.02)")
    p.add_argument("--backend", default=None, choices=["torch", "onnxruntime", "tensorrt", "tensorrt-llm"])
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (torch backend on CUDA)")
    p.add_argument("--profile", default="cpu", help="planner profile configs/planner/NAME.yaml or a YAML path")
    p.add_argument("--ks", default="4,8", help="fixed draft lengths, comma separated (default 4,8)")
    p.add_argument("--no-adaptive", action="store_true", help="leave out the adaptive-k modes")
    p.add_argument("--scenes", type=int, default=16, help="synthetic scenes (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first scene")
    p.add_argument("--split", default="test", help="split of the synthetic scenes")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds over all scenes and modes")
    p.add_argument("--warmup", type=int, default=1, help="untimed cycles per mode first")
    p.add_argument("--budget-ms", type=float, default=0.0, help="planner budget in the timed cycles "
                   "(default 0 = off, so every mode decodes the same tokens)")
    p.add_argument("--deadline-ms", type=float, default=None, help="cycles longer than this count as "
                   "deadline misses (default: the profile's budget_ms)")
    p.add_argument("--max-reasoning", type=int, default=None, help="reasoning tokens per cycle at most")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of this process (0 = torch's "
                   "default); 1 keeps timings steady on a shared machine")
    p.add_argument("--json", type=Path, required=True, help="where the bench record goes")
    p.add_argument("--plot", type=Path, help="speedup plot (default: OUT with .png)")
    p.add_argument("--accept-plot", type=Path, help="where-accepted picture (default: OUT_accept.png)")
    p.add_argument("--picture-scene", type=int, default=0, help="scene index of the where-accepted picture")
    p.set_defaults(run=run)


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
    best = bench_report.best_mode(record) or record["modes"][-1]["name"]
    record["best"] = best
    record["criterion"] = bench_report.criterion(record)
    record["pictures"] = {"speedup": str(plot), "where_accepted": str(accept),
                          "where_accepted_mode": best}
    try:
        bench_report.plot_bench(plot, record)
        record["pictures"]["where_accepted_scene"] = bench_report.plot_where(accept, record, best,
                                                                             args.picture_scene)
    except ModuleNotFoundError as e:     # a vehicle-side install has no plotting library
        if e.name != "matplotlib":
            raise
        record["pictures"] = None
        print("pictures skipped: matplotlib is not installed (pip install '.[plots]')", flush=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    args.json.with_suffix(".md").write_text(bench_report.markdown_report(record))
    print(bench_report.table(record), flush=True)
    print(f"issue 6 bar (>= 2.5x, same output, >= 85% of ideal): {record['criterion']}", flush=True)
    pictures = f", {plot}, {accept}" if record["pictures"] else ""
    print(f"best: {best}; wrote {args.json} (and .md){pictures}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.bench ...` (the same as `specdrive bench ...`)."""
    parser = argparse.ArgumentParser(prog="specdrive bench", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except ConfigError as e:
        parser.exit(2, f"specdrive bench: error: {e}\n")


if __name__ == "__main__":
    raise SystemExit(main())
