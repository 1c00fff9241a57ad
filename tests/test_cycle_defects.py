"""Regressions of the whole-cycle defects (issue 16): a reserve that stuck, unbounded waits on
the fallback worker, two expert batches at once on a CPU, highway and reversing histories,
config values that were silently misread. Each test failed before its fix."""
import threading

import numpy as np
import pytest

from core.config import ConfigError
from prompt.trajectory import encode_history, saturate_history
from prompt.vocab import Tokenizer
from table_backend import TableBackend
from runtime.budget import FakeClock
from runtime.checks import check_trajectory, comfortable_stop, ego_speed
from runtime.config import BudgetConfig, CheckConfig, PlannerConfig, SpecConfig, load_planner_config
from runtime.planner import Planner

TOK = Tokenizer.build("ego is cruising at 12 m/s , so keep speed the lead brakes slow down".split())
T = np.arange(-15, 1) * 0.1
IMAGES = np.random.default_rng(0).integers(0, 256, (4, 2, 64, 96, 3), dtype=np.uint8)


def history(speed):
    return np.stack([speed * T, 0 * T, 0 * T], 1)


def budget_cfg(budget_ms=100.0):
    return BudgetConfig(budget_ms=budget_ms, margin_ms=5.0, worst_case_factor=1.0, prior_vision_ms=10,
                        prior_prefill_ms=20, prior_draft_step_ms=1.0, prior_verify_ms=4.5,
                        prior_verify_per_token_ms=0.5, prior_trajectory_ms=15)


def test_one_slow_trajectory_does_not_lock_the_reasoning_out():
    """Fake clock, 100 ms budget, inline fallback; one 70 ms trajectory. Before the fix the
    reserve stayed at 1.0 x 70 + 5 and the next 1,000 cycles were all prefill +
    budget_exhausted; now the reasoning is back within a few cycles and stays."""
    clock, n = FakeClock(), {"action": 0}

    def action(_):
        n["action"] += 1
        return 70.0 if n["action"] == 3 else 15.0

    costs = {"vision": 10.0, "prefill": 20.0, "draft": 1.0, "verify": lambda w: 4.0 + 0.5 * w, "action": action}
    be = TableBackend(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=1.0, clock=clock, costs=costs)
    p = Planner(be, TOK, PlannerConfig(spec=SpecConfig(k=4, adaptive=False), budget=budget_cfg(),
                                       fallback="inline"), clock=clock)
    results = [p.plan(IMAGES, history(8)) for _ in range(300)]
    steps = [r.decode.get("steps", 0) for r in results]
    slow = 1                      # cycle 2 ran the 3rd action call (its inline fallback)
    assert results[slow + 1].source == "prefill" and steps[slow + 1] == 0      # the slow one bit
    back = next(i for i in range(slow + 1, 300) if steps[i] > 0)
    assert back - slow <= 6, steps[:12]
    assert min(steps[back:]) > 0 and {r.source for r in results[back:]} <= {"reasoning", "cut_reasoning"}
    assert sum(r.source == "reasoning" for r in results[back:]) > 0


SAFETY_S = 30.0     # a wait on an event that should come at once; only a regression reaches it


class Gated(TableBackend):
    """action() in a worker thread blocks on the `gate` event (or raises); no wall-clock sleeps.
    `inside` counts the worker calls still running."""
    worker_raises, concurrent_action = False, True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.gate, self.inside = threading.Event(), 0

    def action(self, *args, **options):
        if threading.current_thread() is not threading.main_thread():
            if self.worker_raises:
                raise RuntimeError("injected fallback failure")
            self.inside += 1
            try:
                self.gate.wait(SAFETY_S)
            finally:
                self.inside -= 1
        return super().action(*args, **options)


class SpyLock:
    """The planner's expert lock, recording the main thread's waits on it (their timeouts) and
    setting `main_waits` when the main thread first asks for it."""

    def __init__(self, lock):
        self.lock, self.main_timeouts, self.main_waits = lock, [], threading.Event()

    def acquire(self, timeout=-1):
        if threading.current_thread() is threading.main_thread():
            self.main_timeouts.append(timeout)
            self.main_waits.set()
        return self.lock.acquire(timeout=timeout)

    def release(self):
        self.lock.release()


def gated_planner(**be_attrs):
    be = Gated(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3)
    for k, v in be_attrs.items():
        setattr(be, k, v)
    budget = BudgetConfig(budget_ms=400.0, margin_ms=5.0, prior_vision_ms=50, prior_prefill_ms=50,
                          prior_trajectory_ms=100)
    return Planner(be, TOK, PlannerConfig(budget=budget, fallback="worker"), clock=FakeClock()), be


def test_a_stuck_fallback_worker_holds_the_next_cycle_only_a_bounded_time():
    """Before: a worker that never finished held the next plan() until it did, counted in no
    stage. Now the wait is bounded: plan() returns while the worker is still blocked."""
    p, be = gated_planner()
    assert p.plan(IMAGES, history(8)).source == "reasoning"          # its fallback is blocked
    res = p.plan(IMAGES, history(8))
    assert be.inside >= 1, "plan() waited for the stuck worker to finish"
    assert "fallback_stuck" in res.flags and res.trajectory is not None
    assert "fallback_wait" in res.timing["stages_ms"]                 # the wait is a stage of its own
    be.gate.set()
    p.close()


