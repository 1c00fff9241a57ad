"""Output checks before a trajectory leaves, the comfortable stop, ego-history sanity."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from runtime.checks import (check_history, check_trajectory, comfortable_stop, ego_speed,
                            kinematics)
from prompt.trajectory import DT
from runtime.config import CheckConfig

CFG = CheckConfig()


def cruise(v=10.0, a=0.0, curvature=0.0):
    """(64, 3) waypoints of constant acceleration and curvature from speed v at the origin."""
    t = np.arange(1, 65) * DT
    s = v * t + 0.5 * a * t**2
    heading = curvature * s
    if curvature:
        x, y = np.sin(heading) / curvature, (1 - np.cos(heading)) / curvature
    else:
        x, y = s, 0 * s
    return np.stack([x, y, heading], 1).astype(np.float32)


def history(v=10.0):
    t = np.arange(-15, 1) * DT
    return np.stack([v * t, 0 * t, 0 * t], 1)


def test_feasible_trajectories_pass():
    for traj in (cruise(), cruise(20, -2), cruise(8, 1, 0.05), cruise(0.0)):
        assert check_trajectory(traj, float(np.hypot(*traj[0, :2]) / DT), CFG) == []


@pytest.mark.parametrize("mutate,word", [
    (lambda t: t.__setitem__((10, 0), np.nan), "non-finite"),
    (lambda t: t.__setitem__((slice(None), 0), t[:, 0] * 6), "speed"),
    (lambda t: t.__setitem__((slice(30, None), 0), t[30:, 0] + 3.0), "accel"),
    (lambda t: t.__setitem__((slice(None), 1), np.where(np.arange(64) % 2, 0.4, -0.4)), "curvature"),
])
def test_infeasible_trajectories_fail_with_the_reason(mutate, word):
    traj = cruise(10.0).copy()
    mutate(traj)
    problems = check_trajectory(traj, 10.0, CFG)
    assert problems and any(word in p for p in problems), problems


def test_jerk_is_checked():
    traj = cruise(10.0).copy()
    traj[32:, 0] += np.cumsum(np.full(32, 0.06))     # a 6 m/s^2 step in acceleration at step 32
    problems = check_trajectory(traj, 10.0, CheckConfig(max_accel=8.0, max_jerk=40.0))
    assert any("jerk" in p for p in problems) and not any("accel" in p for p in problems)


def test_wrong_shape_is_a_problem_not_a_crash():
    assert "shape" in check_trajectory(np.zeros((10, 3)), 0.0, CFG)[0]


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 44.0), st.floats(-8.0, 8.0))
def test_comfortable_stop_passes_the_checks_and_never_reverses(v0, a0):
    stop = comfortable_stop(v0, CFG, a0)
    assert stop.shape == (64, 3) and np.isfinite(stop).all()
    assert check_trajectory(stop, v0, CFG) == []
    assert (np.diff(np.concatenate([[0.0], stop[:, 0]])) >= -1e-6).all() and (stop[:, 1] == 0).all()
    speed = kinematics(stop, v0)["speed"]
    assert speed[-1] <= max(v0 - 2.0, 0.0) + 1e-6            # it really slows down
    if v0 > 1.0:
        assert stop[-1, 0] > 0                                # not a zero trajectory


def test_history_checks():
    assert check_history(history(), CFG) == [] and abs(ego_speed(history(12.0)) - 12.0) < 1e-9
    bad = history().copy()
    bad[4, 1] = np.nan
    assert "non-finite" in check_history(bad, CFG)[0]
    bad = history().copy()
    bad[:8, 0] -= 50.0
    assert "absurd" in check_history(bad, CFG)[0]
    assert "shape" in check_history(np.zeros((15, 3)), CFG)[0]
    assert "origin" in check_history(history() + 1.0, CFG)[0]


def test_the_synthetic_experts_futures_pass():
    world = pytest.importorskip("scenes.world")
    for seed in range(40):
        s = world.make_scene(seed, render=False)
        problems = check_trajectory(s.future, ego_speed(s.history), CFG)
        assert problems == [], f"scene {seed} ({s.family}): {problems}"
        assert check_history(s.history, CFG) == []
