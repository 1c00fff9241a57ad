"""Measured step costs and the adaptive draft length.

With per-token acceptance rate a (each draft token accepted independently with prob a, the
model of Leviathan et al.), a step of draft length k emits on average
    E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)
tokens and costs C(k) = k * c_draft + c_verify(k + 1), so the adaptive policy picks
    k* = argmax_{1 <= k <= k_max} E(k) / C(k)
from a running estimate of a and the measured costs (runtime.budget.CostModel, which also
gives the budget its worst cases).
"""
from __future__ import annotations

import numpy as np

from runtime.budget import CostModel, tree_key


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


def best_k(a: float, costs: CostModel, k_max: int, pending: int = 1, draft: bool = True) -> int:
    """argmax over k in 1..k_max of E(k) / C(k) (tokens per ms); draft=False: proposals that cost
    no draft step (lookup), C(k) = c_verify(k + 1)."""
    rates = [expected_tokens(a, k) / max(costs.step_expected(k, pending, draft), 1e-9) for k in range(1, k_max + 1)]
    return 1 + int(np.argmax(rates))


class StepPolicy:
    """Policy for runtime.loop.decode: fixed k, or adaptive k from the acceptance rate and the
    measured costs; `cap(k, pending) -> k' | None` (the latency budget) may shorten a step or
    end the phase. Every step's costs are recorded, whatever chose k."""

    def __init__(self, costs: CostModel, k: int, adaptive: bool, k_max: int, cap=None,
                 rate: AcceptanceRate | None = None, free_rate: AcceptanceRate | None = None,
                 tree=None, cap_tree=None, tree_tau: "TreeTau | None" = None):
        self.costs, self.k, self.adaptive, self.k_max, self.cap = costs, k, adaptive, k_max, cap
        self.rate = rate or AcceptanceRate()
        self.free_rate = free_rate or AcceptanceRate()     # of lookup proposals (no draft cost)
        # tree: a runtime.tree.TreeShape (token trees for the greedy rule), None: chains only;
        # cap_tree(shape, pending) -> shape | None (the budget's check of the whole tree)
        self.tree, self.cap_tree = tree, cap_tree
        self.tree_tau = tree_tau or TreeTau()

    def next_k(self, pending: int, free: bool = False, trees: bool = False):
        """free: a lookup proposal waits: k by its own acceptance rate at no draft cost (fixed-k
        modes keep their k; plain decoding, k = 0, takes the adaptive choice), and the budget
        caps it by the verify pass alone. trees: the step may be self.tree (a TreeShape is then
        returned): fixed, or, adaptive, when its measured tokens per ms beat the best chain's;
        a tree the budget refuses becomes a chain the budget caps."""
        if trees and self.tree is not None:
            if not self.adaptive or self.tree_wins(pending):
                shape = self.cap_tree(self.tree, pending) if self.cap_tree else self.tree
                if shape is not None:
                    return shape
                k = min(self.tree.depth, self.k_max)
                return self.cap(k, pending) if self.cap else k
        if free:
            keep = self.k and not self.adaptive
            k = self.k if keep else best_k(self.free_rate.value, self.costs, self.k_max, pending, draft=False)
            return self.cap(k, pending, free=True) if self.cap else k
        k = best_k(self.rate.value, self.costs, self.k_max, pending) if self.adaptive else self.k
        return self.cap(k, pending) if self.cap else k

    def observe_search(self, ms: float) -> None:
        """One lookup search took `ms` (the budget prices the next ones by it)."""
        self.costs.observe("lookup", ms)

    def tree_wins(self, pending: int) -> bool:
        """Adaptive: the tree's measured tokens per step over its cost (its measured draft time, the
        verify of its width) against the best chain's E(k) / C(k). Until the tree has been
        measured (and every 8th tree-eligible step after, to keep measuring) the tree is taken."""
        tau = self.tree_tau
        if tau.steps < 2 or tau.asked % 8 == 0:
            tau.asked += 1
            return True
        tau.asked += 1
        a = self.rate.value
        k = best_k(a, self.costs, self.k_max, pending)
        chain = expected_tokens(a, k) / max(self.costs.step_expected(k, pending), 1e-9)
        tree = tau.value / max(self.costs.tree_expected(self.tree, pending), 1e-9)
        return tree >= chain

    def observe_tree(self, shape, n: int, emitted: int, draft_ms: float, verify_ms: float, width: int) -> None:
        """A tree step: its tokens and draft time to the tree's own record, its verify pass to the
        cost model (the budget's worst case of that width), the accepted depth to the rate."""
        self.tree_tau.observe(emitted)
        self.costs.observe(tree_key(shape), draft_ms)
        self.costs.observe(("verify", width), verify_ms)

    def observe(self, k: int, n: int, draft_ms: float, verify_ms: float, width: int,
                free: bool = False) -> None:
        (self.free_rate if free else self.rate).observe(k, n)
        if k and not free:
            self.costs.observe("draft", draft_ms / k)
        self.costs.observe(("verify", width), verify_ms)


class TreeTau:
    """Running mean (exponential forgetting) of the tokens a tree step emits."""

    def __init__(self, decay: float = 0.9):
        self.decay, self.steps, self.asked, self.value = decay, 0, 0, 0.0

    def observe(self, emitted: int) -> None:
        w = 1.0 if self.steps == 0 else 1.0 - self.decay
        self.value += w * (emitted - self.value)
        self.steps += 1
