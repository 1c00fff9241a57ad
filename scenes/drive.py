"""Drives: a scenario unrolled in time, one planning cycle every 0.1 s, each labelled at its instant.

    run = simulate_scenario(scen)                 the expert through the whole time grid
    labels = label_cycle(scen, run, step, rng)    cause, facts, decision and CoC at one step

A cycle at grid step n sees what the planner gets at t = TIMES[n]: every camera at t - 0.5 s
and t, and the 16-pose history ending at t, all in the ego frame at t. Its labels are the
expert's 6.4 s future from t and the CoC of that instant: the cause is the first of the
scenario's candidates that is visible and ahead at t (its facts read at t: a light's colour, a
lead's brake lights, a pedestrian walking or waiting), or the road's curvature ahead for curves
and turns, else the clear road; the decision follows from the expert's motion after t and the
cause, except where that motion hangs on what the frames cannot show: at a red light the
decision is to stop (or stay stopped) even when the light turns green later in the 6.4 s
future, and on a clear road it is to keep speed even when the expert will slow for a cause not
visible yet. So the commitment changes when an event happens and holds between events, while the
routine part follows the history every cycle. Visibility has hysteresis (MIN_VISIBLE_PIXELS to
be named, HOLD_VISIBLE_PIXELS to stay named), so a far cause does not flicker from cycle to cycle.

Closed loop: `render_cycle(scen, ego_world, step)` renders a cycle for any ego path (agents keep
their scripts: non-reactive), with images and history from that path.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scenes.config import (DT, FRAME_OFFSETS, HIST_POSES, HOLD_VISIBLE_PIXELS, MIN_VISIBLE_PIXELS, N_STEPS,
                           TIMES)
from scenes.language import make_coc, num
from scenes.planner import ego_poses, simulate
from scenes.render import render_frame, visible_pixels

CURVE_LOOKAHEAD = 70.0          # m of path ahead in which a bend is named
HOLD_STEPS = 20                 # steps (2 s) the visibility hysteresis looks back at most
GENERIC = {"keep": "keep_speed", "speed": "speed_up", "slow": "slow_down", "stop": "stop", "stopped": "stop",
           "start": "speed_up"}
OVERRIDES = {   # cause kind -> motion -> decision, over GENERIC
    "follow": {"keep": "follow", "slow": "follow", "speed": "follow"},
    "lead_braking": {"keep": "follow", "speed": "follow"},
    "lead_stopped": {"keep": "follow", "speed": "follow"},
    "stop_sign": {"slow": "stop"},
    "pedestrian_crossing": {"stop": "yield", "slow": "yield"},
    "pedestrian_waiting": {"stop": "yield", "slow": "yield"},
    "pedestrian_hidden": {"stop": "slow_down"},
    "cyclist": {"keep": "follow", "slow": "follow"},
    "curve": {"keep": "keep_lane", "speed": "keep_lane"},
    # slowing for what is not visible yet: the frames show a clear road
    "free_cruise": {"slow": "keep_speed", "stop": "keep_speed"},
    "cut_in": {"stop": "slow_down"},
}
LATERAL = {"cyclist": "nudge_left", "cones": "nudge_left", "door": "nudge_left", "stalled": "change_lane_left"}


@dataclass
class Run:
    """The expert through one scenario's time grid (world frame)."""
    poses: np.ndarray            # (N_STEPS, 3) ego x, y, heading
    s: np.ndarray                # (N_STEPS,) arc length on the ego path
    v: np.ndarray                # (N_STEPS,) speed


def simulate_scenario(scen) -> Run:
    s, v, _ = simulate(scen.path, scen.v_init, scen.cruise, scen.agents, scen.stops)
    return Run(ego_poses(scen.path, s), s, v)


def to_ego(poses: np.ndarray, origin) -> np.ndarray:
    """World (..., 3) poses -> the ego frame at `origin` (x forward, y left, heading wrapped);
    `origin` is one pose (3,) or one per batch row, broadcasting against `poses[..., 0]`."""
    origin = np.asarray(origin)
    x0, y0, th0 = origin[..., 0], origin[..., 1], origin[..., 2]
    c, s = np.cos(th0), np.sin(th0)
    dx, dy = poses[..., 0] - x0, poses[..., 1] - y0
    th = np.angle(np.exp(1j * (poses[..., 2] - th0)))
    return np.stack([c * dx + s * dy, -s * dx + c * dy, th], axis=-1)


def boxes_at(agents, step: int) -> list:
    return [(*box, i) for i, agent in enumerate(agents) for box in agent.boxes(step)]


def history_at(ego_world: np.ndarray, step: int) -> np.ndarray:
    """(16, 3) float32 history ending at `step`, in the ego frame there."""
    return to_ego(ego_world[step - HIST_POSES + 1: step + 1], ego_world[step]).astype(np.float32)


