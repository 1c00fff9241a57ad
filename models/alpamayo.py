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
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from models.action_expert import DT, MAX_FREQ, ActionExpert, expert_llm, in_proj_shape
from models.config import DraftConfig, ExpertConfig, ModelConfig
from models.hf import PATCH_KEY, hf_shapes, to_hf_name, config_from_hf, hf_config
from models.io import check_names
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


def from_alpamayo(tensors: dict[str, torch.Tensor], cfg: ModelConfig, dtype=torch.float32):
    """{upstream name: tensor} -> (Target, ActionExpert); refuses missing, unexpected or
    mis-shaped tensors with their names and expected shapes."""
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


def model_config(alpamayo: dict, vlm: dict) -> ModelConfig:
    """Release config.json (flat) + the VLM's Qwen3-VL config.json -> ModelConfig."""
    target = config_from_hf(vlm)
    if "vocab_size" in alpamayo:  # the VLM's vocabulary grown by the trajectory/special tokens
        llm = dataclasses.replace(target.llm, vocab_size=int(alpamayo["vocab_size"]))
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
                          in_proj_hidden=proj.get("hidden_size", 1024))
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


def release_config(cfg: ModelConfig, vlm_name_or_path: str) -> dict:
    """The flat config.json fields AlpamayoR1Config reads, for a checkpoint we write."""
    feats, layers, hidden = in_proj_shape(cfg.expert)
    e, llm = cfg.expert, cfg.target.llm
    return {
        "model_type": "alpamayo_r1", "architectures": ["AlpamayoR1"],
        "vlm_name_or_path": vlm_name_or_path, "vlm_backend": "qwenvl3", "vocab_size": llm.vocab_size,
        "tokens_per_future_traj": e.n_waypoints, "expert_non_causal_attention": True,
        "expert_cfg": {"hidden_size": e.hidden, "num_attention_heads": e.heads,
                       "num_key_value_heads": llm.kv_heads, "head_dim": llm.head_dim,
                       "intermediate_size": e.intermediate},
        "action_space_cfg": {"_target_": "alpamayo_r1.action_space.unicycle_accel_curvature."
                             "UnicycleAccelCurvatureActionSpace", "n_waypoints": e.n_waypoints, "dt": DT},
        "action_in_proj_cfg": {"_target_": "alpamayo_r1.models.action_in_proj.PerWaypointActionInProjV2",
                               "num_fourier_feats": feats, "num_enc_layers": layers,
                               "hidden_size": hidden, "max_freq": MAX_FREQ},
        "action_out_proj_cfg": {"_target_": "torch.nn.Linear"},
        "diffusion_cfg": {"_target_": "alpamayo_r1.diffusion.flow_matching.FlowMatching",
                          "int_method": "euler", "num_inference_steps": e.euler_steps},
    }


def save_alpamayo(path, target: Target, expert: ActionExpert, cfg: ModelConfig,
                  vlm_name_or_path: str = "Qwen/Qwen3-VL-8B-Instruct", shard_bytes: int = 1 << 30):
    """Write config.json + model-0000i-of-0000n.safetensors + the index, as the release does;
    also `vlm_config.json` (the Qwen3-VL config the release fetches from `vlm_name_or_path`)."""
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
    (path / "config.json").write_text(json.dumps(release_config(cfg, vlm_name_or_path), indent=2))
    (path / "vlm_config.json").write_text(json.dumps(hf_config(cfg.target), indent=2))


def load_alpamayo(path, vlm_config=None, dtype=torch.float32):
    """Folder in the release layout -> (Target, ActionExpert, ModelConfig).

    vlm_config: the Qwen3-VL config (dict or path to its config.json); default: the folder's
    vlm_config.json, or text_config/vision_config inside config.json.
    """
    path = Path(path)
    alpamayo = json.loads((path / "config.json").read_text())
    cfg = model_config(alpamayo, _vlm_config(path, alpamayo, vlm_config))
    target, expert = from_alpamayo(_read_shards(path), cfg, dtype)
    return target, expert, cfg


def _vlm_config(path: Path, alpamayo: dict, vlm_config) -> dict:
    if isinstance(vlm_config, dict):
        return vlm_config
    if vlm_config is not None:
        return json.loads(Path(vlm_config).read_text())
    if "text_config" in alpamayo and "vision_config" in alpamayo:
        return alpamayo
    if (path / "vlm_config.json").is_file():
        return json.loads((path / "vlm_config.json").read_text())
    raise ValueError(f"{path}/config.json is flat and names vlm_name_or_path="
                     f"{alpamayo.get('vlm_name_or_path')!r}; pass that model's config.json as vlm_config")


def _read_shards(path: Path) -> dict[str, torch.Tensor]:
    index = path / INDEX
    if not index.is_file():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no {INDEX} and no *.safetensors in {str(path)!r}")
        return {k: v for f in files for k, v in load_file(str(f)).items()}
    weight_map = json.loads(index.read_text())["weight_map"]
    tensors = {}
    for name in sorted(set(weight_map.values())):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name}: listed in {INDEX} but missing")
        tensors.update(load_file(str(path / name)))
    return tensors   # a tensor the index lists but no shard holds is reported by check_names
