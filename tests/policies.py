"""Test-only draft-length policies for runtime.loop.decode, and a chain step's record."""
import numpy as np

from runtime.step import Chain, StepRecord


class FixedK:
    """The same k every step (k = 0: plain decoding); lookup proposals are not taken."""

    k_max = 16

    def __init__(self, k: int):
        self.k = int(k)

    def plan(self, pending: int, proposal=None, trees: bool = False):
        return Chain(self.k)

    def record(self, rec) -> None:
        pass

    def observe_overhead(self, ms: float, step) -> None:
        pass

    def observe_search(self, ms: float) -> None:
        pass


def chain_record(k: int, n: int, draft_ms: float, verify_ms: float, width: int) -> StepRecord:
    """What the loop records for a chain step of k that accepted n."""
    return StepRecord(Chain(k), k, np.zeros(k, np.int64), n, width, draft_ms, verify_ms, [0] * (n + 1))
