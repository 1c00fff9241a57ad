"""Grading generated words and trajectories against one scene's labels (numpy only).

    commitment_correct(words, scene)   the CoC's commitment names the scene's cause and decision
    routine_length(words)              words up to the 4th top-level "," (the routine part)
    cause_words(scene)                 the cause phrase of the scene's own CoC
    ade(pred, future)                  mean L2 over the 64 waypoints (x, y)

Training (train/metrics.py) and the accuracy report of quantized graphs (calibration/report.py)
both grade with these.
"""
from __future__ import annotations

import itertools

import numpy as np

from scenes.coc import ACTION, CAUSE

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
