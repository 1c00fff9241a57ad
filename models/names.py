"""Refusals shared by every checkpoint reader: CheckpointError, and the name/shape check of
foreign layouts (Hugging Face, Alpamayo-R1). Apart from models.io so that models.hf and
models.alpamayo use it without importing the checkpoint I/O that loads them."""
from __future__ import annotations

from typing import Mapping

import torch

from core.config import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint that cannot be trusted; the message names the file, tensor and expectation.
    A ConfigError: the command lines exit 2 with the message, no traceback."""


def check_names(expected: Mapping[str, tuple], got: Mapping[str, torch.Tensor], what: str,
                ignore=()) -> None:
    """Refuse tensors `got` of a foreign layout (HF, Alpamayo-R1) unless they hold exactly the
    names of `expected` ({name: shape}) with those shapes; names in `ignore` may be extra."""
    missing = [f"{k} (expected shape {tuple(expected[k])})" for k in expected if k not in got]
    unexpected = sorted(set(got) - set(expected) - set(ignore))
    shaped = [f"{k}: file {tuple(got[k].shape)}, expected {tuple(expected[k])}"
              for k in expected if k in got and tuple(got[k].shape) != tuple(expected[k])]
    problems = [f"{label} ({len(v)}): " + "; ".join(v[:8]) + (" ..." if len(v) > 8 else "")
                for label, v in (("missing tensors", missing), ("unexpected tensors", unexpected),
                                 ("mis-shaped tensors", shaped)) if v]
    if problems:
        raise CheckpointError(f"{what} does not match its config:\n  " + "\n  ".join(problems))
