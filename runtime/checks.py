"""Checks before a trajectory leaves, the comfortable stop, and ego-history sanity.

Trajectories are (64, 3) waypoints (x forward, y left, heading) at 10 Hz in the ego frame at
t0, starting after the origin. Finite differences with p[-1] = origin and v[-1] = |v0| (a
negative v0 is a reversing ego: its direction of travel starts at pi, not 0):
    speed    v_i = |p_i - p_{i-1}| / dt
    accel    a_i = (v_i - v_{i-1}) / dt
    jerk     j_i = (a_i - a_{i-1}) / dt                       (i >= 1)
    curvature  k_i = wrap(psi_i - psi_{i-1}) / |p_i - p_{i-1}|  psi = direction of travel,
               checked where v_i >= curvature_min_speed (psi of a standstill is noise)
A trajectory that fails is replaced by a defined fallback (the planner's job), never by zeros.
"""
from __future__ import annotations

import numpy as np

from prompt.trajectory import DT, FUT_WAYPOINTS, HIST_POSES
from runtime.config import CheckConfig

HISTORY_SHAPE = (HIST_POSES, 3)


def ego_speed(history: np.ndarray) -> float:
    """v0 (m/s) at t0 along the t0 heading (x): (3 x[-1] - 4 x[-2] + x[-3]) / (2 dt), the
    second-order backward difference that models.action_expert.v0_from_history (training) uses."""
    x = np.asarray(history, dtype=np.float64)[:, 0]
    return float((3 * x[-1] - 4 * x[-2] + x[-3]) / (2 * DT))


def check_history(history, cfg: CheckConfig) -> list[str]:
    """Problems of an ego history (16, 3) of real numbers; [] when usable."""
    try:
        raw = np.asarray(history)
    except ValueError as e:          # ragged nested lists
        return [f"ego history must be a ({HISTORY_SHAPE[0]}, {HISTORY_SHAPE[1]}) array of real numbers: {e}"]
    if raw.dtype.kind not in "iuf":  # strings, bools, complex, objects are not poses
        return [f"ego history has dtype {raw.dtype}; it must hold real numbers (float or int)"]
    h = raw.astype(np.float64)
    if h.shape != HISTORY_SHAPE:
        return [f"ego history must have shape {HISTORY_SHAPE}, got {h.shape}"]
    if not np.isfinite(h).all():
        bad = np.argwhere(~np.isfinite(h))[0].tolist()
        return [f"ego history has a non-finite value at index {bad}"]
    step = np.hypot(*np.diff(h[:, :2], axis=0).T) / DT
    if step.max() > cfg.max_history_speed:
        i = int(step.argmax())
        return [f"ego history is absurd: {step[i]:.1f} m/s between poses {i} and {i + 1} "
                f"(limit {cfg.max_history_speed} m/s)"]
    if np.abs(h[-1]).max() > 1e-3:
        return [f"ego history must end at the origin (t0 pose (0, 0, 0)), got {h[-1].round(3).tolist()}"]
    return []


def check_speed(v0: float, cfg: CheckConfig) -> list[str]:
    """Problems of the v0 a layout estimates from an accepted history: every step may be under
    max_history_speed while the estimator (a second-order difference) reads more (a last step
    of 4 m after 0.5 m steps: 57.5 m/s). |v0| <= max_history_speed keeps the promise that the
    stop from any accepted speed passes the checks (max_history_speed <= max_speed)."""
    if not np.isfinite(v0) or abs(v0) > cfg.max_history_speed:
        return [f"ego history gives v0 = {v0:.1f} m/s at t0 (its steps accelerate too sharply); "
                f"allowed |v0| <= {cfg.max_history_speed} m/s"]
    return []


def kinematics(traj: np.ndarray, v0: float) -> dict[str, np.ndarray]:
    p = np.concatenate([np.zeros((1, 2)), np.asarray(traj, dtype=np.float64)[:, :2]])
    seg = np.diff(p, axis=0)                                  # (64, 2)
    ds = np.hypot(seg[:, 0], seg[:, 1])
    speed = ds / DT
    accel = np.diff(np.concatenate([[abs(v0)], speed])) / DT
    jerk = np.diff(accel) / DT
    psi = np.arctan2(seg[:, 1], seg[:, 0])
    prev = np.concatenate([[0.0 if v0 >= 0 else np.pi], psi[:-1]])
    turn = np.angle(np.exp(1j * (psi - prev)))                # wrapped to (-pi, pi]
    curvature = np.where(ds > 0, turn / np.maximum(ds, 1e-9), 0.0)
    return {"speed": speed, "accel": accel, "jerk": jerk, "curvature": curvature}


def check_trajectory(traj, v0: float, cfg: CheckConfig) -> list[str]:
    """Problems of a trajectory; [] when it may leave. Each problem names value, step, limit."""
    t = np.asarray(traj)
    if t.shape != (FUT_WAYPOINTS, 3):
        return [f"trajectory must have shape ({FUT_WAYPOINTS}, 3), got {t.shape}"]
    if not np.isfinite(t).all():
        return [f"trajectory has a non-finite value at index {np.argwhere(~np.isfinite(t))[0].tolist()}"]
    kin = kinematics(t, v0)
    moving = kin["speed"] >= cfg.curvature_min_speed
    moving_prev = np.concatenate([[abs(v0) >= cfg.curvature_min_speed], moving[:-1]])
    limits = (("speed", kin["speed"], cfg.max_speed, "m/s"),
              ("accel", kin["accel"], cfg.max_accel, "m/s^2"),
              ("jerk", kin["jerk"], cfg.max_jerk, "m/s^3"),
              ("curvature", np.where(moving & moving_prev, kin["curvature"], 0.0), cfg.max_curvature, "1/m"))
    problems = []
    for name, values, limit, unit in limits:
        i = int(np.argmax(np.abs(values)))
        if abs(values[i]) > limit:
            problems.append(f"{name} {values[i]:.3g} {unit} at step {i} exceeds {limit} {unit}")
    return problems


def comfortable_stop(v0: float, cfg: CheckConfig, a0: float = 0.0) -> np.ndarray:
    """(64, 3) straight stop: the deceleration ramps from a0 to -stop_decel at a jerk of
    stop_decel / 0.5 s, then holds until standstill; a reversing ego (v0 < 0) stops along -x,
    never changing direction. Passes check_trajectory for |v0| <= max_speed."""
    jerk = cfg.stop_decel / 0.5
    a, v, x = float(np.clip(a0, -cfg.stop_decel, 0.0)), abs(float(v0)), 0.0
    xs = np.zeros(FUT_WAYPOINTS)
    for i in range(FUT_WAYPOINTS):
        a = max(a - jerk * DT, -cfg.stop_decel) if v > 0 else 0.0
        v_next = max(v + a * DT, 0.0)
        x += 0.5 * (v + v_next) * DT
        v = v_next
        xs[i] = x
    xs = xs if v0 >= 0 else -xs
    return np.stack([xs, np.zeros(FUT_WAYPOINTS), np.zeros(FUT_WAYPOINTS)], axis=1).astype(np.float32)
