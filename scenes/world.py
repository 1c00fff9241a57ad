"""make_scene: draw a scenario, drive the expert through it, check it, write the CoC, render it.

A draw is rejected and redrawn (seed, attempt + 1) when the expert breaks a limit or touches an
agent, when the trajectory does not fit the trajectory tokens, when no cause candidate covers
MIN_VISIBLE_PIXELS of an id image at t0, or when the family's decision rule refuses the motion.
Everything is a function of (seed, family, split): the same arguments give the same Scene.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prompt.trajectory import TrajectoryRangeError, encode_future, encode_history
from scenes import events, families
from scenes.checks import first_collision, limit_violation
from scenes.coc import make_coc
from scenes.config import (FAMILIES, FRAME_OFFSETS, HIST_POSES, MIN_VISIBLE_PIXELS,
                           SPLITS, T0_INDEX, UNSEEN_FAMILY, ConfigError, check_choice, ranges_for)
from scenes.planner import ego_poses, simulate
from scenes.render import render_frame, visible_pixels

BUILDERS = {
    "free_cruise": families.free_cruise, "follow": families.follow, "lead_braking": families.lead_braking,
    "stop_sign": events.stop_sign, "traffic_light": events.traffic_light, "pedestrian": events.pedestrian,
    "cyclist": events.cyclist, "obstacle": events.obstacle, "door_zone": events.door_zone,
    "curve": families.curve, "turn": families.turn, "cut_in": families.cut_in,
}
MAX_ATTEMPTS = 60
FIRST = T0_INDEX - (HIST_POSES - 1)          # first history step in the time grid


@dataclass
class Scene:
    history: np.ndarray          # (16, 3) float32, ego frame at t0, history[-1] = (0, 0, 0)
    future: np.ndarray           # (64, 3) float32, t0 + 0.1 .. t0 + 6.4 s
    coc: str
    coc_routine: list            # per CoC word: True for routine words
    family: str
    cause: int | None            # index into agents (and the id images), None without a cause
    decision: str
    agents: list                 # per agent: dict with id, kind, role, pose and size at t0
    agent_poses: np.ndarray      # (K, 80, 3) float32, every agent from t0 - 1.5 s to t0 + 6.4 s
    split: str = "train"
    seed: int = 0
    routine_variant: int = 0
    unseen_family: bool = False
    roads: list = field(default_factory=list)   # ego-frame road chains (for pictures)
    paint: list = field(default_factory=list)
    images: np.ndarray = None    # (4, 2, H, W, 3) uint8, frames t0 - 0.5 s and t0
    ids: np.ndarray = None       # (4, 2, H, W) int16, agent index per pixel, -1 none


def pick_family(seed: int, split: str, allowed=FAMILIES) -> str:
    """The family of scene `seed` in `split`: 'unseen' is always cut-in, the others never are."""
    check_choice("split", split, SPLITS)
    if split == "unseen":
        return UNSEEN_FAMILY
    seen = [f for f in FAMILIES if f != UNSEEN_FAMILY]
    weights = np.array([w if f in allowed else 0.0 for f, w in zip(seen, ranges_for(split).weights)])
    if weights.sum() == 0:
        raise ConfigError(f"split {split!r} needs a family other than {UNSEEN_FAMILY!r}; got {list(allowed)}")
    rng = np.random.default_rng([seed, 7919])
    return seen[int(rng.choice(len(seen), p=weights / weights.sum()))]


def make_scene(seed: int, family: str | None = None, split: str = "train", render: bool = True) -> Scene:
    check_choice("split", split, SPLITS)
    family = family or pick_family(seed, split)
    check_choice("family", family, FAMILIES)
    ranges = ranges_for(split)
    for attempt in range(MAX_ATTEMPTS):
        rng = np.random.default_rng([seed, attempt])
        scene = _attempt(BUILDERS[family](rng, ranges), rng, render)
        if scene is not None:
            scene.split, scene.seed, scene.unseen_family = split, seed, family == UNSEEN_FAMILY
            return scene
    raise RuntimeError(f"no valid {family} scene for seed {seed} in {MAX_ATTEMPTS} draws")


def motion(v: np.ndarray) -> str:
    """The expert's longitudinal behaviour after t0 from its speeds (N_STEPS,)."""
    v0, fut = v[T0_INDEX], v[T0_INDEX + 1:]
    if v0 < 0.5:
        return "stopped" if fut.max() < 0.5 else "start"
    if fut.min() < 0.5:
        return "stop"
    if fut.min() < v0 - 1.5:
        return "slow"
    return "speed" if fut.max() > v0 + 1.5 else "keep"


