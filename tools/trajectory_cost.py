"""`specdrive trajectory-cost`: displacement error against cost for the action expert's settings.

    specdrive trajectory-cost --checkpoint DIR [--scenes N --seed S] [--steps 2,4,6,10]
                              [--samples 1,2,4,8] [--repeats R] --json OUT [--plot PNG]

What it measures and writes: bench/trajectory_cost/ (the library this command calls with a
TrajectoryCostRun).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.trajectory_cost import command as trajectory_cost
from tools.argtypes import config_of, count, int_list, integer


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("trajectory-cost", help="ADE against cost of Euler steps x draws x combine",
                              description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="trained planner folder")
    p.add_argument("--draft", default=None, help="draft variant for the reasoning (default: the folder's)")
    p.add_argument("--scenes", type=integer, default=32)
    p.add_argument("--seed", type=integer, default=0)
    p.add_argument("--split", default="test")
    p.add_argument("--steps", type=int_list(), default=(2, 4, 6, 10), help="Euler steps, comma separated")
    p.add_argument("--samples", type=int_list(), default=(1, 2, 4, 8), help="expert draws per trajectory, comma separated")
    p.add_argument("--repeats", type=integer, default=3, help="timed calls per setting and scene (the least "
                   "counts: other processes only ever add time)")
    p.add_argument("--threads", type=count(0), default=1, help="torch CPU threads (as specdrive bench; 0 = torch's default)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--plot", type=Path, help="ADE against ms (default: OUT with .png)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return trajectory_cost.run(config_of(trajectory_cost.TrajectoryCostRun, args))
