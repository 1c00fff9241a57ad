"""What makes an expert trajectory acceptable: kinematic limits and no overlap with any agent.

Kinematics by finite differences on poses at 10 Hz (the same definition the tests use):
    speed_k = |p_{k+1} - p_k| / dt,  accel = diff(speed) / dt,  jerk = diff(accel) / dt,
    curvature_k = wrap(heading_{k+1} - heading_k) / |p_{k+1} - p_k|   (where moving > 0.05 m)
"""
from __future__ import annotations

import numpy as np

from scenes.config import DT, EGO_LENGTH, EGO_WIDTH, LIMITS
from scenes.geometry import boxes_overlap

TOL = 1e-3                       # float slack on the limits (values are computed in float64)


def kinematics(poses: np.ndarray) -> dict:
    p = np.asarray(poses, dtype=np.float64)
    step = np.hypot(np.diff(p[:, 0]), np.diff(p[:, 1]))
    speed = step / DT
    accel = np.diff(speed) / DT
    jerk = np.diff(accel) / DT
    dth = np.angle(np.exp(1j * np.diff(p[:, 2])))
    moving = step > 0.05
    curvature = np.where(moving, dth / np.maximum(step, 1e-9), 0.0)
    return {"speed": speed, "accel": accel, "jerk": jerk, "curvature": curvature,
            "lat_accel": speed ** 2 * np.abs(curvature)}


def limit_violation(poses: np.ndarray, limits=LIMITS) -> str | None:
    """None when the poses obey the limits, else a sentence naming the first broken limit."""
    k = kinematics(poses)
    tests = (("accel", k["accel"].max(), limits.accel_max), ("decel", -k["accel"].min(), limits.decel_max),
             ("jerk", np.abs(k["jerk"]).max(), limits.jerk_max),
             ("curvature", np.abs(k["curvature"]).max(), limits.curvature_max),
             ("lateral accel", k["lat_accel"].max(), limits.lat_accel_max))
    for name, value, limit in tests:
        if value > limit + TOL:
            return f"{name} {value:.2f} exceeds {limit}"
    return None


def first_collision(ego_poses: np.ndarray, agents) -> tuple | None:
    """(agent index, step) of the first overlap of the ego box with a solid agent, or None."""
    n = len(ego_poses)
    ego = np.column_stack([ego_poses, np.full(n, EGO_LENGTH), np.full(n, EGO_WIDTH)])
    for i, agent in enumerate(agents):
        if not agent.solid:
            continue
        other = np.column_stack([agent.poses[:n], np.full(n, agent.size[0]), np.full(n, agent.size[1])])
        hits = np.flatnonzero(boxes_overlap(ego, other))
        if hits.size:
            return i, int(hits[0])
    return None
