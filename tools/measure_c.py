"""Measure c = (draft time per proposal) / (target decode step time) for a model preset.

    python -m tools.measure_c --preset tiny --cached 400 --runs 500 [--threads 1] [--k 8]
                              [--draft-vocab N[,N...]] [--target-layers M]

CPU, float32, batch 1, one new token after `cached` cache rows, median of `runs` timed steps
(models.sizes.step_cost_ratio), random weights. Each row: c_feed (the draft's feed step, the
target's features through its fc fusion, one row), c_chain (a chained step on the draft's own
hidden, no fc) and c = (c_feed + (k - 1) c_chain) / k, one draft call of k proposals per verify
(k: the planner's k_max by default); a standalone draft has c_feed == c_chain. --draft-vocab: the draft's LM head rows (0 or
"full" = the target's head; N = a reduced head whose logits are scattered to the target's
vocabulary), several in one run share the target and the draft's layers. --target-layers M builds
only M target layers and extrapolates the whole target's step from them (a preset whose fp32
weights do not fit this machine's memory, e.g. alpamayo-r1-10b). Prints one JSON line per head size.

The measured floor (bench/roofline/floor.py), on any device:

    python -m tools.measure_c --floor --preset edge-2b --device cuda --dtype bf16 --max-len 2048
                              --cached 1200 [--widths 1-9,17,33,65] [--images 8] [--samples 8]
                              [--path inference|reference] [--eager] [--json OUT]

times the target step at each width, the draft's feed and chain steps, the ViT and the prefill of
N images and one Euler step of the expert's draws (CUDA graphs on a GPU unless --eager), each
with the bytes it must read and its share of a device-to-device copy's bandwidth measured in the
same run, and the kernels (CPU: top-level ops) one eager step launches; prints and writes JSON
that `specdrive roofline --measured FILE` reads.
"""
from __future__ import annotations

import argparse
import json

from tools.argtypes import count
from tools.measure_floor import add_floor_args, run_floor


def vocab_list(text: str) -> tuple[int, ...]:
    """"full,32768,8192" -> (0, 32768, 8192); every entry 'full', 0 or a positive int."""
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            out.append(0 if part == "full" else int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not 'full' or an integer") from None
        if out[-1] < 0:
            raise argparse.ArgumentTypeError(f"{part!r} is out of range; allowed 'full', 0 or an int >= 1")
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="configs/models/NAME.yaml or a path")
    parser.add_argument("--cached", type=count(0), default=400, help="cache rows before the step")
    parser.add_argument("--runs", type=count(1), default=None,
                        help="timed steps per model (default 500; --floor: 30 per call)")
    parser.add_argument("--threads", type=count(0), default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--draft-vocab", type=vocab_list, default=(0,),
                        help="draft head rows, comma-separated: full (the target's head) or N")
    parser.add_argument("--k", type=count(1), default=8,
                        help="proposals per draft call in c = (c_feed + (k-1) c_chain) / k")
    parser.add_argument("--target-layers", type=count(0), default=0,
                        help="build only this many target layers and extrapolate (0 = all)")
    add_floor_args(parser)
    args = parser.parse_args(argv)
    if args.floor:
        return run_floor(parser, args)
    args.runs = args.runs or 500
    import torch

    from models.config import load_preset
    from models.sizes import step_cost_ratio
    from core.config import ConfigError

    if args.threads:
        torch.set_num_threads(args.threads)  # this process only
    try:
        out = step_cost_ratio(load_preset(args.preset), cached=args.cached, runs=args.runs,
                              draft_vocabs=args.draft_vocab, target_layers=args.target_layers,
                              k=args.k)
    except ConfigError as e:
        parser.exit(2, f"measure_c: {e}\n")
    for row in out.pop("by_vocab", [out]):
        print(json.dumps({"preset": args.preset, **{k: v for k, v in out.items() if k not in row}, **row}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
