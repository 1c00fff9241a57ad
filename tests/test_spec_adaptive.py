"""Adaptive draft length: the expected-tokens model, the acceptance-rate estimate, the choice."""
import collections

import numpy as np
import pytest

from runtime.adaptive import AcceptanceRate, CostModel, StepPolicy, best_k, expected_tokens
from types import SimpleNamespace

from policies import chain_record
from runtime.budget import CycleBudget, _Sums, draft_key
from runtime.step import Chain
from runtime.config import BudgetConfig


def simulate_step(rng, a, k):
    """Accept each of k draft tokens independently with prob a until the first rejection."""
    n = 0
    while n < k and rng.random() < a:
        n += 1
    return n


def test_expected_tokens_matches_simulation():
    rng = np.random.default_rng(0)
    for a, k in ((0.3, 2), (0.7, 5), (0.9, 8)):
        sim = np.mean([simulate_step(rng, a, k) + 1 for _ in range(20000)])
        assert abs(sim - expected_tokens(a, k)) < 0.05
    assert expected_tokens(1.0, 4) == 5 and expected_tokens(0.0, 4) == 1


def test_acceptance_rate_recovers_a():
    rng = np.random.default_rng(1)
    for a in (0.2, 0.6, 0.9):
        rate = AcceptanceRate(decay=1.0)
        for _ in range(3000):
            k = int(rng.integers(1, 9))
            rate.observe(k, simulate_step(rng, a, k))
        assert abs(rate.value - a) < 0.03


def costs(draft_ms, verify_ms, per_token_ms):
    return CostModel(BudgetConfig(prior_draft_step_ms=draft_ms, prior_verify_ms=verify_ms,
                                  prior_verify_per_token_ms=per_token_ms))


def test_best_k_maximises_tokens_per_ms():
    cheap = costs(0.5, 10.0, 0.2)                  # a small draft, a wide verify is nearly free
    ks = [best_k(a, cheap, 8) for a in (0.2, 0.5, 0.8, 0.95)]
    assert ks == sorted(ks) and ks[0] <= 2 and ks[-1] == 8
    same = costs(10.0, 10.0, 0.2)                  # the draft costs as much as the target
    assert best_k(0.6, same, 8) == 1
    for a in (0.3, 0.7):                           # the choice is the brute-force optimum
        rates = [expected_tokens(a, k) / (k * 0.5 + 10.0 + 0.2 * k) for k in range(1, 9)]
        assert best_k(a, cheap, 8) == 1 + int(np.argmax(rates))


def test_the_policy_learns_from_measured_steps():
    model = costs(5.0, 10.0, 0.2)                  # priors say drafting is expensive
    policy = StepPolicy(model, k=4, adaptive=True, k_max=8)
    first = policy.plan(1).k
    for _ in range(30):                            # measured: drafting is cheap, all accepted
        k = policy.plan(1).k
        policy.record(chain_record(k, k, draft_ms=0.1 * k, verify_ms=10.0 + 0.2 * k, width=k + 1))
    assert policy.plan(1).k > first and policy.plan(1) == Chain(8)
    capped = SimpleNamespace(cap=lambda k, pending, free=False: min(k, 2))
    assert CycleBudget.fit(capped, StepPolicy(model, k=6, adaptive=False, k_max=8).plan(1), 1) == Chain(2)


def bursty_step(rng, k, p_long=0.6):
    """Acceptance in runs, as a reasoning text has it: with prob p_long the step is inside a long
    routine stretch (every draft token accepted), else it meets a near-tie within 2 tokens."""
    run = 10**6 if rng.random() < p_long else int(rng.integers(0, 3))
    return min(run, k)