def future_at(ego_world: np.ndarray, step: int) -> np.ndarray:
    return to_ego(ego_world[step + 1: step + 65], ego_world[step]).astype(np.float32)


def motion(v: np.ndarray, step: int) -> str:
    """The expert's longitudinal behaviour after `step` from its speeds."""
    v0, fut = v[step], v[step + 1: step + 65]
    if v0 < 0.5:
        return "stopped" if fut.max() < 0.5 else "start"
    if fut.min() < 0.5:
        return "stop"
    if fut.min() < v0 - 1.5:
        return "slow"
    return "speed" if fut.max() > v0 + 1.5 else "keep"


def lateral_ahead(plan: str, future: np.ndarray) -> bool:
    """A lateral manoeuvre still lies ahead in the expert's future."""
    if plan in ("nudge_left", "change_lane_left"):
        return future[:, 1].max() > 0.3
    if plan == "turn_left":
        return future[-1, 2] > 0.8
    if plan == "turn_right":
        return future[-1, 2] < -0.8
    return False


def _agent_kind(scen, idx: int, base: dict, step: int, local: np.ndarray) -> str | None:
    """The cause kind candidate `idx` stands for at `step` (None when it is not a cause then)."""
    a = scen.agents[idx]
    fam, speed = scen.family, a.speed()
    if fam in ("follow", "lead_braking", "cut_in"):
        lat_rate = abs(a.poses[min(step + 1, N_STEPS - 1), 1] - a.poses[max(step - 1, 0), 1]) / (2 * DT)
        if fam == "cut_in" and lat_rate > 0.15:
            return "cut_in"
        if fam == "cut_in" and abs(local[1]) > 2.0:
            return None
        if a.braking[step] and speed[step] > 0.3:
            return "lead_braking"
        return "lead_stopped" if speed[step] < 0.3 else "follow"
    if fam == "stop_sign":
        return "stop_sign"
    if fam == "traffic_light":
        recent = a.light[max(step - 20, 0): step + 1]
        return "light_turned" if a.light[step] == 2 and (recent == 0).any() else "light"
    if fam == "pedestrian":
        if base.get("occluded"):
            return "pedestrian_hidden"
        moved = np.abs(a.poses[step, :2] - a.poses[0, :2]).sum() > 0.05
        if speed[step] > 0.2:
            return "pedestrian_crossing"
        return None if moved else "pedestrian_waiting"       # across and standing: no longer a cause
    if fam == "cyclist":
        return "cyclist"
    if fam == "obstacle":
        return "stalled" if base.get("blocked") else "cones"
    if fam == "door_zone":
        return "door"
    return None


def _bend(scen, run, step: int):
    """(side, distance to its start) of the first bend within CURVE_LOOKAHEAD, or None."""
    path = scen.path
    s0 = run.s[step]
    sel = (path.s >= s0) & (path.s <= s0 + CURVE_LOOKAHEAD)
    bent = np.abs(path.kappa[sel]) > 0.01
    if not bent.any():
        return None
    first = np.argmax(bent)
    k = path.kappa[sel][first]
    return ("left" if k > 0 else "right"), float(path.s[sel][first] - s0)


def _visible(scen, run, step: int, boxes, origin, idx: int) -> bool:
    """Visibility with hysteresis: named at MIN_VISIBLE_PIXELS, kept while HOLD_VISIBLE_PIXELS.

    True when the agent covers MIN_VISIBLE_PIXELS now, or covers HOLD_VISIBLE_PIXELS now and at
    every step back to one (at most HOLD_STEPS back) where it covered MIN_VISIBLE_PIXELS. The
    id-image pixel count of a far, thin agent aliases between steps; this keeps its name steady.
    """
    now = visible_pixels(origin, boxes, idx)
    if now >= MIN_VISIBLE_PIXELS:
        return True
    if now < HOLD_VISIBLE_PIXELS:
        return False
    for back in range(step - 1, max(step - HOLD_STEPS, 0) - 1, -1):
        px = visible_pixels(run.poses[back], boxes_at(scen.agents, back), idx)
        if px >= MIN_VISIBLE_PIXELS:
            return True
        if px < HOLD_VISIBLE_PIXELS:
            return False
    return False


def find_cause(scen, run, step: int, boxes, origin, ego_world=None):
    """(kind, facts, agent index or None) of the cycle at `step`."""
    if scen.family in ("curve", "turn"):
        bend = _bend(scen, run, step)
        if bend is not None:
            return scen.family, {"side": bend[0], "distance": bend[1]}, None
        return "free_cruise", {}, None
    hidden_ped_gone = False
    for idx, base in scen.causes:
        local = to_ego(scen.agents[idx].poses[step], origin)
        if local[0] < 0.5:
            if scen.family == "pedestrian" and not base.get("occluded"):
                hidden_ped_gone = True
            continue
        kind = _agent_kind(scen, idx, base, step, local)
        if kind is None:
            if scen.family == "pedestrian":
                hidden_ped_gone = True
            continue
        if kind == "pedestrian_hidden" and hidden_ped_gone:
            continue
        if not _visible(scen, run, step, boxes, origin, idx):
            continue
        facts = {"noun": base["noun"] if base.get("noun") in ("car", "van") else "car",
                 "distance": float(local[0])}
        if kind == "light":
            facts["light"] = ("red", "yellow", "green")[int(scen.agents[idx].light[step])]
        return kind, facts, idx
    return "free_cruise", {}, None


