"""The speculative loop: chain-draft k tokens, verify k+1 in one target pass, accept n, roll back.

One loop serves every backend and every rule. State is host-side and small:

    seq    the accepted tokens (prompt + generated); seq[-1] is always pending (not yet fed)
    t_len  target cache rows that are valid (tokens seq[:t_len] have been fed)
    d_len  draft cache rows that are valid

A step feeds the target seq[t_len:] + draft (width w = pending + k) and the draft seq[d_len:]
+ its own k-1 proposals; after accepting n of k and adding token t, t_len = len(seq) - 1 and
the draft keeps min(n, k-1) of its proposals. When all k are accepted d[k-1] was never fed to
the draft: it stays pending and the next draft call feeds it first (the cache is filled then).
k = 0 is a plain target step (width 1, no draft call): plain decoding is this loop with k = 0.

A lookup (runtime/reuse.py CycleLookup), when given, is asked first: its proposal (the last
cycles' reasoning after the tokens just accepted) is verified like a draft, the draft model is
not called and d_len stays where it was (the draft is fed what it missed at its next call). The
policy chooses its k with no draft cost; for sampling the proposal is a point mass q = onehot.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from runtime.acceptance import accept_greedy, accept_relaxed, accept_sampling, process_logits, sample
from runtime.backend import DraftSampling, PrefillInputs
from runtime.budget import wall_ms
from runtime.trace import span
from runtime.tree import TreeShape, accept_greedy_tree, fed_prefix, greedy_run, layout

class GreedyRule:
    """Exact greedy: output identical to plain greedy decoding of the target."""
    readout = "argmax"
    trees = True            # token trees are verified by this rule alone (runtime/tree.py)

    def sampling(self, k: int) -> DraftSampling | None:
        """How the draft chooses its k proposals: None = the masked arg-max."""
        return None

    def first(self, row: np.ndarray) -> int:
        return int(row[0])

    def accept(self, draft, q, rows) -> tuple[int, int]:
        return accept_greedy(draft, rows)


class RelaxedRule(GreedyRule):
    """Greedy with Spec-VLA relaxed acceptance of trajectory tokens (text stays exact)."""

    trees = False

    def __init__(self, range_ids: np.ndarray, r: int):
        self.range_ids, self.r = range_ids, int(r)

    def accept(self, draft, q, rows) -> tuple[int, int]:
        return accept_relaxed(draft, rows, self.range_ids, self.r)


class SamplingRule:
    """Speculative sampling with temperature and top-p; the draft samples from q with the
    uniforms drawn here first, and returns q with its proposals."""
    readout = "logits"
    trees = False           # sampling keeps chains (no recursive rejection over siblings here)

    def __init__(self, temperature: float, top_p: float, rng: np.random.Generator):
        self.temperature, self.top_p, self.rng = temperature, top_p, rng

    def sampling(self, k: int) -> DraftSampling:
        return DraftSampling(self.temperature, self.top_p, self.rng.random(k))

    def probs(self, logits: np.ndarray) -> np.ndarray:
        return process_logits(logits, self.temperature, self.top_p)

    def first(self, row: np.ndarray) -> int:
        return sample(self.probs(row[0]), self.rng.random())

    def accept(self, draft, q, rows) -> tuple[int, int]:
        q = q if len(draft) else np.zeros((0, rows.shape[-1]), np.float32)
        return accept_sampling(draft, q, self.probs(rows), self.rng)


def make_rule(spec, phase: str, rng: np.random.Generator, range_ids: np.ndarray):
    """The acceptance rule of a SpecConfig for a phase ("reasoning" or "trajectory"): relaxed
    acceptance applies to trajectory tokens only."""
    if spec.decoding == "sample":
        return SamplingRule(spec.temperature, spec.top_p, rng)
    if phase == "trajectory" and spec.relax_r:
        return RelaxedRule(range_ids, spec.relax_r)
    return GreedyRule()


@dataclass
class DecodeState:
    seq: list
    t_len: int
    d_len: int

    @classmethod
    def after_prefill(cls, prompt_ids, first_token: int) -> "DecodeState":
        """Prefill wrote the whole prompt into both caches and chose the first token."""
        seq = [int(i) for i in prompt_ids] + [int(first_token)]
        return cls(seq, len(seq) - 1, len(seq) - 1)

    def force(self, tokens) -> None:
        """Append tokens the target did not choose (e.g. a forced <|cot_end|>)."""
        self.seq.extend(int(t) for t in tokens)


@dataclass
class StepRecord:
    """One draft -> verify step, as the loop's observer sees it."""
    k: int                  # draft length (0: a plain target step)
    draft: np.ndarray       # (k,) the draft's proposals
    accepted: int           # n of them accepted
    width: int              # tokens in the verify pass (pending + k)
    draft_ms: float
    verify_ms: float
    source: str = "model"   # who proposed: "model" (the draft), "lookup" (reuse), "none" (k = 0)
    nodes: int = 0          # a token tree's drafted nodes (0: a chain); `draft` is then its path
                            # judged: the accepted nodes and the best-scored child where it stopped


