"""Alpamayo-R1 checkpoints (VLM + action expert + action projections) <-> Target, ActionExpert.

Layout, from the upstream source at NVlabs/alpamayo commit 1cba38cabffb4b4416dbdd312c868e21ccd57394:
  src/alpamayo_r1/models/alpamayo_r1.py   AlpamayoR1: `vlm` (Qwen3VLForConditionalGeneration),
      `expert` = AutoModel(text_config overlaid with expert_cfg) with embed_tokens deleted,
      `action_in_proj` (action_in_proj_cfg), `action_out_proj` (torch.nn.Linear),
      `action_space`, `diffusion` (FlowMatching, no tensors)
  src/alpamayo_r1/models/action_in_proj.py    PerWaypointActionInProjV2: sinus.{i}.freqs,
      timestep_fourier_encoder.freqs (persistent buffers), encoder.trunk.*, norm (LayerNorm)
  src/alpamayo_r1/action_space/unicycle_accel_curvature.py   buffers accel_mean, accel_std,
      curvature_mean, curvature_std (0-d)
So the tensors are `vlm.` + the Hugging Face Qwen3-VL names (models/hf.py), `expert.layers.*`,
`expert.norm.weight`, `action_in_proj.*`, `action_out_proj.{weight,bias}`, `action_space.*`,
in sharded safetensors with `model.safetensors.index.json`. The release config.json is flat
(the VLM's own config comes from `vlm_name_or_path`), so `load_alpamayo` takes the Qwen3-VL
config.json as `vlm_config` unless config.json carries text_config/vision_config itself.

Sizes come from the folder, never from a preset: the vocabulary is the embedding's row count
(upstream sets vocab_size = len(tokenizer), Qwen's tokens + trajectory + added tokens). The 7
non-learned buffers (action_in_proj.sinus.{0,1}.freqs, action_in_proj.timestep_fourier_encoder
.freqs, action_space.{accel,curvature}_{mean,std}) are rebuilt from config.json when a folder
omits them. `release_config` writes every key AlpamayoR1Config / ReasoningVLAConfig read.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from core.config import ConfigError, read_json

from models.action_expert import DT, MAX_FREQ, ActionExpert, expert_llm, in_proj_shape
from models.config import DraftConfig, ExpertConfig, ModelConfig
from models.hf import PATCH_KEY, check_causal, config_from_hf, hf_config, hf_shapes, to_hf_name, weight_files
from models.names import check_names
from models.target import Target

UPSTREAM = ("NVlabs/alpamayo", "1cba38cabffb4b4416dbdd312c868e21ccd57394")
INDEX = "model.safetensors.index.json"
SPACE = ("accel", "curvature")   # action_space buffer prefixes, one per action dim


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """Every tensor of an AlpamayoR1 state dict with its shape, from the upstream classes."""
    shapes = _vlm_shapes(cfg)
    layer = expert_llm(cfg.expert, cfg.target.llm)
    H, I, hd = layer.hidden, layer.intermediate, layer.head_dim
    for i in range(layer.layers):
        p = f"expert.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (layer.heads * hd, H),
                       p + "self_attn.k_proj.weight": (layer.kv_heads * hd, H),
                       p + "self_attn.v_proj.weight": (layer.kv_heads * hd, H),
                       p + "self_attn.o_proj.weight": (H, layer.heads * hd),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                       p + "mlp.down_proj.weight": (H, I)})
        if layer.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    shapes["expert.norm.weight"] = (H,)
    shapes.update(_in_proj_shapes(cfg.expert))
    shapes.update({"action_out_proj.weight": (cfg.expert.action_dim, H),
                   "action_out_proj.bias": (cfg.expert.action_dim,)})
    shapes.update({f"action_space.{n}_{s}": () for n in SPACE for s in ("mean", "std")})
    return shapes


def _vlm_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    with torch.device("meta"):  # shapes only: nothing is allocated
        target = Target(cfg.target)
    return {"vlm." + k: v for k, v in hf_shapes(target).items()}


def _in_proj_shapes(cfg: ExpertConfig) -> dict[str, tuple]:
    """PerWaypointActionInProjV2: trunk = Linear, SiLU, then (RMSNorm, Linear, SiLU) per layer,
    the last SiLU dropped; Linear indices 0, 3, 6, ..., RMSNorm indices 2, 5, ..."""
    feats, layers, hidden = in_proj_shape(cfg)
    p = "action_in_proj."
    shapes = {f"{p}sinus.{i}.freqs": (1, feats // 2) for i in range(cfg.action_dim)}
    shapes[p + "timestep_fourier_encoder.freqs"] = (1, feats // 2)
    shapes.update({p + "encoder.trunk.0.weight": (hidden, feats * (cfg.action_dim + 1)),
                   p + "encoder.trunk.0.bias": (hidden,)})
    for i in range(layers):
        out = cfg.hidden if i == layers - 1 else hidden
        shapes[f"{p}encoder.trunk.{2 + 3 * i}.weight"] = (hidden,)
        shapes[f"{p}encoder.trunk.{3 + 3 * i}.weight"] = (out, hidden)
        shapes[f"{p}encoder.trunk.{3 + 3 * i}.bias"] = (out,)
    shapes.update({p + "norm.weight": (cfg.hidden,), p + "norm.bias": (cfg.hidden,)})
    return shapes


def to_alpamayo(target: Target, expert: ActionExpert) -> dict[str, torch.Tensor]:
    """Our modules -> {upstream name: tensor} (upstream shapes; Conv3d patch embedding)."""
    hf = hf_shapes(target)
    out = {"vlm." + to_hf_name(k): t.reshape(hf[to_hf_name(k)])
           for k, t in target.state_dict().items() if to_hf_name(k) in hf}
    for k, t in expert.state_dict().items():
        if k.startswith(("layers.", "norm.")):
            out["expert." + k] = t
        elif k.startswith(("action_in_proj.", "action_out_proj.")):
            out[k] = t
    for i, name in enumerate(SPACE):
        out[f"action_space.{name}_mean"] = expert.action_mean[i].clone()
        out[f"action_space.{name}_std"] = expert.action_std[i].clone()
    return {k: v.detach().contiguous() for k, v in out.items()}


def rebuilt_buffers(cfg: ExpertConfig, space: dict | None = None) -> dict[str, torch.Tensor]:
    """The 7 non-learned buffers upstream registers, from the config: Fourier frequencies
    logspace(0, log10(max_freq), feats/2) (FourierEncoderV2) and the action normalisation
    (UnicycleAccelCurvatureActionSpace: action_space_cfg {accel,curvature}_{mean,std}, else 0 / 1)."""
    feats, _, _ = in_proj_shape(cfg)
    freqs = torch.logspace(0, math.log10(MAX_FREQ), feats // 2)[None]
    out = {f"action_in_proj.sinus.{i}.freqs": freqs.clone() for i in range(cfg.action_dim)}
    out["action_in_proj.timestep_fourier_encoder.freqs"] = freqs.clone()
    space = space or {}
    for name in SPACE:
        out[f"action_space.{name}_mean"] = torch.tensor(float(space.get(f"{name}_mean", 0.0)))
        out[f"action_space.{name}_std"] = torch.tensor(float(space.get(f"{name}_std", 1.0)))
    return out


def from_alpamayo(tensors: dict[str, torch.Tensor], cfg: ModelConfig, dtype=torch.float32,
                  space: dict | None = None):
    """{upstream name: tensor} -> (Target, ActionExpert); refuses missing, unexpected or
    mis-shaped tensors with their names and expected shapes. Non-learned buffers the folder
    omits are rebuilt from the config (`space`: the release's action_space_cfg)."""
    tensors = {**rebuilt_buffers(cfg.expert, space), **tensors}
    expected = expected_shapes(cfg)
    check_names(expected, tensors, "Alpamayo-R1 checkpoint")
    target = Target(cfg.target).to(dtype)
    tstate = {}
    for k in target.state_dict():
        name = "vlm." + to_hf_name(k)
        if name in expected:
            tstate[k] = tensors[name]
    tstate[PATCH_KEY] = tstate[PATCH_KEY].reshape(tstate[PATCH_KEY].shape[0], -1)
    target.load_state_dict(tstate, strict=not cfg.target.llm.tie_embeddings)
    expert = ActionExpert(cfg.expert, cfg.target.llm).to(dtype)
    estate = {}
    for k in expert.state_dict():
        src = "expert." + k if k.startswith(("layers.", "norm.")) else k
        if src in tensors:
            estate[k] = tensors[src]
    for stat in ("mean", "std"):
        estate[f"action_{stat}"] = torch.stack([tensors[f"action_space.{n}_{stat}"] for n in SPACE])
    expert.load_state_dict(estate, strict=True)
    return target, expert


def model_config(alpamayo: dict, vlm: dict, vocab_size: int | None = None) -> ModelConfig:
    """Release config.json (flat) + the VLM's Qwen3-VL config.json -> ModelConfig.
    vocab_size: the folder's embedding rows (wins; config.json's vocab_size must agree)."""
    target = config_from_hf(vlm)
    vocab = vocab_size or alpamayo.get("vocab_size")
    if vocab_size and alpamayo.get("vocab_size", vocab_size) != vocab_size:
        raise ConfigError(f"config.json vocab_size={alpamayo['vocab_size']} but the folder's embedding has "
                          f"{vocab_size} rows")
    if vocab:  # the VLM's vocabulary grown by the trajectory/special tokens
        llm = dataclasses.replace(target.llm, vocab_size=int(vocab))
        target = dataclasses.replace(target, llm=llm)
    tc, ec = vlm.get("text_config") or vlm, alpamayo.get("expert_cfg") or {}
    space, diff = alpamayo.get("action_space_cfg") or {}, alpamayo.get("diffusion_cfg") or {}
    for key, ours in (("num_key_value_heads", target.llm.kv_heads), ("head_dim", target.llm.head_dim),
                      ("num_hidden_layers", target.llm.layers)):
        if ec.get(key, ours) != ours:
            raise ValueError(f"expert_cfg.{key}={ec[key]} differs from the VLM's {ours}; "
                             "specdrive's expert reads the VLM's K/V layer by layer, so it must match")
    if float(space.get("dt", DT)) != DT:
        raise ValueError(f"action_space_cfg.dt={space['dt']}: specdrive integrates at dt={DT}")
    proj = alpamayo.get("action_in_proj_cfg") or {}
    # upstream PerWaypointActionInProjV2 defaults: 4 layers, hidden 1024, 20 features
    expert = ExpertConfig(hidden=ec.get("hidden_size", tc["hidden_size"]),
                          heads=ec.get("num_attention_heads", tc["num_attention_heads"]),
                          intermediate=ec.get("intermediate_size", tc["intermediate_size"]),
                          n_waypoints=space.get("n_waypoints", 64),
                          euler_steps=diff.get("num_inference_steps", 10),
                          fourier_feats=proj.get("num_fourier_feats", 20),
                          in_proj_layers=proj.get("num_enc_layers", 4),
                          in_proj_hidden=proj.get("hidden_size", 1024),
                          non_causal=bool(alpamayo.get("expert_non_causal_attention", True)))
    cfg = ModelConfig(target=target, draft=DraftConfig(), expert=expert)
    _check_in_proj(alpamayo.get("action_in_proj_cfg") or {}, cfg.expert)
    return cfg


def _check_in_proj(upstream: dict, cfg: ExpertConfig) -> None:
    feats, layers, hidden = in_proj_shape(cfg)
    theirs = (upstream.get("num_fourier_feats", 20), upstream.get("num_enc_layers", 4),
              upstream.get("hidden_size", 1024), float(upstream.get("max_freq", 100.0)))
    if theirs != (feats, layers, hidden, MAX_FREQ):
        raise ValueError(f"action_in_proj_cfg (num_fourier_feats, num_enc_layers, hidden_size, "
                         f"max_freq)={theirs} but this expert builds {(feats, layers, hidden, MAX_FREQ)}")


# The trajectory-token settings of the release (upstream ReasoningVLAConfig keys): 3000
# (accel, curvature) future bins in [-10, 10] and 1000 delta history bins, 4000 <i*> tokens.
RELEASE_TOKENS = {
    "traj_vocab_size": 4000, "add_special_tokens": True, "tokens_per_history_traj": 48,
    "traj_tokenizer_cfg": {
        "_target_": "alpamayo_r1.action_space.discrete_action_space.DiscreteTrajectoryTokenizer",
        "_recursive_": False, "num_bins": 3000, "dims_min": [-10.0, -10.0], "dims_max": [10.0, 10.0],
        "action_space_cfg": {"_target_": "alpamayo_r1.action_space.unicycle_accel_curvature."
                                         "UnicycleAccelCurvatureActionSpace"}},
    "hist_traj_tokenizer_cfg": {"_target_": "alpamayo_r1.models.delta_tokenizer.DeltaTrajectoryTokenizer",
                                "num_bins": 1000},
}
TOKEN_KEYS = tuple(RELEASE_TOKENS)


def release_config(cfg: ModelConfig, vlm_name_or_path: str, tokens: dict | None = None,
                   action_stats: dict | None = None, dtype: str = "float32") -> dict:
    """The flat config.json fields AlpamayoR1Config and ReasoningVLAConfig read, for a checkpoint
    we write. tokens: the trajectory-token settings (TOKEN_KEYS; default RELEASE_TOKENS, or the
    ones of the folder a model was loaded from); action_stats: {accel,curvature}_{mean,std}."""
    feats, layers, hidden = in_proj_shape(cfg.expert)
    e, llm = cfg.expert, cfg.target.llm
    tokens = {**RELEASE_TOKENS, **{k: v for k, v in (tokens or {}).items() if k in TOKEN_KEYS}}
    return {
        "model_type": "alpamayo_r1", "architectures": ["AlpamayoR1"],
        "vlm_name_or_path": vlm_name_or_path, "vlm_backend": "qwenvl3", "vocab_size": llm.vocab_size,
        **tokens,
        # the discrete future tokens: one per action value per waypoint (not the waypoint count)
        "tokens_per_future_traj": e.n_waypoints * e.action_dim,
        "expert_non_causal_attention": e.non_causal, "keep_same_dtype": True,
        # the weights' dtype; sdpa (flash-attn is a CUDA build): with upstream's explicit 4D
        # expert mask both give the same attention; pixels: the processor's defaults (null)
        "model_dtype": dtype, "attn_implementation": "sdpa", "min_pixels": None, "max_pixels": None,
        "expert_cfg": {"hidden_size": e.hidden, "num_attention_heads": e.heads,
                       "num_key_value_heads": llm.kv_heads, "head_dim": llm.head_dim,
                       "intermediate_size": e.intermediate},
        "action_space_cfg": {"_target_": "alpamayo_r1.action_space.unicycle_accel_curvature."
                             "UnicycleAccelCurvatureActionSpace", "n_waypoints": e.n_waypoints, "dt": DT,
                             **(action_stats or {})},
        "action_in_proj_cfg": {"_target_": "alpamayo_r1.models.action_in_proj.PerWaypointActionInProjV2",
                               "num_fourier_feats": feats, "num_enc_layers": layers,
                               "hidden_size": hidden, "max_freq": MAX_FREQ},
        "action_out_proj_cfg": {"_target_": "torch.nn.Linear"},
        "diffusion_cfg": {"_target_": "alpamayo_r1.diffusion.flow_matching.FlowMatching",
                          "int_method": "euler", "num_inference_steps": e.euler_steps},
    }


def save_alpamayo(path, target: Target, expert: ActionExpert, cfg: ModelConfig,
                  vlm_name_or_path: str = "Qwen/Qwen3-VL-8B-Instruct", shard_bytes: int = 1 << 30,
                  tokens: dict | None = None):
    """Write config.json + model-0000i-of-0000n.safetensors + the index, as the release does;
    also `vlm_config.json` (the Qwen3-VL config the release fetches from `vlm_name_or_path`).
    tokens: trajectory-token settings for config.json (release_config). A frame_local target is
    refused (check_causal): upstream's VLM and the runtimes that read this layout build a causal mask."""
    check_causal(target.cfg, f"save_alpamayo {path}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shards, size = [{}], 0
    for k, t in to_alpamayo(target, expert).items():
        if shards[-1] and size + t.nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k], size = t, size + t.nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    total = sum(t.nbytes for s in shards for t in s.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX).write_text(json.dumps(index, indent=2))
    stats = {f"{n}_{s}": float(getattr(expert, f"action_{s}")[i]) for i, n in enumerate(SPACE)
             for s in ("mean", "std")}
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    config = release_config(cfg, vlm_name_or_path, tokens, stats, dtype)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "vlm_config.json").write_text(json.dumps(hf_config(cfg.target), indent=2))


