"""Adaptive draft length: the expected-tokens model, the acceptance-rate estimate, the choice."""
import numpy as np

from runtime.adaptive import AcceptanceRate, CostModel, StepPolicy, best_k, expected_tokens
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
    first = policy.next_k(1)
    for _ in range(30):                            # measured: drafting is cheap, all accepted
        k = policy.next_k(1)
        policy.observe(k, k, draft_ms=0.1 * k, verify_ms=10.0 + 0.2 * k, width=k + 1)
    assert policy.next_k(1) > first and policy.next_k(1) == 8
    capped = StepPolicy(model, k=6, adaptive=False, k_max=8, cap=lambda k, pending: min(k, 2))
    assert capped.next_k(1) == 2
