"""Lookup drafting (runtime/reuse.py Lookup) on the numpy table backend: greedy output equals
plain decoding token for token, the draft model's cache stays correct across lookup steps (a
draft equal to the target then accepts all it proposes), sampled output follows the target's
joint distribution (the point-mass proposal), and the statistical test catches a wrong rule."""
from collections import Counter

import numpy as np
import pytest

from runtime.adaptive import CostModel, StepPolicy
from runtime.config import BudgetConfig
from runtime.loop import GreedyRule, SamplingRule, generate
from runtime.reuse import CycleLookup, Lookup
from distribution import chi2_z, exact_joint
from table_backend import TableBackend, prompts

V, STOP = 48, 3


def policy(k, adaptive=False, k_max=8):
    return StepPolicy(CostModel(BudgetConfig()), k, adaptive, k_max)


def backend(noise):
    return TableBackend(V, max_len=256, seed=0, draft_noise=noise, stop_id=STOP, stop_slope=0.06)


def lookup_of(texts, prompt, ngram=1):
    store = Lookup(cycles=len(texts) or 1, ngram=ngram)
    for t in texts:
        store.remember(t)
    return CycleLookup(store, len(prompt) - 1)


def test_propose_takes_the_longest_matching_tail_most_recent_text_first():
    store = Lookup(cycles=2, ngram=2)
    store.remember([9, 1, 2, 3, 4, 5])
    store.remember([9, 7, 2, 3, 8, 8])
    assert store.propose([0, 2, 3], 2).tolist() == [8, 8]          # both match "2 3": the newer
    assert store.propose([0, 1, 2, 3], 3).tolist() == [4, 5]       # "1 2 3" only in the older
    assert store.propose([0, 5, 6], 3).size == 0                    # no tail of >= 2 tokens matches
    assert store.propose([4, 5], 4).size == 0                       # matched at the end: nothing follows


