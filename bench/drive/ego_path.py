"""Closed loop on the world's side: the ego following a plan, and the metrics of a driven path.

The ego tracks a plan by its motion increments: a plan is 64 waypoints (10 Hz) in the ego frame
of its cycle's instant, and the step from waypoint i-1 to i (its displacement and heading change,
in the frame of waypoint i-1; waypoint -1 is the plan's origin) is applied to the ego's actual
pose. So the pose stays continuous when a new plan takes over (no jump to where a late plan
thought the ego would be), the ego moves at the plan's speed, and a plan that has run out holds
its last step.

Metrics of a driven path over grid steps [first, last] (nuPlan / AlpaSim style; 10 Hz poses):
    collisions     first overlap of the ego box with each solid agent's box; at fault unless the
                   ego stands (< 0.1 m/s) or the agent's centre is behind the ego's rear bumper
    off_road       steps with an ego box corner outside every road's carriageway (|d| > half width)
    red_light      stop lines crossed (the ego's front) while the light is red
    stop_sign      stop-sign lines crossed without the speed dropping below STOP_SPEED within
                   STOP_WINDOW m before the line
    progress       arc length gained along the scenario's ego path, and its ratio to the expert's
    comfort        max |longitudinal jerk|, max lateral and min / max longitudinal acceleration
                   (finite differences smoothed over 0.5 s) and whether they stay within nuPlan's
                   comfort bounds
    min_ttc        smallest time to collision, both the ego and every agent extrapolated at constant
                   velocity over TTC_HORIZON s (the ego moving; None when nothing comes within it)
"""
from __future__ import annotations

import numpy as np

from scenes.agents import RED
from scenes.checks import kinematics
from scenes.config import DT, EGO_LENGTH, EGO_WIDTH
from scenes.geometry import box_corners, boxes_overlap

STOP_SPEED = 0.5          # m/s: a stop at a stop sign
STOP_WINDOW = 5.0         # m before the line in which the stop must happen
TTC_HORIZON = 3.0         # s
SMOOTH = 5                # samples (0.5 s) of the comfort metrics' moving averages
STANDING = 0.1            # m/s: the ego stands (a collision then is not its fault)
COMFORT = {"max_abs_jerk": 8.37, "max_lat_accel": 4.89, "min_lon_accel": -4.05, "max_lon_accel": 2.40}  # nuPlan


def compose(pose, rel) -> np.ndarray:
    """The pose `rel` (x, y, heading in the frame of `pose`) in the frame `pose` lives in."""
    x, y, th = pose
    c, s = np.cos(th), np.sin(th)
    return np.array([x + c * rel[0] - s * rel[1], y + s * rel[0] + c * rel[1], th + rel[2]])


def relative(pose, origin) -> np.ndarray:
    """`pose` in the frame of `origin` (both x, y, heading in one frame)."""
    dx, dy = pose[0] - origin[0], pose[1] - origin[1]
    c, s = np.cos(origin[2]), np.sin(origin[2])
    return np.array([c * dx + s * dy, -s * dx + c * dy, np.angle(np.exp(1j * (pose[2] - origin[2])))])


def plan_step(plan: np.ndarray, i: int) -> np.ndarray:
    """The motion from waypoint i-1 to i of a (64, 3) ego-frame plan (i past the end: the last step)."""
    i = min(i, len(plan) - 1)
    prev = plan[i - 1] if i > 0 else np.zeros(3)
    return relative(plan[i], prev)


def hold_plan(speed: float, n: int = 64) -> np.ndarray:
    """(n, 3) ego-frame plan: straight on at `speed`."""
    x = speed * DT * np.arange(1, n + 1)
    return np.stack([x, np.zeros(n), np.zeros(n)], axis=1)


def to_world(plan: np.ndarray, origin) -> np.ndarray:
    """(n, 3) ego-frame waypoints -> world, the ego frame at `origin`."""
    return np.stack([compose(origin, p) for p in plan])


def speeds(ego_world: np.ndarray) -> np.ndarray:
    """(N,) speed arriving at each step (the first repeats the second)."""
    v = np.hypot(*np.diff(ego_world[:, :2], axis=0).T) / DT
    return np.concatenate([v[:1], v])


# --- metrics --------------------------------------------------------------------------------------
def ego_boxes(ego_world: np.ndarray) -> np.ndarray:
    n = len(ego_world)
    return np.column_stack([ego_world, np.full(n, EGO_LENGTH), np.full(n, EGO_WIDTH)])


def collisions(ego_world: np.ndarray, agents, first: int, last: int) -> list[dict]:
    """The first contact with each solid agent within [first, last]: step, agent, at fault."""
    steps = np.arange(first, last + 1)
    ego, v, out = ego_boxes(ego_world[steps]), speeds(ego_world), []
    for i, agent in enumerate(agents):
        if not agent.solid:
            continue
        other = np.column_stack([agent.poses[steps], np.full(len(steps), agent.size[0]),
                                 np.full(len(steps), agent.size[1])])
        hits = np.flatnonzero(boxes_overlap(ego, other))
        if hits.size:
            n = int(steps[hits[0]])
            behind = relative(agent.poses[n], ego_world[n])[0] < -EGO_LENGTH / 2
            out.append({"step": n, "agent": i, "kind": agent.kind,
                        "at_fault": bool(v[n] >= STANDING and not behind)})
    return out


