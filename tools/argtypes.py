"""Argument types of the commands: a bad value is refused by argparse (exit 2, one line naming
the argument, the value and what is allowed) before any work starts."""
from __future__ import annotations

import argparse
import math
from pathlib import Path


def count(lo: int = 0):
    """An int >= lo (threads, warm-up cycles, pictures)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"{n} is out of range; allowed >= {lo}")
        return n
    return parse


def finite_ms(text: str) -> float:
    """A finite float >= 0 (a budget in ms; 0 = off)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range; allowed a finite number >= 0")
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
