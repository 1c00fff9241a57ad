"""`specdrive drive`: closed-loop drives where a late plan is followed late.

    specdrive drive [--checkpoint DIR] [--drives DIR|N] [--modes plain,speculative,...]
                    [--latency measured|DEVICE:PRESET[,...]] [--budget-ms B] [--seconds S] --out DIR

What it runs, measures and writes: bench/drive/ (the library this command calls with a
ClosedLoopRun).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from scenes.config import DT, MAX_DRIVE_SECONDS, MAX_DRIVES
from tools.argtypes import MAX_THREADS, config_of, count, out_folder

MAX_GIFS = 10_000


def drives_arg(text: str):
    """A drives folder (`scenes generate --drives`) or a count N of new test drives, 1..MAX_DRIVES."""
    try:
        n = int(text)
    except ValueError:
        p = Path(text)
        if not p.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is neither a drives folder nor a count; "
                                             f"allowed a folder or an integer 1..{MAX_DRIVES}") from None
        return p
    if not 1 <= n <= MAX_DRIVES:
        raise argparse.ArgumentTypeError(f"{n} is out of range; allowed a drives folder or a count 1..{MAX_DRIVES}")
    return n


def seconds_arg(text: str) -> float:
    """A drive length of at least one 0.1 s cycle, at most the time grid's MAX_DRIVE_SECONDS."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; allowed {DT:g}..{MAX_DRIVE_SECONDS:g} s") from None
    if not DT <= x <= MAX_DRIVE_SECONDS:       # NaN fails too
        raise argparse.ArgumentTypeError(f"{text!r} is out of range; allowed {DT:g}..{MAX_DRIVE_SECONDS:g} s "
                                         f"(at least one {DT:g} s cycle)")
    return x


def add_parser(subparsers) -> None:
    from bench.drive.loop import DEFAULT_BUDGET_MS, MODES

    p = subparsers.add_parser("drive", help="closed-loop drives: metrics, tables and GIFs per mode and latency",
                              description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoints/tiny"),
                   help="checkpoint folder with target, expert and the flat draft (default checkpoints/tiny)")
    p.add_argument("--drives", type=drives_arg, default=4, help="drives folder (its --split) or N new drives "
                   "of --split (seeds --seed..); default 4")
    p.add_argument("--split", default="test")
    p.add_argument("--seed", type=count(0, 2 ** 32 - 1), default=0, help="first seed of new drives (0..2**32-1, "
                   "as `scenes generate`)")
    p.add_argument("--seconds", type=seconds_arg, default=None, help="drive length (default: the drive's own, 8 s)")
    p.add_argument("--modes", default="", help=f"comma list of {', '.join(MODES)} (default: every mode the "
                   "checkpoint runs; the +stream ones need a frame_local target)")
    p.add_argument("--latency", default="measured", help="comma list of 'measured' (this machine's clock) "
                   "and DEVICE:PRESET (roofline-priced calls on a virtual clock), e.g. orin-agx-64:edge-2b")
    p.add_argument("--budget-ms", default=str(DEFAULT_BUDGET_MS), help="budget (ms) of the +budget modes: "
                   f"one for every --latency spec or a comma list, one per spec (default {DEFAULT_BUDGET_MS:g})")
    p.add_argument("--profile", default="cpu", help="planner profile the modes start from (default cpu)")
    p.add_argument("--threads", type=count(0, MAX_THREADS), default=1, help="torch threads (default 1; 0 = torch's default)")
    p.add_argument("--gifs", type=count(0, MAX_GIFS), default=20, help="GIFs for the first N drives (default 20)")
    p.add_argument("--expect-fingerprint", metavar="SHA256", help="the checkpoint folder's pinned fingerprint "
                   "(64 hex, as printed at start): a folder that differs is refused (exit 2)")
    p.add_argument("--expect-drives-fingerprint", metavar="SHA256", help="the same for a --drives folder")
    p.add_argument("--out", type=out_folder, required=True)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from bench.drive import command
    return command.run(config_of(command.ClosedLoopRun, args))
