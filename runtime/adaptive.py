"""Measured step costs and the adaptive draft length.

A step of draft length k emits E(k) = 1 + S(1) + ... + S(k) tokens on average, where S(j) is the
probability that the first j draft tokens are accepted, and costs C(k) = c_draft(k) +
c_verify(k + 1) (+ a step's overhead), each a line through the measured means (CostModel.draft_line,
verify_line: a draft call has a fixed part besides its k steps); the adaptive policy picks
    k* = argmax_{1 <= k <= k_max} E(k) / C(k)
from the measured costs (runtime.budget.CostModel, which also gives the budget its worst cases)
and a running estimate of S.

S comes from the accepted runs of earlier steps, as a life table (Kaplan-Meier): a step that
accepted n < k tokens is a run that ended at position n + 1, one that accepted all k a run of at
least k (censored there). The hazard h(j) = P(token j + 1 rejected | the first j accepted) is
ended(j) / at_risk(j), shrunk towards the pooled per-token rejection rate where a position has few
steps, and S(j) = (1 - h(0)) ... (1 - h(j - 1)). With one hazard at every position this is the
geometric model of Leviathan et al., E(k) = (1 - a^(k+1)) / (1 - a). Acceptance in a reasoning
text comes in runs (long routine stretches, misses at the commitment), and the geometric model
then undervalues long k; the life table does not assume a shape.
"""
from __future__ import annotations

import bisect

import numpy as np

from runtime.budget import CostModel, draft_key, overhead_key, tree_key, verify_key
from runtime.config import K_MAX_LIMIT
from runtime.step import Chain, Lookup, Step, StepRecord, TreeStep, lookup_or_plain


AT_EDGES = (8, 16, 32)     # a step's offset in its phase (tokens emitted before it): 4 life tables


class AcceptanceRate:
    """Accepted-run lengths of draft proposals as censored life tables, one per stretch of the
    phase a step starts in (its offset `at`: tokens emitted before it in this phase, in buckets
    split at AT_EDGES), with exponential forgetting so they follow the scene. A position forgets
    only when a step reaches it: the evidence that long proposals fail late in a phase is kept
    while short ones are drafted there, not faded by steps that never get that far. A reasoning text is routine wording first and the commitment after, so where a
    step starts says much about how long its run will be.

    `value` is the pooled per-token acceptance rate a = accepted / (accepted + rejections) with a
    Beta(1, 1) prior (the geometric model's maximum-likelihood estimate); `expected(k, at)` is
    E(k) from the step's table. Shrinkage: each position's hazard in a table carries `prior`
    pseudo-steps at the same position's hazard over all tables, which carries `prior` pseudo-steps
    at the pooled rate; so a table or a position with few steps (longer than any k tried yet)
    follows the others, and, with none, the geometric model."""

    def __init__(self, decay: float = 0.95, prior: float = 2.0, positions: int = K_MAX_LIMIT):
        self.decay, self.prior, self.positions = decay, prior, positions
        # [table][j]: steps that proposed token j + 1 with the first j accepted; of those, the ones
        # whose token j + 1 was rejected. Plain lists: the policy reads one table before every
        # step, and numpy's per-call cost on arrays this small is most of a choice's time
        self._risk = [[0.0] * positions for _ in range(len(AT_EDGES) + 1)]
        self._ended = [[0.0] * positions for _ in range(len(AT_EDGES) + 1)]
        self._col_risk, self._col_ended = [0.0] * positions, [0.0] * positions   # over all tables
        self._rows: dict = {}      # table -> its hazards, until the next observation

    @property
    def at_risk(self) -> np.ndarray:
        return np.array(self._risk)

    @property
    def ended(self) -> np.ndarray:
        return np.array(self._ended)

    @staticmethod
    def table(at: int) -> int:
        return bisect.bisect_right(AT_EDGES, at)

    def observe(self, k: int, n: int, at: int = 0) -> None:
        if k == 0:
            return
        if not 0 <= n <= k <= self.positions:
            raise ValueError(f"a step of draft length k={k} accepted n={n}; allowed 0 <= n <= k <= "
                             f"{self.positions}")
        t, reached, d = self.table(at), min(n, k - 1) + 1, self.decay
        risk, ended = self._risk[t], self._ended[t]
        col_risk, col_ended = self._col_risk, self._col_ended
        for j in range(reached):
            r, e = d * risk[j] + 1.0, d * ended[j]
            col_risk[j] += r - risk[j]
            col_ended[j] += e - ended[j]
            risk[j], ended[j] = r, e
        if n < k:
            ended[n] += 1.0
            col_ended[n] += 1.0
        self._rows.clear()

    @property
    def value(self) -> float:
        rejected, trials = sum(self._col_ended), sum(self._col_risk)
        return (trials - rejected + 1.0) / (trials + 2.0)

    def hazard_row(self, at: int = 0) -> list:
        """h(j) = P(draft token j + 1 rejected | the first j accepted), j = 0..positions-1, for a
        step starting at offset `at` (a list; `hazards` as an array)."""
        t = self.table(at)
        if t not in self._rows:
            c, pooled = self.prior, 1.0 - self.value
            row = []
            for r, e, cr, ce in zip(self._risk[t], self._ended[t], self._col_risk, self._col_ended):
                row.append((e + c * (ce + c * pooled) / (cr + c)) / (r + c))
            self._rows[t] = row
        return self._rows[t]

    def hazards(self, at: int = 0) -> np.ndarray:
        return np.array(self.hazard_row(at))

    def expected(self, k: int, at: int = 0) -> float:
        """E(k): tokens a step of draft length k starting at offset `at` emits (accepted draft
        tokens + the target's one)."""
        return _tokens(self.hazard_row(at), k)[-1] if k else 1.0


