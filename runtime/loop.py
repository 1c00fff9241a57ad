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
from runtime.step import Chain, Lookup, StepRecord, TreeStep, shorten
from runtime.tree import TreeShape, accept_greedy_tree, fed_prefix, greedy_run, layout

class GreedyRule:
    """Exact greedy: output identical to plain greedy decoding of the target."""
    readout = "argmax"
    trees = True            # token trees are verified by this rule alone (runtime/tree.py)
    # plain greedy: a backend may run the whole step on its device (a subclass that accepts on the
    # host, e.g. to read the logits, sets it False)
    exact_greedy = True

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
    exact_greedy = False

    def __init__(self, range_ids: np.ndarray, r: int):
        self.range_ids, self.r = range_ids, int(r)

    def accept(self, draft, q, rows) -> tuple[int, int]:
        return accept_relaxed(draft, rows, self.range_ids, self.r)


class SamplingRule:
    """Speculative sampling with temperature and top-p; the draft samples from q with the
    uniforms drawn here first, and returns q with its proposals."""
    readout = "logits"
    trees = False           # sampling keeps chains (no recursive rejection over siblings here)
    exact_greedy = False

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

    def count(self, rec: StepRecord) -> None:
        """One step's record: its tokens, its calls' times, its branch."""
        k, n = rec.k, rec.accepted
        self.steps += 1
        self.emitted += len(rec.emitted)
        self.drafted += k
        self.accepted += n
        if rec.source == "lookup":
            self.looked_up += k
            self.looked_up_accepted += n
        if rec.nodes:
            self.trees += 1
            self.tree_nodes += rec.nodes
        self.draft_ms += rec.draft_ms
        self.verify_ms += rec.verify_ms
        self.ks.append(k)
        self.ns.append(n)
        branch = "plain" if k == 0 else "all_accepted" if n == k else "first_rejected" if n == 0 else "partial"
        self.branches[branch] += 1

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
           lookup=None, budget=None) -> str:
    """Step until seq ends with a stop id ("stop"), reaches `limit` tokens ("limit"), the cache
    (less `reserve` rows kept for the trajectory tail) is full ("max_len"), or the budget has no
    time for a step ("budget"). Returns the reason; `state` and `stats` are updated in place.

    Each step is a value (runtime/step.py): `lookup.propose(seq, k)`, when given, is asked first;
    `policy.plan` chooses the step; `budget.fit`, when given, fits it into the time left; the room
    left in the sequence and the caches shortens it; `run_step` runs it and its StepRecord goes
    to the stats, the policy and `observer`."""
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
            policy.observe_search(searched)
        trees = getattr(rule, "trees", False) and backend.takes_trees and not (proposal is not None and len(proposal))
        step = policy.plan(pending, proposal, trees)
        if budget is not None and step is not None:
            step = budget.fit(step, pending)
        if step is None:
            return "budget"
        step = within_room(backend, state, step, room, stats)
        run_step(backend, state, rule, policy, step, stops, clock, stats, observer)


def within_room(backend, state: DecodeState, step, room: int, stats: DecodeStats):
    """The step as the sequence's room and the caches allow: a tree that does not fit becomes a
    chain of its depth; a longer chain or lookup is cut to the room (counted as "max_length")."""
    if isinstance(step, TreeStep):
        if tree_fits(backend, state, step.shape, room):
            return step
        return Chain(min(step.shape.depth, room))
    if step.k > room:
        stats.branches["max_length"] += 1
        return shorten(step, room)
    return step


def run_step(backend, state: DecodeState, rule, policy, step, stops: set, clock, stats: DecodeStats,
             observer=None):
    """Run one step: draft (or take the lookup's tokens), verify, accept, then the one tail that
    moves the state and hands the record on. Returns the StepRecord."""
    reads, t0 = backend.host_reads, clock()
    if isinstance(step, TreeStep):
        rec, keep = _tree(backend, state, step, clock)
    elif rule.exact_greedy and backend.device_greedy:
        rec, keep = _device_chain(backend, state, step, clock)
    else:
        rec, keep = _chain(backend, state, rule, step, clock)
    t2 = clock()
    rec.wall_ms = t2 - t0
    rec.syncs = None if reads is None else backend.host_reads - reads
    _tail(backend, state, rec, keep, stops, stats)
    policy.record(rec)
    if observer is not None:
        observer(rec)
    policy.observe_overhead(clock() - t2, step)
    return rec


def _chain(backend, state: DecodeState, rule, step, clock):
    """A chain or lookup step through the backend's draft and verify calls (any rule): the draft's
    proposals and the target's rows come to the host, the rule accepts there."""
    k = step.k
    pending = np.asarray(state.seq[state.t_len:], dtype=np.int64)
    t0 = clock()
    draft, q = np.zeros(0, np.int64), None
    if isinstance(step, Lookup):
        draft = np.asarray(step.tokens, dtype=np.int64)
    elif k:
        with span("draft"):
            draft, q = backend.draft(np.asarray(state.seq[state.d_len:], np.int64), state.d_len, k,
                                     rule.sampling(k))
            draft = np.asarray(draft, dtype=np.int64)
    t1 = clock()
    with span("verify"):
        rows = backend.verify(np.concatenate([pending, draft]), state.t_len, rule.readout)
    t2 = clock()
    if isinstance(step, Lookup) and rule.readout == "logits":   # a point-mass draft: q(x) = 1
        q = np.zeros((k, rows.shape[-1]), np.float32)
        q[np.arange(k), draft] = 1.0
    with span("accept"):
        n, t = rule.accept(draft, q, rows[len(pending) - 1:])
    rec = StepRecord(step, k, draft, n, len(pending) + k, t1 - t0, t2 - t1,
                     [int(x) for x in draft[:n]] + [int(t)])
    return rec, _chain_keep(backend, step, n)


