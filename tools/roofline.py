"""`specdrive roofline`: will a preset's cycle fit its budget on a device? (bench/roofline/projection.py)

    specdrive roofline --preset alpamayo-r1-10b|edge-2b|tiny --device orin-agx-64|thor|...|cpu
                       [--precision int8] [--k 4 --tau 3.0] [--profile orin] [--budget-ms 100]
                       [--memory] [--validate PROFILE.json] [--measured FLOOR.json] [--json OUT]
                       [--trees "16,8,4;32,8,8" (--tree-tau 4.6 5.0 | --bench BENCH.json)]

What it measures and writes: bench/roofline/ (the library this command calls with a RooflineRun).
"""
from __future__ import annotations

import argparse

from bench.common.costs import PRECISIONS
from bench.roofline import command as roofline
from tools.argtypes import config_of, count, finite_ms, input_file, integer, out_file, tree_list


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("roofline", help="project a preset's cycle on a device (fits the budget?)",
                              description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="alpamayo-r1-10b", help="configs/models/NAME.yaml")
    p.add_argument("--device", default="orin-agx-64", help="configs/devices.yaml name, or cpu (measured here)")
    p.add_argument("--precision", default=None, choices=sorted(PRECISIONS),
                   help="weights/arithmetic (default: int8 on devices, fp32 on cpu)")
    p.add_argument("--profile", default=None, help="planner profile for budget, k, draws, Euler steps "
                   "(default: orin on Orin devices, thor on Thor, cpu on cpu)")
    p.add_argument("--budget-ms", type=finite_ms, help="cycle budget (default: the profile's)")
    p.add_argument("--k", type=integer, help="draft length (default: the profile's k)")
    p.add_argument("--tau", type=float, default=3.0, help="tokens per verify pass (default 3.0, assumed)")
    p.add_argument("--reasoning-tokens", type=integer, help="CoC tokens (default: devices.yaml workload, else 40)")
    p.add_argument("--samples", type=integer, help="expert draws (default: the profile's)")
    p.add_argument("--euler-steps", type=integer, help="Euler steps (default: the profile's, else the preset's)")
    p.add_argument("--draft-vocab", type=count(0), default=0,
                   help="draft LM head rows (0: the target's head; N: a reduced head)")
    p.add_argument("--encoded-images", type=integer, help="images the ViT encodes per cycle (reuse)")
    p.add_argument("--lookup-share", type=float, default=0.5, help="drives row: share of speculative steps "
                   "proposed by lookup (default 0.5, assumed; `specdrive bench --drives` measures it)")
    p.add_argument("--threads", type=count(1), default=1, help="torch threads of the cpu microbenchmark")
    p.add_argument("--memory", action="store_true", help="add the memory report")
    p.add_argument("--validate", type=input_file, help="a `specdrive profile` stats.json: measured / projected")
    p.add_argument("--measured", type=input_file, help="a measured floor (python -m tools.measure_c --floor --json): "
                   "every call kind predicted against measured, Orin/Thor with its efficiencies, --trees from its "
                   "verify curve (precision: the floor's dtype)")
    p.add_argument("--json", type=out_file, help="write the result here")
    p.add_argument("--trees", type=tree_list, default=(), help="token trees N,d,K ';'-separated (\"16,8,4;32,8,8\"): "
                   "each priced against the chain (--k, --tau)")
    p.add_argument("--tree-tau", type=float, nargs="+", default=(), help="each tree's tau, in order (assumed)")
    p.add_argument("--bench", type=input_file, help="a `specdrive bench --trees` record: the trees' tau and the "
                   "--k chain's, measured")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return roofline.run(config_of(roofline.RooflineRun, args))