def _attempt(scen, rng, render: bool) -> Scene | None:
    s, v, _ = simulate(scen.path, scen.v_init, scen.cruise, scen.agents, scen.stops)
    poses = ego_poses(scen.path, s)
    if limit_violation(poses) or first_collision(poses, scen.agents):
        return None
    origin = poses[T0_INDEX]
    local = to_ego(poses, origin)
    history, future = local[FIRST:T0_INDEX + 1], local[T0_INDEX + 1:]
    try:
        encode_history(history), encode_future(future)
    except TrajectoryRangeError:
        return None
    if not _plan_ok(scen.plan, future):
        return None
    boxes_t0 = _boxes(scen.agents, T0_INDEX)
    cause, facts = None, scen.facts
    for idx, f in scen.causes:
        if visible_pixels(origin, boxes_t0, idx) >= MIN_VISIBLE_PIXELS:
            cause, facts = idx, f
            break
    if scen.causes and cause is None:
        return None
    decision = scen.decide(motion(v), facts)
    if decision is None:
        return None
    variant = int(rng.integers(0, 2))
    history32, future32 = history.astype(np.float32), future.astype(np.float32)
    coc, flags = make_coc(history32, scen.family, facts, decision, variant)
    scene = Scene(history32, future32, coc, flags, scen.family, cause, decision,
                  _agent_info(scen.agents, origin), _agent_poses(scen.agents, origin),
                  routine_variant=variant, roads=_roads(scen.roads, origin), paint=_paint(scen.paint, origin))
    if render:
        frames = [render_frame(poses[T0_INDEX - k], _boxes(scen.agents, T0_INDEX - k), scen.roads, scen.paint)
                  for k in FRAME_OFFSETS]
        scene.images = np.stack([f[0] for f in frames], axis=1)        # (4, 2, H, W, 3)
        scene.ids = np.stack([f[1] for f in frames], axis=1)           # (4, 2, H, W)
    return scene


def _plan_ok(plan: str, future: np.ndarray) -> bool:
    """A lateral plan must still lie ahead at t0 (it is what the commitment announces)."""
    if plan in ("nudge_left", "change_lane_left"):
        return future[:, 1].max() > 0.3
    if plan == "turn_left":
        return future[-1, 2] > 0.8
    if plan == "turn_right":
        return future[-1, 2] < -0.8
    return True


def to_ego(poses: np.ndarray, origin) -> np.ndarray:
    """World (..., 3) poses -> the ego frame at `origin` (x forward, y left, heading wrapped)."""
    x0, y0, th0 = origin
    c, s = np.cos(th0), np.sin(th0)
    dx, dy = poses[..., 0] - x0, poses[..., 1] - y0
    th = np.angle(np.exp(1j * (poses[..., 2] - th0)))
    return np.stack([c * dx + s * dy, -s * dx + c * dy, th], axis=-1)


def _boxes(agents, step: int) -> list:
    return [(*box, i) for i, agent in enumerate(agents) for box in agent.boxes(step)]


def _agent_info(agents, origin) -> list:
    out = []
    for i, a in enumerate(agents):
        x, y, yaw = to_ego(a.poses[T0_INDEX], origin)
        info = {"id": i, "kind": a.kind, "role": a.role, "x": round(float(x), 3), "y": round(float(y), 3),
                "yaw": round(float(yaw), 4), "length": a.size[0], "width": a.size[1], "height": a.size[2],
                "speed": round(float(a.speed()[T0_INDEX]), 3)}
        if a.light is not None:
            info["light"] = ("red", "yellow", "green")[int(a.light[T0_INDEX])]
        out.append(info)
    return out


def _agent_poses(agents, origin) -> np.ndarray:
    if not agents:
        return np.zeros((0, 80, 3), dtype=np.float32)
    return np.stack([to_ego(a.poses[FIRST:], origin) for a in agents]).astype(np.float32)


def _roads(roads, origin) -> list:
    return [{"start": [round(float(v), 4) for v in to_ego(np.array(r.start), origin)],
             "pieces": [[float(l), float(k)] for l, k in r.pieces], "lanes": r.lanes} for r in roads]


def _paint(paint, origin) -> list:
    out = []
    for x, y, yaw, length, width, color in paint:
        px, py, pyaw = to_ego(np.array([x, y, yaw]), origin)
        out.append([round(float(px), 3), round(float(py), 3), round(float(pyaw), 4), length, width, list(color)])
    return out

