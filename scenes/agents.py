"""Agents: their sizes, colours, simple kinematics over the time grid, and their 3D box models.

Every agent (vehicles, vulnerable road users, cones, traffic lights, stop signs) has a pose per
time step (N_STEPS, 3) in the road frame. Traffic lights carry a state per step; vehicles carry
a braking flag per step (brake lights). Controls and the sign/light poles stand off the road and
are not obstacles (`solid` False).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scenes.config import DT, N_STEPS, TIMES

# kind -> (length, width, height) in metres
SIZES = {
    "car": (4.5, 1.9, 1.5), "van": (5.2, 2.1, 2.4), "cyclist": (1.8, 0.7, 1.7),
    "pedestrian": (0.6, 0.6, 1.75), "cone": (0.5, 0.5, 0.8), "traffic_light": (0.5, 0.5, 5.0),
    "stop_sign": (0.2, 0.9, 2.6), "door": (0.9, 0.12, 1.3),
}
# kind -> RGB body colour; boxes are coloured by class. A stop sign's face is violet, a hue no
# other agent, lamp or ground has: a red face was one shade from a light's red lamp, and at
# 64 x 96 the target read every far stop sign as a traffic light.
COLORS = {
    "car": (45, 95, 225), "van": (20, 170, 165), "cyclist": (250, 225, 0),
    "pedestrian": (235, 45, 200), "cone": (255, 110, 0), "traffic_light": (40, 40, 40),
    "stop_sign": (120, 0, 255), "door": (45, 95, 225),
}
LIGHT_COLORS = ((230, 0, 0), (255, 190, 0), (0, 220, 60))   # red, yellow, green
RED, YELLOW, GREEN = 0, 1, 2
NOUNS = {"car": "car", "van": "van", "cyclist": "cyclist", "pedestrian": "pedestrian",
         "cone": "cones", "traffic_light": "light", "stop_sign": "stop sign", "door": "door"}
KINDS = tuple(SIZES)


@dataclass
class Agent:
    kind: str
    poses: np.ndarray                     # (N_STEPS, 3) x, y, heading in the road frame
    braking: np.ndarray = None            # (N_STEPS,) bool, brake lights on
    light: np.ndarray = None              # (N_STEPS,) int, RED / YELLOW / GREEN (traffic lights)
    role: str = ""                        # lead, parked, oncoming, ... (for tests and pictures)
    size: tuple = field(default=None)

    def __post_init__(self):
        if self.kind not in SIZES:
            raise ValueError(f"agent kind {self.kind!r} unknown; allowed: {', '.join(KINDS)}")
        self.size = self.size or SIZES[self.kind]
        if self.braking is None:
            self.braking = np.zeros(N_STEPS, dtype=bool)

    @property
    def solid(self) -> bool:
        """True when the ego must never overlap it (controls stand beside the road)."""
        return self.kind not in ("traffic_light", "stop_sign")

    def speed(self) -> np.ndarray:
        """(N_STEPS,) speed from the poses (finite differences, m/s)."""
        v = np.hypot(np.diff(self.poses[:, 0]), np.diff(self.poses[:, 1])) / DT
        return np.concatenate([v, v[-1:]])

    def boxes(self, step: int) -> list:
        """Boxes (x, y, z0, yaw, length, width, height, rgb) in the road frame at one step."""
        x, y, yaw = self.poses[step]
        l, w, h = self.size
        body = COLORS[self.kind]
        if self.kind == "traffic_light":
            lamp = LIGHT_COLORS[int(self.light[step])]
            return [(x, y, 0.0, yaw, 0.15, 0.15, h - 1.2, body),
                    (x, y, h - 1.3, yaw, l, w, 1.3, lamp)]
        if self.kind == "stop_sign":
            return [(x, y, 0.0, yaw, 0.08, 0.08, h - 0.9, (120, 120, 120)),
                    (x, y, h - 0.9, yaw, l, w, 0.9, body)]
        out = [(x, y, 0.0, yaw, l, w, h, body)]
        if self.braking[step]:
            bx, by = x - np.cos(yaw) * (l / 2 + 0.05), y - np.sin(yaw) * (l / 2 + 0.05)
            out.append((bx, by, 0.5 * h, yaw, 0.12, w * 0.9, 0.3 * h, (255, 0, 0)))
        return out


def static(kind: str, x: float, y: float, yaw: float, **kw) -> Agent:
    return Agent(kind, np.tile([x, y, yaw], (N_STEPS, 1)).astype(np.float64), **kw)


def speed_profile(v0: float, accel_events=()) -> np.ndarray:
    """(N_STEPS,) speed: v0, then each (t_start, accel, v_target) event accelerates toward v_target."""
    v = np.full(N_STEPS, float(v0))
    for k in range(1, N_STEPS):
        v[k] = v[k - 1]
        for t_start, accel, v_target in accel_events:
            if TIMES[k - 1] >= t_start and (v[k - 1] - v_target) * accel < 0:
                stepped = v[k - 1] + accel * DT
                v[k] = max(stepped, v_target) if accel < 0 else min(stepped, v_target)
    return np.maximum(v, 0.0)


def brake_lights(speeds: np.ndarray) -> np.ndarray:
    """On while decelerating harder than 0.5 m/s^2, and while standing still after braking."""
    decel = np.concatenate([np.diff(speeds) < -0.5 * DT, [False]])
    return decel | ((speeds < 0.1) & np.maximum.accumulate(decel))


def along(kind: str, road_or_path, s0: float, speeds: np.ndarray, offset=0.0, reverse=False, **kw) -> Agent:
    """An agent moving along a road (with a left offset, a float or callable of time) or a Path.

    s0 is its position at t = TIMES[0]; reverse drives against the chain direction.
    """
    s = s0 + np.concatenate([[0.0], np.cumsum(speeds[1:] * DT)]) * (-1.0 if reverse else 1.0)
    d = offset(TIMES) if callable(offset) else np.full(N_STEPS, float(offset))
    if hasattr(road_or_path, "pose"):
        x, y, th = road_or_path.pose(s, d)
    else:
        x, y, th = road_or_path.at(s)
    if callable(offset):   # changing lanes: the box turns with the direction of travel
        dx, dy = np.gradient(x), np.gradient(y)
        th = np.where(np.hypot(dx, dy) > 1e-3, np.arctan2(dy, dx), th + (np.pi if reverse else 0.0))
    elif reverse:
        th = th + np.pi
    return Agent(kind, np.stack([x, y, th], axis=1), braking=brake_lights(speeds), **kw)


def walker(kind: str, x: float, y: float, heading: float, speed: float, t_start: float,
           distance: float) -> Agent:
    """Stands at (x, y) until t_start, then walks `distance` along `heading` at `speed`."""
    travelled = np.clip((TIMES - t_start) * speed, 0.0, distance)
    px, py = x + np.cos(heading) * travelled, y + np.sin(heading) * travelled
    return Agent(kind, np.stack([px, py, np.full(N_STEPS, heading)], axis=1), role="crossing")


def light_schedule(changes) -> np.ndarray:
    """(N_STEPS,) light state from [(t, state), ...]; the first entry holds from the start."""
    state = np.full(N_STEPS, changes[0][1], dtype=np.int64)
    for t, s in changes[1:]:
        state[TIMES >= t - 1e-9] = s
    return state
