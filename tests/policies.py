"""Test-only draft-length policies for runtime.loop.decode."""


class FixedK:
    """The same k every step (k = 0: plain decoding)."""

    def __init__(self, k: int):
        self.k = int(k)

    def next_k(self, pending: int) -> int | None:
        return self.k

    def observe(self, k: int, n: int, draft_ms: float, verify_ms: float, width: int) -> None:
        pass
