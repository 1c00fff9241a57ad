"""CPU threads of the torch reference backend.

On a shared CPU, torch's intra-op threads wait for each other at every parallel region; when
another process holds a core, each wait costs a scheduler time slice. Measured on the 2-core
development box with other jobs running: `specdrive demo` at torch's default (2 threads) took
4.3 s per prefill and 6 s per trajectory stage and the budget cut every reasoning; at one
thread, 34 ms and 60 ms. The tools therefore default to one thread (`--threads`).
"""
from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's CPU threads = n inside the block (0: leave as is), restored after it. Does
    nothing when torch was never imported (an engine backend without torch)."""
    torch = sys.modules.get("torch")
    if not n or torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