def _tokens(hazards, k_max: int) -> list:
    """E(1), ..., E(k_max) from the hazards: E(k) = 1 + S(1) + ... + S(k)."""
    out, surv, e = [], 1.0, 1.0
    for h in hazards[:k_max]:
        surv *= 1.0 - h
        e += surv
        out.append(e)
    return out


def expected_tokens(a: float, k: int) -> float:
    """The geometric model's E(k) = (1 - a^(k+1)) / (1 - a) (every position's hazard 1 - a)."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def best_k(rate: "AcceptanceRate | float", costs: CostModel, k_max: int, pending: int = 1,
           draft: bool = True, at: int = 0) -> int:
    """argmax over k in 1..k_max of E(k) / C(k) (tokens per ms), E from the life table of `rate`
    for a step at offset `at` (or the geometric model of a float a); draft=False: proposals that
    cost no draft step (lookup), C(k) = c_verify(k + 1)."""
    return chain_choice(rate, costs, k_max, pending, draft, at)[0]


def chain_choice(rate: "AcceptanceRate | float", costs: CostModel, k_max: int, pending: int = 1,
                 draft: bool = True, at: int = 0) -> tuple[int, float]:
    """best_k and its E(k) / C(k) (tokens per ms)."""
    if isinstance(rate, AcceptanceRate):
        tokens = _tokens(rate.hazard_row(at), k_max)
    else:
        tokens = [expected_tokens(rate, k) for k in range(1, k_max + 1)]
    rates = [e / max(c, 1e-9) for e, c in zip(tokens, costs.steps_expected(k_max, pending, draft))]
    best = max(rates)
    return 1 + rates.index(best), best


class StepPolicy:
    """Policy for runtime.loop.decode: fixed k, or adaptive k from the acceptance rate and the
    measured costs. `plan` returns the step (runtime.step) the policy wants; the latency budget
    fits it in decode (runtime.budget.CycleBudget.fit). Every step's record is learnt from,
    whatever chose it."""

    def __init__(self, costs: CostModel, k: int, adaptive: bool, k_max: int,
                 rate: AcceptanceRate | None = None, free_rate: AcceptanceRate | None = None,
                 tree=None, tree_tau: "TreeTau | None" = None):
        self.costs, self.k, self.adaptive, self.k_max = costs, k, adaptive, k_max
        self.rate = rate or AcceptanceRate()
        self.free_rate = free_rate or AcceptanceRate()     # of lookup proposals (no draft cost)
        # tree: a runtime.tree.TreeShape (token trees for the greedy rule), None: chains only
        self.tree = tree
        self.tree_tau = tree_tau or TreeTau()
        self.at = 0        # tokens this phase's steps have emitted: the next step's offset
        self._chain_k = None   # the chain tree_wins chose for this step (plan reuses it)

    def plan(self, pending: int, proposal=None, trees: bool = False) -> Step:
        """The step wanted now. proposal: lookup tokens wait: as many as their own acceptance rate
        pays for at no draft cost (fixed-k modes keep their k; plain decoding, k = 0, takes the
        adaptive choice). trees: the step may be self.tree: fixed, or, adaptive, when its
        measured tokens per ms beat the best chain's."""
        self._chain_k = None
        if trees and self.tree is not None and (not self.adaptive or self.tree_wins(pending)):
            return TreeStep(self.tree, min(self.tree.depth, self.k_max))
        if proposal is not None and len(proposal):
            keep = self.k and not self.adaptive
            k = self.k if keep else best_k(self.free_rate, self.costs, self.k_max, pending, draft=False, at=self.at)
            return lookup_or_plain(proposal[:k])
        if self.adaptive:       # the chain tree_wins priced for this step, else priced now
            return Chain(self._chain_k or best_k(self.rate, self.costs, self.k_max, pending, at=self.at))
        return Chain(self.k)

    def record(self, rec: StepRecord) -> None:
        """A step's tokens to the acceptance tables, its calls to the cost model. A tree step: its
        tokens and draft time to the tree's own record and its greedy line (what a chain of that
        length would have had accepted) to the chain's table, so the chain is measured while the
        tree is chosen; a lookup's to the lookup's own table, with no draft cost to learn."""
        step = rec.step
        if isinstance(step, TreeStep):
            if rec.chain and rec.chain[0]:
                self.rate.observe(*rec.chain, self.at)
            self.tree_tau.observe(len(rec.emitted), self.at)
            self.at += len(rec.emitted)
            self.costs.observe(tree_key(step.shape), rec.draft_ms)
        else:
            lookup = isinstance(step, Lookup)
            (self.free_rate if lookup else self.rate).observe(rec.k, rec.accepted, self.at)
            self.at += rec.accepted + 1
            if rec.k and not lookup:
                self.costs.observe("draft", rec.draft_ms / rec.k)
                self.costs.observe(draft_key(rec.k), rec.draft_ms)
        self.costs.observe(verify_key(rec.width), rec.verify_ms)

    def observe_overhead(self, ms: float, step: Step) -> None:
        """What a step cost besides its draft and verify calls (acceptance, cache bookkeeping), a
        chain's or a tree's: the choice and the budget price every step with it."""
        self.costs.observe(overhead_key(step.shape if isinstance(step, TreeStep) else None), ms)

    def observe_search(self, ms: float) -> None:
        """One lookup search took `ms` (the budget prices the next ones by it)."""
        self.costs.observe("lookup", ms)

    def tree_wins(self, pending: int) -> bool:
        """Adaptive: the tree's measured tokens per step over its cost (its measured draft time, the
        verify of its width) against the best chain's E(k) / C(k). The tree is taken until it has
        been measured twice, then a chain until one has been measured; after that, where it loses,
        it is still taken now and then to keep its measurement current: 8 tree-eligible steps after
        a win, and after each look that it lost twice as long as before (16, 32, ... at most 256
        steps), so a tree that does not pay on this backend costs little."""
        tau = self.tree_tau
        tau.asked += 1
        if tau.steps < 2:
            return True
        if "draft" not in self.costs.mean:      # no chain step measured yet: one is, before comparing
            return False
        self._chain_k, chain = chain_choice(self.rate, self.costs, self.k_max, pending, at=self.at)
        tree = tau.tokens(self.at) / max(self.costs.tree_expected(self.tree, pending), 1e-9)
        if tree >= chain:
            tau.lost, tau.next_look = 0, tau.asked + 8
            return True
        if tau.asked >= tau.next_look:
            tau.lost += 1
            tau.next_look = tau.asked + 8 * 2 ** min(tau.lost, 5)
            return True
        return False


class TreeTau:
    """Running mean (exponential forgetting) of the tokens a tree step emits, per stretch of the
    phase (AcceptanceRate's tables); a stretch with no tree step yet takes the mean over all."""

    def __init__(self, decay: float = 0.9):
        self.decay, self.steps, self.asked, self.value = decay, 0, 0, 0.0
        self.per = np.zeros(len(AT_EDGES) + 1)
        self.seen = np.zeros(len(AT_EDGES) + 1, int)
        self.lost, self.next_look = 0, 8       # tree_wins' looks at a tree that loses

    def observe(self, emitted: int, at: int = 0) -> None:
        w = 1.0 if self.steps == 0 else 1.0 - self.decay
        self.value += w * (emitted - self.value)
        self.steps += 1
        t = AcceptanceRate.table(at)
        w = 1.0 if self.seen[t] == 0 else 1.0 - self.decay
        self.per[t] += w * (emitted - self.per[t])
        self.seen[t] += 1

    def tokens(self, at: int = 0) -> float:
        t = AcceptanceRate.table(at)
        return float(self.per[t]) if self.seen[t] else self.value