@pytest.mark.parametrize("noise", [0.0, 0.4])
def test_greedy_with_lookup_equals_plain_and_the_draft_cache_stays_correct(noise):
    """Lookup texts: this prompt's own plain output (long matches), other prompts' outputs and
    noise (partial matches, rejections); the model draft runs between lookup steps."""
    be, rng = backend(noise), np.random.default_rng(5)
    ps = prompts(40, seed=1)
    plains = [generate(be, p, GreedyRule(), policy(0), stop_ids=[STOP], max_new=40)[0] for p in ps]
    looked, rejected, model_steps, mismatches = 0, 0, [], []
    for i, p in enumerate(ps):
        own = list(plains[i])
        if i % 3 == 1:         # the own text, with a wrong token in the middle
            own[len(own) // 2] = int(rng.integers(4, V))
        texts = [[int(p[-1])] + own, [int(p[-1])] + list(plains[i - 1]), list(rng.integers(4, V, 12))]
        steps = []
        out, _, stats = generate(be, p, GreedyRule(), policy(4, adaptive=i % 2 == 0), stop_ids=[STOP],
                                 max_new=40, lookup=lookup_of(texts, p, ngram=2), observer=steps.append)
        if out != plains[i]:
            mismatches.append(i)
        looked += stats.looked_up
        rejected += sum(s.source == "lookup" and s.accepted < s.k for s in steps)
        model_steps += [s for s in steps if s.source == "model"]
    assert not mismatches, f"lookup decoding != plain on prompts {mismatches[:5]}"
    assert looked > 0 and rejected > 0 and model_steps, (looked, rejected, len(model_steps))
    if noise == 0.0:    # the draft is the target: with a correct cache it is always right
        wrong = [s for s in model_steps if s.accepted < s.k]
        assert not wrong, f"{len(wrong)} model-draft steps rejected after lookup steps: stale draft cache"


def sampled_z_with_lookup(accept=None, runs: int = 6000) -> tuple[float, int]:
    """Chi-square z of `runs` sampled 4-token outputs (vocab 4, k = 3) with lookup proposals
    from a fixed text, against the exact joint; and how many tokens lookup proposed."""
    import runtime.loop

    be = TableBackend(4, max_len=32, seed=3, draft_noise=1.0)
    prompt, n, temperature = np.array([1, 2, 0, 3]), 4, 0.8
    exact = exact_joint(be, prompt, n, temperature, 1.0)
    texts = [[3, 1, 1, 2, 0, 2, 3, 3, 0, 1]]
    rng = np.random.default_rng(11)
    counts, looked = Counter(), 0
    saved = runtime.loop.accept_sampling
    if accept is not None:
        runtime.loop.accept_sampling = accept
    try:
        for _ in range(runs):
            out, _, stats = generate(be, prompt, SamplingRule(temperature, 1.0, rng), policy(3, k_max=3),
                                     max_new=n, lookup=lookup_of(texts, prompt, ngram=2))
            counts[tuple(out)] += 1
            looked += stats.looked_up
    finally:
        runtime.loop.accept_sampling = saved
    keys = sorted(exact)
    return chi2_z(np.array([counts[k] for k in keys]), np.array([exact[k] for k in keys])), looked


def test_sampling_with_lookup_proposals_follows_the_target_joint_distribution():
    z, looked = sampled_z_with_lookup()
    assert looked > 1000, f"lookup proposed only {looked} tokens: the test would not exercise it"
    assert z < 4.0, f"sampled sequences with lookup do not follow the target (chi-square z={z:.1f})"


def test_the_lookup_sampling_test_catches_accepting_every_lookup_proposal():
    from runtime.acceptance import accept_sampling, sample

    def accept_lookup(draft, q, p, rng):     # wrong for point masses only: model drafts stay exact
        if len(draft) and (q.max(axis=-1) == 1.0).all():
            return len(draft), sample(p[len(draft)], rng.random())
        return accept_sampling(draft, q, p, rng)
    z, _ = sampled_z_with_lookup(accept_lookup, runs=2000)
    assert z > 8.0, f"a rule that accepts every lookup proposal passed the test (z={z:.1f})"


def scan(texts, ngram, context, k):
    """The plain scan the index replaces: longest tail first, most recent text, first place."""
    context = list(context)
    for n in range(min(8, len(context)), ngram - 1, -1):
        for text in reversed(texts):
            for i in range(len(text) - n):
                if text[i:i + n] == context[-n:]:
                    return text[i + n:i + n + k]
    return []


def test_the_indexed_search_proposes_what_the_scan_of_the_texts_proposes():
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(300):
        ngram, cycles = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        store = Lookup(cycles=cycles, ngram=ngram)
        texts = [list(rng.integers(0, 6, int(rng.integers(0, 30)))) for _ in range(int(rng.integers(0, 7)))]
        for t in texts:
            store.remember(t)
        kept = [[int(x) for x in t] for t in texts[-cycles:]] if texts else []
        context = list(rng.integers(0, 6, int(rng.integers(0, 12))))
        k = int(rng.integers(1, 9))
        want = scan(kept, ngram, context, k)
        assert store.propose(context, k).tolist() == [int(x) for x in want], (trial, texts, context)
        checked += bool(want)
    assert checked > 50          # most trials matched something: the comparison is not vacuous


@pytest.mark.parametrize("kind", ["random", "one token repeated"])
def test_a_search_stays_under_a_millisecond_at_the_largest_settings(kind):
    """reuse.lookup_cycles = 64 texts of max_reasoning_tokens = 4,096, ngram 1 (the largest
    allowed): a scan of the texts took ~193 ms per step; the index reads at most 8 x 64 entries."""
    import time

    from runtime.config import ReuseConfig, PlannerConfig

    cfg = PlannerConfig(max_reasoning_tokens=4096, reuse=ReuseConfig(lookup=True, lookup_cycles=64, lookup_ngram=1))
    rng = np.random.default_rng(0)
    store = Lookup(cfg.reuse.lookup_cycles, cfg.reuse.lookup_ngram)
    for _ in range(cfg.reuse.lookup_cycles):
        text = rng.integers(0, 40, cfg.max_reasoning_tokens) if kind == "random" else np.full(cfg.max_reasoning_tokens, 5)
        store.remember(text)
    contexts = [list(rng.integers(100, 200, 40)), list(rng.integers(0, 40, 40)), [5] * 40]
    for context in contexts:
        times = []
        for _ in range(21):
            t0 = time.perf_counter()
            store.propose(context, 16)
            times.append((time.perf_counter() - t0) * 1e3)
        assert float(np.median(times)) < 1.0, (kind, context[:4], np.median(times))


class SlowLookup(CycleLookup):
    """A lookup whose every search costs `ms` on the fake clock."""

    def __init__(self, store, start, clock, ms):
        super().__init__(store, start)
        self.clock, self.ms, self.searches = clock, ms, 0

    def propose(self, seq, k):
        self.clock.advance(self.ms)
        self.searches += 1
        return super().propose(seq, k)


@pytest.mark.parametrize("search_ms", [0.5, 8.0])
def test_the_search_is_measured_and_the_budget_keeps_room_for_it(search_ms):
    """Each search's time is in the decode stats and the cost model; every step the budget
    allows leaves room for the next search and the trajectory reserve, so reasoning never runs
    into the reserve however slow the search is."""
    from runtime.budget import CycleBudget, FakeClock

    clock = FakeClock()
    be = TableBackend(V, max_len=256, seed=0, draft_noise=0.0, stop_id=STOP, stop_slope=0.0, clock=clock,
                      costs={"draft": 1.0, "verify": 4.0, "prefill": 10.0})
    cfg = BudgetConfig(budget_ms=120.0, margin_ms=2.0, prior_trajectory_ms=20.0, prior_lookup_ms=1.0)
    costs = CostModel(cfg, searches=True)
    budget = CycleBudget(cfg, costs, clock)
    p = prompts(1, seed=3)[0]
    store = Lookup(cycles=1, ngram=1)
    store.remember([int(p[-1])] + list(range(4, V)) * 3)     # something to propose
    look = SlowLookup(store, len(p) - 1, clock, search_ms)
    pol = StepPolicy(costs, 4, False, 8)
    out, reason, stats = generate(be, p, GreedyRule(), pol, stop_ids=[STOP], max_new=200, lookup=look,
                                  clock=clock, budget=budget)
    assert look.searches >= 2
    assert stats.lookup_ms == pytest.approx(search_ms * look.searches)
    assert costs.mean["lookup"] == pytest.approx(search_ms)
    assert reason == "budget"                                       # the budget, not the cache, ended it
    assert budget.left_ms() >= budget.reserve_ms() - 1e-9, (budget.left_ms(), budget.reserve_ms())
    blind = CostModel(cfg)                                          # the same costs, the search not priced
    for key in costs.mean:
        blind.observe(key, costs.mean[key])
    assert costs.step_worst(4) - blind.step_worst(4) == pytest.approx(costs.worst("lookup"))
