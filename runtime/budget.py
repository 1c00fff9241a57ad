"""The latency budget of one planning cycle.

Stages: vision -> prefill -> reasoning (speculative steps) -> trajectory. With deadline D =
cycle start + budget_ms, W(x) the predicted worst case of x (runtime.adaptive.CostModel) and
R = W(trajectory) + margin, the reasoning may take a step of draft length k only if

    now + W(step k) + R <= D                                          (checked before every step)

and takes the largest k <= the wanted k that fits; when not even a plain step (k = 0) fits,
reasoning is closed (<|cot_end|> forced) and the trajectory runs. Guarantee: if every step
and the trajectory stay within their predicted worst cases, and vision + prefill + R <= budget,
the trajectory is delivered by D - margin. When either premise fails the cycle is flagged
(`worst_case_exceeded`, `miss`); it is never silent. The clock is injectable: tests use FakeClock.
"""
from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager

from runtime.adaptive import CostModel
from runtime.config import BudgetConfig


def wall_ms() -> float:
    """Monotonic clock in ms (the default)."""
    return time.perf_counter() * 1e3


class FakeClock:
    """A clock that moves only when told: `clock()` reads it, `clock.advance(ms)` moves it."""

    def __init__(self, start_ms: float = 0.0):
        self.t = float(start_ms)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> None:
        with self._lock:
            self.t += float(ms)


class CycleBudget:
    """Deadline bookkeeping of one cycle: stage timings, the step cap, flags."""

    def __init__(self, cfg: BudgetConfig, costs: CostModel, clock=wall_ms):
        self.cfg, self.costs, self.clock = cfg, costs, clock
        self.start = clock()
        self.deadline = self.start + cfg.budget_ms if cfg.enabled else math.inf
        self.stages: dict[str, float] = {}
        self.flags: list[str] = []
        self.cut = False
        self._step = None      # (time the last allowed step began, its predicted worst case)

    @contextmanager
    def stage(self, name: str):
        """Time a stage; its duration feeds the cost model (worst cases of later cycles)."""
        t0 = self.clock()
        try:
            yield
        finally:
            ms = self.clock() - t0
            self.stages[name] = self.stages.get(name, 0.0) + ms
            if name in ("vision", "prefill", "trajectory"):
                predicted = self.costs.worst(name)
                self.costs.observe(name, ms)
                if name == "trajectory" and self.cfg.enabled and ms > predicted:
                    self.flag("worst_case_exceeded")

    def reserve_ms(self) -> float:
        """R = W(trajectory) + margin: what must stay free for the final trajectory."""
        return self.costs.worst("trajectory") + self.cfg.margin_ms

    def left_ms(self) -> float:
        return self.deadline - self.clock()

    def trajectory_fits(self) -> bool:
        return self.left_ms() >= self.reserve_ms()

    def cap(self, k: int, pending: int = 1) -> int | None:
        """Largest k' <= k with now + W(step k') + R <= D, or None: close the reasoning."""
        self._check_last_step()
        if not self.cfg.enabled:
            return k
        left = self.left_ms() - self.reserve_ms()
        for kk in range(k, -1, -1):
            worst = self.costs.step_worst(kk, pending)
            if worst <= left:
                self._step = (self.clock(), worst)
                return kk
        self.cut = True
        return None

    def end_reasoning(self) -> None:
        self._check_last_step()

    def _check_last_step(self) -> None:
        if self._step is not None:
            began, worst = self._step
            if self.clock() - began > worst:
                self.flag("worst_case_exceeded")
            self._step = None

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def finish(self) -> dict:
        """Close the cycle: total, slack, miss flag. Returns the timing record."""
        now = self.clock()
        total = now - self.start
        slack = self.deadline - now if self.cfg.enabled else None
        if self.cfg.enabled and now > self.deadline:
            self.flag("miss")
        return {"total_ms": round(total, 3), "budget_ms": self.cfg.budget_ms or None,
                "slack_ms": None if slack is None else round(slack, 3),
                "stages_ms": {k: round(v, 3) for k, v in self.stages.items()},
                "cut": self.cut}