def off_road_steps(ego_world: np.ndarray, roads, first: int, last: int) -> int:
    """Steps with an ego corner on no road's carriageway."""
    poses = ego_world[first: last + 1]
    corners = box_corners(poses[:, 0], poses[:, 1], poses[:, 2], EGO_LENGTH, EGO_WIDTH)   # (n, 4, 2)
    on = np.zeros(corners.shape[:2], dtype=bool)
    for road in roads:
        _, d, inside = road.frenet(corners[..., 0], corners[..., 1])
        on |= inside & (np.abs(d) <= road.half_width)
    return int((~on).any(axis=1).sum())


def front_s(ego_world: np.ndarray, path) -> np.ndarray:
    """(N,) arc length of the ego's front on the scenario's ego path."""
    s, _ = path.project(ego_world[:, 0], ego_world[:, 1])
    return s + EGO_LENGTH / 2


def line_violations(ego_world: np.ndarray, scen, first: int, last: int) -> dict:
    """{"red_light": n, "stop_sign": n}: stop lines crossed against their rule within (first, last]."""
    fs, v = front_s(ego_world[: last + 1], scen.path), speeds(ego_world[: last + 1])
    out = {"red_light": 0, "stop_sign": 0}
    for rule in scen.stops:
        crossed = [n for n in range(first + 1, last + 1) if fs[n - 1] < rule.s_line <= fs[n]]
        if not crossed:
            continue
        n = crossed[0]
        if rule.kind == "light" and rule.light[n] == RED:
            out["red_light"] += 1
        if rule.kind == "stop_sign":
            near = (fs[: n + 1] >= rule.s_line - STOP_WINDOW) & (fs[: n + 1] <= rule.s_line)
            if not near.any() or v[: n + 1][near].min() >= STOP_SPEED:
                out["stop_sign"] += 1
    return out


def progress(ego_world: np.ndarray, path, first: int, last: int) -> float:
    s, _ = path.project(ego_world[[first, last], 0], ego_world[[first, last], 1])
    return float(s[1] - s[0])


def smooth(x: np.ndarray, n: int = SMOOTH) -> np.ndarray:
    """Centred moving average over n samples (edges: the samples there are)."""
    w = np.ones(n)
    return np.convolve(x, w, "same") / np.convolve(np.ones_like(x), w, "same")


def comfort(ego_world: np.ndarray, first: int, last: int) -> dict:
    """Longitudinal speed, acceleration and jerk by finite differences, each smoothed over SMOOTH
    samples (a plan switch is a step in speed; the vehicle's tracking controller would smooth it,
    as nuPlan filters its derivatives); lateral acceleration v^2 |curvature|, smoothed alike."""
    k = kinematics(ego_world[max(first - 2, 0): last + 1])
    accel = smooth(np.diff(smooth(k["speed"])) / DT)
    jerk = np.diff(accel) / DT
    lat = smooth(k["lat_accel"])
    out = {"max_abs_jerk": float(np.abs(jerk).max()), "max_lat_accel": float(lat.max()),
           "min_lon_accel": float(accel.min()), "max_lon_accel": float(accel.max())}
    out["comfortable"] = bool(out["max_abs_jerk"] <= COMFORT["max_abs_jerk"]
                              and out["max_lat_accel"] <= COMFORT["max_lat_accel"]
                              and COMFORT["min_lon_accel"] <= out["min_lon_accel"]
                              and out["max_lon_accel"] <= COMFORT["max_lon_accel"])
    return out


def min_ttc(ego_world: np.ndarray, agents, first: int, last: int) -> float | None:
    """Smallest time (s) until the ego box, moving on at its velocity, overlaps an agent moving on
    at its own; over steps where the ego moves. None when nothing comes within TTC_HORIZON."""
    solid = [a for a in agents if a.solid]
    if not solid:
        return None
    taus = DT * np.arange(0, round(TTC_HORIZON / DT) + 1)
    v, best = speeds(ego_world), None
    for n in range(max(first, 1), last + 1):
        if v[n] < STANDING:
            continue
        x, y, th = ego_world[n]
        ego = np.column_stack([x + np.cos(th) * v[n] * taus, y + np.sin(th) * v[n] * taus, np.full_like(taus, th),
                               np.full_like(taus, EGO_LENGTH), np.full_like(taus, EGO_WIDTH)])
        for a in solid:
            p, vel = a.poses[n], (a.poses[n] - a.poses[n - 1]) / DT
            other = np.column_stack([p[0] + vel[0] * taus, p[1] + vel[1] * taus, np.full_like(taus, p[2]),
                                     np.full_like(taus, a.size[0]), np.full_like(taus, a.size[1])])
            hit = np.flatnonzero(boxes_overlap(ego, other))
            if hit.size and (best is None or taus[hit[0]] < best):
                best = float(taus[hit[0]])
    return best


def drive_metrics(scen, ego_world: np.ndarray, expert_world: np.ndarray, first: int, last: int) -> dict:
    """Every metric of the driven path `ego_world` (N_STEPS, 3) over [first, last], against the
    expert's path through the same scenario."""
    hits = collisions(ego_world, scen.agents, first, last)
    done, expert = progress(ego_world, scen.path, first, last), progress(expert_world, scen.path, first, last)
    return {"collisions": len(hits), "at_fault_collisions": sum(h["at_fault"] for h in hits),
            "collision_events": hits, "off_road_steps": off_road_steps(ego_world, scen.roads, first, last),
            **line_violations(ego_world, scen, first, last),
            "progress_m": round(done, 3), "expert_progress_m": round(expert, 3),
            "progress_ratio": round(done / expert, 4) if expert > 0.5 else None,
            "comfort": comfort(ego_world, first, last), "min_ttc_s": min_ttc(ego_world, scen.agents, first, last)}
