"""Event families: stop sign, traffic light, pedestrian crossing, cyclist, obstacle, door zone.

Same conventions as scenes/families.py (straight roads from x = -60, ego from x = 0; road s of
a point at x is x - ROAD_X0). Distances are drawn so that the cause sits in the tele camera's
view at t0 most of the time; the world checks visibility and redraws when it is not.
"""
from __future__ import annotations

import numpy as np

from scenes.agents import GREEN, RED, YELLOW, along, light_schedule, static, walker
from scenes.config import LANE_WIDTH, N_STEPS, T0_INDEX, T_START
from scenes.families import (ROAD_X0, Scenario, add_background, ego_path, lateral_plan,
                             ramp_length, speeds, straight_road, t0_x)
from scenes.geometry import SHOULDER, Road
from scenes.planner import StopRule

WHITE = (235, 235, 235)
HW = LANE_WIDTH                  # half width of a one-lane-per-direction road


def _junction(scen: Scenario, x_line: float):
    """A cross road just past the stop line, and the line painted across the ego lane."""
    scen.roads.append(Road((x_line + HW + 1.0, -150.0, np.pi / 2), [(300.0, 0.0)]))
    scen.paint.append((x_line + 0.25, -HW / 2, 0.0, 0.5, HW, WHITE))


def _density(rng, ranges):
    return int(rng.integers(ranges.density[0], ranges.density[1] + 1))