@dataclass
class DecodeStats:
    steps: int = 0
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    looked_up: int = 0          # proposals from the lookup (in drafted), and how many were accepted
    looked_up_accepted: int = 0
    trees: int = 0              # steps that verified a token tree, and their drafted nodes
    tree_nodes: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    lookup_ms: float = 0.0      # lookup searches (measured, priced by the budget)
    ks: list = field(default_factory=list)
    ns: list = field(default_factory=list)     # accepted draft tokens per step
    branches: Counter = field(default_factory=Counter)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target verify pass (k + 1 when every draft is accepted)."""
        return self.emitted / self.steps if self.steps else 0.0

    def to_json(self) -> dict:
        return {"steps": self.steps, "emitted": self.emitted, "drafted": self.drafted,
                "accepted": self.accepted,
                "looked_up": self.looked_up, "looked_up_accepted": self.looked_up_accepted,
                "trees": self.trees, "tree_nodes": self.tree_nodes,
                "tau": round(self.tau, 4), "ks": list(self.ks),
                "ns": list(self.ns), "draft_ms": round(self.draft_ms, 3),
                "verify_ms": round(self.verify_ms, 3), "lookup_ms": round(self.lookup_ms, 3), "branches": dict(self.branches)}


def decode(backend, state: DecodeState, rule, policy, *, stop_ids=(), limit: int,
           reserve: int = 0, clock=wall_ms, stats: DecodeStats | None = None, observer=None,
           lookup=None) -> str:
    """Step until seq ends with a stop id ("stop"), reaches `limit` tokens ("limit"), the cache
    (less `reserve` rows kept for the trajectory tail) is full ("max_len"), or the policy
    returns None ("budget"). Returns the reason; `state` and `stats` are updated in place;
    `observer(StepRecord)`, when given, sees every step; `lookup.propose(seq, k)`, when given,
    is tried before the draft (module docstring)."""
    stats = stats if stats is not None else DecodeStats()
    stops = {int(s) for s in stop_ids}
    while True:
        if state.seq[-1] in stops:
            return "stop"
        room = min(limit - len(state.seq) - 1, backend.max_len - reserve - len(state.seq))
        if room < 0:
            return "limit" if len(state.seq) >= limit else "max_len"
        pending = len(state.seq) - state.t_len
        proposal = None
        if lookup is not None:      # the search is timed: the budget prices the next ones by it
            t0 = clock()
            proposal = lookup.propose(state.seq, min(policy.k_max, room))
            searched = clock() - t0
            stats.lookup_ms += searched
            if hasattr(policy, "observe_search"):
                policy.observe_search(searched)
        free = proposal is not None and len(proposal) > 0
        trees = not free and getattr(policy, "tree", None) is not None and getattr(rule, "trees", False) \
            and backend.takes_trees
        k = policy.next_k(pending, free=True) if free else \
            policy.next_k(pending, trees=True) if trees else policy.next_k(pending)
        if k is None:
            return "budget"
        if isinstance(k, TreeShape):
            if tree_fits(backend, state, k, room):
                step_tree(backend, state, policy, k, stops, clock, stats, observer)
                continue
            k = min(k.depth, room)      # no room for the tree: its depth as a chain
        if free:
            k = min(k, len(proposal))
        if k > room:
            k = room
            stats.branches["max_length"] += 1
        step(backend, state, rule, policy, k, stops, clock, stats, observer,
             proposal[:k] if free and k else None)


def step(backend, state: DecodeState, rule, policy, k: int, stops: set, clock, stats: DecodeStats,
         observer=None, proposal=None) -> None:
    """One draft -> verify -> accept step of draft length k (k = 0: a plain target step); a
    lookup `proposal` (k,) stands in for the draft: no draft call, q = onehot(proposal)."""
    pending = np.asarray(state.seq[state.t_len:], dtype=np.int64)
    t0 = clock()
    draft, q = np.zeros(0, np.int64), None
    if proposal is not None:
        draft = np.asarray(proposal, dtype=np.int64)
    elif k:
        with span("draft"):
            draft, q = backend.draft(np.asarray(state.seq[state.d_len:], np.int64), state.d_len, k,
                                     rule.sampling(k))
            draft = np.asarray(draft, dtype=np.int64)
    t1 = clock()
    with span("verify"):
        rows = backend.verify(np.concatenate([pending, draft]), state.t_len, rule.readout)
    t2 = clock()
    if proposal is not None and rule.readout == "logits":   # a point-mass draft: q(x) = 1
        q = np.zeros((k, rows.shape[-1]), np.float32)
        q[np.arange(k), draft] = 1.0
    with span("accept"):
        n, t = rule.accept(draft, q, rows[len(pending) - 1:])
    emitted = [int(x) for x in draft[:n]] + [t]
    cut = next((i for i, x in enumerate(emitted) if x in stops), None)
    if cut is not None and cut < n:
        stats.branches["stop_in_block"] += 1     # tokens after an accepted stop are dropped
    if cut is not None:
        emitted = emitted[:cut + 1]
    if k and proposal is None:   # the draft was fed seq[d_len:] and d[:k-1]; those now in seq may stay valid
        kept = min(n, k - 1, len(emitted)) if backend.draft_keeps_proposals else 0
        state.d_len = len(state.seq) + kept
    state.seq.extend(emitted)
    state.t_len = len(state.seq) - 1
    source = "none" if not k else "model" if proposal is None else "lookup"
    if source == "lookup":      # no draft cost to learn; the lookup's own acceptance rate
        policy.observe(k, n, 0.0, t2 - t1, len(pending) + k, free=True)
    else:
        policy.observe(k, n, t1 - t0, t2 - t1, len(pending) + k)
    _count(stats, k, n, len(emitted), t1 - t0, t2 - t1, source)
    if observer is not None:
        observer(StepRecord(k, draft, n, len(pending) + k, t1 - t0, t2 - t1, source))
    if hasattr(policy, "observe_overhead"):
        policy.observe_overhead(clock() - t2)


def tree_fits(backend, state: DecodeState, shape: TreeShape, room: int) -> bool:
    """The tree's verify and draft rows fit the caches, and its deepest path the room left."""
    pending, fed = len(state.seq) - state.t_len, len(state.seq) - state.d_len
    draft_rows = state.d_len + fed + shape.topk * (shape.depth - 1)
    return shape.depth <= room and state.t_len + pending + shape.nodes <= backend.max_len \
        and draft_rows <= backend.max_len


