"""`specdrive profile`: N planner cycles with named ranges on every stage and engine call.

    specdrive profile (--checkpoint DIR | --engines DIR | --preset NAME --random-init SEED)
                      [--profile cpu] [--cycles N] [--warmup W] [--threads T] [--device cpu|cuda]
                      [--no-nsys] --out DIR

What it measures and writes: bench/profile/ (the library this command calls with a ProfileRun).
"""
from __future__ import annotations

import argparse
import sys

from bench.profile import command as profiling
from tools.argtypes import add_source_args, count, integer, model_source, out_folder


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("profile", help="profile planner cycles (Nsight Systems, or ranges recorded here)",
                              description=__doc__.splitlines()[0])
    add_source_args(p)
    p.add_argument("--draft", default=None, help="draft variant, 'self' or 'none' (plain decoding)")
    p.add_argument("--profile", default="cpu", help="planner profile configs/planner/NAME.yaml")
    p.add_argument("--cycles", type=count(1), default=16, help="measured cycles, one per synthetic scene")
    p.add_argument("--warmup", type=count(0), default=2, help="cycles before the capture range")
    p.add_argument("--seed", type=integer, default=0, help="first synthetic scene")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (torch backend on CUDA)")
    p.add_argument("--threads", type=count(1), default=1, help="torch CPU threads (bench/common/threads.py)")
    p.add_argument("--no-nsys", action="store_true", help="record the ranges here even where nsys is")
    p.add_argument("--nvtx", action="store_true", help="also emit NVTX ranges (set for the child of nsys)")
    p.add_argument("--out", type=out_folder, required=True)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return profiling.run(profile_run(args))


def profile_run(args: argparse.Namespace) -> profiling.ProfileRun:
    """The parsed arguments -> the typed config of one profile run (argv: what nsys reruns)."""
    argv = tuple(sys.argv[sys.argv.index("profile") + 1:]) if "profile" in sys.argv else ()
    return profiling.ProfileRun(source=model_source(args), out=args.out, profile=args.profile, cycles=args.cycles,
                                warmup=args.warmup, seed=args.seed, threads=args.threads,
                                no_nsys=args.no_nsys, nvtx=args.nvtx, argv=argv)
