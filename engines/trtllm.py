"""TensorRT-LLM checkpoints (Thor / Hopper profiles): the target LLM and the standalone draft in
TensorRT-LLM's own layout, with FP8 scales from ModelOpt calibration, and the trtllm-build commands.

    out/trtllm/target/   config.json + rank0.safetensors (TensorRT-LLM) + meta.json (ours)
    out/trtllm/draft/    the same for the standalone FlatRoPE draft
    out/trtllm/BUILD.sh  the exact trtllm-build commands (target: draft_tokens_external)

Layout: TensorRT-LLM's checkpoint format as its source defines it at release TRTLLM_RELEASE (the
names and shapes we follow are listed, with the files read, in tests/data/trtllm_golden.json):
    transformer.vocab_embedding.weight, transformer.ln_f.weight, lm_head.weight
    transformer.layers.N.{input_layernorm, post_layernorm}.weight
    transformer.layers.N.attention.qkv.weight      cat(q, k, v) rows; .bias when qkv_bias
    transformer.layers.N.attention.{q,k}_layernorm.weight   Qwen3 qk-norm (qwen_type "qwen3")
    transformer.layers.N.attention.dense.weight    o_proj
    transformer.layers.N.mlp.{fc, gate, proj}.weight   fc = gate_proj (the SiLU branch),
                                                       gate = up_proj, proj = down_proj
FP8 (quant_algo "FP8"): every linear but the LM head stores float8_e4m3fn weights (out, in) and two
(1,) float32 scales, weights_scaling_factor = weight amax / 448 and activation_scaling_factor =
input amax / 448 (dequantized x = x8 * scale). q, k, v share one input and one fused GEMM, so qkv
takes the largest of the three weight scales (fc and gate likewise).

What the checkpoint carries and what it cannot (`limits`): the decoder LLM only (the vision tower
and the action expert run as TensorRT engines beside it; image embeddings enter through the prompt
table, --max_prompt_embedding_table_size). Target M-RoPE is position_embedding_type "mrope", whose
cos/sin the runtime feeds (mrope_rotary_cos_sin): TensorRT-LLM builds those inputs only for the
Qwen2VL architectures, and its qwen2_vl type has no qk-norm (only qwen3 has), and no DeepStack
injection exists in its TensorRT-backend Qwen model. A Qwen3-VL-style target (qk-norm, DeepStack,
interleaved M-RoPE) is therefore written, read back and checked here, but trtllm-build at the
pinned release would not build it as is: meta.json and the manifest say which features block it.
A Qwen2.5-VL-style target (qkv bias, no qk-norm, no DeepStack) has no such blocker. The standalone
draft (features "none", FlatRoPE) is a plain Qwen3ForCausalLM with rope_gpt_neox: fully carried.
TensorRT-LLM is not installed here: the checkpoints are checked by reading them back into our
PyTorch models (tests/test_trtllm_checkpoint.py); the commands are written, never run.
"""
from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import safetensors.torch
import torch

from models import io
from models.draft import Draft
from models.hf import check_causal
from models.names import check_names
from core.artifacts import TrtllmMeta
from core.config import ConfigError, file_sha256, read_json
from prompt.draft_vocab import d2t_sha256

TRTLLM_RELEASE = "1.0.0rc4"
FP8_MAX = 448.0            # largest finite float8_e4m3fn value
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FP8_DTYPE = torch.float8_e4m3fn
# ours (per layer) -> TensorRT-LLM (per layer); qkv is the concatenation of q_proj, k_proj, v_proj
LINEARS = {"attention.dense": ("self_attn.o_proj",), "mlp.fc": ("mlp.gate_proj",),
           "mlp.gate": ("mlp.up_proj",), "mlp.proj": ("mlp.down_proj",),
           "attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")}
NORMS = {"input_layernorm": "input_layernorm", "post_layernorm": "post_attention_layernorm",
         "attention.q_layernorm": "self_attn.q_norm", "attention.k_layernorm": "self_attn.k_norm"}


