"""The latency budget with an injected clock: the table backend moves a FakeClock by a simulated
cost per call, so every decision is exact. Reasoning is cut exactly when the next step would
not leave room for the trajectory, every cycle delivers a trajectory, misses are flagged."""
import pytest
import numpy as np
from hypothesis import given, settings, strategies as st

from prompt.vocab import Tokenizer
from runtime.adaptive import CostModel
from table_backend import TableBackend
from runtime.budget import CycleBudget, FakeClock
from runtime.config import BudgetConfig, PlannerConfig, SpecConfig
from runtime.planner import Planner

TOK = Tokenizer.build("ego is cruising at 12 m/s , so keep speed the lead brakes slow down".split())
T = np.arange(-15, 1) * 0.1
HISTORY = np.stack([8 * T, 0 * T, 0 * T], 1)
IMAGES = np.random.default_rng(0).integers(0, 256, (4, 2, 64, 96, 3), dtype=np.uint8)
COSTS = {"vision": 10.0, "prefill": 20.0, "draft": 1.0, "verify": lambda w: 4.0 + 0.5 * w, "action": 15.0}


def budget_cfg(budget_ms, factor=1.0, margin=5.0):
    # priors = the simulated costs: the predicted worst cases are exact before any measurement
    return BudgetConfig(budget_ms=budget_ms, margin_ms=margin, worst_case_factor=factor,
                        prior_vision_ms=10, prior_prefill_ms=20, prior_draft_step_ms=1.0,
                        prior_verify_ms=4.5, prior_verify_per_token_ms=0.5, prior_trajectory_ms=15)


def planner(budget: BudgetConfig, costs=COSTS, k=4, adaptive=False, stop_slope=0.0, fallback="worker"):
    clock = FakeClock()
    be = TableBackend(len(TOK), max_len=1024, draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=stop_slope,
                      clock=clock, costs=costs)
    cfg = PlannerConfig(spec=SpecConfig(k=k, adaptive=adaptive), budget=budget, max_reasoning_tokens=200,
                        fallback=fallback)
    return Planner(be, TOK, cfg, clock=clock), be, clock


class StepLog:
    """Wraps CycleBudget.cap to record (now, k asked, k given, worst case of the step given)."""

    def __init__(self, monkeypatch):
        self.rows = []
        original = CycleBudget.cap
        log = self

        def cap(budget, k, pending=1, free=False):
            got = original(budget, k, pending, free)
            worst = None if got is None else budget.costs.step_worst(got, pending)
            log.rows.append((budget.clock(), k, got, worst, budget.deadline, budget.reserve_ms(), pending))
            return got

        monkeypatch.setattr(CycleBudget, "cap", cap)


def test_reasoning_is_cut_exactly_when_the_next_step_would_not_fit(monkeypatch):
    log = StepLog(monkeypatch)
    p, be, clock = planner(budget_cfg(100.0))
    res = p.plan(IMAGES, HISTORY)
    assert "budget_cut" in res.flags and "miss" not in res.flags and res.trajectory is not None
    assert res.source == "cut_reasoning"          # not "reasoning": the text was closed early
    allowed, cut = log.rows[:-1], log.rows[-1]
    for now, k, got, worst, deadline, reserve, pending in allowed:
        assert now + worst + reserve <= deadline                       # every step fitted
        if got < k:                                                    # shortened: k+1 did not fit
            assert now + p.costs.step_worst(got + 1, pending) + reserve > deadline
    now, k, got, _, deadline, reserve, pending = cut
    assert got is None and now + p.costs.step_worst(0, pending) + reserve > deadline
    assert any(g < k for _, k, g, *_ in allowed), "the cap never shortened a step"
    # the trajectory took its predicted 15 ms and the cycle ends inside the margin
    assert res.timing["total_ms"] <= 100.0 - 5.0 and res.timing["slack_ms"] >= 5.0


def test_no_budget_means_no_cut():
    p, _, _ = planner(BudgetConfig(budget_ms=0.0), stop_slope=0.5)
    res = p.plan(IMAGES, HISTORY)
    assert "budget_cut" not in res.flags and res.stop_reason == "stop" and res.timing["slack_ms"] is None


def test_a_slow_step_is_flagged_and_a_late_cycle_is_a_miss():
    calls = {"n": 0}

    def verify(w):
        calls["n"] += 1
        return 4.0 + 0.5 * w + (60.0 if calls["n"] == 3 else 0.0)   # one step 60 ms over its worst case

    p, _, _ = planner(budget_cfg(100.0), costs={**COSTS, "verify": verify})
    res = p.plan(IMAGES, HISTORY)
    assert "worst_case_exceeded" in res.flags and res.trajectory is not None
    assert ("miss" in res.flags) == (res.timing["total_ms"] > 100.0)


def test_vision_and_prefill_over_budget_still_deliver_a_flagged_trajectory():
    p, be, _ = planner(budget_cfg(40.0))       # 10 + 20 + 15 + 5 > 40: no reasoning fits
    res = p.plan(IMAGES, HISTORY)
    assert res.trajectory is not None and res.decode["steps"] == 0 and "budget_cut" in res.flags
    assert ("miss" in res.flags) == (res.timing["total_ms"] > 40.0)


