"""The shipped layout of a trained planner (all through models.io: safetensors + meta.json):

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
from models.action_expert import ActionExpert
from models.config import DraftConfig, ModelConfig
from models.draft import Draft
from models.target import Target
from prompt.config import ConfigError
from prompt.vocab import Tokenizer

VARIANTS = {  # draft variant -> (rope, features)
    "flat": ("flat", "fused"), "mrope": ("mrope", "fused"),
    "flat-standalone": ("flat", "none"), "flat-aarl": ("flat", "fused"),
}


def draft_config(cfg: ModelConfig, variant: str) -> ModelConfig:
    """The model config with the draft of `variant` (same depth and feature layers for all)."""
    if variant not in VARIANTS:
        raise ConfigError(f"draft variant {variant!r} is not known; choose one of {sorted(VARIANTS)}")
    rope, features = VARIANTS[variant]
    draft = DraftConfig(layers=cfg.draft.layers, rope=rope, features=features,
                        feature_layers=tuple(cfg.draft.feature_layers))
    return dataclasses.replace(cfg, draft=draft)


def load_planner(folder) -> tuple[Tokenizer, ModelConfig, Target, ActionExpert]:
    """tokenizer, config, target and expert of a trained planner folder (eval mode)."""
    folder = Path(folder)
    tok = Tokenizer.load(folder / "tokenizer.json")
    states, cfg, _ = io.load(folder / "target", kind="target")
    target = Target(cfg.target)
    io.check_state(target.state_dict(), states["target"], str(folder / "target"))
    target.load_state_dict(states["target"])
    expert = ActionExpert(cfg.expert, cfg.target.llm)
    io.load_into(folder / "expert", {"expert": expert}, kind="expert")
    if len(tok) != cfg.target.llm.vocab_size:
        raise ConfigError(f"{folder}: tokenizer has {len(tok)} tokens but the target's vocab_size "
                          f"is {cfg.target.llm.vocab_size}")
    return tok, cfg, target.eval(), expert.eval()


def save_draft(folder, variant: str, cfg: ModelConfig, draft: Draft, extra: dict) -> Path:
    return io.save(Path(folder) / f"draft-{variant}", {"draft": draft}, draft_config(cfg, variant),
                   {"kind": "draft", "variant": variant, **extra})


def load_draft(path, target: Target) -> tuple[Draft, dict]:
    """A draft checkpoint folder, sharing `target`'s embedding and LM head -> (draft, meta)."""
    states, cfg, meta = io.load(path, kind="draft")
    draft = Draft(cfg, target.embed_tokens, target.lm_head)
    io.check_state(draft.state_dict(), states["draft"], str(path))
    draft.load_state_dict(states["draft"])
    return draft.eval(), meta
