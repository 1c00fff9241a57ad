"""The scenes calibration draws from: the train split only, seeded as the dataset generator seeds it.

Calibration never sees a test, held-out or unseen scene: the accuracy report (calibration/report.py)
runs on held-out scenes, and the bench on test scenes, so a quantizer tuned on those would grade
itself. Scene i of a calibration set is `make_scene(scene_seed(seed, "train", i), split="train")`,
the same seeding `specdrive scenes generate` uses, so the family mix is the training mix.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.config import ConfigError

SPLIT = "train"
FORBIDDEN = ("test", "heldout", "unseen")


@dataclass
class CalibrationScene:
    name: str
    family: str
    images: np.ndarray          # (cameras, frames, H, W, 3) uint8
    history: np.ndarray         # (16, 3) float32


def calibration_scenes(n: int, seed: int = 0, split: str = SPLIT) -> list[CalibrationScene]:
    """`n` train-split scenes for calibration (a different `seed` draws a different set)."""
    from scenes.dataset import scene_seed
    from scenes.world import make_scene

    if split in FORBIDDEN:
        raise ConfigError(f"calibration split {split!r}: calibration never uses {list(FORBIDDEN)} scenes "
                          f"(they judge the result); use {SPLIT!r}")
    if n < 1:
        raise ConfigError(f"calibration prompts={n}: at least 1")
    out = []
    for i in range(n):
        s = make_scene(scene_seed(seed, split, i), split=split)
        out.append(CalibrationScene(f"{split}-{seed}-{i}", s.family, np.asarray(s.images),
                                    np.asarray(s.history, np.float32)))
    return out
