"""One speculative step as a value: what a policy plans, the budget fits and the loop runs.

    Chain(k)          draft k tokens with the draft model, verify pending + k (k = 0: a plain
                      target step, no draft call)
    TreeStep(shape)   draft a token tree (runtime/tree.py) and verify it in one pass; `chain` is
                      the chain it becomes where the tree does not fit (budget or cache rows)
    Lookup(tokens)    verify tokens proposed by the cycle lookup (runtime/reuse.py): no draft call

A step is planned once (`Policy.plan`), fitted once (`fit_step`: the latency budget, the room left)
and run by one of two calls of runtime/loop.py, which end in one tail and one `StepRecord`.

The protocols below are what runtime.loop.decode asks of its collaborators; runtime/adaptive.py's
StepPolicy and runtime/acceptance.py's rules are the implementations the planner uses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Union

import numpy as np

from runtime.tree import TreeShape


@dataclass(frozen=True)
class Chain:
    k: int


@dataclass(frozen=True)
class TreeStep:
    shape: TreeShape
    chain: int          # the chain's length where the tree does not fit


@dataclass(frozen=True)
class Lookup:
    tokens: tuple

    @property
    def k(self) -> int:
        return len(self.tokens)


Step = Union[Chain, TreeStep, Lookup]


def lookup_or_plain(tokens) -> Step:
    """A lookup of `tokens`, or a plain step (Chain(0)) when there are none."""
    tokens = tuple(int(t) for t in tokens)
    return Lookup(tokens) if tokens else Chain(0)


def shorten(step: Step, k: int) -> Step:
    """A chain or lookup step cut to at most k tokens (a tree is not cut: see fit_step)."""
    if isinstance(step, Lookup):
        return lookup_or_plain(step.tokens[:k])
    if isinstance(step, Chain):
        return Chain(min(step.k, k))
    return step


class CostKey(NamedTuple):
    """A sized key of the cost model (runtime/budget.py): ("verify", width), ("draft_call", k),
    ("tree_draft", shape), ("overhead", shape). Unsized costs are plain names ("draft",
    "overhead", "lookup", the stages). A NamedTuple: ("verify", 9) and CostKey("verify", 9) are
    the same key."""
    kind: str
    size: object


@dataclass
class StepRecord:
    """One step, as the stats, the policy and the observer see it."""
    step: Step
    k: int                  # tokens judged: a chain's or lookup's k; a tree's judged path
    draft: np.ndarray       # (k,) the proposals judged (a tree: its accepted nodes, then the
                            # best-scored child where it stopped)
    accepted: int           # n of them accepted
    width: int              # tokens in the verify pass (pending + k, or pending + nodes)
    draft_ms: float
    verify_ms: float
    emitted: list = field(default_factory=list)   # the tokens the step added to the sequence
    nodes: int = 0          # a token tree's drafted nodes (0: a chain)
    chain: tuple = ()       # a tree step: (k, n) of its greedy line (runtime.tree.greedy_run)
    path: str = "host"      # "device": the backend's device-resident greedy step ran it
    syncs: int | None = None    # the backend's device-to-host reads in the step (None: not counted)
    wall_ms: float = 0.0    # the step's host time, call to accepted tokens (draft_ms and verify_ms
                            # are device times on the device path: the rest is the host's)

    @property
    def source(self) -> str:
        """Who proposed: "model" (the draft), "lookup" (reuse), "none" (k = 0)."""
        if isinstance(self.step, Lookup):
            return "lookup"
        return "model" if self.k else "none"


class Rule(Protocol):
    """An acceptance rule (runtime/loop.py GreedyRule, RelaxedRule, SamplingRule)."""
    readout: str            # what verify returns: "argmax" ids or "logits"
    trees: bool             # token trees may be verified by this rule
    exact_greedy: bool      # plain greedy: a backend may run the whole step on its device

    def sampling(self, k: int): ...

    def first(self, row: np.ndarray) -> int: ...

    def accept(self, draft, q, rows) -> tuple[int, int]: ...


class Policy(Protocol):
    """Chooses each step and learns from each record (runtime/adaptive.py StepPolicy)."""
    k_max: int

    def plan(self, pending: int, proposal=None, trees: bool = False) -> Step | None: ...

    def record(self, rec: StepRecord) -> None: ...

    def observe_overhead(self, ms: float, step: Step) -> None: ...

    def observe_search(self, ms: float) -> None: ...


class Proposer(Protocol):
    """Proposes tokens before the draft is asked (runtime/reuse.py CycleLookup)."""

    def propose(self, seq: list, k: int): ...


class Budget(Protocol):
    """Fits a planned step into the time left (runtime/budget.py CycleBudget), or None: stop."""

    def fit(self, step: Step, pending: int) -> Step | None: ...
