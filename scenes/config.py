"""The numbers of the synthetic world, in one place: time grid, limits, cameras, families, splits.

Units: metres, seconds, radians. World frame while simulating: the road frame (x along the main
road, y left, z up). What a Scene hands out is in the ego frame at t0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.config import ConfigError, check_choice
from prompt.trajectory import DT, FUT_WAYPOINTS, HIST_POSES   # 10 Hz; declared once in prompt/trajectory.py

DRIVE_SECONDS = 8.0              # default drive: cycles at t = -4.0 .. 3.9 s around the scenario's t0
MAX_DRIVES = 10_000              # `scenes generate --drives` at most
MAX_DRIVE_SECONDS = 12.0         # the time grid holds a drive of up to this many seconds
# the simulation starts 0.5 s before the first cycle's history (warm-up) and ends with the last
# cycle's 6.4 s future: t = -8.0 .. 12.4 s, 205 poses
T_START = -MAX_DRIVE_SECONDS / 2 - (HIST_POSES - 1) * DT - 0.5
N_STEPS = round((MAX_DRIVE_SECONDS / 2 + FUT_WAYPOINTS * DT - T_START) / DT) + 1
T0_INDEX = round(-T_START / DT)                               # index of t = 0 (the scenario's t0)
TIMES = T_START + DT * np.arange(N_STEPS)
FRAME_OFFSETS = (5, 0)           # camera frames at t0 - 0.5 s and t0 (steps before t0)

EGO_LENGTH, EGO_WIDTH, EGO_HEIGHT = 4.6, 1.9, 1.5
LANE_WIDTH = 3.5
# Visibility with hysteresis (scenes/drive.py find_cause): a cause is named once it covers
# MIN_VISIBLE_PIXELS id-image pixels at t, and stays named while it keeps HOLD_VISIBLE_PIXELS
# (a far agent's pixel count aliases between steps). Below 16 pixels (a pedestrian beyond
# ~50 m: 2 x 5 pixels in the tele camera) the tiny target could not see it.
MIN_VISIBLE_PIXELS = 16
HOLD_VISIBLE_PIXELS = 8


@dataclass(frozen=True)
class Limits:
    """What every expert future obeys (checked on the written waypoints by finite differences)."""
    accel_max: float = 3.0       # m/s^2
    decel_max: float = 6.0       # m/s^2, braking
    jerk_max: float = 8.0        # m/s^3
    curvature_max: float = 0.2   # 1/m (radius 5 m)
    lat_accel_max: float = 3.5   # m/s^2


LIMITS = Limits()


@dataclass(frozen=True)
class CameraSpec:
    name: str
    yaw_deg: float               # mounting yaw, left positive
    hfov_deg: float
    pitch_deg: float = 0.0       # down positive


CAMERAS = (
    CameraSpec("front_wide", 0.0, 120.0, 2.0),
    CameraSpec("front_tele", 0.0, 30.0, 0.0),
    CameraSpec("cross_left", 75.0, 120.0, 2.0),
    CameraSpec("cross_right", -75.0, 120.0, 2.0),
)
CAMERA_MOUNT = (1.5, 0.0, 1.6)   # x forward, y left, z up from the ego reference point (m)

FAMILIES = (
    "free_cruise", "follow", "lead_braking", "stop_sign", "traffic_light", "pedestrian",
    "cyclist", "obstacle", "door_zone", "curve", "turn", "cut_in",
)
UNSEEN_FAMILY = "cut_in"         # never in train/val/test/heldout; only in the 'unseen' split
SPLITS = ("train", "val", "test", "heldout", "unseen")
SPLIT_FRACTIONS = {"train": 0.8, "val": 0.05, "test": 0.05, "heldout": 0.05, "unseen": 0.05}

DECISIONS = (
    "keep_speed", "speed_up", "follow", "slow_down", "stop", "yield", "nudge_left",
    "change_lane_left", "keep_lane", "turn_left", "turn_right",
)


@dataclass(frozen=True)
class Ranges:
    """Parameter ranges of one split. heldout: faster, denser, later events."""
    speed: tuple = (6.0, 15.0)           # m/s, ego cruise speed
    density: tuple = (0, 3)              # background agents (parked / oncoming), inclusive
    event_delay: tuple = (0.0, 1.0)      # s, how much later than the earliest an event starts
    weights: tuple = (1.0,) * 11         # family weights over the seen families (FAMILIES[:-1])

    def __post_init__(self):
        if len(self.weights) != len(FAMILIES) - 1 or min(self.weights) < 0:
            raise ConfigError(f"weights={self.weights}: need {len(FAMILIES) - 1} non-negative weights, "
                              f"one per family in {FAMILIES[:-1]}")


TRAIN_RANGES = Ranges()
HELDOUT_RANGES = Ranges(speed=(12.0, 19.0), density=(3, 6), event_delay=(0.8, 1.8),
                        weights=(0.3, 1.5, 1.5, 0.6, 1.5, 1.5, 1.0, 1.0, 0.6, 1.2, 0.6))


def ranges_for(split: str) -> Ranges:
    check_choice("split", split, SPLITS)
    return HELDOUT_RANGES if split in ("heldout", "unseen") else TRAIN_RANGES


def check_families(names) -> tuple:
    """A list of family names -> tuple, refusing unknown names (ConfigError names the allowed)."""
    names = tuple(names)
    bad = [n for n in names if n not in FAMILIES]
    if bad or not names:
        raise ConfigError(f"unknown family {bad[0]!r}; allowed: {', '.join(FAMILIES)}" if bad
                          else f"no family given; allowed: {', '.join(FAMILIES)}")
    return names
