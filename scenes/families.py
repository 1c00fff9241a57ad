"""Scenario families on roads: cruise, following, braking lead, cut-in, curves, turns.

A builder draws parameters from the split's Ranges and returns a Scenario: roads, the ego path
(lateral plan fixed in advance), agents, stop rules, ground paint, the cause candidates (agent
indices, most specific first; the first one that is visible at t0 becomes the cause) and a
`decide` rule mapping the expert's motion to a decision (None rejects the draw).
The event families (signs, lights, pedestrians, cyclists, obstacles, door zone) are in
scenes/events.py. Roads start at x = -60 along +x; the ego starts at x = 0 at TIMES[0].
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scenes.agents import along, speed_profile, static
from scenes.config import LANE_WIDTH, N_STEPS, T_START
from scenes.geometry import SHOULDER, Path, Road, smoothstep

ROAD_X0 = -60.0                  # road chains start here; the ego path starts at x = 0
PATH_LENGTH = 480.0              # covers a drive's whole time grid at the heldout split's 19 m/s


@dataclass
class Scenario:
    family: str
    roads: list
    path: Path
    v_init: float
    cruise: float
    agents: list = field(default_factory=list)
    stops: list = field(default_factory=list)
    paint: list = field(default_factory=list)     # (x, y, yaw, length, width, rgb) on the ground
    causes: list = field(default_factory=list)    # [(agent index, facts), ...] in preference order
    facts: dict = field(default_factory=dict)     # facts when no agent is the cause
    plan: str = ""                                # lateral plan: nudge_left, turn_left, ...
    decide: object = None                         # (motion, facts) -> decision or None


def straight_road(lanes: int = 1) -> Road:
    return Road((ROAD_X0, 0.0, 0.0), [(700.0, 0.0)], lanes=lanes)


def ego_path(road: Road, offset) -> Path:
    """The ego path starts where the road passes x = 0 (road s = -ROAD_X0 on straight roads)."""
    return Path.along(road, -ROAD_X0, -ROAD_X0 + PATH_LENGTH, offset)


def lateral_plan(d_lane: float, shifts=()):
    """Offset(road s): d_lane plus quintic shifts (amount, s_out0, s_out1, s_back0, s_back1)."""
    def offset(s):
        d = np.full_like(np.asarray(s, dtype=np.float64), d_lane)
        for amount, a0, a1, b0, b1 in shifts:
            d += amount * (smoothstep(s, a0, a1) - (smoothstep(s, b0, b1) if b1 > b0 else 0.0))
        return d
    return offset


def ramp_length(v: float, amount: float) -> float:
    """Shift length so that lateral accel stays near 1.5 m/s^2: peak 5.77 A v^2 / L^2."""
    return float(np.clip(np.sqrt(5.77 * abs(amount) * v * v / 1.5), 12.0, 90.0))


def speeds(rng, ranges, slower_start: float = 0.25):
    """(v_init, cruise): mostly cruising near the set speed, sometimes speeding up to it."""
    cruise = rng.uniform(*ranges.speed)
    v_init = cruise * (rng.uniform(0.5, 0.8) if rng.random() < slower_start else rng.uniform(0.93, 1.0))
    return float(v_init), float(cruise)


def t0_x(v_init: float) -> float:
    """Roughly where the ego is at t0 (it starts at x = 0 at T_START)."""
    return -T_START * v_init


def add_background(rng, scen: Scenario, road: Road, n: int, x0: float, keep_clear=(), oncoming=True):
    """n parked cars on the right shoulder or oncoming cars, away from keep_clear (x0, x1) spans."""
    placed = []
    for _ in range(n):
        for _try in range(8):
            x = x0 + rng.uniform(-15.0, 90.0)
            if all(not (a - 6 < x < b + 6) for a, b in keep_clear) and all(abs(x - p) > 7 for p in placed):
                break
        else:
            continue
        if rng.random() < 0.5 or not oncoming:
            kind = "car" if rng.random() < 0.75 else "van"
            d = -(road.half_width + 1.2)
            px, py, th = road.pose(np.array(x - ROAD_X0), d)
            scen.agents.append(static(kind, float(px), float(py), float(th), role="parked"))
            placed.append(x)
        else:
            v = rng.uniform(7.0, 14.0)
            s0 = x - ROAD_X0 - T_START * v + rng.uniform(20.0, 60.0)
            scen.agents.append(along("car", road, s0, np.full(N_STEPS, v), offset=LANE_WIDTH / 2,
                                     reverse=True, role="oncoming"))


def free_cruise(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.35)
    scen = Scenario("free_cruise", [road], ego_path(road, -LANE_WIDTH / 2), v_init, cruise)
    add_background(rng, scen, road, rng.integers(ranges.density[0], ranges.density[1] + 1), t0_x(v_init))
    scen.decide = lambda m, f: {"keep": "keep_speed", "speed": "speed_up"}.get(m)
    return scen


def _lead(rng, scen, road, v_init, gap, v_lead, events=()):
    kind = "car" if rng.random() < 0.7 else "van"
    s0 = -ROAD_X0 + gap + (v_init - v_lead) * (-T_START)     # gap at t0 if nobody brakes
    lead = along(kind, road, s0, speed_profile(v_lead, events), offset=-LANE_WIDTH / 2, role="lead")
    scen.agents.append(lead)
    return len(scen.agents) - 1, kind


def follow(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    v_lead = v_init * rng.uniform(0.7, 1.0)
    scen = Scenario("follow", [road], ego_path(road, -LANE_WIDTH / 2), v_init, cruise)
    gap = 6.0 + v_lead * rng.uniform(1.2, 2.2)
    idx, kind = _lead(rng, scen, road, v_init, gap, v_lead)
    scen.causes = [(idx, {"noun": kind})]
    add_background(rng, scen, road, rng.integers(ranges.density[0], ranges.density[1] + 1), t0_x(v_init))
    scen.decide = lambda m, f: "follow" if m in ("keep", "slow", "speed") else None
    return scen


def lead_braking(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    scen = Scenario("lead_braking", [road], ego_path(road, -LANE_WIDTH / 2), v_init, cruise)
    t_brake = -1.4 + 0.7 * rng.uniform(*ranges.event_delay)
    v_end = 0.0 if rng.random() < 0.5 else v_init * rng.uniform(0.2, 0.5)
    gap = 6.0 + v_init * rng.uniform(1.5, 2.5)
    idx, kind = _lead(rng, scen, road, v_init, gap, v_init, [(t_brake, -rng.uniform(2.0, 4.0), v_end)])
    scen.causes = [(idx, {"noun": kind})]
    add_background(rng, scen, road, rng.integers(ranges.density[0], ranges.density[1] + 1), t0_x(v_init))
    scen.decide = lambda m, f: {"stop": "stop", "stopped": "stop", "slow": "slow_down"}.get(m)
    return scen


def cut_in(rng, ranges) -> Scenario:
    road = straight_road(lanes=2)
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    ego_d, inner_d = -1.5 * LANE_WIDTH, -0.5 * LANE_WIDTH
    scen = Scenario("cut_in", [road], ego_path(road, ego_d), v_init, cruise)
    v_cut = v_init * rng.uniform(0.75, 1.0)
    t_cut = -1.2 + 0.6 * rng.uniform(*ranges.event_delay)      # drifting already at t0 (seen in 2 frames)
    lead_at_t0 = rng.uniform(10.0, 18.0)                  # metres ahead of the ego at t0
    s0 = -ROAD_X0 + t0_x(v_init) - (-T_START) * v_cut + lead_at_t0
    dur = rng.uniform(2.0, 3.0)
    shift = lambda t: inner_d + (ego_d - inner_d) * smoothstep(t, t_cut, t_cut + dur)   # noqa: E731
    kind = "car" if rng.random() < 0.8 else "van"
    scen.agents.append(along(kind, road, s0, np.full(N_STEPS, v_cut), offset=shift, role="cut_in"))
    scen.causes = [(0, {"noun": kind})]
    add_background(rng, scen, road, rng.integers(ranges.density[0], ranges.density[1] + 1), t0_x(v_init))
    scen.decide = lambda m, f: {"slow": "slow_down", "stop": "slow_down"}.get(m)
    return scen


def curve(rng, ranges) -> Scenario:
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    side = 1.0 if rng.random() < 0.5 else -1.0
    radius, angle = rng.uniform(35.0, 90.0), np.radians(rng.uniform(15.0, 40.0))
    x_start = t0_x(v_init) + rng.uniform(-15.0, 35.0) + 5.0 * rng.uniform(*ranges.event_delay)
    road = Road((ROAD_X0, 0.0, 0.0), [(x_start - ROAD_X0, 0.0), (radius * angle, side / radius), (600.0, 0.0)])
    scen = Scenario("curve", [road], ego_path(road, -LANE_WIDTH / 2), v_init, cruise)
    add_background(rng, scen, road, rng.integers(ranges.density[0], ranges.density[1] + 1), t0_x(v_init))
    scen.facts = {"side": "left" if side > 0 else "right"}
    scen.decide = lambda m, f: {"slow": "slow_down", "keep": "keep_lane", "speed": "keep_lane"}.get(m)
    return scen


def turn(rng, ranges) -> Scenario:
    """An L junction: the main road ends at a cross road that only leads to one side."""
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    cruise = min(cruise, 10.0)
    left = rng.random() < 0.5
    radius = rng.uniform(10.0, 14.0) if left else rng.uniform(7.0, 10.0)
    x_j = t0_x(v_init) + rng.uniform(22.0, 40.0) + 6.0 * rng.uniform(*ranges.event_delay)
    hw = LANE_WIDTH
    main = Road((ROAD_X0, 0.0, 0.0), [(x_j + hw + SHOULDER - ROAD_X0, 0.0)])
    sign = 1.0 if left else -1.0
    cross = Road((x_j, -sign * (hw + SHOULDER), sign * np.pi / 2), [(500.0, 0.0)])
    lane_x = x_j + sign * hw / 2                         # the cross road's lane for our direction
    x_a = lane_x - radius
    chain = Road((0.0, -hw / 2, 0.0), [(x_a, 0.0), (radius * np.pi / 2, sign / radius), (500.0, 0.0)])
    path = Path.along(chain, 0.0, PATH_LENGTH)
    scen = Scenario("turn", [main, cross], path, v_init, cruise)
    scen.plan = "turn_left" if left else "turn_right"
    scen.facts = {"side": "left" if left else "right"}
    scen.decide = lambda m, f: scen.plan
    n = rng.integers(ranges.density[0], ranges.density[1] + 1)
    add_background(rng, scen, main, min(n, 2), t0_x(v_init), keep_clear=[(x_j - 25, x_j + 30)], oncoming=False)
    return scen
