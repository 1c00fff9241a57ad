"""make_scene / make_drive: draw a scenario, drive the expert through it, check it, label and render it.

A draw is rejected and redrawn (seed, attempt + 1) when the expert breaks a limit or touches an
agent anywhere on the time grid, or when a cycle of the longest drive does not fit the
trajectory tokens. A drive's cycles are labelled at their own instants (scenes/drive.py); a
snapshot (`make_scene`) is one cycle of the default 8 s drive, drawn from the seed. Everything is
a function of (seed, family, split): the same arguments give the same Scene or Drive, and a
snapshot equals the same cycle of its drive.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prompt.trajectory import FUT_WAYPOINTS, HIST_POSES, future_fits, history_bins
from scenes import events, families
from scenes.checks import first_collision, limit_violation
from scenes.config import (DRIVE_SECONDS, FAMILIES, FRAME_OFFSETS, MAX_DRIVE_SECONDS, SPLITS, TIMES,
                           UNSEEN_FAMILY, ConfigError, check_choice, ranges_for)
from scenes.drive import (boxes_at, cycle_frames, cycle_steps, label_cycle, render_steps,
                          simulate_scenario, to_ego)

MAX_ATTEMPTS = 60
LABEL_STREAM = 1000              # language generator of cycle n: default_rng([seed, attempt, 1000 + n])


@dataclass
class Scene:
    """One planning cycle: what the planner gets at its instant, and its labels."""
    history: np.ndarray          # (16, 3) float32, ego frame at t, history[-1] = (0, 0, 0)
    future: np.ndarray           # (64, 3) float32, t + 0.1 .. t + 6.4 s
    coc: str
    coc_routine: list            # per CoC word: True for routine words
    family: str                  # the scenario's family
    cause: int | None            # index into agents (and the id images), None without a cause
    decision: str
    agents: list                 # per agent: dict with id, kind, role, pose and size at t
    agent_poses: np.ndarray      # (K, 80, 3) float32, every agent from t - 1.5 s to t + 6.4 s
    split: str = "train"
    seed: int = 0
    cause_kind: str = "free_cruise"   # what the commitment names (scenes.language.CAUSE)
    cause_facts: dict = field(default_factory=dict)   # its non-number facts: noun, side, light
    cycle: int = 0               # index of this cycle in its drive
    time: float = 0.0            # s, the cycle's instant relative to the scenario's t0
    unseen_family: bool = False
    roads: list = field(default_factory=list)   # ego-frame road chains (for pictures)
    paint: list = field(default_factory=list)
    images: np.ndarray = None    # (4, 2, H, W, 3) uint8, frames t - 0.5 s and t
    ids: np.ndarray = None       # (4, 2, H, W) int16, agent index per pixel, -1 none


@dataclass
class Drive:
    """A scenario unrolled in time: one Scene per 0.1 s cycle, plus what closed loop needs."""
    seed: int
    split: str
    family: str
    seconds: float
    cycles: list                 # [Scene], images included when rendered
    ego_world: np.ndarray        # (N_STEPS, 3) the expert's world poses
    steps: np.ndarray            # (C,) grid step of each cycle
    scenario: object = None      # scenes.families.Scenario (for closed-loop rendering)


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


def snapshot_cycle(seed: int) -> int:
    """Which cycle of its default drive the snapshot of `seed` is."""
    return int(np.random.default_rng([seed, 104729]).integers(len(cycle_steps(DRIVE_SECONDS))))


def make_scene(seed: int, family: str | None = None, split: str = "train", render: bool = True) -> Scene:
    """The snapshot of `seed`: one cycle (snapshot_cycle) of its default drive."""
    drive = make_drive(seed, family, split, DRIVE_SECONDS, render, only=snapshot_cycle(seed))
    return drive.cycles[0]


def make_drive(seed: int, family: str | None = None, split: str = "train", seconds: float = DRIVE_SECONDS,
               render: bool = True, only: int | None = None) -> Drive:
    """The drive of `seed`: cycles at 10 Hz over `seconds` (at most MAX_DRIVE_SECONDS) centred on
    the scenario's t0; `only` keeps one cycle (by index) and renders just its frames."""
    check_choice("split", split, SPLITS)
    if not 0.1 <= seconds <= MAX_DRIVE_SECONDS:
        raise ConfigError(f"seconds={seconds!r}: a drive lasts 0.1 .. {MAX_DRIVE_SECONDS} s")
    family = family or pick_family(seed, split)
    check_choice("family", family, FAMILIES)
    ranges = ranges_for(split)
    for attempt in range(MAX_ATTEMPTS):
        rng = np.random.default_rng([seed, attempt])
        scen = BUILDERS[family](rng, ranges)
        run = simulate_scenario(scen)
        if _valid(scen, run):
            return _drive(scen, run, seed, attempt, split, seconds, render, only)
    raise RuntimeError(f"no valid {family} drive for seed {seed} in {MAX_ATTEMPTS} draws")


