"""Grading generated words and trajectories against one scene's labels (numpy only).

    commitment_correct(words, scene)   the CoC's commitment names the scene's cause and decision
    routine_length(words)              leading words that are routine clauses
    cause_words(scene)                 the canonical words of the scene's cause (no number)
    ade(pred, future)                  mean L2 over the 64 waypoints (x, y)

The language has many paraphrases per clause, so generated text is parsed back into clauses
(scenes.language.parse) and graded by what it says, not how: the cause by its kind and the facts
its slots name (noun, side, light colour), the decision by its action clause. Distances are
not graded here. Training (train/metrics.py) and the accuracy report of quantized graphs
(calibration/report.py) both grade with these.
"""
from __future__ import annotations

import numpy as np

from scenes.language import canonical_cause_words, cause_key, read_commitment, routine_length  # noqa: F401


def cause_words(scene) -> list[str]:
    """The canonical words of the scene's cause (its first paraphrase without the number)."""
    return canonical_cause_words(scene.cause_kind, scene.cause_facts)


def commitment_correct(words: list[str], scene) -> tuple[bool, bool]:
    """(cause right, decision right) of generated CoC words against the scene's labels."""
    cause, decision = read_commitment(list(words))
    return cause == cause_key(scene.cause_kind, scene.cause_facts), decision == scene.decision


def ade(pred: np.ndarray, future: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(pred)[:, :2] - np.asarray(future)[:, :2], axis=-1).mean())
