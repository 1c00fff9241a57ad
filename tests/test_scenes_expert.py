"""The expert planner over thousands of scenes: kinematic limits, no collisions, frames and splits.

The checks here are written independently of scenes/checks.py: finite differences on the written
float32 poses, and collisions by sampling points on the box outlines.
"""
import numpy as np
import pytest

from scenes.checks import first_collision, limit_violation
from scenes.config import DT, EGO_LENGTH, EGO_WIDTH, FAMILIES, LIMITS, UNSEEN_FAMILY
from scenes.dataset import scene_seed
from scenes.world import make_scene, pick_family

COUNTS = {"train": 1500, "heldout": 350, "unseen": 150}


@pytest.fixture(scope="module")
def scenes():
    out = []
    for split, n in COUNTS.items():
        for i in range(n):
            seed = scene_seed(11, split, i)
            out.append(make_scene(seed, pick_family(seed, split), split, render=False))
    return out


def _track(scene) -> np.ndarray:
    return np.concatenate([scene.history, scene.future]).astype(np.float64)   # (80, 3), 10 Hz


def _finite_differences(p):
    step = np.linalg.norm(np.diff(p[:, :2], axis=0), axis=1)
    v = step / DT
    a = np.diff(v) / DT
    j = np.diff(a) / DT
    dth = (np.diff(p[:, 2]) + np.pi) % (2 * np.pi) - np.pi
    kappa = np.where(step > 0.05, dth / np.maximum(step, 1e-9), 0.0)
    return v, a, j, kappa


def test_expert_futures_obey_acceleration_jerk_and_curvature_limits(scenes):
    worst = {"accel": 0.0, "decel": 0.0, "jerk": 0.0, "curvature": 0.0, "lat_accel": 0.0}
    for s in scenes:
        v, a, j, kappa = _finite_differences(_track(s))
        worst["accel"] = max(worst["accel"], a.max())
        worst["decel"] = max(worst["decel"], -a.min())
        worst["jerk"] = max(worst["jerk"], np.abs(j).max())
        worst["curvature"] = max(worst["curvature"], np.abs(kappa).max())
        worst["lat_accel"] = max(worst["lat_accel"], (v ** 2 * np.abs(kappa)).max())
    # float32 poses add ~1e-5 m of rounding: a few hundredths on accel, a few tenths on jerk
    limits = {"accel": LIMITS.accel_max + 0.02, "decel": LIMITS.decel_max + 0.02, "jerk": LIMITS.jerk_max + 0.3,
              "curvature": LIMITS.curvature_max + 0.005, "lat_accel": LIMITS.lat_accel_max + 0.05}
    broken = {k: round(float(worst[k]), 3) for k in worst if worst[k] > limits[k]}
    assert not broken, f"limits broken over {len(scenes)} scenes: {broken}; allowed {limits}"
    assert worst["decel"] > 2.0 and worst["jerk"] > 2.0, f"the expert never brakes or changes accel: {worst}"


def test_heading_follows_the_direction_of_travel(scenes):
    worst = 0.0
    for s in scenes:
        p = _track(s)
        d = np.diff(p[:, :2], axis=0)
        moving = np.linalg.norm(d, axis=1) > 0.3
        travel = np.arctan2(d[:, 1], d[:, 0])
        mid = (p[1:, 2] + p[:-1, 2]) / 2
        err = np.abs((travel - mid + np.pi) % (2 * np.pi) - np.pi)[moving]
        worst = max(worst, float(err.max(initial=0.0)))
    assert worst < 0.05, f"heading differs from the direction of travel by up to {worst:.3f} rad"


def _outline(boxes, n=12):
    """(T, 4n, 2) points on the outlines of rectangles boxes (T, 5) = (x, y, yaw, length, width)."""
    u = np.linspace(-0.5, 0.5, n)
    side = np.ones(n)
    lx = np.concatenate([u, u, -0.5 * side, 0.5 * side])[None] * boxes[:, 3:4]
    ly = np.concatenate([-0.5 * side, 0.5 * side, u, u])[None] * boxes[:, 4:5]
    c, s_ = np.cos(boxes[:, 2:3]), np.sin(boxes[:, 2:3])
    return np.stack([boxes[:, 0:1] + c * lx - s_ * ly, boxes[:, 1:2] + s_ * lx + c * ly], axis=-1)