def stop_sign(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    x_line = t0_x(v_init) + rng.uniform(20.0, 45.0) + 8.0 * rng.uniform(*ranges.event_delay)
    scen = Scenario("stop_sign", [road], ego_path(road, -HW / 2), v_init, cruise)
    scen.stops.append(StopRule(x_line, "stop_sign", hold=rng.uniform(0.8, 1.5)))
    _junction(scen, x_line)
    scen.agents.append(static("stop_sign", x_line + 0.5, -(HW + SHOULDER - 0.6), 0.0, role="control"))
    scen.causes = [(0, {"noun": "stop sign"})]
    add_background(rng, scen, road, _density(rng, ranges), t0_x(v_init), keep_clear=[(x_line - 10, x_line + 10)])
    scen.decide = lambda m, f: "stop" if m in ("stop", "slow") else None
    return scen


def traffic_light(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    kind = rng.choice(["red", "green", "yellow", "turned_green"], p=[0.35, 0.25, 0.2, 0.2])
    delay = rng.uniform(*ranges.event_delay)
    x_line = t0_x(v_init) + rng.uniform(20.0, 45.0) + 8.0 * delay
    if kind == "red":
        changes = [(-9.0, RED)] + ([(rng.uniform(1.5, 6.0) + delay, GREEN)] if rng.random() < 0.5 else [])
    elif kind == "green":
        changes = [(-9.0, GREEN)]
    elif kind == "yellow":
        t_y = -1.6 + 0.8 * delay
        changes = [(-9.0, GREEN), (t_y, YELLOW), (t_y + 3.0, RED)]
    else:                               # ego waits at the line; the light turned green just now
        v_init, x_line = 0.0, 2.3 + rng.uniform(1.0, 2.5)
        changes = [(-9.0, RED), (rng.uniform(-1.4, -0.3) + 0.3 * delay, GREEN)]
    light = light_schedule(changes)
    scen = Scenario("traffic_light", [road], ego_path(road, -HW / 2), v_init, cruise)
    scen.stops.append(StopRule(x_line, "light", light=light))
    _junction(scen, x_line)
    scen.agents.append(static("traffic_light", x_line + 1.0, -(HW + SHOULDER - 0.5), 0.0, light=light,
                              role="control"))
    state = {RED: "red", YELLOW: "yellow", GREEN: "green"}
    scen.causes = [(0, {"noun": "light", "light": state[int(light[T0_INDEX])],
                        "turned": kind == "turned_green"})]
    add_background(rng, scen, road, _density(rng, ranges), max(t0_x(v_init), 10.0),
                   keep_clear=[(x_line - 10, x_line + 10)])
    table = {"red": {"stop": "stop", "stopped": "stop", "slow": "slow_down"},
             "green": {"keep": "keep_speed", "speed": "speed_up"},
             "yellow": {"stop": "stop", "slow": "slow_down", "keep": "keep_speed", "speed": "keep_speed"},
             "turned_green": {"start": "speed_up", "speed": "speed_up"}}[kind]
    scen.decide = lambda m, f: table.get(m)
    return scen


def pedestrian(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    delay = rng.uniform(*ranges.event_delay)
    occluded = rng.random() < 0.5
    from_left = not occluded and rng.random() < 0.4
    x_cw = t0_x(v_init) + (rng.uniform(32.0, 45.0) if from_left else rng.uniform(22.0, 40.0)) + 5.0 * delay
    scen = Scenario("pedestrian", [road], ego_path(road, -HW / 2), v_init, cruise)
    for j in range(int(2 * (HW + SHOULDER) / 1.0)):           # zebra stripes across the road
        scen.paint.append((x_cw, -(HW + SHOULDER) + 0.5 + 1.0 * j, 0.0, 3.0, 0.5, WHITE))
    side = 1.0 if from_left else -1.0
    y0 = side * (HW + SHOULDER + 0.5)
    walk = rng.uniform(1.1, 1.6)
    t_arrive = (x_cw - 3.0) / v_init + T_START                 # the ego at the crosswalk, unhindered
    entry = -HW / 2 + side * 2.25                             # where it enters the ego corridor
    to_corridor = abs(y0 - entry) / walk
    t_start = t_arrive - to_corridor - rng.uniform(-0.5, 2.0) + 0.5 * delay
    x_ped = x_cw - 0.5 if occluded else x_cw + rng.uniform(-1.0, 1.0)
    ped = walker("pedestrian", x_ped, y0, -side * np.pi / 2, walk, t_start, 2 * abs(y0))
    scen.agents.append(ped)
    scen.causes = [(0, {"noun": "pedestrian", "occluded": False, "walking": bool(ped.speed()[T0_INDEX] > 0.2)})]
    if occluded:
        scen.agents.append(static("van", x_cw - rng.uniform(5.0, 7.5), -(HW + 1.2), 0.0, role="parked"))
        scen.causes.append((1, {"noun": "van", "occluded": True}))
    add_background(rng, scen, road, _density(rng, ranges), t0_x(v_init), keep_clear=[(x_cw - 25, x_cw + 8)])
    scen.decide = lambda m, f: ("slow_down" if f.get("occluded") else "yield") if m in ("stop", "slow") else None
    return scen


def cyclist(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    v_c = rng.uniform(3.0, 5.5)
    v_init = cruise = max(v_init, v_c + 3.0)
    y_c = -(HW - 0.6)
    passing = rng.random() < 0.65
    amount = (y_c + 0.35 + 1.5 + 0.95) - (-HW / 2) if passing else 0.0
    ramp = ramp_length(v_init, max(amount, 1.0))
    # the ego catches up at x_pass; the nudge starts 12 m + ramp before, around t0 or later
    x_pass = t0_x(v_init) + 12.0 + ramp + rng.uniform(-5.0, 20.0) + 5.0 * rng.uniform(*ranges.event_delay)
    x_c0 = x_pass * (v_init - v_c) / v_init                     # cyclist x at TIMES[0]
    s_pass = x_pass - ROAD_X0
    shifts = [(amount, s_pass - 12 - ramp, s_pass - 12, s_pass + 10, s_pass + 10 + ramp)] if passing else []
    scen = Scenario("cyclist", [road], ego_path(road, lateral_plan(-HW / 2, shifts)), v_init, cruise)
    scen.agents.append(along("cyclist", road, x_c0 - ROAD_X0, np.full(N_STEPS, v_c), offset=y_c, role="lead"))
    scen.causes = [(0, {"noun": "cyclist"})]
    if not passing:                     # an oncoming car makes passing unsafe: stay behind
        s_on = x_pass - ROAD_X0 + 12.0 * (x_pass / v_init + rng.uniform(-1.0, 1.5))
        scen.agents.append(along("car", road, s_on, np.full(N_STEPS, 12.0), offset=HW / 2, reverse=True,
                                 role="oncoming"))
    scen.plan = "nudge_left" if passing else ""
    add_background(rng, scen, road, _density(rng, ranges), t0_x(v_init), oncoming=False,
                   keep_clear=[(x_c0, x_pass + 20)])
    scen.decide = lambda m, f: scen.plan or ("follow" if m in ("keep", "slow") else None)
    return scen


def obstacle(rng, ranges) -> Scenario:
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    later = rng.uniform(-5.0, 20.0) + 8.0 * rng.uniform(*ranges.event_delay)   # shift starts after t0
    if rng.random() < 0.5:
        return _cones(rng, ranges, v_init, cruise, later)
    road = straight_road(lanes=2)                                # stalled vehicle: change lane
    ego_d = -1.5 * LANE_WIDTH
    ramp = ramp_length(v_init, LANE_WIDTH) * 1.3
    x_obs = t0_x(v_init) + 18.0 + ramp + later
    s_obs = x_obs - ROAD_X0
    shifts = [(LANE_WIDTH, s_obs - 18 - ramp, s_obs - 18, 0.0, 0.0)]
    scen = Scenario("obstacle", [road], ego_path(road, lateral_plan(ego_d, shifts)), v_init, cruise)
    kind = "car" if rng.random() < 0.6 else "van"
    scen.agents.append(static(kind, x_obs, ego_d + rng.uniform(-0.3, 0.3), 0.0, role="stalled"))
    scen.causes = [(0, {"noun": kind, "blocked": True})]
    scen.plan = "change_lane_left"
    add_background(rng, scen, road, _density(rng, ranges), t0_x(v_init), oncoming=False,
                   keep_clear=[(x_obs - 60, x_obs + 10)])
    scen.decide = lambda m, f: scen.plan
    return scen


def _cones(rng, ranges, v_init, cruise, later) -> Scenario:
    road = straight_road()
    n = int(rng.integers(3, 6))
    intrusion = rng.uniform(0.7, 1.2)
    ys = -(HW - 0.2) + intrusion * np.minimum(np.arange(n) / 2.0, 1.0)
    amount = (ys.max() + 0.25 + 0.5 + 0.95) - (-HW / 2)
    ramp = ramp_length(v_init, amount)
    xs = t0_x(v_init) + 8.0 + ramp + later + 2.5 * np.arange(n)
    x_obs = xs[0]
    s0, s1 = xs[0] - ROAD_X0, xs[-1] - ROAD_X0
    shifts = [(amount, s0 - 8 - ramp, s0 - 8, s1 + 6, s1 + 6 + ramp)]
    scen = Scenario("obstacle", [road], ego_path(road, lateral_plan(-HW / 2, shifts)), v_init, cruise)
    for x, y in zip(xs, ys):
        scen.agents.append(static("cone", float(x), float(y), 0.0, role="cone"))
    scen.causes = [(i, {"noun": "cones", "blocked": False}) for i in range(n)]
    scen.plan = "nudge_left"
    add_background(rng, scen, road, _density(rng, ranges), t0_x(v_init), oncoming=False,
                   keep_clear=[(x_obs - 40, x_obs + 30)])
    scen.decide = lambda m, f: scen.plan
    return scen


def door_zone(rng, ranges) -> Scenario:
    road = straight_road()
    v_init, cruise = speeds(rng, ranges, slower_start=0.0)
    x_first = t0_x(v_init) + rng.uniform(22.0, 40.0) + 6.0 * rng.uniform(*ranges.event_delay)
    n = int(rng.integers(2, 4))
    xs = x_first + np.cumsum(np.r_[0.0, rng.uniform(6.0, 7.5, n - 1)])
    y_car = -(HW + 0.95)
    which = int(rng.integers(0, n))
    scen = Scenario("door_zone", [road], None, v_init, cruise)
    for i, x in enumerate(xs):
        scen.agents.append(static("car" if i != which or rng.random() < 0.8 else "van", float(x), y_car, 0.0,
                                  role="parked"))
    car = scen.agents[which]
    door_x = xs[which] + 0.6
    door_y = y_car + car.size[1] / 2 + 0.45
    scen.agents.append(static("door", float(door_x), float(door_y), np.pi / 2, role="door"))
    amount = (door_y + 0.45 + 0.6 + 0.95) - (-HW / 2)
    ramp = ramp_length(v_init, amount)
    s0, s1 = xs[0] - ROAD_X0 - 3, xs[-1] - ROAD_X0 + 3
    shifts = [(amount, s0 - 6 - ramp, s0 - 6, s1 + 4, s1 + 4 + ramp)]
    scen.path = ego_path(road, lateral_plan(-HW / 2, shifts))
    scen.causes = [(which, {"noun": car.kind, "door": True}), (n, {"noun": car.kind, "door": True})]
    scen.plan = "nudge_left"
    add_background(rng, scen, road, _density(rng, ranges), t0_x(v_init), oncoming=False,
                   keep_clear=[(xs[0] - 30, xs[-1] + 25)])
    scen.decide = lambda m, f: scen.plan
    return scen
