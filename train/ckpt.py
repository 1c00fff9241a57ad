"""The shipped layout of a trained planner (all through models.io: safetensors + meta.json;
loaded by models.io.load_planner / load_draft, which find each part by its meta.json kind):

    FOLDER/tokenizer.json
    FOLDER/target/          kind "target", module "target", config ModelConfig
    FOLDER/expert/          kind "expert", module "expert" (reads the target's KV cache)
    FOLDER/draft-<variant>/ kind "draft",  module "draft" (shares the target's embedding and head)

The ModelConfig stored with a draft carries that draft's DraftConfig (rope, features).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from models import io
from models.config import DraftConfig, ModelConfig
from models.draft import Draft
from prompt.config import ConfigError

VARIANTS = {  # draft variant -> (rope, features)
    "flat": ("flat", "fused"), "mrope": ("mrope", "fused"),
    "flat-standalone": ("flat", "none"), "mrope-standalone": ("mrope", "none"),
    "flat-aarl": ("flat", "fused"),
}


def draft_config(cfg: ModelConfig, variant: str) -> ModelConfig:
    """The model config with the draft of `variant` (same depth and feature layers for all)."""
    if variant not in VARIANTS:
        raise ConfigError(f"draft variant {variant!r} is not known; choose one of {sorted(VARIANTS)}")
    rope, features = VARIANTS[variant]
    draft = DraftConfig(layers=cfg.draft.layers, rope=rope, features=features,
                        feature_layers=tuple(cfg.draft.feature_layers))
    return dataclasses.replace(cfg, draft=draft)


def save_draft(folder, variant: str, cfg: ModelConfig, draft: Draft, extra: dict) -> Path:
    return io.save(Path(folder) / f"draft-{variant}", {"draft": draft}, draft_config(cfg, variant),
                   {"kind": "draft", "variant": variant, **extra})