def test_the_life_table_recovers_bursty_runs_that_the_geometric_model_undervalues():
    rng = np.random.default_rng(2)
    rate = AcceptanceRate(decay=1.0)
    for _ in range(4000):
        k = int(rng.integers(1, 9))                # censored at assorted k, as an adaptive run is
        rate.observe(k, bursty_step(rng, k))
    true = {k: np.mean([bursty_step(rng, k) + 1 for _ in range(20000)]) for k in range(1, 9)}
    for k in (2, 5, 8):
        assert abs(rate.expected(k) - true[k]) < 0.1
    # the geometric model with the same pooled rate overvalues short steps and undervalues long ones
    assert expected_tokens(rate.value, 2) > true[2] + 0.05 and expected_tokens(rate.value, 8) < true[8] - 0.1
    # so where a draft step costs a fifth of a verify pass it stops short of the best k; the life
    # table picks the brute-force optimum of the true tokens per ms
    model = costs(2.0, 10.0, 0.2)
    best = 1 + int(np.argmax([true[k] / model.step_expected(k) for k in range(1, 9)]))
    assert best_k(rate, model, 8) == best and best_k(rate.value, model, 8) < best


def test_the_life_table_is_the_geometric_model_when_acceptance_is_independent():
    rng = np.random.default_rng(3)
    rate = AcceptanceRate(decay=1.0)
    for _ in range(6000):
        k = int(rng.integers(1, 9))
        rate.observe(k, simulate_step(rng, 0.8, k))
    for k in (1, 4, 8):
        assert abs(rate.expected(k) - expected_tokens(0.8, k)) < 0.1


def test_positions_no_step_reached_follow_the_pooled_rate_and_bad_counts_are_refused():
    rate = AcceptanceRate(decay=1.0)
    for _ in range(50):
        rate.observe(2, 2)                         # never proposed past position 2
    h = rate.hazards()
    assert h[5] == pytest.approx(1.0 - rate.value) and h[0] < h[5]
    with pytest.raises(ValueError, match="allowed 0 <= n <= k"):
        rate.observe(3, 4)


def test_where_a_step_starts_in_the_phase_picks_its_table():
    """Routine wording first (long runs), the commitment after (runs end early): the policy, which
    counts the tokens its steps emitted, drafts long at the start of a phase and short later.
    One table for every offset would choose one k for both."""
    rng = np.random.default_rng(4)
    model = costs(2.0, 10.0, 0.2)
    rate = AcceptanceRate()
    early, late = [], []
    for _ in range(40):                           # 40 phases of 48 tokens
        policy = StepPolicy(model, k=4, adaptive=True, k_max=8, rate=rate)
        while policy.at < 48:
            k = policy.plan(1).k
            (early if policy.at < 16 else late).append(k)
            n = min(k, 10**6 if policy.at < 16 else int(rng.integers(0, 2)))
            policy.record(chain_record(k, n, draft_ms=2.0 * k, verify_ms=10.0 + 0.2 * (k + 1), width=k + 1))
    assert rate.expected(8, at=0) > 8.5 and abs(rate.expected(1, at=40) - 1.5) < 0.2
    # late steps draft 1-2 tokens; now and then one probes long again (the evidence at positions
    # a short k never reaches fades, and the other tables' long runs pull it up) and is corrected
    assert np.mean(early[-20:]) == 8 and np.median(late[-40:]) <= 2 and sum(k > 2 for k in late[-40:]) <= 6


def test_one_lucky_verify_pass_does_not_steer_the_choice():
    """Verify costs are noisy per pass; the choice prices widths by a line through all of them, so
    a width measured once on a quiet moment is not taken for cheap at every step after."""
    model = costs(5.0, 10.0, 0.2)
    model.observe("draft", 1.0)
    rng = np.random.default_rng(5)
    for _ in range(20):
        for w in (2, 5, 9):
            model.observe(("verify", w), 10.0 + 0.2 * w + rng.normal(0, 0.3))
    model.observe(("verify", 8), 4.0)                  # one pass of width 8, on a quiet moment
    assert model.expected(("verify", 8)) < model.expected(("verify", 5))   # its own mean: cheapest
    assert abs(model.step_expected(7) - (7 * 1.0 + 10.0 + 0.2 * 8)) < 1.0
    rate = AcceptanceRate(decay=1.0)
    for _ in range(200):
        rate.observe(8, 3)                             # runs end at the fourth token
    assert best_k(rate, model, 8) == 3
    one = costs(5.0, 10.0, 3.0)                        # a steep prior slope, one width measured
    one.observe(("verify", 2), 9.0)
    assert one.step_expected(8, draft=False) == 9.0    # flat from it: a wider step gets tried


