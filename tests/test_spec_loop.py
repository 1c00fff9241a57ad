"""The speculative loop on the numpy table backend (tests/table_backend.py): greedy output
equals plain decoding for every k and adaptive k, every branch is hit, a budget cut is a
prefix, rollback bugs are caught, sampled output follows the target's joint distribution.

The table target reads every earlier cache row (a causal mean), so a wrong `start` or a stale
row changes its output; scenes here are synthetic token prompts (no images)."""
from collections import Counter

import numpy as np
import pytest

from runtime.adaptive import CostModel, StepPolicy
from runtime.backend import PrefillInputs
from table_backend import TableBackend, prompts
from runtime.config import BudgetConfig
from runtime.step import Chain
from policies import FixedK
from distribution import chi2_z, exact_joint, wrong_rule_resample_from_p
from runtime.loop import (DecodeState, DecodeStats, GreedyRule, SamplingRule, decode,
                          generate)

V, STOP = 48, 3


def backend(noise: float, seed: int = 0) -> TableBackend:
    return TableBackend(V, max_len=256, seed=seed, draft_noise=noise, stop_id=STOP, stop_slope=0.06)


def policy(k, adaptive=False):
    return StepPolicy(CostModel(BudgetConfig()), k, adaptive, 8)


def run(be, prompt, k, adaptive=False, max_new=48):
    return generate(be, prompt, GreedyRule(), policy(k, adaptive), stop_ids=[STOP], max_new=max_new)


@pytest.mark.parametrize("noise,scenes", [(0.0, 60), (0.4, 200), (1.5, 60)])
def test_greedy_speculative_equals_plain_for_every_k(noise, scenes):
    """scenes x (k = 1..8 and adaptive) per draft quality (self, noised, poor): token for token."""
    be, branches, mismatches = backend(noise), Counter(), []
    for i, prompt in enumerate(prompts(scenes)):
        plain, _, _ = run(be, prompt, 0)
        for k in [*range(1, 9), "adaptive"]:
            out, _, stats = run(be, prompt, 4 if k == "adaptive" else k, k == "adaptive",
                                max_new=48 if i % 4 else 9)   # every 4th scene hits max length
            branches.update(stats.branches)
            if out != plain[:len(out)] or len(out) != min(len(plain), 9 if i % 4 == 0 else 48):
                mismatches.append((i, k))
    assert not mismatches, f"speculative != plain at (scene, k) {mismatches[:5]}"
    need = {"all_accepted", "stop_in_block", "max_length"} | ({"partial", "first_rejected"} if noise else set())
    assert need <= set(branches), f"branches not hit: {need - set(branches)} (hit {dict(branches)})"


def test_self_draft_accepts_everything_tau_is_k_plus_1():
    be = backend(0.0)
    for k in (1, 3, 6):
        _, _, stats = generate(be, prompts(1, 3)[0], GreedyRule(), FixedK(k), max_new=1 + 10 * (k + 1))
        assert stats.accepted == stats.drafted and stats.tau == k + 1


def test_budget_cut_yields_a_prefix_of_plain_output():
    class StopAfter(FixedK):
        def __init__(self, k, steps):
            super().__init__(k)
            self.left = steps

        def plan(self, pending, proposal=None, trees=False):
            self.left -= 1
            return None if self.left < 0 else Chain(self.k)

    be = backend(0.4)
    for prompt in prompts(20, 5):
        plain, _, _ = run(be, prompt, 0)
        for steps in (0, 1, 3):
            out, reason, _ = generate(be, prompt, GreedyRule(), StopAfter(3, steps), stop_ids=[STOP], max_new=48)
            assert out == plain[:len(out)]
            assert reason == "budget" or out == plain


def test_forced_tokens_and_wide_pending_match_plain():
    """After forcing tokens (as <|cot_end|> <|traj_future_start|> are), the loop feeds several
    pending tokens at once; the result must equal plain decoding with the same forced tokens."""
    be = backend(0.4)
    for prompt in prompts(20, 7):
        outs = []
        for k in (0, 4):
            row = be.prefill(PrefillInputs(prompt, np.tile(np.arange(len(prompt)), (3, 1)), 0), "argmax")
            state = DecodeState.after_prefill(prompt, int(row[0]))
            decode(be, state, GreedyRule(), FixedK(k), limit=len(prompt) + 6)
            state.force([7, 8])
            decode(be, state, GreedyRule(), FixedK(k), limit=len(state.seq) + 12)
            outs.append(state.seq)
        assert outs[0] == outs[1]


class OffByOne(TableBackend):
    """A rollback bug: verify writes one row too far (as if the rejected row were kept)."""

    def verify(self, tokens, start, readout):
        return super().verify(tokens, start + 1, readout)


def test_the_equality_sweep_catches_a_rollback_bug():
    be_ok = backend(0.4)
    bad = OffByOne(V, max_len=256, seed=0, draft_noise=0.4, stop_id=STOP, stop_slope=0.06)
    diffs = sum(run(bad, p, 3)[0] != run(be_ok, p, 0)[0] for p in prompts(20))
    assert diffs > 0


def sampled_z(top_p: float, draft_head=None) -> float:
    """Chi-square z of 6000 sampled 4-token outputs (k = 3, vocab 4) against the exact joint;
    draft_head: the target ids of a reduced draft head (its q is zero outside them)."""
    be = TableBackend(4, max_len=32, seed=3, draft_noise=1.0, draft_head=draft_head)
    prompt, n, temperature = np.array([1, 2, 0, 3]), 4, 0.8
    exact = exact_joint(be, prompt, n, temperature, top_p)
    rng = np.random.default_rng(11)
    counts = Counter()
    for _ in range(6000):
        out, _, _ = generate(be, prompt, SamplingRule(temperature, top_p, rng), FixedK(3), max_new=n)
        counts[tuple(out)] += 1
    assert set(counts) <= {k for k, v in exact.items() if v > 0}, "a zero-probability output"
    keys = sorted(exact)
    return chi2_z(np.array([counts[k] for k in keys]), np.array([exact[k] for k in keys]))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampled_speculative_output_follows_the_target_joint_distribution(top_p):
    z = sampled_z(top_p)
    assert z < 4.0, f"sampled sequences do not follow the target (chi-square z={z:.1f})"


def test_sampled_output_is_exact_with_a_reduced_draft_head():
    """A draft head over 2 of the 4 tokens (q = 0 on tokens 1 and 2): the target still writes
    tokens 1 and 2 (through the residual max(0, p - q)), with the target's joint distribution."""
    be = TableBackend(4, max_len=32, seed=3, draft_noise=1.0, draft_head=[0, 3])
    prompt = np.array([1, 2, 0, 3])
    be.prefill(PrefillInputs(prompt, np.tile(np.arange(4), (3, 1)), 0), "logits")
    from runtime.backend import DraftSampling
    props, q = be.draft(prompt[-1:], 4, 3, DraftSampling(0.8, 1.0, np.random.default_rng(0).random(3)))
    assert set(props.tolist()) <= {0, 3} and np.all(q[:, [1, 2]] == 0), (props, q)
    z = sampled_z(1.0, draft_head=[0, 3])
    assert z < 4.0, f"sampled sequences do not follow the target with a reduced draft head (chi-square z={z:.1f})"


def test_the_joint_distribution_test_catches_a_wrong_rule(monkeypatch):
    import runtime.loop

    monkeypatch.setattr(runtime.loop, "accept_sampling", wrong_rule_resample_from_p)
    assert sampled_z(1.0) > 8.0