def test_budget_off_waits_for_a_slow_fallback_instead_of_giving_up():
    """Before: with the budget off, the wait cap still came from the profile's trajectory prior
    (an Orin profile's 15 ms on a CPU: 60 ms), so the final trajectory gave up on an expert busy
    with a longer fallback and the cycle ended in a stop ("expert_busy"). The worker here holds
    the expert until the final trajectory asks for it."""
    be = Gated(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3)
    be.concurrent_action = False
    budget = BudgetConfig(budget_ms=0.0, prior_trajectory_ms=15.0)
    p = Planner(be, TOK, PlannerConfig(budget=budget, fallback="worker"), clock=FakeClock())
    spy = p.fallback.lock = SpyLock(p.fallback.lock)
    be.gate = spy.main_waits             # the fallback ends once the main thread waits for the expert
    for _ in range(2):
        spy.main_waits.clear()
        res = p.plan(IMAGES, history(8))
        assert res.source == "reasoning" and "expert_busy" not in res.flags, (res.source, res.flags, res.error)
    # the final trajectory's bounded wait (then run_expert takes the free lock, timeout -1) may
    # last as long as a hung worker takes, not the prior's 60 ms
    bounded = [t for t in spy.main_timeouts if t >= 0]
    assert len(bounded) == 2 and min(bounded) >= 10.0, spy.main_timeouts
    p.close()


def test_a_failed_fallback_worker_leaves_a_flag():
    p, _ = gated_planner(worker_raises=True)
    first = p.plan(IMAGES, history(8))
    assert first.source == "reasoning"                               # its fallback was not needed
    second = p.plan(IMAGES, history(8))
    assert "fallback_failed" in second.flags
    assert any("injected fallback failure" in n for n in second.notes)
    p.close()


class Counting(TableBackend):
    """Records how many action() calls run at once. The worker's call stays inside until the
    main thread arrives (asks for the expert lock, or calls action itself), and the reasoning
    starts only once the worker is inside, so a missing lock always shows as two at once."""
    concurrent_action = False
    handshake = True      # False where no worker runs (fallback on_failure): verify must not wait for one

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.active, self.most, self.count_lock = 0, 0, threading.Lock()
        self.worker_inside, self.main_arrived = threading.Event(), threading.Event()

    def vision(self, images):
        self.worker_inside.clear()
        self.main_arrived.clear()
        return super().vision(images)

    def verify(self, tokens, start, readout):
        if self.handshake:
            self.worker_inside.wait(SAFETY_S)
        return super().verify(tokens, start, readout)

    def action(self, *args, **options):
        worker = threading.current_thread() is not threading.main_thread()
        if not worker:
            self.main_arrived.set()
        with self.count_lock:
            self.active += 1
            self.most = max(self.most, self.active)
        if worker:
            self.worker_inside.set()
            self.main_arrived.wait(SAFETY_S)
        try:
            return super().action(*args, **options)
        finally:
            with self.count_lock:
                self.active -= 1


def test_never_two_expert_batches_at_once_on_a_cpu_backend():
    """Before: the final trajectory and the worker's fallback overlapped (1.4-3.3 s on CPU)."""
    be = Counting(len(TOK), draft_noise=0.0, stop_id=TOK.cot_end, stop_slope=1.0)
    p = Planner(be, TOK, PlannerConfig(fallback="worker"), clock=FakeClock())
    spy = p.fallback.lock = SpyLock(p.fallback.lock)
    be.main_arrived = spy.main_waits
    for _ in range(6):
        res = p.plan(IMAGES, history(8))
        assert res.trajectory is not None
    p.close()
    assert be.calls["action"] == 12 and be.most == 1


def test_on_failure_fallback_runs_the_expert_once_per_good_cycle():
    be = Counting(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3)
    be.handshake = False        # no worker starts: each verify would sit out SAFETY_S (180 s in all)
    p = Planner(be, TOK, PlannerConfig(fallback="on_failure"))
    res = p.plan(IMAGES, history(8))
    assert res.source == "reasoning" and be.calls["action"] == 1 and "fallback" not in res.timing["stages_ms"]


@pytest.mark.parametrize("speed", [33.0, 40.0, 44.0])
def test_highway_speeds_are_planned_with_saturated_history_tokens(speed):
    """Before: history tokens hold 32 m/s, the check allowed 60: at 33 m/s every cycle was
    input_error + stop. Now the history saturates (flagged) and the expert gets the true v0."""
    p = Planner(TableBackend(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3), TOK)
    res = p.plan(IMAGES, history(speed))
    assert res.error is None and "history_saturated" in res.flags and res.source != "stop"
    assert check_trajectory(res.trajectory, speed, CheckConfig()) == []


