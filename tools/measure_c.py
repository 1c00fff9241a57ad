"""Measure c = (draft decode step time) / (target decode step time) for a model preset.

    python -m tools.measure_c --preset tiny --cached 400 --runs 500 [--threads 1]

CPU, float32, batch 1, one new token after `cached` cache rows, median of `runs` timed steps
(models.sizes.step_cost_ratio). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="configs/models/NAME.yaml or a path")
    parser.add_argument("--cached", type=int, default=400, help="cache rows before the step")
    parser.add_argument("--runs", type=int, default=500, help="timed steps per model")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args(argv)
    import torch

    from models.config import load_preset
    from models.sizes import step_cost_ratio

    if args.threads:
        torch.set_num_threads(args.threads)  # this process only
    out = step_cost_ratio(load_preset(args.preset), cached=args.cached, runs=args.runs)
    print(json.dumps({"preset": args.preset, **out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
