"""Development inputs of `specdrive plan`: synthetic scenes or a dataset folder.

The vehicle calls Planner.plan with its own camera frames and ego history; scenes/ is only the
development world, so it is loaded by name here (like an engine library) and the shipped
runtime never needs it. Every static import of runtime/ stays inside the import contract.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from prompt.config import ConfigError
from prompt.vocab import Tokenizer

DEFAULT_SCENES = 8


@dataclass
class PlanScene:
    name: str
    images: np.ndarray            # (4, 2, H, W, 3) uint8
    history: np.ndarray           # (16, 3)
    future: np.ndarray | None     # (64, 3) the expert's, for the pictures and the log
    family: str | None


def _scenes_module(name: str):
    try:
        return importlib.import_module(f"scenes.{name}")
    except ModuleNotFoundError as e:
        raise ConfigError(f"synthetic scenes need scenes.{name}, which is not available ({e.name})") from None


def default_tokenizer() -> Tokenizer:
    """The shipped vocabulary: every word of the synthetic world's CoC grammar."""
    return Tokenizer.build(_scenes_module("coc").vocabulary())


def scene_source(args, tok):
    """Iterate PlanScenes: `--data DIR` (dataset shards) or `--scenes N --seed S`."""
    if args.data is not None:
        scenes = _scenes_module("dataset").load(str(args.data), args.split)
        for i, s in enumerate(scenes):
            yield _plan_scene(s, f"{args.split}/{i}")
        return
    world = _scenes_module("world")
    n = DEFAULT_SCENES if args.scenes is None else args.scenes
    for i in range(n):
        s = world.make_scene(args.seed + i, split=args.split)
        yield _plan_scene(s, f"seed{args.seed + i}")


def _plan_scene(s, name: str) -> PlanScene:
    if getattr(s, "images", None) is None:
        raise ConfigError(f"scene {name} has no camera images (a dataset made with --no-render?); "
                          "the planner needs them")
    return PlanScene(name, np.asarray(s.images), np.asarray(s.history, np.float32),
                     None if getattr(s, "future", None) is None else np.asarray(s.future, np.float32),
                     getattr(s, "family", None))
