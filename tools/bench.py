"""`specdrive bench`: speculative vs plain decoding in one process, on the same scenes.

    specdrive bench (--checkpoint DIR | --engines DIR | --preset NAME --random-init SEED)
                    [--drafts a,b] [--backend torch] [--ks 4,8] [--no-adaptive]
                    [--scenes N --seed S] [--repeats R] [--warmup W] [--threads T]
                    --json OUT [--plot PNG] [--accept-plot PNG]
    specdrive bench ... --drives DIR [--drive-count N] [--cycles C] [--modes M,..] --json OUT

What it measures and writes: bench/command.py (the library this command calls).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.speedup import command
from prompt.config import ConfigError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="speculative vs plain decoding: speedup, identity, where accepted",
                              description=__doc__.splitlines()[0])
    configure(p)


def configure(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help="trained planner folder (tokenizer.json, target, "
                     "expert, one or more drafts)")
    src.add_argument("--engines", type=Path, help="built engines folder (meta.json names the backend)")
    src.add_argument("--preset", help="random-weight models from configs/models/NAME.yaml or a path")
    p.add_argument("--random-init", type=int, metavar="SEED", help="seed of the random weights (--preset)")
    p.add_argument("--drafts", default=None, help="comma list: with --checkpoint the draft variants to "
                   "run (default all); with --preset any of self, noised:SIGMA, routine "
                   "(default self,noised:0.02)")
    p.add_argument("--backend", default=None, choices=["torch", "onnxruntime", "tensorrt", "tensorrt-llm"])
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (torch backend on CUDA)")
    p.add_argument("--profile", default="cpu", help="planner profile configs/planner/NAME.yaml or a YAML path")
    p.add_argument("--ks", default="4,8", help="fixed draft lengths, comma separated (default 4,8)")
    p.add_argument("--no-adaptive", action="store_true", help="leave out the adaptive-k modes")
    p.add_argument("--scenes", type=int, default=16, help="synthetic scenes (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first scene")
    p.add_argument("--split", default="test", help="split of the synthetic scenes")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds over all scenes and modes")
    p.add_argument("--warmup", type=int, default=1, help="untimed cycles per mode first")
    p.add_argument("--budget-ms", type=float, default=0.0, help="planner budget in the timed cycles "
                   "(default 0 = off, so every mode decodes the same tokens)")
    p.add_argument("--deadline-ms", type=float, default=None, help="cycles longer than this count as "
                   "deadline misses (default: the profile's budget_ms)")
    p.add_argument("--max-reasoning", type=int, default=None, help="reasoning tokens per cycle at most")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of this process (0 = torch's "
                   "default); 1 keeps timings steady on a shared machine")
    p.add_argument("--json", type=Path, required=True, help="where the bench record goes")
    p.add_argument("--plot", type=Path, help="speedup plot (default: OUT with .png)")
    p.add_argument("--accept-plot", type=Path, help="where-accepted picture (default: OUT_accept.png)")
    p.add_argument("--picture-scene", type=int, default=0, help="scene index of the where-accepted picture")
    p.add_argument("--drives", type=Path, help="drives folder (`scenes generate --drives`): whole drives "
                   "through plain, speculative and reuse modes instead of snapshots (bench/drives.py)")
    p.add_argument("--drive-count", type=int, default=4, help="drives of the split to run (--drives; default 4)")
    p.add_argument("--cycles", type=int, default=0, help="cycles per drive at most (--drives; default 0 = whole "
                   "drives: 3 s of a drive can end before its event)")
    p.add_argument("--modes", help="comma list of drive modes to run besides plain (--drives; default all: "
                   "plain+vision, spec, spec+vision, spec+vision+lookup)")
    p.set_defaults(run=command.run)


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.bench ...` (the same as `specdrive bench ...`)."""
    parser = argparse.ArgumentParser(prog="specdrive bench", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return command.run(args)
    except ConfigError as e:
        parser.exit(2, f"specdrive bench: error: {e}\n")


if __name__ == "__main__":
    raise SystemExit(main())
