"""Development inputs of `specdrive plan`: synthetic scenes or a dataset folder.

The vehicle calls Planner.plan with its own camera frames and ego history; scenes/ is only the
development world, so this glue lives in bench/ (which may import every folder but tools/) and
the shipped runtime never imports it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.config import ConfigError
from prompt.vocab import Tokenizer
from scenes import coc, dataset, world

DEFAULT_SCENES = 8


@dataclass
class PlanScene:
    name: str
    images: np.ndarray            # (4, 2, H, W, 3) uint8
    history: np.ndarray           # (16, 3)
    future: np.ndarray | None     # (64, 3) the expert's, for the pictures and the log
    family: str | None


def default_tokenizer() -> Tokenizer:
    """The shipped vocabulary: every word of the synthetic world's CoC grammar."""
    return Tokenizer.build(coc.vocabulary())


@dataclass(frozen=True)
class SceneSource:
    """Where the scenes come from: a dataset folder's split, or `scenes` synthetic scenes from `seed`."""
    data: Path | None = None
    scenes: int | None = None     # None: DEFAULT_SCENES
    seed: int = 0
    split: str = "test"

    def __post_init__(self):
        if self.scenes is not None and self.scenes < 1:
            raise ConfigError(f"--scenes={self.scenes} must be >= 1")
        if self.seed < 0:
            raise ConfigError(f"--seed={self.seed} must be >= 0 (scene seeds are non-negative)")


def scene_source(src: SceneSource, tok):
    """Iterate PlanScenes: `--data DIR` (dataset shards) or `--scenes N --seed S`."""
    if src.data is not None:
        scenes = dataset.load(str(src.data), src.split)
        for i, s in enumerate(scenes):
            yield _plan_scene(s, f"{src.split}/{i}")
        return
    n = DEFAULT_SCENES if src.scenes is None else src.scenes
    for i in range(n):
        s = world.make_scene(src.seed + i, split=src.split)
        yield _plan_scene(s, f"seed{src.seed + i}")


def _plan_scene(s, name: str) -> PlanScene:
    if getattr(s, "images", None) is None:
        raise ConfigError(f"scene {name} has no camera images (a dataset made with --no-render?); "
                          "the planner needs them")
    return PlanScene(name, np.asarray(s.images), np.asarray(s.history, np.float32),
                     None if getattr(s, "future", None) is None else np.asarray(s.future, np.float32),
                     getattr(s, "family", None))


def announce_fingerprints(src, profile_pin: str | None = None, drives: Path | None = None,
                          expect_drives: str | None = None, vehicle: bool = False, require_pin: bool = False) -> dict:
    """Before a run: the fingerprint of every folder it reads (the model folder, a drives folder),
    printed and checked against its pins (--expect-fingerprint or the profile's `fingerprint`,
    --expect-drives-fingerprint): ConfigError (exit 2) before anything runs when one differs.
    An unpinned model folder is refused with `require_pin` (the profile's), and on a vehicle path
    (plan --engines, drive) said once to be unverified. Returns {folder: fingerprint} for the
    run's record."""
    from core.artifacts import pinned_fingerprint
    from runtime.artifacts import source_fingerprint

    out = {}
    fp = source_fingerprint(src, profile_pin)
    if fp is not None:
        out[str(src.folder)] = fp
        pinned = bool(src.expect_fingerprint or profile_pin)
        print(f"fingerprint {src.folder}: {fp}" + (" (pinned)" if pinned else ""), flush=True)
        if not pinned and (vehicle or require_pin):
            _unpinned(src.folder, fp, require_pin)
    if drives is not None:
        out[str(drives)] = pinned_fingerprint(drives, ("--expect-drives-fingerprint", expect_drives),
                                              what="drives folder")
        print(f"fingerprint {drives}: {out[str(drives)]}" + (" (pinned)" if expect_drives else ""), flush=True)
    return out


def _unpinned(folder, fp: str, require_pin: bool) -> None:
    """An unpinned model folder: ConfigError with require_pin, else one line on stderr."""
    what = (f"{folder} is unverified: no pin covers it, so its cards, weights and graphs are whatever the folder "
            f"holds now; pin the fingerprint it has now, if it is the folder you checked: --expect-fingerprint "
            f"{fp} (or `fingerprint: {fp}` in the planner profile)")
    if require_pin:
        raise ConfigError(f"{what}; the planner profile has require_pin: true, so an unpinned run is refused")
    print(f"warning: {what}; `require_pin: true` in the profile refuses an unpinned run", file=sys.stderr,
          flush=True)


def source_stamp(src, fingerprints: dict, command: str | None = None) -> dict:
    """The results stamp (core/stamp.py) of a run of `src`, from the fingerprints
    announce_fingerprints printed: a checkpoint folder's own; an engines folder's source
    checkpoint (checked to hold the modules it was exported from), with the engines folder's
    fingerprint beside it. A preset (random weights) is stamped with no checkpoint."""
    from core.stamp import engines_stamp, results_stamp

    if src.checkpoint is not None:
        return results_stamp(src.checkpoint, fingerprints, command)
    if src.engines is not None:
        return engines_stamp(src.engines, command, engines_fingerprint=fingerprints.get(str(src.engines)))
    return results_stamp(None, fingerprints, command)


def check_scene_cameras(cfg) -> None:
    """The world's scenes and drives carry scenes.config's cameras, frames and image size; a
    planner profile with others would refuse every cycle as an input error and still exit 0, so
    the run is refused before it starts (ConfigError naming both)."""
    from scenes.config import CAMERAS, FRAME_OFFSETS
    from scenes.render import IMAGE_H, IMAGE_W

    world = {"cameras": [c.name for c in CAMERAS], "frames": len(FRAME_OFFSETS), "image_hw": [IMAGE_H, IMAGE_W]}
    mine = {"cameras": list(cfg.cameras), "frames": cfg.frames, "image_hw": list(cfg.image_hw)}
    differ = [k for k in world if world[k] != mine[k]]
    if differ:
        raise ConfigError("the planner profile's " + ", ".join(f"{k} {mine[k]}" for k in differ) + " are not the "
                          "scenes' " + ", ".join(f"{k} {world[k]}" for k in differ) + ": every cycle would be an "
                          "input error; use a profile made for these scenes (e.g. cpu)")
