"""Acceptance rules: greedy, relaxed (Spec-VLA, property tests), speculative sampling
(statistical: the emitted tokens follow the target distribution; a wrong rule is caught)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from runtime.acceptance import (TEXT_RANGE, accept_greedy, accept_relaxed, accept_sampling,
                                process_logits, sample, trajectory_range_ids)
from prompt.vocab import Tokenizer
from distribution import chi2_z, wrong_rule_resample_from_p


# --- greedy and relaxed ------------------------------------------------------------------------
def test_greedy_accepts_the_matching_prefix_and_adds_the_target_token():
    target = np.array([5, 6, 7, 8])
    assert accept_greedy(np.array([5, 6, 7]), target) == (3, 8)     # all accepted: bonus
    assert accept_greedy(np.array([5, 9, 7]), target) == (1, 6)     # partial: correction
    assert accept_greedy(np.array([1, 6, 7]), target) == (0, 5)     # first rejected
    assert accept_greedy(np.array([], np.int64), target[:1]) == (0, 5)   # k = 0: plain step


TOK = Tokenizer.build(["a", "b", "c", "d"])
RANGES = trajectory_range_ids(TOK)
TRAJ_IDS = np.flatnonzero(RANGES != TEXT_RANGE)
TEXT_IDS = np.flatnonzero(RANGES == TEXT_RANGE)


def test_range_ids_follow_the_tokenizer():
    assert (RANGES[list(TOK.hist_ids)] == 0).all() and (RANGES[list(TOK.fut_x_ids)] == 1).all()
    assert (RANGES[list(TOK.fut_y_ids)] == 2).all() and RANGES[TOK.cot_end] == TEXT_RANGE


@st.composite
def relaxed_case(draw):
    k = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    r = draw(st.integers(0, 8))
    rng = np.random.default_rng(seed)
    # target rows: random logits over a vocab mixing text and trajectory ids; argmax per row
    logits = rng.normal(size=(k + 1, len(TOK)))
    target = logits.argmax(-1)
    # draft: near the target's choice (same range, a few bins off), exact, or random
    draft = []
    for a in target[:k]:
        mode = rng.integers(3)
        d = a if mode == 0 else rng.integers(len(TOK)) if mode == 1 else a + rng.integers(-r - 2, r + 3)
        draft.append(int(np.clip(d, 0, len(TOK) - 1)))
    return np.array(draft), target, r


@settings(max_examples=300, deadline=None)
@given(relaxed_case())
def test_relaxed_acceptance_properties(case):
    draft, target, r = case
    n, t = accept_relaxed(draft, target, RANGES, r)
    assert t == target[n]                                      # the added token is the target's
    for i in range(n):                                         # accepted: exact, or same range within r
        d, a = draft[i], target[i]
        if RANGES[d] == TEXT_RANGE or RANGES[a] == TEXT_RANGE:
            assert d == a, "text tokens are accepted only when exact"
        else:
            assert RANGES[d] == RANGES[a] and abs(int(d) - int(a)) <= r
    if n < len(draft):                                         # the first refused really is out
        d, a = draft[n], target[n]
        assert d != a and (RANGES[d] != RANGES[a] or RANGES[d] == TEXT_RANGE or abs(int(d) - int(a)) > r)
    if r == 0:
        assert (n, t) == accept_greedy(draft, target)


# --- sampling -------------------------------------------------------------------------------
def test_process_logits_matches_transformers_top_p():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    p = process_logits(logits, 1.0, 0.8)          # keeps 0.5 + 0.3 (cumulative 0.8 reached)
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], rtol=1e-6)
    p = process_logits(logits, 1.0, 0.81)         # needs the third token too
    assert (p[0, :3] > 0).all() and p[0, 3] == 0
    masked = np.array([[1.0, -np.inf, 0.0]], np.float32)
    assert process_logits(masked, 0.6, 1.0)[0, 1] == 0 and process_logits(masked, 0.6, 1.0).dtype == np.float32


def test_sample_never_returns_a_zero_probability_token():
    p = np.array([0.0, 0.5, 0.0, 0.5, 0.0], np.float32)
    got = {sample(p, u) for u in np.linspace(0, 1 - 1e-12, 1001)}
    assert got == {1, 3}


def _tables(rng, k, V):
    """Target rows p (k+1, V) and draft rows q (k, V) that differ a lot (q hotter)."""
    logits = rng.normal(0, 1.5, (k + 1, V)).astype(np.float32)
    p = process_logits(logits, 1.0, 1.0)
    q = process_logits(logits[:k] + rng.normal(0, 1.5, (k, V)).astype(np.float32), 0.7, 1.0)
    return p, q


def _emitted_counts(rule, p, q, n_samples, seed):
    """counts[i, x]: how often x was emitted at position i (position i exists when n >= i)."""
    k, V = q.shape
    rng = np.random.default_rng(seed)
    counts = np.zeros((k + 1, V), np.int64)
    for _ in range(n_samples):
        draft = np.array([sample(q[i], rng.random()) for i in range(k)])
        n, t = rule(draft, q, p, rng)
        for i, x in enumerate(list(draft[:n]) + [t]):
            counts[i, x] += 1
    return counts


def test_speculative_sampling_emits_the_target_distribution_at_every_position():
    """As vLLM tests its rejection sampler: fixed p, q rows, many samples, each position's
    emitted tokens against p_i (given that position is reached)."""
    p, q = _tables(np.random.default_rng(1), k=3, V=6)
    counts = _emitted_counts(accept_sampling, p, q, 20000, seed=2)
    for i in range(4):
        assert counts[i].sum() > 1000, f"position {i} reached too rarely to test"
        z = chi2_z(counts[i], p[i])
        assert z < 4.0, f"position {i}: emitted tokens do not follow p (chi-square z={z:.1f})"


def _wrong_rule_accept_all(draft, q, p, rng):
    """Accepting every draft token emits q, not p."""
    return len(draft), sample(p[len(draft)], rng.random())


@pytest.mark.parametrize("rule", [wrong_rule_resample_from_p, _wrong_rule_accept_all])
def test_the_statistical_test_catches_a_wrong_rule(rule):
    p, q = _tables(np.random.default_rng(1), k=3, V=6)
    counts = _emitted_counts(rule, p, q, 20000, seed=2)
    z = max(chi2_z(counts[i], p[i]) for i in range(3))
    assert z > 8.0, f"a wrong rule passed the distribution test (z={z:.1f})"