def test_with_no_time_left_for_the_final_trajectory_the_prefill_one_leaves():
    """Inline fallback (15 ms) after vision + prefill: at 45 ms the final trajectory (15 ms +
    5 ms margin) would end after 55; the ready prefill trajectory leaves at 45, no miss."""
    p, be, _ = planner(budget_cfg(55.0), fallback="inline")
    res = p.plan(IMAGES, HISTORY)
    assert res.source == "prefill" and "budget_exhausted" in res.flags and "miss" not in res.flags
    assert res.timing["total_ms"] == 45.0 and be.calls["action"] == 1
    p, be, _ = planner(budget_cfg(40.0), fallback="inline")   # even that is late: flagged
    res = p.plan(IMAGES, HISTORY)
    assert res.source == "prefill" and {"budget_exhausted", "miss"} <= set(res.flags)


def test_worst_cases_are_learnt_from_measurements():
    costs = CostModel(BudgetConfig(worst_case_factor=1.5, prior_verify_ms=6.0, prior_verify_per_token_ms=0.5))
    assert costs.worst(("verify", 3)) == 7.0                         # prior until measured
    costs.observe(("verify", 3), 2.0)
    costs.observe(("verify", 3), 4.0)
    assert costs.worst(("verify", 3)) == 6.0                         # 1.5 x the largest seen
    costs.observe(("verify", 5), 6.0)                                # unmeasured width: linear fit
    assert 4.0 < costs.expected(("verify", 4)) < 6.0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(50.0, 200.0), st.integers(1, 8), st.booleans())
def test_guarantee_no_miss_while_steps_stay_within_their_worst_case(seed, budget_ms, k, adaptive):
    """Costs vary per call in [0.5, 1] x their prior and the factor is 2, so every step stays
    within its predicted worst case; vision + prefill + R fits. Then no cycle may miss."""
    rng = np.random.default_rng(seed)

    def u():
        return rng.uniform(0.5, 1.0)

    costs = {"vision": lambda w: 10 * u(), "prefill": lambda w: 20 * u(), "draft": lambda w: w * u(),
             "verify": lambda w: (4.0 + 0.5 * w) * u(), "action": lambda w: 15 * u()}
    p, _, _ = planner(budget_cfg(budget_ms, factor=2.0), costs=costs, k=k, adaptive=adaptive, stop_slope=0.05)
    for _ in range(3):
        res = p.plan(IMAGES, HISTORY)
        assert res.trajectory is not None
        assert "miss" not in res.flags and "worst_case_exceeded" not in res.flags, res.timing


def test_steps_over_their_worst_case_give_flagged_misses_never_silent():
    """Costs up to 1.5 x the prediction (factor 1): the premise fails, some cycles miss, and a
    cycle is flagged a miss exactly when it ran over the budget."""
    misses = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)

        def u():
            return rng.uniform(0.5, 1.5)

        costs = {"vision": lambda w: 10 * u(), "prefill": lambda w: 20 * u(), "draft": lambda w: w * u(),
                 "verify": lambda w: (4.0 + 0.5 * w) * u(), "action": lambda w: 15 * u()}
        p, _, _ = planner(budget_cfg(100.0), costs=costs, stop_slope=0.05)
        for _ in range(3):
            res = p.plan(IMAGES, HISTORY)
            assert res.trajectory is not None
            assert ("miss" in res.flags) == (res.timing["total_ms"] > 100.0)
            misses += "miss" in res.flags
    assert misses > 0


def test_the_prompt_build_is_a_stage_the_budget_counts():
    """Issue 23.11: ~37 ms of a cycle (the prompt build) fell in no stage and no worst case. Here
    the prompt build takes 37 ms on the fake clock: it is the stage "prompt", nothing is left
    unaccounted, and the budget's premise counts its worst case."""
    tok = Tokenizer.build("ego is cruising at 12 m/s , so keep speed the lead brakes slow down".split())
    clock = FakeClock()

    class SlowPrompt(TableBackend):
        building = False

        def vision_grid(self, image_shape):       # called by the prompt build of every cycle
            if self.building:
                clock.advance(37.0)
            return super().vision_grid(image_shape)

    be = SlowPrompt(len(tok), draft_noise=0.3, stop_id=tok.cot_end, stop_slope=0.3, clock=clock,
                    costs={"vision": 10.0, "prefill": 20.0, "draft": 1.0, "verify": 4.0, "action": 15.0})
    budget = BudgetConfig(budget_ms=200.0, worst_case_factor=1.0, prior_vision_ms=10, prior_prefill_ms=20,
                          prior_trajectory_ms=15)
    p = Planner(be, tok, PlannerConfig(budget=budget, fallback="inline"), clock=clock)
    be.building = True
    t = np.arange(-15, 1) * 0.1
    images = np.random.default_rng(0).integers(0, 256, (4, 2, 64, 96, 3), dtype=np.uint8)
    res = p.plan(images, np.stack([8 * t, 0 * t, 0 * t], 1))
    assert res.timing["stages_ms"]["prompt"] == pytest.approx(37.0)
    assert res.timing["unaccounted_ms"] == pytest.approx(0.0, abs=1e-6)
    premise = p.costs.premise(budget)
    assert premise["prompt_worst_ms"] == pytest.approx(37.0) and premise["need_ms"] == pytest.approx(37 + 10 + 20 + 15 + 5)
