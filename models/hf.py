"""Hugging Face Qwen3-VL / Qwen2.5-VL checkpoints (config.json + safetensors) <-> Target.

    target, model_cfg = load_hf(dir)     model.safetensors, or the shards its index lists
    save_hf(target, dir)                 config.json + model.safetensors that transformers loads
    config_from_hf(config_dict) -> TargetConfig;  hf_config(target_cfg) -> config dict

Our module names are transformers' names, so the weight map is prefixes only: the LLM under
`model.language_model.` (legacy checkpoints: `model.`), the vision tower under `model.visual.`
(legacy: `visual.`), `lm_head.weight` (absent when embeddings are tied). One reshape: HF's
patch embedding is a Conv3d (D, C, tp, p, p); ours is the same map as a Linear (D, C*tp*p*p).
Video fields (video_token_id, tokens_per_second) are not modelled; save writes neutral values.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from models.config import (DraftConfig, ExpertConfig, LLMConfig, ModelConfig, TargetConfig,
                           VisionConfig)
from models.names import check_names
from models.target import Target
from core.config import ConfigError

STYLES = {"qwen3_vl": "qwen3", "qwen2_5_vl": "qwen2.5"}
VISION_ACT = {"qwen3": "gelu_pytorch_tanh", "qwen2.5": "silu"}
PATCH_KEY = "visual.patch_embed.proj.weight"


def _require(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"HF config {name}={value!r} is not supported; allowed {list(allowed)}")


def _rope_params(tc: dict) -> dict:
    rp = dict(tc.get("rope_parameters") or tc.get("rope_scaling") or {})
    rp.setdefault("rope_theta", tc.get("rope_theta", 10000.0))
    _require("rope_type", rp.get("rope_type", rp.get("type", "default")), ("default", "mrope"))
    return rp


def _llm_from_hf(tc: dict, style: str, tie: bool) -> LLMConfig:
    _require("text_config.hidden_act", tc.get("hidden_act", "silu"), ("silu",))
    _require("text_config.attention_bias", tc.get("attention_bias", False), (False,))
    _require("text_config.use_sliding_window", tc.get("use_sliding_window", False), (False,))
    rp = _rope_params(tc)
    if not rp.get("mrope_section"):
        raise ValueError("HF config text_config has no mrope_section (in rope_parameters / rope_scaling); "
                         "a Qwen-VL target needs one: 3 ints (t, h, w) summing to head_dim/2")
    heads = tc["num_attention_heads"]
    return LLMConfig(
        layers=tc["num_hidden_layers"], hidden=tc["hidden_size"], heads=heads,
        kv_heads=tc.get("num_key_value_heads") or heads,
        head_dim=tc.get("head_dim") or tc["hidden_size"] // heads,
        intermediate=tc["intermediate_size"], vocab_size=tc["vocab_size"],
        rope_theta=float(rp["rope_theta"]), mrope_section=tuple(rp["mrope_section"]),
        interleaved=style == "qwen3", qk_norm=style == "qwen3", qkv_bias=style == "qwen2.5",
        norm_eps=float(tc.get("rms_norm_eps", 1e-6)), tie_embeddings=tie)


def _vision_from_hf(vc: dict, style: str) -> VisionConfig:
    _require("vision_config.hidden_act", vc.get("hidden_act", VISION_ACT[style]),
             (VISION_ACT[style],))
    rp = vc.get("rope_parameters") or {}
    return VisionConfig(
        style=style, depth=vc["depth"], hidden=vc["hidden_size"], heads=vc["num_heads"],
        intermediate=vc["intermediate_size"], patch=vc["patch_size"],
        temporal_patch=vc["temporal_patch_size"], merge=vc["spatial_merge_size"],
        in_channels=vc.get("in_channels", 3), rope_theta=float(rp.get("rope_theta", 10000.0)),
        num_position_embeddings=vc.get("num_position_embeddings", 2304) if style == "qwen3" else 1,
        deepstack_layers=tuple(vc.get("deepstack_visual_indexes", ())) if style == "qwen3" else (),
        **_windows_from_hf(vc, style))


def _windows_from_hf(vc: dict, style: str) -> dict:
    """Qwen2.5 window attention; every block full-attention is the same model as no windows
    (what hf_config writes for window_size 0), read back as window_size 0."""
    if style != "qwen2.5":
        return {"window_size": 0, "fullatt_blocks": ()}
    full = tuple(vc.get("fullatt_block_indexes", ()))
    if set(full) >= set(range(vc["depth"])):
        return {"window_size": 0, "fullatt_blocks": ()}
    return {"window_size": vc.get("window_size", 0), "fullatt_blocks": full}


def config_from_hf(d: dict) -> TargetConfig:
    """transformers' Qwen3VLConfig / Qwen2_5_VLConfig dict -> TargetConfig."""
    _require("model_type", d.get("model_type"), STYLES)
    style = STYLES[d["model_type"]]
    tc = d.get("text_config") or d  # legacy Qwen2.5-VL configs keep text fields at top level
    tie = bool(d.get("tie_word_embeddings", tc.get("tie_word_embeddings", False)))
    llm, vision = _llm_from_hf(tc, style, tie), _vision_from_hf(d["vision_config"], style)
    out = d["vision_config"].get("out_hidden_size", llm.hidden)
    if out != llm.hidden:
        raise ValueError(f"vision_config.out_hidden_size={out} must equal text hidden_size={llm.hidden}")
    return TargetConfig(vision=vision, llm=llm, image_token_id=d.get("image_token_id", -1),
                        vision_start_id=d.get("vision_start_token_id", -1))