def step_tree(backend, state: DecodeState, policy, shape: TreeShape, stops: set, clock,
              stats: DecodeStats, observer=None) -> None:
    """One tree step (greedy; runtime/tree.py): draft a tree, verify pending + nodes in one pass,
    walk the target's argmax down it, move the accepted rows where a chain would have them."""
    pending = np.asarray(state.seq[state.t_len:], dtype=np.int64)
    P = len(pending)
    t0 = clock()
    with span("draft"):
        tree = backend.draft_tree(np.asarray(state.seq[state.d_len:], np.int64), state.d_len, shape)
    t1 = clock()
    offsets, mask = layout(tree, P)
    with span("verify"):
        rows = backend.verify_tree(np.concatenate([pending, tree.tokens]), state.t_len, "argmax", offsets, mask)
    t2 = clock()
    with span("accept"):
        path, t = accept_greedy_tree(tree, rows[P - 1:])
    n = len(path)
    emitted = [int(tree.tokens[i]) for i in path] + [t]
    cut = next((i for i, x in enumerate(emitted) if x in stops), None)
    if cut is not None and cut < n:
        stats.branches["stop_in_block"] += 1
    if cut is not None:
        emitted = emitted[:cut + 1]
    fed = fed_prefix(tree, path) if backend.draft_keeps_proposals else []
    kept = min(len(fed), len(emitted))
    here = len(state.seq)       # the row of the first accepted node, in both caches
    backend.keep_rows(here, state.t_len + P + np.asarray(path, np.int64), here, np.asarray(fed[:kept], np.int64))
    state.d_len = here + kept
    state.seq.extend(emitted)
    state.t_len = len(state.seq) - 1
    last = path[-1] if path else -1     # the judged path: accepted nodes, then the best child there
    child = next((i for i in range(len(tree)) if tree.parents[i] == last), None)
    judged = [int(tree.tokens[i]) for i in path] + ([] if child is None else [int(tree.tokens[child])])
    if hasattr(policy, "observe_chain"):     # the greedy chain this tree step stands for
        policy.observe_chain(*greedy_run(tree, path))
    policy.observe_tree(shape, n, len(emitted), t1 - t0, t2 - t1, P + len(tree))
    _count(stats, len(judged), n, len(emitted), t1 - t0, t2 - t1)
    stats.trees += 1
    stats.tree_nodes += len(tree)
    if observer is not None:
        observer(StepRecord(len(judged), np.asarray(judged, np.int64), n, P + len(tree), t1 - t0, t2 - t1,
                            "model", len(tree)))
    if hasattr(policy, "observe_overhead"):
        policy.observe_overhead(clock() - t2, shape)