# --- config.json ----------------------------------------------------------------------------------

def trtllm_config(llm, role: str, dtype: str, max_len: int, fp8: bool) -> dict:
    """config.json for our LLMConfig `llm`: role "target" (M-RoPE: Qwen2VL architecture) or "draft"
    (1D rope: Qwen3 with qk-norm, else Qwen2)."""
    if dtype not in DTYPES:
        raise ConfigError(f"trtllm dtype {dtype!r}: allowed {list(DTYPES)}")
    mrope = bool(llm.mrope_section)
    if role == "target" and not mrope:
        raise ConfigError("a TensorRT-LLM target checkpoint needs an M-RoPE target (llm.mrope_section set)")
    if mrope:
        arch, qwen_type, pe = "Qwen2VLForConditionalGeneration", "qwen2_vl", "mrope"
    else:
        arch, qwen_type, pe = ("Qwen3ForCausalLM", "qwen3", "rope_gpt_neox") if llm.qk_norm \
            else ("Qwen2ForCausalLM", "qwen2", "rope_gpt_neox")
    return {
        "architecture": arch, "qwen_type": qwen_type, "dtype": dtype, "logits_dtype": "float32",
        "vocab_size": llm.vocab_size, "hidden_size": llm.hidden, "num_hidden_layers": llm.layers,
        "num_attention_heads": llm.heads, "num_key_value_heads": llm.kv_heads, "head_size": llm.head_dim,
        "intermediate_size": llm.intermediate, "hidden_act": "silu", "norm_epsilon": llm.norm_eps,
        "position_embedding_type": pe, "rotary_base": llm.rope_theta,
        "rotary_scaling": {"type": "mrope", "mrope_section": list(llm.mrope_section)} if mrope else None,
        "rotary_embedding_dim": llm.head_dim if mrope else None,
        "max_position_embeddings": max_len, "seq_length": max_len,
        "attn_bias": llm.qkv_bias, "mlp_bias": False, "qk_layernorm": llm.qk_norm, "use_logn_attn": False,
        "tie_word_embeddings": llm.tie_embeddings, "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": "FP8" if fp8 else None, "kv_cache_quant_algo": None,
                         "exclude_modules": ["lm_head"] if fp8 else None},
    }


def limits(cfg, role: str) -> list[str]:
    """Features of our model that TensorRT-LLM TRTLLM_RELEASE cannot build from this checkpoint."""
    if role != "target":
        return []
    llm, vision, out = cfg.target.llm, cfg.target.vision, []
    if llm.qk_norm:
        out.append("qk-norm with M-RoPE: the qwen2_vl type (the only one given mrope cos/sin inputs) "
                   "builds no q/k layernorm; only qwen3 (1D rope) does")
    if vision.style == "qwen3" and vision.deepstack_layers:
        out.append(f"DeepStack: vision features added after LLM layers {list(vision.deepstack_layers)}; "
                   "the TensorRT-backend Qwen model has no such input")
    if llm.interleaved:
        out.append("interleaved M-RoPE (Qwen3-VL): TensorRT-LLM's own runner computes sectioned "
                   "(Qwen2-VL) cos/sin; ours must feed mrope_rotary_cos_sin from prompt.positions")
    return out


# --- weights: ours <-> TensorRT-LLM ---------------------------------------------------------------

