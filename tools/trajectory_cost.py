"""`specdrive trajectory-cost`: displacement error against cost for the action expert's settings.

    specdrive trajectory-cost --checkpoint DIR [--scenes N --seed S] [--steps 2,4,6,10]
                              [--samples 1,2,4,8] [--repeats R] --json OUT [--plot PNG]

Per test scene the planner reasons once (greedy, budget off); then, on that same cache, the
trajectory stage runs with every (Euler steps, draws, combine) setting, each timed `repeats`
times (median), and its waypoints are scored against the scene's expert future (ADE, FDE over
6.4 s). Settings are interleaved per scene, so every one sees the same machine load. Also
measured: how far the mean of 8 one-draw paths lies from the nearest of them (the mean of two
modes is a path nobody drew) against the spread of the draws. Writes JSON, a markdown table
(stdout) and a plot of ADE against ms.
"""
from __future__ import annotations

from pathlib import Path

from bench import trajectory_cost


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("trajectory-cost", help="ADE against cost of Euler steps x draws x combine",
                              description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="trained planner folder")
    p.add_argument("--draft", default=None, help="draft variant for the reasoning (default: the folder's)")
    p.add_argument("--scenes", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="test")
    p.add_argument("--steps", default="2,4,6,10", help="Euler steps, comma separated")
    p.add_argument("--samples", default="1,2,4,8", help="expert draws per trajectory, comma separated")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per setting and scene (the least "
                   "counts: other processes only ever add time)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (as specdrive bench; 0 = torch's default)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--plot", type=Path, help="ADE against ms (default: OUT with .png)")
    p.set_defaults(run=trajectory_cost.run)
