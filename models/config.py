"""Model configuration: checked dataclasses for the target VLA, the draft and the action expert.

Public API (stable; models/draft.py, models/action_expert.py and train/ build on it):

    VisionConfig   vision tower (Qwen3-VL style, or Qwen2.5-VL style by `style`)
    LLMConfig      decoder LLM (GQA, RMSNorm, SwiGLU; q/k norm or qkv bias; M-RoPE settings)
    TargetConfig   VisionConfig + LLMConfig + the special token ids the forward needs
    DraftConfig    routine reasoner: arch "specdrive"|"eagle3", layers, rope "flat"|"mrope",
                   features "fused"|"none", feature_layers (low, mid, top) = target layers
                   whose outputs it reads, vocab (0: the target's LM head; N: a reduced head
                   over N target tokens)
    ExpertConfig   flow-matching action expert (its layer count = the target's layer count)
    ModelConfig    (target, draft, expert); `draft_llm()` gives the draft decoder's LLMConfig
    load_preset(name_or_path) -> ModelConfig   reads configs/models/NAME.yaml

Sizes that come from the tokenizer (`llm.vocab_size`, `image_token_id`, `vision_start_id`)
are plain fields; training overrides them with `dataclasses.replace`. -1 means "not set yet".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from core.config import ConfigError, check_choice, check_range, load_named
from core.graphs import IMAGE_ATTENTION

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"
VISION_STYLES = ("qwen3", "qwen2.5")


def _check_indices(name: str, values: tuple, n: int) -> None:
    for v in values:
        if not isinstance(v, int) or not 0 <= v < n:
            raise ConfigError(f"{name}={list(values)!r}: every index must be an int in [0, {n - 1}]")


@dataclass
class VisionConfig:
    """Vision tower. Qwen3: LayerNorm, GELU(tanh) MLP, learned position table + 2D rotary,
    DeepStack. Qwen2.5: RMSNorm, SwiGLU MLP with bias, 2D rotary only, window attention."""
    style: str = "qwen3"
    depth: int = 3
    hidden: int = 64
    heads: int = 4
    intermediate: int = 128
    patch: int = 8
    temporal_patch: int = 2
    merge: int = 2                      # spatial merge: merge x merge patches -> 1 LLM token
    in_channels: int = 3
    rope_theta: float = 10000.0
    num_position_embeddings: int = 144  # qwen3 learned table, a square grid (12 x 12 here)
    deepstack_layers: tuple[int, ...] = (0, 1)   # qwen3: ViT blocks feeding LLM layers 0, 1, ...
    window_size: int = 0                # qwen2.5: window side in pixels (0 = no windows)
    fullatt_blocks: tuple[int, ...] = ()  # qwen2.5: blocks with full (per-image) attention

    def __post_init__(self):
        check_choice("vision.style", self.style, VISION_STYLES)
        for name in ("depth", "hidden", "heads", "intermediate", "patch", "temporal_patch",
                     "merge", "in_channels"):
            check_range(f"vision.{name}", getattr(self, name), lo=1)
        if self.hidden % self.heads or (self.hidden // self.heads) % 4:
            raise ConfigError(f"vision.hidden={self.hidden} / heads={self.heads} must give a "
                              "head_dim divisible by 4 (2D rotary splits it into h and w halves)")
        side = round(self.num_position_embeddings ** 0.5)
        if self.style == "qwen3" and side * side != self.num_position_embeddings:
            raise ConfigError(f"vision.num_position_embeddings={self.num_position_embeddings} "
                              "must be a square number (a side x side learned grid)")
        _check_indices("vision.deepstack_layers", self.deepstack_layers, self.depth)
        _check_indices("vision.fullatt_blocks", self.fullatt_blocks, self.depth)
        if self.style == "qwen2.5" and self.deepstack_layers:
            raise ConfigError("vision.deepstack_layers must be empty for style 'qwen2.5'")
        if self.window_size and self.window_size < self.patch * self.merge:
            raise ConfigError(f"vision.window_size={self.window_size} must be 0 (no windows) or "
                              f">= patch*merge={self.patch * self.merge} pixels")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch row: C * temporal_patch * patch * patch."""
        return self.in_channels * self.temporal_patch * self.patch * self.patch