def details(scen, run, step: int, kind: str, facts: dict, cause, origin) -> dict:
    """The optional detail clauses that hold at this cycle: key -> its {num} or None."""
    out = {"lane": None}
    v = float(run.v[step])
    if cause is not None and v > 1.0 and "distance" in facts:
        d = facts["distance"]
        agent = scen.agents[cause]
        if kind in ("follow", "lead_braking", "lead_stopped", "cyclist", "cut_in"):
            out["gap"] = num(d / v)
            if agent.braking[step]:
                out["brake_lights"] = None
        closing = v - (float(agent.speed()[step]) if kind not in ("pedestrian_crossing", "pedestrian_waiting") else 0.0)
        if closing > 0.5 and d / closing < 10.0:
            out["ttc"] = num(d / closing)
    for a in scen.agents:
        x, y, _ = to_ego(a.poses[step], origin)
        if a.role == "oncoming" and 0.0 < x < 80.0 and abs(y) < 10.0:
            out["oncoming"] = None
        if a.role == "parked" and 0.0 < x < 60.0:
            out["parked"] = None
    return out


def decide(kind: str, move: str, plan: str, future: np.ndarray, light: str | None = None) -> str:
    lateral = LATERAL.get(kind)
    if kind == "turn" and lateral_ahead(plan, future):
        return plan
    if lateral and plan == lateral and lateral_ahead(plan, future):
        return lateral
    if kind == "light" and light == "green" and move == "slow":
        return "slow_down"
    if kind == "light" and light == "red":
        return "stop"            # what the frames show; a later green is not in them
    return OVERRIDES.get(kind, {}).get(move, GENERIC[move])


@dataclass
class CycleLabels:
    step: int
    history: np.ndarray
    future: np.ndarray
    kind: str
    facts: dict
    cause: int | None
    decision: str
    coc: str
    coc_routine: list


def label_cycle(scen, run: Run, step: int, rng) -> CycleLabels:
    origin = run.poses[step]
    history, future = history_at(run.poses, step), future_at(run.poses, step)
    boxes = boxes_at(scen.agents, step)
    kind, facts, cause = find_cause(scen, run, step, boxes, origin)
    decision = decide(kind, motion(run.v, step), scen.plan, future, facts.get("light"))
    extra = details(scen, run, step, kind, facts, cause, origin)
    coc, flags = make_coc(history, kind, facts, decision, extra, rng)
    return CycleLabels(step, history, future, kind, {k: v for k, v in facts.items() if k != "distance"},
                       cause, decision, coc, flags)


def render_steps(scen, ego_world: np.ndarray, steps) -> dict:
    """{step: (rgb (C, H, W, 3), ids (C, H, W))} of the cameras at each grid step on this ego path."""
    return {n: render_frame(ego_world[n], boxes_at(scen.agents, n), scen.roads, scen.paint) for n in steps}


def cycle_frames(frames: dict, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(images (C, 2, H, W, 3), ids (C, 2, H, W)) of one cycle from rendered steps."""
    picked = [frames[step - k] for k in FRAME_OFFSETS]
    return np.stack([f[0] for f in picked], axis=1), np.stack([f[1] for f in picked], axis=1)


def render_cycle(scen, ego_world: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """What the planner gets at `step` when the ego drove `ego_world` (N_STEPS, 3) (closed loop):
    (images (C, 2, H, W, 3) uint8, history (16, 3) float32). Agents keep their scripts."""
    ego_world = np.asarray(ego_world, dtype=np.float64)
    if ego_world.shape != (N_STEPS, 3) or not np.isfinite(ego_world[: step + 1]).all():
        raise ValueError(f"ego path must be ({N_STEPS}, 3) finite world poses up to step {step}; "
                         f"got {ego_world.shape}")
    frames = render_steps(scen, ego_world, [step - k for k in FRAME_OFFSETS])
    return cycle_frames(frames, step)[0], history_at(ego_world, step)


def cycle_steps(seconds: float) -> np.ndarray:
    """Grid steps of a drive's cycles: 10 Hz, centred on the scenario's t0."""
    n = int(round(seconds / DT))
    first = int(np.argmin(np.abs(TIMES - (-n // 2) * DT)))
    return first + np.arange(n)