def test_what_a_step_costs_besides_its_calls_favours_longer_steps():
    """Acceptance and cache bookkeeping cost every step the same, whatever its k: a policy blind
    to it drafts too short. The loop reports it (observe_overhead) and the choice prices it."""
    rate = AcceptanceRate(decay=1.0)
    rng = np.random.default_rng(6)
    for _ in range(3000):
        k = int(rng.integers(1, 9))
        rate.observe(k, simulate_step(rng, 0.75, k))
    policy = StepPolicy(costs(1.5, 10.0, 0.2), k=4, adaptive=True, k_max=8, rate=rate)
    blind = policy.plan(1).k
    policy.observe_overhead(15.0, Chain(4))
    assert policy.costs.step_expected(4) == pytest.approx(4 * 1.5 + 10.0 + 0.2 * 4 + 15.0)
    assert policy.plan(1).k > blind


def test_a_draft_call_with_a_fixed_part_is_priced_by_a_line_not_per_token():
    """A draft call costs a fixed part (feeding what it missed, the call) plus its k steps. Priced
    per token (a call's time over its k), short calls look dear per token and every longer k is
    overpriced: the choice drafts shorter than the true optimum, and keeps its short calls' high
    per-token mean. The line through the measured calls recovers the true optimum."""
    fixed, per, verify = 3.0, 0.6, 10.0
    rate = AcceptanceRate(decay=1.0)
    rng = np.random.default_rng(7)
    for _ in range(3000):
        k = int(rng.integers(1, 9))
        rate.observe(k, simulate_step(rng, 0.85, k))
    true = [rate.expected(k) / (fixed + per * k + verify) for k in range(1, 9)]
    policy = StepPolicy(costs(5.0, verify, 0.0), k=4, adaptive=True, k_max=8, rate=rate)
    for k in (2, 3, 3, 4, 2, 3):                     # an adaptive run that drafted short so far
        policy.record(chain_record(k, k, draft_ms=fixed + per * k, verify_ms=verify, width=k + 1))
    line = policy.costs.draft_line
    assert line(8) == pytest.approx(fixed + per * 8) and line(1) == pytest.approx(fixed + per)
    per_token = [rate.expected(k) / (k * policy.costs.expected("draft") + verify) for k in range(1, 9)]
    assert 1 + int(np.argmax(per_token)) < 1 + int(np.argmax(true))     # what pricing per token chose
    assert policy.plan(1).k == 1 + int(np.argmax(true))
    one = costs(5.0, verify, 0.0)                   # one call length measured: per token, as before
    one.observe("draft", 1.0), one.observe(draft_key(4), 4.0)
    assert one.draft_line(6) == 6.0


def _line(xs, ys, counts):
    """The cost model's line through (xs, ys), each point taken `counts` times, none fading."""
    sums = _Sums(1.0)
    for x, y, c in zip(xs, ys, counts):
        for _ in range(c):
            sums.add(x, y)
    return sums.line()


def test_the_lines_keep_slope_and_intercept_non_negative():
    assert _line([1, 2, 3], [5.0, 4.0, 3.0], [1, 1, 1]) == (4.0, 0.0)          # falling: the mean
    icpt, slope = _line([4, 8], [1.0, 3.0], [1, 1])                           # through (0, -1)
    assert icpt == 0.0 and slope == pytest.approx((4 * 1 + 8 * 3) / (16 + 64))  # through the origin
    icpt, slope = _line([2, 4, 8], [3.0, 5.0, 9.0], [1, 4, 9])
    assert (icpt, slope) == (pytest.approx(1.0), pytest.approx(1.0))


