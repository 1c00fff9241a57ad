"""`python -m tools.measure_c --floor`: the measured floor of every call kind (bench/roofline/floor.py).

    python -m tools.measure_c --floor --preset edge-2b --device cuda --dtype bf16 --max-len 2048
                              --cached 1200 [--widths 1-9,17,33,65] [--images 8 --image-hw 320 576]
                              [--samples 8] [--path inference|reference] [--eager] [--json OUT]

The target step at each width, the draft's feed and chain steps, the ViT and the prefill of N
images and one Euler step of the expert's draws (CUDA graphs on a GPU unless --eager), each with
the bytes it must read and its share of a device-to-device copy's bandwidth measured in the same
run, and the kernels (a CPU: the top-level ops) one eager step launches; printed as a table and
written as JSON for `specdrive roofline --measured FILE`.
"""
from __future__ import annotations

import argparse
import json

from tools.argtypes import count, out_file


def width_list(text: str) -> tuple[int, ...]:
    """"1-9,17,33" -> (1, ..., 9, 17, 33); each width an int >= 1, ranges a-b with a <= b."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a width or a range a-b") from None
        if not 1 <= a <= b:
            raise argparse.ArgumentTypeError(f"{part!r}: widths are ints >= 1, a range a-b needs a <= b")
        out += range(a, b + 1)
    return tuple(sorted(set(out)))


def add_floor_args(parser) -> None:
    floor = parser.add_argument_group("the measured floor (--floor)")
    floor.add_argument("--floor", action="store_true", help="measure every call kind (bench/roofline/floor.py)")
    floor.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    floor.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    floor.add_argument("--max-len", type=count(2), default=2048, help="cache rows")
    floor.add_argument("--widths", type=width_list, default=(1, 2, 3, 4, 5, 9, 17, 33, 65),
                       help="target widths, e.g. 1-9,17,33,65")
    floor.add_argument("--images", type=count(1), default=8, help="images of the prefill")
    floor.add_argument("--image-hw", type=count(8), nargs=2, default=(64, 96), help="image height, width")
    floor.add_argument("--samples", type=count(1), default=8, help="expert draws")
    floor.add_argument("--path", default="inference", choices=("inference", "reference"),
                       help="the models' inference path (kv buckets, fused) or the masked reference")
    floor.add_argument("--eager", action="store_true", help="no CUDA graphs")
    floor.add_argument("--copy-mb", type=count(1), default=512, help="MiB of the bandwidth copy")
    floor.add_argument("--warmup", type=count(0), default=5, help="untimed calls first")
    floor.add_argument("--json", type=out_file, help="write the floor here")


def run_floor(parser, args) -> int:
    import torch

    from bench.roofline.floor import FloorRun, format_floor, measure_floor
    from models.config import load_preset
    from core.config import ConfigError

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        q = FloorRun(device=args.device, dtype=args.dtype, max_len=args.max_len, cached=args.cached,
                     widths=args.widths, images=args.images, image_hw=tuple(args.image_hw),
                     samples=args.samples, runs=args.runs or 30, warmup=args.warmup, graphs=not args.eager,
                     path=args.path, copy_mb=args.copy_mb)
        out = {"preset": args.preset, **measure_floor(load_preset(args.preset), q)}
    except ConfigError as e:
        parser.exit(2, f"measure_c: {e}\n")
    print(format_floor(out))
    if args.json:
        from core.stamp import results_stamp

        out["stamp"] = results_stamp(None)          # random weights: no checkpoint
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0