def model_config_from_hf(d: dict) -> ModelConfig:
    """TargetConfig from config.json plus a default 1-layer FlatRoPE draft and an expert with
    half the target's heads (its head_dim must be the target's to read the target K/V)."""
    target = config_from_hf(d)
    heads = max(1, target.llm.heads // 2)
    hidden = heads * target.llm.head_dim
    return ModelConfig(target=target, draft=DraftConfig(),
                       expert=ExpertConfig(hidden=hidden, heads=heads, intermediate=3 * hidden))


def hf_config(cfg: TargetConfig) -> dict:
    """TargetConfig -> a config.json dict transformers builds the same model from."""
    style, llm, v = cfg.vision.style, cfg.llm, cfg.vision
    kind = "qwen3_vl" if style == "qwen3" else "qwen2_5_vl"
    rope = {"rope_type": "default", "rope_theta": llm.rope_theta,
            "mrope_section": list(llm.mrope_section)}
    if style == "qwen3":
        rope["mrope_interleaved"] = True
    text = {"model_type": f"{kind}_text", "vocab_size": llm.vocab_size, "hidden_size": llm.hidden,
            "intermediate_size": llm.intermediate, "num_hidden_layers": llm.layers,
            "num_attention_heads": llm.heads, "num_key_value_heads": llm.kv_heads,
            "hidden_act": "silu", "rms_norm_eps": llm.norm_eps, "rope_parameters": rope,
            "tie_word_embeddings": llm.tie_embeddings}
    vision = {"model_type": f"{kind}_vision", "depth": v.depth, "hidden_size": v.hidden,
              "hidden_act": VISION_ACT[style], "intermediate_size": v.intermediate,
              "num_heads": v.heads, "in_channels": v.in_channels, "patch_size": v.patch,
              "spatial_merge_size": v.merge, "temporal_patch_size": v.temporal_patch,
              "out_hidden_size": llm.hidden,
              "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta}}
    if style == "qwen3":
        text.update(head_dim=llm.head_dim, attention_bias=False)
        vision.update(num_position_embeddings=v.num_position_embeddings,
                      deepstack_visual_indexes=list(v.deepstack_layers))
    else:
        # transformers divides by window_size // merge // patch: window_size 0 (no windows) is
        # written as the same model it can run, every block full-attention (windows unused)
        windows = (v.window_size, list(v.fullatt_blocks)) if v.window_size else \
            (v.patch * v.merge, list(range(v.depth)))
        vision.update(window_size=windows[0], fullatt_block_indexes=windows[1])
        if llm.head_dim * llm.heads != llm.hidden:
            raise ValueError(f"Qwen2.5-VL needs head_dim*heads == hidden, got {llm.head_dim}*"
                             f"{llm.heads} != {llm.hidden}")
    return {"architectures": [f"{type_name(kind)}ForConditionalGeneration"], "model_type": kind,
            "text_config": text, "vision_config": vision,
            "image_token_id": cfg.image_token_id, "vision_start_token_id": cfg.vision_start_id,
            "video_token_id": -1, "vision_end_token_id": -1,
            "tie_word_embeddings": llm.tie_embeddings, "dtype": "float32"}


def type_name(kind: str) -> str:
    return {"qwen3_vl": "Qwen3VL", "qwen2_5_vl": "Qwen2_5_VL"}[kind]


def to_hf_name(name: str) -> str:
    if name.startswith("visual."):
        return "model." + name
    return name if name.startswith("lm_head.") else "model.language_model." + name


def _from_legacy(name: str) -> str:
    """Old layout (`visual.*`, `model.layers.*`) -> current (`model.visual.*`, ...)."""
    if name.startswith("visual."):
        return "model." + name
    if name.startswith("model.") and not name.startswith(("model.visual.", "model.language_model.")):
        return "model.language_model." + name[len("model."):]
    return name


INDEX = "model.safetensors.index.json"


def weight_files(path: Path) -> list[Path]:
    """The weight files transformers reads: model.safetensors, else the shards that
    model.safetensors.index.json lists; other *.safetensors in the folder are not weights."""
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    if (path / INDEX).is_file():
        index = json.loads((path / INDEX).read_text())
        files = [path / name for name in sorted(set(index.get("weight_map", {}).values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{missing[0]}: listed in {INDEX} but missing")
        return files
    found = sorted(p.name for p in path.glob("*.safetensors"))
    raise FileNotFoundError(f"no model.safetensors and no {INDEX} in {str(path)!r}"
                            + (f" (found {found[:5]}: not read, transformers would not read them either)"
                               if found else ""))


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for f in weight_files(path):
        tensors.update(load_file(str(f)))
    return {_from_legacy(k): v for k, v in tensors.items()}


def hf_shapes(target: Target) -> dict[str, tuple]:
    shapes = {}
    for name, t in target.state_dict().items():
        if name == "lm_head.weight" and target.cfg.llm.tie_embeddings:
            continue
        shape = tuple(t.shape)
        if name == PATCH_KEY:
            v = target.cfg.vision
            shape = (shape[0], v.in_channels, v.temporal_patch, v.patch, v.patch)
        shapes[to_hf_name(name)] = shape
    return shapes


def load_hf(path: str | Path, dtype=torch.float32) -> tuple[Target, ModelConfig]:
    """Directory with config.json + safetensors -> (Target with those weights, ModelConfig)."""
    path = Path(path)
    model_cfg = model_config_from_hf(json.loads((path / "config.json").read_text()))
    target = Target(model_cfg.target).to(dtype)
    tensors = _read_tensors(path)
    expected = hf_shapes(target)
    tied = ("lm_head.weight",) if model_cfg.target.llm.tie_embeddings else ()
    check_names(expected, tensors, "HF checkpoint", ignore=tied)
    state = {name: tensors[to_hf_name(name)] for name in target.state_dict()
             if to_hf_name(name) in expected}
    state[PATCH_KEY] = state[PATCH_KEY].reshape(state[PATCH_KEY].shape[0], -1)
    target.load_state_dict(state, strict=not model_cfg.target.llm.tie_embeddings)
    return target, model_cfg


def check_causal(cfg, where: str) -> None:
    """Runtimes that build their own causal mask (transformers' generate, TensorRT-LLM, TensorRT
    Edge-LLM) would run a frame_local target as if it were causal, with other output: refused."""
    if cfg.llm.image_attention != "causal":
        raise ConfigError(f"{where}: this target's llm.image_attention is {cfg.llm.image_attention!r}; the "
                          "runtime this writes for builds a causal mask and would run it as another model. "
                          "Use specdrive's runtimes (torch, onnxruntime, tensorrt), or a causal-layout target "
                          "(checkpoints/tiny-causal, which `make train-causal` trains)")


def save_hf(target: Target, path: str | Path) -> None:
    """Write config.json + model.safetensors (HF names and shapes; never pickle). A frame_local
    target is refused (check_causal)."""
    check_causal(target.cfg, f"save_hf {path}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shapes = hf_shapes(target)
    tensors = {}
    for name, t in target.state_dict().items():
        hf = to_hf_name(name)
        if hf in shapes:
            tensors[hf] = t.detach().reshape(shapes[hf]).contiguous().cpu()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config(target.cfg)
    config["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")   # the weights' own
    (path / "config.json").write_text(json.dumps(config, indent=2))
