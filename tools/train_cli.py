"""`specdrive train vision|sft|distill|aarl|ship|eval|card --config configs/train/X.yaml` (wired by tools/cli.py).

`card` renders the model card again from an eval config's metrics file and notes, without
evaluating.

Each stage resumes from its run folder's saved state when there is one; `torchrun
--nproc_per_node N -m tools.train_cli sft --config ...` runs it data-parallel.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from prompt.config import ConfigError
from train import config

RUNNERS = {"vision": "train.vision:run", "sft": "train.sft:run", "distill": "train.distill:run", "aarl": "train.aarl:run",
           "ship": "train.ship:run", "eval": "train.evaluate:run", "card": "train.evaluate:card"}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train the tiny planner: vision, sft, distill, aarl, ship, eval, card")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE")
    stages.required = True
    for stage in RUNNERS:
        p = stages.add_parser(stage, help=f"{stage} stage (config: configs/train/*.yaml)")
        p.add_argument("--config", required=True, help="YAML file of this stage's config")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field (dotted, value as YAML), e.g. --set run.out=runs/x")
        p.set_defaults(run=_run)


def _run(args) -> int:
    cfg = config.load(args.stage, args.config, args.set)
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
