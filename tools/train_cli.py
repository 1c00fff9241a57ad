"""`specdrive train vision|sft|distill|aarl|ship|eval|card --config configs/train/X.yaml` (wired by tools/cli.py).

`grid --config configs/grids/X.yaml [--max-cells N] [--budget-min M] [--status]` runs the next
unfinished cells of a grid and commits each finished one under its results folder (train.grid).

`card` renders the model card again from an eval config's metrics file and notes, without
evaluating.

Each stage resumes from its run folder's saved state when there is one; `torchrun
--nproc_per_node N -m tools.train_cli sft --config ...` runs it data-parallel.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from core.config import ConfigError
from tools.argtypes import integer
from train import config

RUNNERS = {"vision": "train.vision:run", "sft": "train.sft:run", "distill": "train.distill:run", "aarl": "train.aarl:run",
           "ship": "train.ship:run", "eval": "train.evaluate:run", "card": "train.evaluate:card"}
DEVICE_KEY = {"sft": "run.device", "distill": "run.device", "aarl": "run.device", "eval": "device"}   # --device


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train the tiny planner: vision, sft, distill, aarl, ship, eval, card")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE")
    stages.required = True
    for stage in RUNNERS:
        p = stages.add_parser(stage, help=f"{stage} stage (config: configs/train/*.yaml)")
        p.add_argument("--config", required=True, help="YAML file of this stage's config")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field (dotted, value as YAML), e.g. --set run.out=runs/x")
        if stage in DEVICE_KEY:
            p.add_argument("--device", choices=config.DEVICES, default=None,
                           help=f"where the models run (--set {DEVICE_KEY[stage]}=...); default: the config's")
        p.set_defaults(run=_run)
    p = stages.add_parser("grid", help="the next unfinished cells of a grid (config: configs/grids/*.yaml)")
    p.add_argument("--config", required=True, help="YAML file of the grid")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a grid field")
    p.add_argument("--max-cells", type=integer, default=None, help="run at most N cells now")
    p.add_argument("--budget-min", type=float, default=None,
                   help="start no cell that the mean cell time says would end past M minutes")
    p.add_argument("--status", action="store_true", help="say how many cells are finished; run none")
    p.set_defaults(run=_run_grid)


def _run_grid(args) -> int:
    from train import grid

    sets = list(args.set) + [f"{k}={v}" for k, v in (("max_cells", args.max_cells), ("budget_min", args.budget_min))
                             if v is not None]
    print(grid.run(grid.load(args.config, sets), status_only=args.status))
    return 0


def _run(args) -> int:
    sets = list(args.set)
    if getattr(args, "device", None):
        sets.append(f"{DEVICE_KEY[args.stage]}={args.device}")
    cfg = config.load(args.stage, args.config, sets)
    module_name, func = RUNNERS[args.stage].split(":")
    result = getattr(importlib.import_module(module_name), func)(cfg)
    if result is not None:
        print(result)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.train_cli")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.run(args)
    except ConfigError as e:
        parser.exit(2, f"specdrive train {args.stage}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
