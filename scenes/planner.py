"""The rule-based expert: IDM car following, stop and yield rules, a lateral path fixed in advance.

Longitudinal control per 0.1 s step:
    a_free = a_idm * (1 - (v / v_target)^4)      v_target = min(cruise, curve speed ahead)
    a_k    = -a_idm * (s*_k / gap_k)^2,  s*_k = s0 + v T + v dv / (2 sqrt(a_idm b))
    a      = a_free + min_k a_k                   over leaders and active stop lines
then clipped to the limits, to the jerk limit, and to a >= -sqrt(J v): braking at that bound
and easing off at jerk J/2 ends exactly at a standstill, so a stop is a ramp instead of a jump. Integration is semi-implicit Euler
(v += a dt; s += v dt), so the finite-difference speed of the poses is exactly v.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scenes.config import DT, EGO_LENGTH, EGO_WIDTH, LIMITS, N_STEPS

A_IDM, B_IDM, T_GAP = 1.5, 2.5, 1.4        # m/s^2, m/s^2, s
A_LAT_PLAN, B_CURVE = 2.0, 1.5             # m/s^2 planned lateral accel, braking for curves
JERK_PLAN = 0.9 * LIMITS.jerk_max          # margin under the checked limit
LOOKAHEAD = {"pedestrian": 30, "cyclist": 10}   # steps: anticipate agents entering the corridor


@dataclass
class StopRule:
    """A line across the ego path: a stop sign (stop, hold, go) or a traffic light."""
    s_line: float                      # arc length of the line on the ego path
    kind: str                          # "stop_sign" or "light"
    light: np.ndarray = None           # (N_STEPS,) light states for kind == "light"
    hold: float = 1.0                  # s standing still at a stop sign before going


def curve_speed(path) -> np.ndarray:
    """Allowed speed at each path vertex: lateral accel A_LAT_PLAN, braking B_CURVE ahead of bends.

    v_allow(s_i)^2 = min_{j >= i} (v_lim(s_j)^2 + 2 B (s_j - s_i)), a reversed running minimum.
    """
    v_lim2 = A_LAT_PLAN / np.maximum(np.abs(path.kappa), 1e-4)
    tail = np.minimum.accumulate((v_lim2 + 2 * B_CURVE * path.s)[::-1])[::-1]
    return np.sqrt(np.maximum(tail - 2 * B_CURVE * path.s, 0.0))


def leader_table(path, agents):
    """For every solid agent and step: its arc length on the ego path, speed along it, extent.

    Returns (s_ahead (K, N), v_along (K, N), half_length (K, N), in_corridor (K, N)); an agent
    expected to enter the corridor within its LOOKAHEAD counts as in it, standing at its entry.
    """
    solid = [a for a in agents if a.solid]
    if not solid:
        z = np.zeros((0, N_STEPS))
        return z, z, z, z.astype(bool)
    px = np.stack([a.poses[:, 0] for a in solid])
    py = np.stack([a.poses[:, 1] for a in solid])
    s, lat = path.project(px, py)
    rel = np.stack([a.poses[:, 2] for a in solid]) - np.interp(s, path.s, path.heading)
    length = np.array([a.size[0] for a in solid])[:, None]
    width = np.array([a.size[1] for a in solid])[:, None]
    half_len = np.abs(np.cos(rel)) * length / 2 + np.abs(np.sin(rel)) * width / 2
    half_lat = np.abs(np.sin(rel)) * length / 2 + np.abs(np.cos(rel)) * width / 2
    margin = np.array([1.0 if a.kind in ("pedestrian", "cyclist") else 0.4 for a in solid])[:, None]
    inside = (np.abs(lat) < EGO_WIDTH / 2 + half_lat + margin) & (s < path.s[-1] - 1.0)
    v_along = np.gradient(s, DT, axis=1) * inside
    steps = np.arange(N_STEPS)
    for k, a in enumerate(solid):
        horizon = LOOKAHEAD.get(a.kind, 0)
        if not horizon:
            continue
        # next step at or after n that is inside (N_STEPS when none): a reversed running minimum
        nxt = np.minimum.accumulate(np.where(inside[k], steps, N_STEPS)[::-1])[::-1]
        enter = ~inside[k] & (nxt - steps <= horizon) & (nxt < N_STEPS)
        if enter.any():                         # will enter: a standing obstacle at its entry
            s[k, enter] = s[k, nxt[enter]]
            v_along[k, enter], inside[k, enter] = 0.0, True
    return s, v_along, half_len, inside


def idm_term(v, gap, dv, s0):
    """IDM interaction -a (s*/gap)^2 for arrays of leaders."""
    s_star = s0 + np.maximum(0.0, v * T_GAP + v * dv / (2 * np.sqrt(A_IDM * B_IDM)))
    return -A_IDM * (s_star / np.maximum(gap, 0.1)) ** 2


def simulate(path, v_init: float, cruise: float, agents, stops=(), s_init: float = 0.0):
    """Closed-loop ego along `path` from TIMES[0]: returns (s, v, a), each (N_STEPS,)."""
    v_allow = curve_speed(path)
    s_lead, v_lead, half_len, inside = leader_table(path, agents)
    s, v, a = np.zeros(N_STEPS), np.zeros(N_STEPS), np.zeros(N_STEPS)
    s[0], v[0] = s_init, v_init
    stood = np.zeros(len(stops))                # seconds stood still at each stop sign
    go_yellow = [None] * len(stops)             # latched yellow-light decision per light
    for n in range(N_STEPS - 1):
        front = s[n] + EGO_LENGTH / 2
        v_target = max(min(cruise, np.interp(s[n] + v[n], path.s, v_allow)), 0.5)
        a_free = max(A_IDM * (1 - (v[n] / v_target) ** 4), -B_CURVE - 1.0)
        gaps = s_lead[:, n] - half_len[:, n] - front
        ahead = inside[:, n] & (gaps > -EGO_LENGTH)
        terms = list(idm_term(v[n], gaps[ahead], v[n] - v_lead[ahead, n], 2.5))
        near = list(gaps[ahead])
        for i, rule in enumerate(stops):
            gap = rule.s_line - front
            if _stop_active(rule, i, n, gap, v[n], stood, go_yellow):
                terms.append(idm_term(v[n], gap, v[n], 0.5))
                near.append(gap + 2.0)
            if rule.kind == "stop_sign" and v[n] < 0.1 and abs(gap) < 4.0:
                stood[i] += DT
        a_des = a_free + (min(terms) if terms else 0.0)
        if v[n] < 0.1 and near and min(near) < 5.0:
            a_des = min(a_des, 0.0)             # standing close behind something: stay (no creeping)
        a[n] = _limit(a_des, a[n - 1] if n else 0.0, v[n])
        v[n + 1] = v[n] + a[n] * DT
        if v[n + 1] < 0.0:                      # stand still exactly instead of reversing
            a[n], v[n + 1] = -v[n] / DT, 0.0
        s[n + 1] = s[n] + v[n + 1] * DT
    a[-1] = a[-2]
    return s, v, a


def _stop_active(rule, i, n, gap, v, stood, go_yellow) -> bool:
    if gap < -0.5:
        return False                            # already past the line
    if rule.kind == "stop_sign":
        return stood[i] < rule.hold
    state = rule.light[n]
    if state == 1 and go_yellow[i] is None:     # yellow: stop if it takes at most 3 m/s^2
        go_yellow[i] = v * v / (2 * max(gap, 0.1)) > 3.0
    return state == 0 or (state == 1 and not go_yellow[i])


def _limit(a_des: float, a_prev: float, v: float) -> float:
    """Clip to accel limits, the jerk limit, and a >= -sqrt(J v) (a smooth stop)."""
    lo = max(-LIMITS.decel_max, a_prev - JERK_PLAN * DT, -math.sqrt(JERK_PLAN * max(v, 0.0)))
    hi = min(LIMITS.accel_max, a_prev + JERK_PLAN * DT)
    return min(max(float(a_des), min(lo, hi)), hi)


def ego_poses(path, s: np.ndarray) -> np.ndarray:
    x, y, th = path.at(s)
    return np.stack([x, y, th], axis=1)
