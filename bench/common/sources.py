"""Development inputs of `specdrive plan`: synthetic scenes or a dataset folder.

The vehicle calls Planner.plan with its own camera frames and ego history; scenes/ is only the
development world, so this glue lives in tools/ (which may import every folder) and the
shipped runtime never imports it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prompt.config import ConfigError
from prompt.vocab import Tokenizer
from runtime.artifacts import ModelSource
from scenes import coc, dataset, world

DEFAULT_SCENES = 8


@dataclass
class PlanScene:
    name: str
    images: np.ndarray            # (4, 2, H, W, 3) uint8
    history: np.ndarray           # (16, 3)
    future: np.ndarray | None     # (64, 3) the expert's, for the pictures and the log
    family: str | None


def add_source_args(p) -> None:
    """--checkpoint | --engines | --preset (+ --random-init): what a command runs."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help="checkpoint folder (meta.json kind planner/target)")
    src.add_argument("--engines", type=Path, help="built engines folder (meta.json names the backend)")
    src.add_argument("--preset", help="random-weight models from configs/models/NAME.yaml (needs --random-init)")
    p.add_argument("--random-init", type=int, metavar="SEED", help="seed of the random weights (with --preset)")


def model_source(args) -> ModelSource:
    """The ModelSource of the parsed --checkpoint/--engines/--preset, --draft, --backend,
    --device, --eager and --threads arguments."""
    return ModelSource(engines=args.engines, checkpoint=args.checkpoint, preset=args.preset,
                       random_init=args.random_init, backend=args.backend, draft=args.draft,
                       device=args.device, eager=args.eager, threads=args.threads)


def default_tokenizer() -> Tokenizer:
    """The shipped vocabulary: every word of the synthetic world's CoC grammar."""
    return Tokenizer.build(coc.vocabulary())


def scene_source(args, tok):
    """Iterate PlanScenes: `--data DIR` (dataset shards) or `--scenes N --seed S`."""
    if args.data is not None:
        scenes = dataset.load(str(args.data), args.split)
        for i, s in enumerate(scenes):
            yield _plan_scene(s, f"{args.split}/{i}")
        return
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