def _count(stats: DecodeStats, k: int, n: int, emitted: int, draft_ms: float, verify_ms: float,
           source: str = "model") -> None:
    stats.steps += 1
    stats.emitted += emitted
    stats.drafted += k
    stats.accepted += n
    if source == "lookup":
        stats.looked_up += k
        stats.looked_up_accepted += n
    stats.draft_ms += draft_ms
    stats.verify_ms += verify_ms
    stats.ks.append(k)
    stats.ns.append(n)
    branch = "plain" if k == 0 else "all_accepted" if n == k else "first_rejected" if n == 0 else "partial"
    stats.branches[branch] += 1


def generate(backend, prompt_ids, rule, policy, *, stop_ids=(), max_new: int, clock=wall_ms,
             positions=None, rope_delta: int = 0, observer=None, lookup=None):
    """Prefill a token prompt and decode up to max_new tokens -> (new tokens, reason, stats).

    For text-only prompts (benchmarks, tests, training's acceptance measurements): positions
    default to 0..T-1 on all three M-RoPE axes, which is what M-RoPE gives plain text."""
    ids = np.asarray(prompt_ids, dtype=np.int64)
    if positions is None:
        positions = np.repeat(np.arange(len(ids), dtype=np.int64)[None], 3, axis=0)
    row = backend.prefill(PrefillInputs(ids, positions, rope_delta), rule.readout)
    state = DecodeState.after_prefill(ids, rule.first(row))
    stats = DecodeStats()
    reason = decode(backend, state, rule, policy, stop_ids=stop_ids, limit=len(ids) + max_new,
                    clock=clock, stats=stats, observer=observer, lookup=lookup)
    return state.seq[len(ids):], reason, stats