@dataclass
class LLMConfig:
    """Decoder LLM. `mrope_section` splits head_dim/2 rotary frequencies over (t, h, w);
    empty = plain 1D RoPE. `interleaved` = Qwen3-VL layout, else Qwen2.5-VL sectioned."""
    layers: int = 12
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 320
    vocab_size: int = 1100
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, ...] = (6, 5, 5)
    interleaved: bool = True
    qk_norm: bool = True
    qkv_bias: bool = False
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    # how image rows attend (models/layers.py frame_local_mask): "causal" is HF Qwen-VL's layout;
    # "frame_local" keeps each image block (<|vision_start|> .. <|vision_end|>) to itself
    image_attention: str = "causal"

    def __post_init__(self):
        check_choice("llm.image_attention", self.image_attention, IMAGE_ATTENTION)
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                     "vocab_size"):
            check_range(f"llm.{name}", getattr(self, name), lo=1)
        check_range("llm.rope_theta", self.rope_theta, lo=1.0)
        if self.heads % self.kv_heads:
            raise ConfigError(f"llm.heads={self.heads} must be a multiple of "
                              f"kv_heads={self.kv_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ConfigError(f"llm.head_dim={self.head_dim} must be even (rotary pairs)")
        if self.mrope_section and (len(self.mrope_section) != 3
                                   or sum(self.mrope_section) != self.head_dim // 2):
            raise ConfigError(f"llm.mrope_section={list(self.mrope_section)} must be 3 ints "
                              f"summing to head_dim/2={self.head_dim // 2}, or empty for 1D RoPE")


@dataclass
class TargetConfig:
    vision: VisionConfig = field(default_factory=VisionConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    image_token_id: int = -1    # from the tokenizer; -1 = not set (forward refuses images then)
    vision_start_id: int = -1

    def __post_init__(self):
        if self.image_token_id >= self.llm.vocab_size or self.vision_start_id >= self.llm.vocab_size:
            raise ConfigError(f"image_token_id={self.image_token_id} / vision_start_id="
                              f"{self.vision_start_id} must be < llm.vocab_size={self.llm.vocab_size}")


DRAFT_ARCHS = ("specdrive", "eagle3")


@dataclass
class DraftConfig:
    """Routine reasoner. It shares the target's embedding and LM head, so its width is the
    target's; heads/head_dim/intermediate are the target's too (see ModelConfig.draft_llm).

    arch "specdrive": the first layer reads in_proj([embed, fc(features)]) (models/draft.py).
    arch "eagle3": EAGLE-3's midlayer (models/eagle3.py), the layout vLLM, SGLang, TensorRT-LLM
    and TensorRT Edge-LLM read: one layer, fused features, no q/k norm, and by default the
    target layers Edge-LLM's base export feeds (`eagle3_feature_layers`)."""
    arch: str = "specdrive"
    layers: int = 1
    rope: str = "flat"
    features: str = "fused"
    feature_layers: tuple[int, ...] = ()   # () = default low/mid/top for the target depth
    vocab: int = 0      # draft LM head rows: 0 = the target's head (shared); N = its own head over
                        # N target tokens, mapped to target ids by the d2t buffer (models/draft.py)

    def __post_init__(self):
        check_range("draft.layers", self.layers, lo=1)
        check_range("draft.vocab", self.vocab, lo=0)
        check_choice("draft.arch", self.arch, DRAFT_ARCHS)
        check_choice("draft.rope", self.rope, ("flat", "mrope"))
        check_choice("draft.features", self.features, ("fused", "none"))
        if self.arch == "eagle3" and (self.layers != 1 or self.features != "fused"):
            raise ConfigError(f"draft.arch='eagle3' is EAGLE-3's one midlayer over fused target "
                              f"features: it needs layers=1 and features='fused' (got layers="
                              f"{self.layers}, features={self.features!r})")


@dataclass
class ExpertConfig:
    """Flow-matching action expert. It reads the target's K/V of layer i in its layer i, so
    hidden/heads must equal the target's head_dim; the layer count is the target's."""
    hidden: int = 64
    heads: int = 2
    intermediate: int = 160
    n_waypoints: int = 64
    euler_steps: int = 10
    action_dim: int = 2          # (acceleration, curvature) per waypoint
    fourier_feats: int = 20      # action input projection: Fourier features per action value
    in_proj_layers: int = 2      # its MLP depth
    in_proj_hidden: int = 0      # its MLP width; 0 = expert.hidden (resolved on construction)
    non_causal: bool = True      # action tokens see each other (upstream expert_non_causal_attention);
                                 # False: action token i sees action tokens <= i only

    def __post_init__(self):
        for name in ("hidden", "heads", "intermediate", "n_waypoints", "euler_steps",
                     "action_dim", "fourier_feats", "in_proj_layers"):
            check_range(f"expert.{name}", getattr(self, name), lo=1)
        self.in_proj_hidden = self.in_proj_hidden or self.hidden
        if self.hidden % self.heads:
            raise ConfigError(f"expert.hidden={self.hidden} must be a multiple of "
                              f"expert.heads={self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def default_feature_layers(n_layers: int) -> tuple[int, int, int]:
    """Low/mid/top target layers for fused draft features (EAGLE-3 picks 2, L/2, L-3)."""
    if n_layers < 6:
        return (0, n_layers // 2, n_layers - 1)
    return (2, n_layers // 2, n_layers - 3)


def eagle3_feature_layers(n_layers: int) -> tuple[int, int, int]:
    """The target layers an EAGLE-3 base export feeds its draft, in this repository's indexing
    (the residual after layer i, DeepStack included, as Target.forward's `hidden_layers`).

    TensorRT Edge-LLM 0.11 (models/default/modeling_default.py, eagle_base) concatenates
    all_hidden_states[2, N//2, N-3], where all_hidden_states[i] is the input of layer i (index 0
    the embedding output): the outputs of layers 1, N//2 - 1 and N - 4."""
    if n_layers < 6:
        raise ConfigError(f"an EAGLE-3 draft reads target layers 1, N//2-1 and N-4, so it needs a target of "
                          f"at least 6 layers; this target has {n_layers}")
    return (1, n_layers // 2 - 1, n_layers - 4)


@dataclass
class ModelConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)

    def __post_init__(self):
        llm = self.target.llm
        if not self.draft.feature_layers:
            self.draft.feature_layers = (eagle3_feature_layers(llm.layers) if self.draft.arch == "eagle3"
                                         else default_feature_layers(llm.layers))
        _check_indices("draft.feature_layers", self.draft.feature_layers, llm.layers)
        if self.draft.features == "fused" and len(self.draft.feature_layers) != 3:
            raise ConfigError(f"draft.feature_layers={list(self.draft.feature_layers)} must "
                              "name 3 target layers (low, mid, top) when features='fused'")
        if self.draft.vocab > llm.vocab_size:
            raise ConfigError(f"draft.vocab={self.draft.vocab} must be 0 (the target's head) or at most "
                              f"the target's vocab_size={llm.vocab_size}")
        if self.expert.head_dim != llm.head_dim:
            raise ConfigError(f"expert.hidden/heads={self.expert.head_dim} must equal the "
                              f"target head_dim={llm.head_dim} (the expert reads its K/V)")

    def draft_llm(self) -> LLMConfig:
        """The draft decoder's LLMConfig: the target's widths, draft depth and rope scheme."""
        flat, eagle3 = self.draft.rope == "flat", self.draft.arch == "eagle3"
        llm = dataclasses.replace(self.target.llm, layers=self.draft.layers,
                                  mrope_section=() if flat else self.target.llm.mrope_section)
        # EAGLE-3's midlayer is Llama's attention: no q/k norm, no q/k/v bias
        return dataclasses.replace(llm, qk_norm=False, qkv_bias=False) if eagle3 else llm


def load_preset(name_or_path: str | Path) -> ModelConfig:
    """A preset name (configs/models/NAME.yaml) or a path to a YAML file -> ModelConfig."""
    return load_named(ModelConfig, name_or_path, PRESET_DIR, "model preset", "presets")
