"""Argument types of the commands: argparse refuses a bad value (exit 2, one line naming it and what is allowed)."""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from pathlib import Path

from core.config import ConfigError
from runtime.artifacts import ModelSource
from runtime.backend import BACKENDS
from runtime.config import tree_shape


ASCII_INT = re.compile(r"\s*[+-]?[0-9]+\s*")   # int() alone also reads "١٦" or "１６"


def count(lo: int | None = 0, hi: int | None = None):
    """An int in ASCII digits >= lo (and <= hi where given); count(None), `integer`: any int."""
    allowed = "any integer" if lo is None else f">= {lo}" if hi is None else f"{lo}..{hi}"

    def parse(text: str) -> int:
        if not ASCII_INT.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer in ASCII digits; allowed {allowed}")
        n = int(text)
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"{n} is out of range; allowed {allowed}")
        return n
    return parse


integer = count(None)
MAX_THREADS = 256


def finite_ms(text: str) -> float:
    """A finite float >= 0 (a budget in ms; 0 = off)."""
    x = float(text) if re.fullmatch(r"\s*\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", text) else math.nan
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed a finite number >= 0 in ASCII digits")
    return x


def input_file(text: str) -> Path:
    """An existing regular file."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file (a folder?); give the file")
    return p


def out_folder(text: str) -> Path:
    """A folder to write into: new, or an existing folder (never an existing file)."""
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a folder (new or existing)")
    return p


def out_file(text: str) -> Path:
    """A file to write: new, or an existing file (never a folder)."""
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file path")
    return p


def int_list(lo: int | None = None, hi: int | None = None):
    """A comma list of ints ("4,8"), each in [lo, hi] where given."""
    def parse(text: str) -> tuple[int, ...]:
        parts = [x for x in text.split(",") if x.strip()]
        if not all(ASCII_INT.fullmatch(x) for x in parts):
            raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated ASCII integers, e.g. 4,8")
        out = tuple(int(x) for x in parts)
        bad = [n for n in out if (lo is not None and n < lo) or (hi is not None and n > hi)]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad[0]} in {text!r} is out of range; allowed {lo}..{hi}")
        return out
    return parse


def tree_list(text: str) -> tuple[str, ...]:
    """Token trees N,d,K (nodes, depth, top-K) separated by ';' ("16,8,4;32,8,8"), each one spec.tree allows."""
    try:
        return tuple(str(tree_shape(t.strip())) for t in text.split(";"))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_source_args(p: argparse.ArgumentParser, checkpoint_help: str = "checkpoint folder (meta.json kind planner/target)") -> None:
    """--checkpoint | --engines | --preset (+ --random-init): what a command runs; --backend, --kv-buckets."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help=checkpoint_help)
    src.add_argument("--engines", type=Path, help="built engines folder (meta.json names the backend)")
    src.add_argument("--preset", help="random-weight models from configs/models/NAME.yaml (needs --random-init)")
    p.add_argument("--random-init", type=integer, metavar="SEED", help="seed of the random weights (with --preset)")
    p.add_argument("--expect-fingerprint", metavar="SHA256", help="the folder's pinned fingerprint (64 hex, as printed at start): a folder that differs is refused (exit 2)")
    p.add_argument("--backend", default=None, choices=list(BACKENDS))
    p.add_argument("--kv-buckets", action=argparse.BooleanOptionalAction, help="torch: attend over the smallest "
                   "of 256, 512, .. max_len cache rows a call needs (default: on CUDA; off: every row, the reference)")


def model_source(args: argparse.Namespace) -> ModelSource:
    """The ModelSource of the parsed add_source_args arguments and --draft, --device, --eager,
    --threads (ModelSource checks that --preset comes with --random-init)."""
    return ModelSource(engines=args.engines, checkpoint=args.checkpoint, preset=args.preset,
                       random_init=args.random_init, backend=args.backend, draft=getattr(args, "draft", None),
                       device=args.device, eager=args.eager, threads=args.threads,
                       kv_buckets=getattr(args, "kv_buckets", None),
                       expect_fingerprint=getattr(args, "expect_fingerprint", None))


def config_of(cls, args: argparse.Namespace):
    """The dataclass `cls` from the parsed arguments of the same names (its other fields keep
    their defaults): for commands whose arguments are their config's fields, one for one."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})
