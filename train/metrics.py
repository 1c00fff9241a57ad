"""The numbers of MODEL_CARD.md, as small pure functions over one scene's outputs.

    commitment_correct(words, scene)   the CoC's commitment names the scene's cause and decision
    routine_length(words)              leading words that are routine clauses
    ade(pred, future)                  mean L2 over the 64 waypoints (x, y)
    constant_velocity(v0)              (64, 2) straight line at v0 (the baseline)
    greedy_tau(accepts, first, end, k) tokens per target forward of the greedy speculative loop
    emitted_within(accepts, ..., passes)  CoC tokens written within a budget of target passes
"""
from __future__ import annotations

import numpy as np

from prompt.trajectory import DT, FUT_WAYPOINTS
from scenes.config import EGO_LENGTH, EGO_WIDTH
from scenes.geometry import boxes_overlap
# grading against a scene's labels lives with the scenes (calibration's report uses it too)
from scenes.grade import ade, cause_words, commitment_correct, routine_length  # noqa: F401


def constant_velocity(v0: float, n: int = FUT_WAYPOINTS, dt: float = DT) -> np.ndarray:
    t = dt * np.arange(1, n + 1)
    return np.stack([v0 * t, np.zeros(n)], 1)


def greedy_steps(accepts: np.ndarray, first: int, end: int, k: int) -> list[tuple[int, int]]:
    """Exact greedy speculative decoding from the pending token at row `first` to <|cot_end|>
    at row `end`. accepts[p, r] (bool) = the draft's p-th chain token from verified row r
    equals the target's token at row r + p + 1. A step from pending row v accepts
    n = leading true of accepts[0..k-1, v] (capped so nothing past `end` is proposed) and emits
    n + 1 tokens. Returns (v, tokens emitted) per step (one target forward each)."""
    v, steps = first, []
    while v < end:
        n = 0
        while n < min(k, end - v - 1) and accepts[n, v]:
            n += 1
        steps.append((v, min(n + 1, end - v)))
        v += steps[-1][1]
    return steps


def greedy_tau(accepts: np.ndarray, first: int, end: int, k: int, routine_end: int | None = None):
    """Tokens and target forwards of the greedy loop (`greedy_steps`), with per-part (tokens,
    forwards) for routine / commitment steps, by the row of the step's first emitted token."""
    parts = {"routine": [0, 0], "commitment": [0, 0]}
    steps = greedy_steps(accepts, first, end, k)
    for v, emitted in steps:
        part = "routine" if routine_end is not None and v + 1 < routine_end else "commitment"
        parts[part][0] += emitted
        parts[part][1] += 1
    return sum(e for _, e in steps), len(steps), parts


def emitted_within(accepts: np.ndarray, first: int, end: int, k: int, passes: int) -> int:
    """CoC tokens the greedy loop has emitted after `passes` target forwards (a budget that
    allows that many verify passes; plain decoding emits `passes`)."""
    return sum(e for _, e in greedy_steps(accepts, first, end, k)[:passes])


def free_running(accepts: np.ndarray, first: int, end: int, cap: int) -> tuple[list[int], list[bool]]:
    """Per step of the greedy loop with k = cap: drafted tokens accepted (the leading run of
    accepts[:, v], nothing past `end`), and whether the run reached the cap (so the draft
    might have gone further)."""
    v, runs, capped = first, [], []
    while v < end:
        n = 0
        while n < min(cap, end - v - 1) and accepts[n, v]:
            n += 1
        runs.append(n)
        capped.append(n == cap)
        v += min(n + 1, end - v)
    return runs, capped


NON_SOLID = ("traffic_light", "stop_sign")   # poles stand off the road (scenes.agents)


def collides(waypoints: np.ndarray, scene) -> bool:
    """Does the ego box along `waypoints` (64, 3) (t0 + 0.1 .. 6.4 s) overlap a solid agent at
    the same time step? Agent poses run from t0 - 1.5 s, so future step k is index 16 + k."""
    wp = np.asarray(waypoints, dtype=np.float64)
    n = len(wp)
    ego = np.column_stack([wp[:, :3], np.full(n, EGO_LENGTH), np.full(n, EGO_WIDTH)])
    for agent, poses in zip(scene.agents, np.asarray(scene.agent_poses)):
        if agent["kind"] in NON_SOLID:
            continue
        p = np.asarray(poses[16:16 + n], dtype=np.float64)
        other = np.column_stack([p, np.full(n, agent["length"]), np.full(n, agent["width"])])
        ok = np.isfinite(other).all(1)
        if boxes_overlap(ego[ok], other[ok]).any():
            return True
    return False