def _any_inside(points, boxes):
    """(T,) True where any of points (T, M, 2) lies strictly inside the rectangle boxes (T, 5)."""
    c, s_ = np.cos(boxes[:, 2:3]), np.sin(boxes[:, 2:3])
    dx, dy = points[..., 0] - boxes[:, 0:1], points[..., 1] - boxes[:, 1:2]
    u, v = c * dx + s_ * dy, -s_ * dx + c * dy
    return ((np.abs(u) < boxes[:, 3:4] / 2) & (np.abs(v) < boxes[:, 4:5] / 2)).any(axis=1)


def test_expert_futures_never_collide(scenes):
    hits = []
    for s in scenes:
        track = _track(s)
        ego = np.column_stack([track, np.full(80, EGO_LENGTH), np.full(80, EGO_WIDTH)])
        for agent, poses in zip(s.agents, s.agent_poses):
            other = np.column_stack([poses, np.full(80, agent["length"]), np.full(80, agent["width"])])
            touch = _any_inside(_outline(ego), other) | _any_inside(_outline(other), ego)
            if touch.any():
                hits.append((s.seed, s.family, agent["kind"], int(np.argmax(touch))))
    assert not hits, f"{len(hits)} collisions (seed, family, agent, step), first: {hits[:3]}"


def test_poses_are_in_the_ego_frame_at_t0(scenes):
    for s in scenes[:300]:
        assert s.history.shape == (16, 3) and s.future.shape == (64, 3)
        assert s.history.dtype == np.float32 and s.future.dtype == np.float32
        assert np.abs(s.history[-1]).max() < 1e-5, f"history[-1] is {s.history[-1]}, not the origin"
        v0 = np.linalg.norm(s.history[-1, :2] - s.history[-2, :2]) / DT
        assert abs(np.linalg.norm(s.future[0, :2]) / DT - v0) < 0.8, "future[0] is not 0.1 s after t0"
        assert (s.history[:-1, 0] <= 1e-4).all(), "the past lies behind the ego"


def test_splits_hold_their_families(scenes):
    seen = {s.family for s in scenes if s.split != "unseen"}
    assert seen == set(FAMILIES) - {UNSEEN_FAMILY}, f"families missing: {set(FAMILIES) - seen}"
    assert all(s.family == UNSEEN_FAMILY and s.unseen_family for s in scenes if s.split == "unseen")
    assert not any(s.unseen_family for s in scenes if s.split != "unseen")


def test_heldout_is_faster_than_train(scenes):
    def speed(s):
        return np.linalg.norm(s.history[-1, :2] - s.history[-2, :2]) / DT
    train = np.median([speed(s) for s in scenes if s.split == "train"])
    held = np.median([speed(s) for s in scenes if s.split == "heldout"])
    assert held > train + 2.0, f"heldout median speed {held:.1f} m/s is not above train {train:.1f} m/s"


def test_make_scene_is_deterministic():
    a, b = make_scene(123, "pedestrian"), make_scene(123, "pedestrian")
    assert a.coc == b.coc and np.array_equal(a.future, b.future) and np.array_equal(a.images, b.images)
    c = make_scene(124, "pedestrian", render=False)
    assert not np.array_equal(a.future, c.future)
    assert np.array_equal(make_scene(123, "pedestrian", render=False).future, a.future), "render changed the scene"


def test_the_generator_checks_can_fail():
    t = np.arange(80) * DT
    x = 10.0 * t
    x[40:] += 0.5 * 5.0 * (t[40:] - t[40]) ** 2              # a 5 m/s^2 step: accel and jerk too high
    assert "accel" in limit_violation(np.stack([x, 0 * x, 0 * x], 1))
    smooth = np.stack([10.0 * t, 0 * t, 0 * t], 1)
    assert limit_violation(smooth) is None

    class Box:
        solid, size = True, (4.5, 1.9, 1.5)
        poses = np.stack([10.0 * t + 3.0, 0 * t, 0 * t], 1)
    assert first_collision(smooth, [Box()]) == (0, 0)
    Box.poses = Box.poses + np.array([0.0, 2.5, 0.0])        # one lane over: clear
    assert first_collision(smooth, [Box()]) is None


def test_unknown_family_and_split_are_refused():
    with pytest.raises(ValueError, match="'nope'.*allowed"):
        make_scene(0, "nope")
    with pytest.raises(ValueError, match="'dev'.*allowed"):
        make_scene(0, split="dev")


def test_the_collision_helpers_can_fail():
    a = np.array([[0.0, 0.0, 0.0, 4.6, 1.9]])
    assert _any_inside(_outline(a), a + [[3.0, 1.0, 0.3, 0, 0]])[0]
    assert not _any_inside(_outline(a), a + [[0.0, 2.0, 0.0, 0, 0]])[0]
