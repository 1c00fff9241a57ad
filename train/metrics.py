"""The numbers of MODEL_CARD.md, as small pure functions over one scene's outputs.

    commitment_correct(words, scene)   the CoC's commitment names the scene's cause and decision
    routine_length(words)              words up to the 4th top-level "," (the routine part)
    ade(pred, future)                  mean L2 over the 64 waypoints (x, y)
    constant_velocity(v0)              (64, 2) straight line at v0 (the baseline)
    greedy_tau(accepts, first, end, k) tokens per target forward of the greedy speculative loop
"""
from __future__ import annotations

import itertools

import numpy as np

from scenes.coc import ACTION, CAUSE
from scenes.config import EGO_LENGTH, EGO_WIDTH
from scenes.geometry import boxes_overlap

ROUTINE_COMMAS = 4      # speed, trend, heading, distance (scenes.coc.routine_words)


def routine_length(words: list[str]) -> int:
    """Number of words in the routine part: up to and including the 4th ","."""
    commas = [i for i, w in enumerate(words) if w == ","]
    return commas[ROUTINE_COMMAS - 1] + 1 if len(commas) >= ROUTINE_COMMAS else len(words)


def split_commitment(words: list[str]) -> tuple[list[str], list[str]]:
    """Commitment words -> (cause, action) around the last ", so"."""
    for i in range(len(words) - 2, -1, -1):
        if words[i] == "," and words[i + 1] == "so":
            return words[:i], words[i + 2:]
    return words, []


def cause_words(scene) -> list[str]:
    """The cause phrase of the scene's own commitment (its ground-truth CoC)."""
    words = scene.coc.split()
    return split_commitment(words[routine_length(words):])[0]


def commitment_correct(words: list[str], scene) -> tuple[bool, bool]:
    """(cause right, decision right) of generated CoC words against the scene's labels: the
    cause must say what the scene's cause phrase says, in either grammar variant (the variant
    is a coin flip the model cannot see), the action a phrase of the scene's decision (either
    variant)."""
    cause, action = split_commitment(words[routine_length(words):])
    causes = cause_phrases(scene.family, cause_words(scene), getattr(scene, "routine_variant", 0))
    return cause in causes, action in [list(a) for a in ACTION[scene.decision]]


FACT_OPTIONS = {"noun": ("car", "van"), "light": ("red", "yellow", "green"), "side": ("left", "right"),
                "turned": (False, True), "occluded": (False, True), "walking": (False, True),
                "blocked": (False, True)}


def cause_phrases(family: str, gt_cause: list[str], variant: int) -> list[list[str]]:
    """Every cause phrase of `family`'s grammar (both variants) built from facts under which the
    scene's own variant says `gt_cause`; just [gt_cause] for a family without a grammar."""
    if family not in CAUSE:
        return [gt_cause]
    out = [gt_cause]
    for combo in itertools.product(*FACT_OPTIONS.values()):
        facts = dict(zip(FACT_OPTIONS, combo))
        if CAUSE[family](facts, variant) == gt_cause:
            out += [p for p in (CAUSE[family](facts, v) for v in (0, 1)) if p not in out]
    return out


def ade(pred: np.ndarray, future: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(pred)[:, :2] - np.asarray(future)[:, :2], axis=-1).mean())


def constant_velocity(v0: float, n: int = 64, dt: float = 0.1) -> np.ndarray:
    t = dt * np.arange(1, n + 1)
    return np.stack([v0 * t, np.zeros(n)], 1)


def greedy_tau(accepts: np.ndarray, first: int, end: int, k: int, routine_end: int | None = None):
    """Exact greedy speculative decoding from the pending token at row `first` to <|cot_end|>
    at row `end`. accepts[p, r] (bool) = the draft's p-th chain token from verified row r
    equals the target's token at row r + p + 1. A step from pending row v accepts
    n = leading true of accepts[0..k-1, v] (capped so nothing past `end` is proposed) and emits
    n + 1 tokens. Returns (tokens, forwards, per-part (tokens, forwards) for routine /
    commitment steps, by the row of the step's first emitted token)."""
    v, tokens, forwards = first, 0, 0
    parts = {"routine": [0, 0], "commitment": [0, 0]}
    while v < end:
        n = 0
        while n < min(k, end - v - 1) and accepts[n, v]:
            n += 1
        emitted = min(n + 1, end - v)
        part = "routine" if routine_end is not None and v + 1 < routine_end else "commitment"
        parts[part][0] += emitted
        parts[part][1] += 1
        tokens, forwards, v = tokens + emitted, forwards + 1, v + emitted
    return tokens, forwards, parts


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