def _valid(scen, run) -> bool:
    if limit_violation(run.poses) or first_collision(run.poses, scen.agents):
        return False
    return _cycles_fit_tokens(run.poses)


def _cycles_fit_tokens(poses: np.ndarray) -> bool:
    """Whether the history and future of every cycle of the longest drive fit the trajectory
    tokens: encode_history(history_at(poses, n)) and encode_future(future at n) for every n, all
    cycles in one batch (the same arithmetic element for element; tests/test_scenes_drives.py
    holds it to the per-cycle calls)."""
    steps = cycle_steps(MAX_DRIVE_SECONDS)
    if steps.min() - HIST_POSES + 1 < 0 or steps.max() + FUT_WAYPOINTS >= len(poses):
        return False
    origin = poses[steps][:, None, :]                                         # (C, 1, 3)
    hist = to_ego(poses[steps[:, None] + np.arange(1 - HIST_POSES, 1)], origin).astype(np.float32)
    future = to_ego(poses[steps[:, None] + np.arange(1, FUT_WAYPOINTS + 1)], origin)
    if not np.isfinite(hist).all():
        return False
    return bool((history_bins(hist)[1] < 0).all() and future_fits(future).all())


def _drive(scen, run, seed, attempt, split, seconds, render, only) -> Drive:
    steps = cycle_steps(seconds)
    chosen = list(enumerate(steps)) if only is None else [(only, steps[only])]
    frames = {}
    if render:
        need = sorted({int(n) - k for _, n in chosen for k in FRAME_OFFSETS})
        frames = render_steps(scen, run.poses, need)
    cycles = []
    for c, n in chosen:
        lab = label_cycle(scen, run, int(n), np.random.default_rng([seed, attempt, LABEL_STREAM + int(n)]))
        origin = run.poses[n]
        scene = Scene(lab.history, lab.future, lab.coc, lab.coc_routine, scen.family, lab.cause, lab.decision,
                      _agent_info(scen.agents, origin, int(n)), _agent_poses(scen.agents, origin, int(n)),
                      split=split, seed=seed, cause_kind=lab.kind, cause_facts=lab.facts, cycle=int(c),
                      time=round(float(TIMES[n]), 3), unseen_family=scen.family == UNSEEN_FAMILY,
                      roads=_roads(scen.roads, origin), paint=_paint(scen.paint, origin))
        if render:
            scene.images, scene.ids = cycle_frames(frames, int(n))
        cycles.append(scene)
    return Drive(seed, split, scen.family, float(seconds), cycles, run.poses.astype(np.float32),
                 steps[[c for c, _ in chosen]], scen)


BUILDERS = {
    "free_cruise": families.free_cruise, "follow": families.follow, "lead_braking": families.lead_braking,
    "stop_sign": events.stop_sign, "traffic_light": events.traffic_light, "pedestrian": events.pedestrian,
    "cyclist": events.cyclist, "obstacle": events.obstacle, "door_zone": events.door_zone,
    "curve": families.curve, "turn": families.turn, "cut_in": families.cut_in,
}


def _agent_info(agents, origin, step: int) -> list:
    out = []
    for i, a in enumerate(agents):
        x, y, yaw = to_ego(a.poses[step], origin)
        info = {"id": i, "kind": a.kind, "role": a.role, "x": round(float(x), 3), "y": round(float(y), 3),
                "yaw": round(float(yaw), 4), "length": a.size[0], "width": a.size[1], "height": a.size[2],
                "speed": round(float(a.speed()[step]), 3)}
        if a.light is not None:
            info["light"] = ("red", "yellow", "green")[int(a.light[step])]
        out.append(info)
    return out


def _agent_poses(agents, origin, step: int) -> np.ndarray:
    if not agents:
        return np.zeros((0, 80, 3), dtype=np.float32)
    return np.stack([to_ego(a.poses[step - 15: step + 65], origin) for a in agents]).astype(np.float32)


def _roads(roads, origin) -> list:
    return [{"start": [round(float(v), 4) for v in to_ego(np.array(r.start), origin)],
             "pieces": [[float(l), float(k)] for l, k in r.pieces], "lanes": r.lanes} for r in roads]


def _paint(paint, origin) -> list:
    out = []
    for x, y, yaw, length, width, color in paint:
        px, py, pyaw = to_ego(np.array([x, y, yaw]), origin)
        out.append([round(float(px), 3), round(float(py), 3), round(float(pyaw), 4), length, width, list(color)])
    return out