def test_every_k_priced_at_once_is_each_k_priced_alone():
    rng = np.random.default_rng(8)
    for trial in range(20):
        model = costs(2.0, 10.0, 0.5)
        model.searches = bool(trial % 2)
        for _ in range(int(rng.integers(0, 12))):
            k = int(rng.integers(1, 9))
            model.observe(("verify", k + 1), float(rng.uniform(5, 15)))
            if rng.random() < 0.7:
                model.observe("draft", float(rng.uniform(0.5, 2))), model.observe(draft_key(k), float(rng.uniform(1, 15)))
            if rng.random() < 0.3:
                model.observe("overhead", float(rng.uniform(0, 1))), model.observe("lookup", 0.2)
        for pending, draft in ((1, True), (2, True), (1, False)):
            assert model.steps_expected(8, pending, draft) == pytest.approx(
                [model.step_expected(k, pending, draft) for k in range(1, 9)])


def test_a_slow_pass_at_a_width_no_longer_taken_fades_from_the_verify_line():
    """On a shared CPU one pass now and then is slowed by another process. A width's running mean
    that caught one keeps it while the choice stays off that width, and the choice stays off it
    because of it. The verify line is fitted to every pass, each fading with the passes after it:
    the slow pass stops counting though its width is never measured again (its own mean, for the
    budget's worst case, still has it)."""
    true = lambda w: 10.0 + 0.1 * w
    model = costs(2.0, 10.0, 0.5)
    passes = collections.Counter()
    for w in (5, 9, 5, 9, 7, 7):
        model.observe(("verify", w), true(w)), passes.update([w])
    model.observe(("verify", 9), true(9) + 20.0), passes.update([9])     # a pass slowed two-fold
    assert model.verify_line(9) > true(9) + 2.0                 # right after it, it counts
    for i in range(200):                                        # the choice takes 5..7 from then on
        model.observe(("verify", 5 + i % 3), true(5 + i % 3)), passes.update([5 + i % 3])
    for w in (2, 9):                                            # less than 1 % of the slow pass left
        assert abs(model.verify_line(w) - true(w)) < 0.01 * 20.0
    assert model.expected(("verify", 9)) > true(9) + 2.0        # the width's own mean kept it
    slope = (model.verify_line(9) - model.verify_line(5)) / 4    # what prices a longer k: true 0.1
    widths = (5, 6, 7, 9)                      # a line through the widths' means (count-weighted) keeps it:
    _, old = _line(widths, [model.expected(("verify", w)) for w in widths],      # every longer k
                   [passes[w] for w in widths])                                  # priced dearer for good
    assert old > 2 * 0.1
    assert slope - 0.1 < (old - 0.1) / 5


def test_a_width_whose_weight_has_faded_to_nothing_gives_no_slope():
    """One pass at width 5, then thousands at width 9 only: the width-5 pass's weight is 0.98^n,
    and a slope through it would be round-off. The line is then flat at width 9's mean (for the
    draft: no line, per-token pricing), as with one width measured."""
    model = costs(2.0, 10.0, 0.5)
    model.observe(("verify", 5), 30.0)
    model.observe(draft_key(4), 30.0)
    for _ in range(3000):
        model.observe(("verify", 9), 11.0)
        model.observe("draft", 1.0), model.observe(draft_key(8), 8.0)
    assert model.verify_line(2) == pytest.approx(11.0) and model.verify_line(33) == pytest.approx(11.0)
    assert model.draft_line(3) == pytest.approx(3.0)         # 3 x the per-token mean
    model.observe(("verify", 5), 10.6)                       # a second width, measured now
    assert model.verify_line(9) - model.verify_line(5) == pytest.approx(0.4, abs=0.05)
