"""Measured step costs and the adaptive draft length.

With per-token acceptance rate a (each draft token accepted independently with prob a, the
model of Leviathan et al.), a step of draft length k emits on average
    E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)
tokens and costs C(k) = k * c_draft + c_verify(k + 1), so the adaptive policy picks
    k* = argmax_{1 <= k <= k_max} E(k) / C(k)
from a running estimate of a and the measured costs. The same cost model gives the budget its
worst cases (runtime/budget.py).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from runtime.config import BudgetConfig


class CostModel:
    """Per-op costs in ms: a running mean (for speed) and the largest of the last `window`
    observations (for worst cases: a one-off outlier such as a first-call warm-up ages out).

    Keys: "draft" (one draft step), ("verify", width), "vision", "prefill", "trajectory".
    Unmeasured verify widths are extrapolated linearly from the measured ones."""

    def __init__(self, cfg: BudgetConfig, ema: float = 0.2, window: int = 64):
        self.cfg, self.ema, self.window = cfg, ema, window
        self.mean: dict = {}
        self.recent: dict = {}
        self.peak: dict = {}

    def observe(self, key, ms: float) -> None:
        ms = float(ms)
        old = self.mean.get(key)
        self.mean[key] = ms if old is None else (1 - self.ema) * old + self.ema * ms
        self.recent.setdefault(key, deque(maxlen=self.window)).append(ms)
        self.peak[key] = max(self.recent[key])

    def reset(self) -> None:
        """Forget every measurement (after a warm-up cycle): the priors apply again."""
        self.mean.clear(), self.recent.clear(), self.peak.clear()

    def prior(self, key) -> float:
        c = self.cfg
        if isinstance(key, tuple) and key[0] == "verify":
            return c.prior_verify_ms + c.prior_verify_per_token_ms * (key[1] - 1)
        return {"draft": c.prior_draft_step_ms, "vision": c.prior_vision_ms,
                "prefill": c.prior_prefill_ms, "trajectory": c.prior_trajectory_ms}[key]

    def expected(self, key) -> float:
        if key in self.mean:
            return self.mean[key]
        if isinstance(key, tuple):
            return self._extrapolate(self.mean, key[1]) or self.prior(key)
        return self.prior(key)

    def worst(self, key) -> float:
        """Predicted worst case: factor x the largest seen, or the prior (itself a worst case)."""
        f = self.cfg.worst_case_factor
        if key in self.peak:
            return f * self.peak[key]
        if isinstance(key, tuple):
            guess = self._extrapolate(self.peak, key[1])
            return max(f * guess, self.prior(key)) if guess else self.prior(key)
        return self.prior(key)

    def step_worst(self, k: int, pending: int = 1) -> float:
        return k * self.worst("draft") + self.worst(("verify", pending + k))

    def step_expected(self, k: int, pending: int = 1) -> float:
        return k * self.expected("draft") + self.expected(("verify", pending + k))

    def _extrapolate(self, table: dict, width: int) -> float | None:
        widths = sorted(w for key, w in ((k[0], k[1]) for k in table if isinstance(k, tuple)))
        if not widths:
            return None
        if len(widths) == 1:
            w0 = widths[0]
            slope = self.cfg.prior_verify_per_token_ms
        else:
            xs = np.array(widths, float)
            ys = np.array([table[("verify", w)] for w in widths])
            slope = max(float(np.polyfit(xs, ys, 1)[0]), 0.0)
            w0 = min(widths, key=lambda w: abs(w - width))
        return table[("verify", w0)] + slope * (width - w0)


class AcceptanceRate:
    """Per-token acceptance rate from the accepted counts: a = accepted / (accepted + rejections),
    the maximum-likelihood estimate of the geometric model, with a weak Beta(1, 1) prior and
    exponential forgetting so it follows the scene."""

    def __init__(self, decay: float = 0.95):
        self.decay, self.accepted, self.trials = decay, 0.0, 0.0

    def observe(self, k: int, n: int) -> None:
        if k == 0:
            return
        self.accepted = self.decay * self.accepted + n
        self.trials = self.decay * self.trials + n + (1 if n < k else 0)

    @property
    def value(self) -> float:
        return (self.accepted + 1.0) / (self.trials + 2.0)


def expected_tokens(a: float, k: int) -> float:
    """E(k) = (1 - a^(k+1)) / (1 - a): tokens emitted by a step of draft length k."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def best_k(a: float, costs: CostModel, k_max: int, pending: int = 1) -> int:
    """argmax over k in 1..k_max of E(k) / C(k) (tokens per ms)."""
    rates = [expected_tokens(a, k) / max(costs.step_expected(k, pending), 1e-9) for k in range(1, k_max + 1)]
    return 1 + int(np.argmax(rates))


class StepPolicy:
    """Policy for runtime.loop.decode: fixed k, or adaptive k from the acceptance rate and the
    measured costs; `cap(k, pending) -> k' | None` (the latency budget) may shorten a step or
    end the phase. Every step's costs are recorded, whatever chose k."""

    def __init__(self, costs: CostModel, k: int, adaptive: bool, k_max: int, cap=None,
                 rate: AcceptanceRate | None = None):
        self.costs, self.k, self.adaptive, self.k_max, self.cap = costs, k, adaptive, k_max, cap
        self.rate = rate or AcceptanceRate()

    def next_k(self, pending: int) -> int | None:
        k = best_k(self.rate.value, self.costs, self.k_max, pending) if self.adaptive else self.k
        return self.cap(k, pending) if self.cap else k

    def observe(self, k: int, n: int, draft_ms: float, verify_ms: float, width: int) -> None:
        self.rate.observe(k, n)
        if k:
            self.costs.observe("draft", draft_ms / k)
        self.costs.observe(("verify", width), verify_ms)
