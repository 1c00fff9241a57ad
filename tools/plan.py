"""`specdrive plan`: run planning cycles over scenes, log them, draw them.

    specdrive plan (--checkpoint DIR | --engines DIR | --preset NAME --random-init SEED)
                   [--draft DIR|self|none] [--backend torch|onnxruntime|tensorrt|tensorrt-llm]
                   [--budget-ms B] [--scenes N --seed S | --data DIR] --out DIR

What it measures and writes: bench/plan/ (the library this command calls with a PlanRun).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.common.sources import SceneSource
from bench.plan import command as plan
from runtime.config import DECODING, TRAJECTORY_SOURCES
from tools.argtypes import add_source_args, count, finite_ms, integer, model_source, out_folder


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="run the planner on scenes (live table, JSON lines, pictures)",
                              description=__doc__.splitlines()[0])
    add_source_args(p)
    p.add_argument("--draft", default=None, help="draft checkpoint folder, 'self' (target drafts for "
                   "itself) or 'none' (plain decoding); default: the draft that comes with the models")
    p.add_argument("--profile", default=None, help="planner profile configs/planner/NAME.yaml or a YAML path "
                   "(default: the one an --engines folder's manifest.json names, else cpu)")
    p.add_argument("--budget-ms", type=finite_ms, help="latency budget per cycle (0 = off); default from the profile")
    p.add_argument("--k", type=integer, help="fixed draft length (turns adaptive k off; 0 = plain decoding)")
    p.add_argument("--decoding", choices=DECODING)
    p.add_argument("--trajectory", choices=TRAJECTORY_SOURCES)
    p.add_argument("--max-reasoning", type=integer, help="reasoning tokens per cycle at most")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--scenes", type=count(0), default=None, help="N synthetic scenes (default 8)")
    data.add_argument("--data", type=Path, help="dataset folder of scenes shards")
    p.add_argument("--seed", type=integer, default=0, help="seed of the synthetic scenes")
    p.add_argument("--split", default="test", help="split of the synthetic scenes or the dataset")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (torch backend on CUDA, tensorrt backend)")
    p.add_argument("--threads", type=count(0), default=1, help="CPU threads of torch or onnxruntime (default 1: "
                   "steady on a shared CPU, see bench/common/threads.py; 0 = the library's default)")
    p.add_argument("--warmup", type=count(0), default=1, help="unlogged warm-up cycles on the first scene "
                   "(first-call costs are not what the budget plans for)")
    p.add_argument("--pictures", type=count(0), default=8, help="bird's-eye SVGs for the first N cycles")
    p.add_argument("--out", type=out_folder, required=True)
    p.add_argument("--quiet", action="store_true", help="no live table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return plan.run(plan_run(args))


def plan_run(args: argparse.Namespace) -> plan.PlanRun:
    """The parsed arguments -> the typed config of one plan run."""
    return plan.PlanRun(source=model_source(args), out=args.out, profile=args.profile, k=args.k,
                        decoding=args.decoding, trajectory=args.trajectory, budget_ms=args.budget_ms,
                        max_reasoning=args.max_reasoning,
                        scenes=SceneSource(data=args.data, scenes=args.scenes, seed=args.seed, split=args.split),
                        threads=args.threads, warmup=args.warmup, pictures=args.pictures, quiet=args.quiet)
