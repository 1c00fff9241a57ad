"""The shipped layout of a trained planner (all through models.io: safetensors + meta.json;
loaded by models.io.load_planner / load_draft, which find each part by its meta.json kind):

    FOLDER/tokenizer.json
    FOLDER/target/          kind "target", module "target", config ModelConfig
    FOLDER/expert/          kind "expert", module "expert" (reads the target's KV cache)
    FOLDER/draft-<variant>/ kind "draft",  module "draft" (shares the target's embedding and head)

The ModelConfig stored with a draft carries that draft's DraftConfig (rope, features, vocab).
A reduced-head draft (DraftConfig.vocab = N) is variant "<variant>-v<N>" (draft-flat-v256/) and its
meta.json records draft_vocab N and d2t_sha256 (the map itself is the tensor "d2t" of draft.safetensors).
Every trained draft's meta.json records `target_sha256`, the sha256 of the target weights it was
trained against, so that `train ship` and `make claims` can tell a stale draft.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from models import io
from models.config import DraftConfig, ModelConfig
from models.draft import Draft
from core.config import ConfigError
from prompt.draft_vocab import d2t_sha256
from train.current import target_sha256, trained_for  # noqa: F401  (the drafts' target record)

VARIANTS = {  # draft variant -> (rope, features)
    "flat": ("flat", "fused"), "mrope": ("mrope", "fused"),
    "flat-standalone": ("flat", "none"), "mrope-standalone": ("mrope", "none"),
    "flat-aarl": ("flat", "fused"), "eagle3": ("flat", "fused"),
}
ARCHS = {"eagle3": "eagle3"}    # draft variant -> DraftConfig.arch (every other: "specdrive")


def variant_name(variant: str, vocab: int = 0) -> str:
    """The label of `variant` with a reduced head of `vocab` rows ("flat", 256 -> "flat-v256")."""
    return f"{variant}-v{vocab}" if vocab else variant


def draft_config(cfg: ModelConfig, variant: str, vocab: int = 0) -> ModelConfig:
    """The model config with the draft of `variant` (same depth and feature layers for all;
    "eagle3": EAGLE-3's one midlayer on the layers Edge-LLM feeds, models.config
    eagle3_feature_layers), with a head of `vocab` rows (0: the target's)."""
    if variant not in VARIANTS:
        raise ConfigError(f"draft variant {variant!r} is not known; choose one of {sorted(VARIANTS)}")
    rope, features = VARIANTS[variant]
    arch = ARCHS.get(variant, "specdrive")
    eagle3 = arch == "eagle3"
    draft = DraftConfig(arch=arch, layers=1 if eagle3 else cfg.draft.layers, rope=rope, features=features,
                        feature_layers=() if eagle3 else tuple(cfg.draft.feature_layers), vocab=vocab)
    return dataclasses.replace(cfg, draft=draft)


def save_draft(folder, variant: str, cfg: ModelConfig, draft: Draft, extra: dict) -> Path:
    vocab = draft.cfg.vocab
    if vocab:
        extra = {**extra, "draft_vocab": vocab, "d2t_sha256": d2t_sha256(draft.d2t.cpu().numpy())}
    name = variant_name(variant, vocab)
    return io.save(Path(folder) / f"draft-{name}", {"draft": draft}, draft_config(cfg, variant, vocab),
                   {"kind": "draft", "variant": name, **extra})