def to_trtllm(state: dict, llm, dtype: str, amax: dict | None = None) -> dict:
    """Our LLM state dict (embed_tokens, layers.N..., norm, lm_head) -> TensorRT-LLM tensors.
    amax {our linear name: {"input", "weight"}} turns on FP8 for every linear it covers."""
    dt, out = DTYPES[dtype], {}
    out["transformer.vocab_embedding.weight"] = state["embed_tokens.weight"].to(dt)
    out["transformer.ln_f.weight"] = state["norm.weight"].to(dt)
    out["lm_head.weight"] = state["lm_head.weight"].to(dt)
    for i in range(llm.layers):
        ours, theirs = f"layers.{i}.", f"transformer.layers.{i}."
        for t_name, o_name in NORMS.items():
            if ours + o_name + ".weight" in state:
                out[theirs + t_name + ".weight"] = state[ours + o_name + ".weight"].to(dt)
        for t_name, o_names in LINEARS.items():
            w = torch.cat([state[ours + o + ".weight"] for o in o_names])
            if llm.qkv_bias and t_name == "attention.qkv":
                out[theirs + t_name + ".bias"] = torch.cat([state[ours + o + ".bias"] for o in o_names]).to(dt)
            if amax is None:
                out[theirs + t_name + ".weight"] = w.to(dt)
                continue
            a = [amax.get(ours + o) for o in o_names]
            if None in a:
                missing = [ours + o for o, x in zip(o_names, a) if x is None]
                raise ConfigError(f"FP8 checkpoint: no calibration amax for {missing}; the forward loop "
                                  "never reached them")
            w_scale = max(x["weight"] for x in a) / FP8_MAX
            a_scale = max(x["input"] for x in a) / FP8_MAX
            out[theirs + t_name + ".weight"] = (w.float() / w_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
            out[theirs + t_name + ".weights_scaling_factor"] = torch.tensor([w_scale], dtype=torch.float32)
            out[theirs + t_name + ".activation_scaling_factor"] = torch.tensor([a_scale], dtype=torch.float32)
    return {k: v.contiguous() for k, v in out.items()}


def from_trtllm(weights: dict, config: dict) -> tuple[dict, dict]:
    """TensorRT-LLM tensors -> (our LLM state dict in float32, FP8 weights dequantized as
    w8 * weights_scaling_factor; {our linear name: activation scale} of the FP8 linears)."""
    state, act = {}, {}
    f32 = lambda t: t.float()   # noqa: E731
    state["embed_tokens.weight"] = f32(weights["transformer.vocab_embedding.weight"])
    state["norm.weight"] = f32(weights["transformer.ln_f.weight"])
    state["lm_head.weight"] = f32(weights["lm_head.weight"])
    rows = {"attention.qkv": [config["num_attention_heads"] * config["head_size"],
                              config["num_key_value_heads"] * config["head_size"],
                              config["num_key_value_heads"] * config["head_size"]]}
    for i in range(config["num_hidden_layers"]):
        ours, theirs = f"layers.{i}.", f"transformer.layers.{i}."
        for t_name, o_name in NORMS.items():
            if theirs + t_name + ".weight" in weights:
                state[ours + o_name + ".weight"] = f32(weights[theirs + t_name + ".weight"])
        for t_name, o_names in LINEARS.items():
            w = weights[theirs + t_name + ".weight"]
            if w.dtype == FP8_DTYPE:
                w = w.float() * weights[theirs + t_name + ".weights_scaling_factor"].float()
                for o in o_names:
                    act[ours + o] = float(weights[theirs + t_name + ".activation_scaling_factor"])
            parts = w.float().split(rows.get(t_name, [w.shape[0]]))
            bias = weights.get(theirs + t_name + ".bias")
            bparts = bias.float().split(rows[t_name]) if bias is not None else [None] * len(parts)
            for o, p, b in zip(o_names, parts, bparts):
                state[ours + o + ".weight"] = p
                if b is not None:
                    state[ours + o + ".bias"] = b
    return state, act


def expected_shapes(config: dict) -> dict:
    """{name: shape} of every tensor a checkpoint of `config` holds (the writer's own view; the
    tests hold it against the golden list derived from TensorRT-LLM's source)."""
    H, V, I = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * config["head_size"], config["num_key_value_heads"] * config["head_size"]
    fp8 = config["quantization"]["quant_algo"] == "FP8"
    out = {"transformer.vocab_embedding.weight": (V, H), "transformer.ln_f.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(config["num_hidden_layers"]):
        p = f"transformer.layers.{i}."
        out |= {p + "input_layernorm.weight": (H,), p + "post_layernorm.weight": (H,)}
        if config["qk_layernorm"]:
            out |= {p + "attention.q_layernorm.weight": (config["head_size"],),
                    p + "attention.k_layernorm.weight": (config["head_size"],)}
        if config["attn_bias"]:
            out[p + "attention.qkv.bias"] = (q + 2 * kv,)
        for name, shape in (("attention.qkv", (q + 2 * kv, H)), ("attention.dense", (H, q)),
                            ("mlp.fc", (I, H)), ("mlp.gate", (I, H)), ("mlp.proj", (H, I))):
            out[p + name + ".weight"] = shape
            if fp8:
                out[p + name + ".weights_scaling_factor"] = (1,)
                out[p + name + ".activation_scaling_factor"] = (1,)
    return out


# --- files ----------------------------------------------------------------------------------------

def write_checkpoint(folder: Path, config: dict, weights: dict, **meta) -> TrtllmMeta:
    """config.json, rank0.safetensors and their card (meta: TrtllmMeta.new's arguments but the
    files and the release) -> the card written."""
    folder.mkdir(parents=True, exist_ok=True)
    check_names(expected_shapes(config), weights, f"TensorRT-LLM checkpoint {folder}")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    safetensors.torch.save_file(weights, str(folder / "rank0.safetensors"))
    files = {f: file_sha256(folder / f) for f in ("config.json", "rank0.safetensors")}
    card = TrtllmMeta.new(folder, files=files, release=TRTLLM_RELEASE, **meta)
    card.write(folder)
    return card


def read_checkpoint(folder: Path) -> tuple[dict, dict, TrtllmMeta]:
    """(config.json, tensors, meta.json) of a folder; names and shapes checked against config.json,
    hashes against meta.json. Safetensors and JSON only."""
    folder = Path(folder)
    for f in ("config.json", "rank0.safetensors", "meta.json"):
        if not (folder / f).is_file():
            raise ConfigError(f"{folder}: no {f}; a TensorRT-LLM checkpoint of ours has config.json, "
                              "rank0.safetensors and meta.json")
    meta = TrtllmMeta.from_dict(read_json(folder / "meta.json", "TensorRT-LLM checkpoint metadata"), folder)
    for f, sha in meta.files.items():
        if file_sha256(folder / f) != sha:
            raise ConfigError(f"{folder}/{f}: sha256 differs from meta.json; the file was changed")
    config = read_json(folder / "config.json", "TensorRT-LLM checkpoint config")
    weights = safetensors.torch.load_file(str(folder / "rank0.safetensors"))
    check_names(expected_shapes(config), weights, f"TensorRT-LLM checkpoint {folder}")
    return config, weights, meta


def check_matches(config: dict, llm, folder) -> None:
    """config.json must describe `llm` (the model it is read back into)."""
    pairs = {"hidden_size": llm.hidden, "num_hidden_layers": llm.layers, "num_attention_heads": llm.heads,
             "num_key_value_heads": llm.kv_heads, "head_size": llm.head_dim, "vocab_size": llm.vocab_size,
             "intermediate_size": llm.intermediate, "rotary_base": llm.rope_theta}
    bad = {k: (config.get(k), v) for k, v in pairs.items() if config.get(k) != v}
    if bad:
        raise ConfigError(f"{folder}/config.json does not describe this model: "
                          + "; ".join(f"{k}={a} vs model {b}" for k, (a, b) in bad.items()))


def read_target(folder: Path, target):
    """A copy of our `target` (its vision tower kept) with the LLM weights of the checkpoint ->
    (target, {linear: activation scale} for FP8)."""
    config, weights, _ = read_checkpoint(folder)
    check_matches(config, target.cfg.llm, folder)
    state, act = from_trtllm(weights, config)
    out = copy.deepcopy(target).float()
    missing, unexpected = out.load_state_dict(state, strict=False)
    left = [k for k in missing if not k.startswith("visual.")]
    if left or unexpected:
        raise ConfigError(f"{folder}: read back, missing {left[:5]} unexpected {unexpected[:5]}")
    return out.eval(), act


def read_draft(folder: Path, cfg):
    """The standalone draft of a checkpoint, with its own embedding and LM head -> (draft, act)."""
    config, weights, _ = read_checkpoint(folder)
    llm = cfg.draft_llm()
    check_matches(config, llm, folder)
    state, act = from_trtllm(weights, config)
    embed = torch.nn.Embedding(llm.vocab_size, llm.hidden)
    head = torch.nn.Linear(llm.hidden, llm.vocab_size, bias=False)
    embed.weight.data.copy_(state.pop("embed_tokens.weight"))
    head.weight.data.copy_(state.pop("lm_head.weight"))
    draft = Draft(cfg, embed, head)
    draft.load_state_dict(state, strict=True)
    return draft.eval(), act


def fake_quant_inputs(model: torch.nn.Module, act: dict) -> list:
    """What an FP8 engine does to each calibrated linear's input: x -> e4m3(x / s) * s (saturating).
    Forward pre-hooks on `model`'s linears named in `act`; returns the handles (.remove())."""
    def hook(scale):
        return lambda _, args: ((args[0] / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).to(args[0].dtype) * scale,)
    mods = dict(model.named_modules())
    return [mods[name].register_forward_pre_hook(hook(s)) for name, s in act.items()]


# --- trtllm-build ---------------------------------------------------------------------------------

def build_command(ckpt: str, engine: str, shapes, role: str, k_max: int, prompt_table: int) -> list[str]:
    """trtllm-build flags as tensorrt_llm/commands/build.py of TRTLLM_RELEASE defines them. The target
    verifies up to k_max external draft tokens; the draft returns logits for each generated token."""
    cmd = ["trtllm-build", "--checkpoint_dir", ckpt, "--output_dir", engine,
           "--max_batch_size", "1", "--max_input_len", str(shapes.max_prompt),
           "--max_seq_len", str(shapes.max_len), "--max_beam_width", "1",
           "--max_prompt_embedding_table_size", str(prompt_table),
           "--gemm_plugin", "auto", "--gpt_attention_plugin", "auto",
           "--remove_input_padding", "enable", "--kv_cache_type", "paged"]
    if role == "target":
        cmd += ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", str(k_max),
                "--use_paged_context_fmha", "enable", "--gather_generation_logits"]
    else:
        cmd += ["--gather_generation_logits"]
    return cmd


def write_build_script(out: Path, profile) -> Path:
    s = profile.shapes
    images = s.cameras * s.frames
    lines = ["#!/bin/sh", "# trtllm-build for these checkpoints (TensorRT-LLM " + TRTLLM_RELEASE + ");",
             "# run on the device: the engines are built where they run. Not run here.", "set -e",
             'cd "$(dirname "$0")"']
    for role in ("target", "draft"):
        cmd = build_command(role, f"engines/{role}", s, role, s.k_max, s.max_prompt if images else 0)
        lines.append(" ".join(shlex.quote(c) for c in cmd))
    path = out / "BUILD.sh"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


# --- the build step -------------------------------------------------------------------------------

def full_vocab_head(draft: Draft) -> torch.Tensor:
    """The (V, D) lm_head TensorRT-LLM's draft engine needs (it sees and returns full-vocabulary
    ids): the target's head for a full-head draft; for a reduced head, its rows placed at their
    target ids d2t and zero rows elsewhere (logit 0 there: the tensorrt-llm backend bans those
    ids from the draft's generation as bad words, so it proposes inside the head only)."""
    if not draft.cfg.vocab:
        return draft.lm_head.weight
    w = draft.vocab_head.weight
    return torch.zeros(draft.llm.vocab_size, w.shape[1], dtype=w.dtype).index_copy(0, draft.d2t, w.detach())


def standalone_draft(checkpoint: Path) -> Path:
    """The draft folder TensorRT-LLM can run as an external draft: features "none", rope "flat"."""
    _, drafts = io.scan_checkpoints(checkpoint)
    found = {}
    for label, folder in drafts.items():
        _, dcfg, _ = io.load(folder, kind="draft")
        found[label] = (dcfg.draft.features, dcfg.draft.rope)
        if found[label] == ("none", "flat"):
            return folder
    raise ConfigError(f"{checkpoint}: no standalone FlatRoPE draft (features 'none', rope 'flat') for "
                      f"TensorRT-LLM's draft_tokens_external; drafts found (features, rope): {found}. "
                      "A fused draft reads the target's hidden states, which an external draft engine "
                      "cannot receive")


def write_trtllm(profile, checkpoint: Path, out: Path, planner, progress=print) -> dict:
    """Calibrate (FP8 profiles), write both checkpoints and BUILD.sh into `out` -> manifest entry."""
    from calibration.quantize import modelopt_version
    from calibration.torch_quant import calibration_set, fp8_amax
    from prompt.tokenizer import load_tokenizer

    checkpoint = Path(checkpoint)
    tok = load_tokenizer(checkpoint)
    draft_dir = standalone_draft(checkpoint)
    cfg, target, expert, draft = io.load_models({**io.scan_checkpoints(checkpoint)[0], "draft": draft_dir}, tok)
    check_causal(cfg.target, f"TensorRT-LLM checkpoint of {checkpoint}")
    fp8 = {"target": profile.precision.step == "fp8", "draft": profile.precision.draft_chain == "fp8"}
    amax, calib = {"target": None, "draft": None}, None
    if any(fp8.values()):
        c = profile.calibration
        scenes, sha = calibration_set(c.prompts, c.seed)
        found = fp8_amax(cfg, target, expert, draft, tok, scenes, planner, progress=lambda *_: None)
        amax = {k: found[k] if fp8[k] else None for k in found}
        calib = {"split": "train", "scenes": c.prompts, "seed": c.seed, "method": "max", "sha256": sha,
                 "tool": f"nvidia-modelopt {modelopt_version()}"}
    dtype = profile.trtllm.dtype
    models = {"target": (target, cfg.target.llm, target.state_dict()),
              "draft": (draft, cfg.draft_llm(), {**draft.state_dict(), "embed_tokens.weight":
                        target.embed_tokens.weight, "lm_head.weight": full_vocab_head(draft)})}
    sources = {"target": io.scan_checkpoints(checkpoint)[0].get("target"), "draft": draft_dir}
    entry = {"status": "written (trtllm-build not run: TensorRT-LLM is not installed here)",
             "release": TRTLLM_RELEASE, "calibration": calib, "checkpoints": {}}
    for role, (_, llm, state) in models.items():
        config = trtllm_config(llm, role, dtype, profile.shapes.max_len, fp8[role])
        weights = to_trtllm({k: v.detach() for k, v in state.items()}, llm, dtype, amax[role])
        blockers = limits(cfg, role)
        reduced = role == "draft" and draft.cfg.vocab
        write_checkpoint(out / role, config, weights, role=role, source=str(sources[role]),
                         source_sha256={m: e.sha256 for m, e in io.read_meta(sources[role]).modules.items()},
                         calibration=calib if fp8[role] else None, cannot_build_at_release=blockers,
                         draft_vocab=(int(draft.cfg.vocab), d2t_sha256(draft.d2t.cpu().numpy())) if reduced else None)
        entry["checkpoints"][role] = {"dir": f"trtllm/{role}", "quant_algo": config["quantization"]["quant_algo"],
                                      "architecture": config["architecture"],
                                      "cannot_build_at_release": blockers}
    entry["build_script"] = f"trtllm/{write_build_script(out, profile).name}"
    progress(f"[2/3] trtllm: TensorRT-LLM checkpoints (target {entry['checkpoints']['target']['quant_algo'] or dtype}, "
             f"draft {entry['checkpoints']['draft']['quant_algo'] or dtype}) and BUILD.sh -> {out}")
    return entry