def load_alpamayo(path, vlm_config=None, dtype=torch.float32):
    """Folder in the release layout -> (Target, ActionExpert, ModelConfig).

    vlm_config: the Qwen3-VL config (dict or path to its config.json); default: the folder's
    vlm_config.json, or text_config/vision_config inside config.json.
    """
    path = Path(path)
    alpamayo = read_json(path / "config.json", "Alpamayo-R1 config")
    vlm = _vlm_config(path, alpamayo, vlm_config)
    tensors = _read_shards(path)
    embed = tensors.get("vlm.model.language_model.embed_tokens.weight")
    cfg = model_config(alpamayo, vlm, None if embed is None else int(embed.shape[0]))
    target, expert = from_alpamayo(tensors, cfg, dtype, alpamayo.get("action_space_cfg"))
    return target, expert, cfg


def _vlm_config(path: Path, alpamayo: dict, vlm_config) -> dict:
    if isinstance(vlm_config, dict):
        return vlm_config
    if vlm_config is not None:
        return read_json(vlm_config, "vlm_config")
    if "text_config" in alpamayo and "vision_config" in alpamayo:
        return alpamayo
    if (path / "vlm_config.json").is_file():
        return read_json(path / "vlm_config.json", "vlm_config")
    raise ConfigError(f"{path}/config.json is flat (no text_config / vision_config) and names "
                      f"vlm_name_or_path={alpamayo.get('vlm_name_or_path')!r}, but there is no vlm_config: "
                      f"put that model's config.json in the folder as vlm_config.json, or pass that "
                      f"model's config.json as vlm_config")


def _read_shards(path: Path) -> dict[str, torch.Tensor]:
    """The weights transformers would read (models.hf.weight_files); a tensor the index lists
    but no shard holds is reported by check_names."""
    return {k: v for f in weight_files(path) for k, v in load_file(str(f)).items()}