def test_saturation_keeps_representable_histories_and_clips_faster_ones():
    slow, clipped = saturate_history(history(20))
    assert not clipped and np.allclose(slow, history(20))
    fast, clipped = saturate_history(history(50))
    assert clipped and encode_history(fast).shape == (48,) and fast[-1].tolist() == [0, 0, 0]
    with pytest.raises(ValueError):
        encode_history(history(50))


@pytest.mark.parametrize("speed", [46.0, 59.0])
def test_a_history_too_fast_to_be_real_gets_a_stop_that_passes_the_checks(speed):
    """Before: histories up to 60 m/s were accepted, and above 45 m/s the delivered stop failed
    the planner's own speed check. Now max_history_speed <= max_speed: such a history is an
    input error and the stop starts from the last speed that passed (44 m/s here)."""
    p = Planner(TableBackend(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3), TOK)
    assert p.plan(IMAGES, history(44.0)).error is None
    res = p.plan(IMAGES, history(speed))
    assert "absurd" in res.error and res.source == "stop"
    assert check_trajectory(res.trajectory, 44.0, CheckConfig()) == []


@pytest.mark.parametrize("speed", [-1.0, -5.0])
def test_a_reversing_ego_gets_a_trajectory_that_passes_the_checks(speed):
    """Before: a history driving backwards delivered an all-zero stop that failed the checks
    (accel 80 m/s^2). Now the stop stops along -x and the checks read |v0|."""
    h = history(speed)
    p = Planner(TableBackend(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3), TOK)
    res = p.plan(IMAGES, h)
    v0 = ego_speed(h)
    assert res.trajectory is not None and check_trajectory(res.trajectory, v0, CheckConfig()) == []
    stop = comfortable_stop(v0, CheckConfig())
    assert stop[-1, 0] < 0 and np.all(np.diff(stop[:, 0]) <= 0)


@pytest.mark.parametrize("yaml_text,word", [
    ("budget: {budget_ms: .nan}", "not a finite number"),
    ("budget: {budget_ms: .inf}", "not a finite number"),
    ("spec: {adaptive: 'false'}", "must be true or false"),
    ("fallback: 'no'", "fallback='no' is not allowed"),
    ("spec: {k: 2.5}", "must be an integer"),
    ("budget: null", "expected a mapping"),
    ("spec: null", "expected a mapping"),
    ("budget: {budget_ms: 20.0}", "below prompt + vision + prefill + margin"),
    ("checks: {max_history_speed: 60.0}", "must not exceed checks.max_speed"),
    ("trajectory_samples: true", "must be an integer"),
])
def test_config_values_that_were_misread_are_refused(tmp_path, yaml_text, word):
    path = tmp_path / "p.yaml"
    path.write_text(yaml_text + "\n")
    with pytest.raises(ConfigError, match=word.replace("(", r"\(").replace("+", r"\+")):
        load_planner_config(path)


class HangsOnce(Gated):
    """concurrent_action False (one expert lock): the first worker call hangs on the gate while
    holding the lock; later worker calls run at once."""
    concurrent_action = False

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.worker_calls = 0

    def action(self, *args, **options):
        if threading.current_thread() is not threading.main_thread():
            self.worker_calls += 1
            if self.worker_calls == 1:
                self.inside += 1
                try:
                    self.gate.wait(SAFETY_S)
                finally:
                    self.inside -= 1
        return TableBackend.action(self, *args, **options)


def test_one_hung_fallback_does_not_hold_the_planner_in_stops():
    """Issue 23.4 (fake clock, one expert lock, the worker fallback): before, the hung first
    fallback kept the lock and every later cycle was a stop with expert_busy, never flagged
    fallback_stuck, the worker never replaced. Now the next cycle abandons and replaces the
    worker and the lock, and the reasoning resumes; the hung call, once it ends, releases only
    its own lock and its result is never read."""
    be = HangsOnce(len(TOK), draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3)
    budget = BudgetConfig(budget_ms=400.0, margin_ms=5.0, prior_vision_ms=50, prior_prefill_ms=50,
                          prior_trajectory_ms=25)
    p = Planner(be, TOK, PlannerConfig(budget=budget, fallback="worker"), clock=FakeClock())
    first = p.plan(IMAGES, history(8))
    hung = p.fallback.job
    assert "expert_busy" in first.flags and first.source == "stop" and hung is not None
    results = [p.plan(IMAGES, history(8)) for _ in range(5)]
    assert "fallback_stuck" in results[0].flags, results[0].flags
    for r in results:
        assert r.source == "reasoning" and "expert_busy" not in r.flags, (r.source, r.flags, r.error)
    assert sum("fallback_stuck" in r.flags for r in results) == 1
    # while the abandoned call still runs beside new expert calls (the backend cannot overlap
    # two), every cycle says so (issue 37: it ran unflagged)
    assert all("expert_overlap" in r.flags for r in results[1:]), [r.flags for r in results]
    be.gate.set()
    assert hung.exception(timeout=SAFETY_S) is None          # it released its own lock, no other
    later = [p.plan(IMAGES, history(8)) for _ in range(3)]
    assert all(r.source == "reasoning" and not r.flags for r in later), [r.flags for r in later]
    assert p.fallback.job is not hung and p.fallback.pending is not hung
    p.close()