def _device_chain(backend, state: DecodeState, step, clock):
    """A greedy chain or lookup step run on the backend's device (Backend.greedy_step): the drafted
    tokens, the target's arg-max and the accepted length stay there, and one small copy brings
    back (n, the accepted tokens, the bonus token): the step's one host sync."""
    pending = np.asarray(state.seq[state.t_len:], dtype=np.int64)
    proposal = np.asarray(step.tokens, np.int64) if isinstance(step, Lookup) else None
    with span("step"):
        out = backend.greedy_step(pending, state.t_len, np.asarray(state.seq[state.d_len:], np.int64),
                                  state.d_len, step.k, proposal, clock)
    n = out.accepted
    rec = StepRecord(step, step.k, out.draft, n, len(pending) + step.k, out.draft_ms, out.verify_ms,
                     [int(x) for x in out.draft[:n]] + [int(out.bonus)], path="device")
    return rec, _chain_keep(backend, step, n)


def _chain_keep(backend, step, n: int):
    """How many draft cache rows past the accepted prefix stay valid after a chain step: the draft
    was fed seq[d_len:] and its first k-1 proposals; those accepted stay valid where the backend
    keeps them (None: a lookup or plain step, the draft was not fed)."""
    if not isinstance(step, Chain) or not step.k:
        return None
    return min(n, step.k - 1) if backend.draft_keeps_proposals else 0


def _tree(backend, state: DecodeState, step, clock):
    """A tree step (greedy; runtime/tree.py): draft a tree, verify pending + nodes in one pass,
    walk the target's arg-max down it."""
    pending = np.asarray(state.seq[state.t_len:], dtype=np.int64)
    P = len(pending)
    t0 = clock()
    with span("draft"):
        tree = backend.draft_tree(np.asarray(state.seq[state.d_len:], np.int64), state.d_len, step.shape)
    t1 = clock()
    offsets, mask = layout(tree, P)
    with span("verify"):
        rows = backend.verify_tree(np.concatenate([pending, tree.tokens]), state.t_len, "argmax", offsets, mask)
    t2 = clock()
    with span("accept"):
        path, t = accept_greedy_tree(tree, rows[P - 1:])
    n = len(path)
    last = path[-1] if path else -1     # the judged path: accepted nodes, then the best child there
    child = next((i for i in range(len(tree)) if tree.parents[i] == last), None)
    judged = [int(tree.tokens[i]) for i in path] + ([] if child is None else [int(tree.tokens[child])])
    rec = StepRecord(step, len(judged), np.asarray(judged, np.int64), n, P + len(tree), t1 - t0, t2 - t1,
                     [int(tree.tokens[i]) for i in path] + [int(t)], nodes=len(tree),
                     chain=greedy_run(tree, path))
    fed = fed_prefix(tree, path) if backend.draft_keeps_proposals else []
    return rec, (state.t_len + P + np.asarray(path, np.int64), np.asarray(fed, np.int64))


def _tail(backend, state: DecodeState, rec: StepRecord, keep, stops: set, stats: DecodeStats) -> None:
    """Every step's end: cut the emitted tokens after a stop, keep the draft's valid rows (a tree's
    accepted rows are moved where a chain would have them), move the sequence, count."""
    cut = next((i for i, x in enumerate(rec.emitted) if x in stops), None)
    if cut is not None and cut < rec.accepted:
        stats.branches["stop_in_block"] += 1     # tokens after an accepted stop are dropped
    if cut is not None:
        rec.emitted = rec.emitted[:cut + 1]
    here = len(state.seq)       # the row of the first accepted token, in both caches
    if isinstance(keep, tuple):                  # a tree: its accepted rows, the draft's fed ones
        rows, fed = keep
        kept = min(len(fed), len(rec.emitted))
        backend.keep_rows(here, rows, here, fed[:kept])
        state.d_len = here + kept
    elif keep is not None:
        state.d_len = here + min(keep, len(rec.emitted))
    state.seq.extend(rec.emitted)
    state.t_len = len(state.seq) - 1
    stats.count(rec)


def tree_fits(backend, state: DecodeState, shape: TreeShape, room: int) -> bool:
    """The tree's verify and draft rows fit the caches, and its deepest path the room left."""
    pending, fed = len(state.seq) - state.t_len, len(state.seq) - state.d_len
    draft_rows = state.d_len + fed + shape.topk * (shape.depth - 1)
    return shape.depth <= room and state.t_len + pending + shape.nodes <= backend.max_len \
        and draft_rows <= backend.max_len


def generate(backend, prompt_ids, rule, policy, *, stop_ids=(), max_new: int, clock=wall_ms,
             positions=None, rope_delta: int = 0, observer=None, lookup=None, budget=None):
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
                    clock=clock, stats=stats, observer=observer, lookup=lookup, budget=budget)
    return state.seq[len(ids):], reason, stats
