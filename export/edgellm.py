"""`specdrive export edgellm`: a planner folder -> the folders TensorRT Edge-LLM's exporter reads.

    OUT/target/   the target as a Hugging Face Qwen-VL folder (models/hf.py save_hf) with
                  tokenizer.json and chat_template.jinja (the prompt layout, below)
    OUT/draft/    the EAGLE-3 draft as an EAGLE-3 checkpoint: config.json (LlamaForCausalLMEagle3,
                  draft_vocab_size, target_hidden_size, rope, the target layers it reads) +
                  model.safetensors (fc, midlayer.*, norm, lm_head, d2t as offsets, t2d)
    OUT/action/   the action expert in the Alpamayo-R1 release layout (models/alpamayo.py), the
                  layout Edge-LLM's Alpamayo action export reads, with the VLM's text_config and
                  vision_config inside config.json (Edge-LLM's default command reads them there)
    OUT/README.md the Edge-LLM commands for Orin; OUT/export.json what was exported from what

Checked against tensorrt-edgellm 0.11.0 (EDGELLM_VERSION; tests/test_edgellm.py runs its exporter):
- its EAGLE-3 base export concatenates HF hidden_states [2, N//2, N-3] (models/default/
  modeling_default.py), the outputs of our layers 1, N//2-1, N-4 (models.config
  eagle3_feature_layers); a draft fused on other layers is refused;
- its draft (models/eagle3/modeling_eagle3_draft.py) is `fc`, `layers.0` (checkpoint `midlayer.`),
  `norm`, `lm_head`, `d2t`; q/k norms only when the checkpoint has them (ours has none);
- d2t: EAGLE-3 checkpoints store offsets, target id = i + d2t[i] (Edge-LLM's vocab reduction reads
  both kinds; vLLM and SGLang read offsets); ours stores target ids, so it is written as offsets;
- chat templates: a qwen3_vl folder without one stops its exporter ("does not provide a chat
  template"); we write chat_template.jinja for specdrive's layout (prompt/layout.py);
- weights: its visual and action exports build fp16 layers (FP16Linear refuses fp32 input: "TypeError:
  FP16Linear expects float16 input, got torch.float32"), so every folder is written in --dtype,
  float16 by default (DTYPES);
- token ids: it copies image/video/vision_start/vision_end_token_id from the target's config.json
  into its own; ours are the tokenizer's (video_token_id -1: the vocabulary has no video token);
- draft layers: it reads `target_layer_ids` from the draft's config.json (models/eagle3 config),
  vLLM and SpecForge read `eagle_aux_hidden_state_layer_ids` (top level / `eagle_config`); all three
  are written, in HF hidden_states indexing (id j = output of our layer j-1);
- the expert: it derives `traj_token_start` (the first history token id, which its runtime adds to
  its own history bins) as traj_token_start_idx + traj_tokenizer_cfg.num_bins (upstream's layout:
  future bins first); specdrive's history bins come first, so the action config describes them so
  (action_tokens) and Edge-LLM derives our <hist_0>.

Refused with a ConfigError (exit 2): no draft, a draft of another architecture, fused layers
other than Edge-LLM's, an M-RoPE draft (Edge-LLM's draft rope is 1D), a target that is not a
Qwen-VL layout (no M-RoPE, or the Alpamayo tokenizer layout, whose template is upstream's).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from models import io
from models.alpamayo import save_alpamayo
from models.config import ModelConfig, eagle3_feature_layers
from models.draft import Draft
from models.hf import check_causal, hf_config, save_hf
from core.config import ConfigError, file_sha256
from core.graphs import SHAPES

EDGELLM_VERSION = "0.11.0"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
# Edge-LLM 0.11's Alpamayo action export (scripts/export.py _build_action_config) fixes these,
# whatever the checkpoint says
EDGELLM_ACTION_FIXED = {"rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20], "rms_norm_eps": 1e-6,
                        "action_dims": 2}

# specdrive's prompt layout (prompt/layout.py build_prompt) as a chat template: a user message of
# images ({"type": "image"}: one <|image_pad|>, the processor expands it to the image's tokens) and
# text (the history: <|traj_history_start|> + the 48 history tokens + <|traj_history_end|>), then
# the assistant's turn opened by <|cot_start|>. No spaces or newlines: the layout has none.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant<|cot_start|>{%- endif -%}")


@dataclass(frozen=True)
class EdgeLLMExport:
    out: Path
    draft: str                 # the draft's variant name
    feature_layers: tuple      # ours (the residual after layer i)
    hf_layers: tuple           # Edge-LLM's / HF's hidden_states indices of the same tensors
    unmapped: tuple            # what of the action expert Edge-LLM's layout does not carry


def pick_draft(drafts: dict, name: str | None, where) -> str:
    """The draft to export: `name`, or the folder's only EAGLE-3 draft."""
    if not drafts:
        raise ConfigError(f"{where} has no draft (no folder with meta.json kind 'draft'); train one with "
                          "`specdrive train distill --config configs/train/distill-eagle3.yaml`")
    if name is not None:
        if name not in drafts:
            raise ConfigError(f"--draft {name!r}: {where} has the drafts {sorted(drafts)}")
        return name
    eagle3 = [n for n, d in drafts.items() if io.read_meta(d).config.get("draft", {}).get("arch") == "eagle3"]
    if not eagle3:
        raise ConfigError(f"{where} has no EAGLE-3 draft (draft.arch 'eagle3') among {sorted(drafts)}: Edge-LLM runs "
                          "EAGLE-3 drafts only; train one with configs/train/distill-eagle3.yaml")
    if len(eagle3) > 1:
        raise ConfigError(f"{where} has {len(eagle3)} EAGLE-3 drafts {sorted(eagle3)}; name one with --draft")
    return eagle3[0]


def check_draft(cfg: ModelConfig, name: str) -> None:
    """An EAGLE-3 draft on Edge-LLM's layers with a 1D rope, or a ConfigError saying why not."""
    d, n = cfg.draft, cfg.target.llm.layers
    if d.arch != "eagle3":
        raise ConfigError(f"draft {name!r} has draft.arch={d.arch!r}: Edge-LLM runs EAGLE-3 drafts only "
                          "(EAGLE-3's midlayer, configs/train/distill-eagle3.yaml); its weights cannot be "
                          "mapped exactly")
    want = eagle3_feature_layers(n)
    if tuple(d.feature_layers) != want:
        raise ConfigError(f"draft {name!r} reads target layers {list(d.feature_layers)}; Edge-LLM's EAGLE-3 base "
                          f"feeds layers {list(want)} of {n} (HF hidden_states {hf_indices(want)}), so it would "
                          "read other features than it was trained on")
    if d.rope != "flat":
        raise ConfigError(f"draft {name!r} has draft.rope={d.rope!r}: Edge-LLM's EAGLE-3 draft takes 1D "
                          "rotary positions; export a FlatRoPE draft")


def check_target(cfg: ModelConfig, tok) -> None:
    llm = cfg.target.llm
    check_causal(cfg.target, "export edgellm")          # Edge-LLM builds its own causal mask
    if not llm.mrope_section:
        raise ConfigError("the target has no M-RoPE (llm.mrope_section empty): not a Qwen-VL layout, "
                          "which Edge-LLM's qwen3_vl / qwen2_5_vl export needs")
    if getattr(tok, "layout", "specdrive") != "specdrive":
        raise ConfigError(f"the tokenizer's layout is {tok.layout!r}: export edgellm writes the chat template "
                          "of specdrive's layout only; an Alpamayo-R1 folder uses upstream's template")


def hf_indices(layers) -> list[int]:
    """Our layer i (its output) is HF hidden_states[i + 1] (index 0: the embedding output)."""
    return [int(i) + 1 for i in layers]


def draft_tensors(draft: Draft, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The draft's weights under EAGLE-3's checkpoint names in `dtype`; d2t as offsets (int64),
    t2d a bool mask."""
    V, D = draft.llm.vocab_size, draft.llm.hidden
    out = {}
    for name, t in draft.state_dict().items():
        if name == "d2t":
            continue
        key = {"vocab_head.weight": "lm_head.weight"}.get(name, name.replace("layers.0.", "midlayer.", 1))
        out[key] = t.detach().to(dtype).contiguous().cpu()
    if draft.cfg.vocab:
        d2t = draft.d2t.detach().long().cpu()
    else:   # a full head: the target's rows, the identity map
        out["lm_head.weight"] = draft.lm_head.weight.detach().to(dtype).contiguous().cpu()
        d2t = torch.arange(V)
    out["d2t"] = d2t - torch.arange(len(d2t))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[d2t] = True
    out["t2d"] = t2d
    if tuple(out["fc.weight"].shape) != (D, 3 * D):
        raise ConfigError(f"draft fc.weight {tuple(out['fc.weight'].shape)}: EAGLE-3 fuses 3 target layers "
                          f"into ({D}, {3 * D})")
    return out


def read_draft_tensors(folder) -> dict[str, torch.Tensor]:
    """Read an exported draft folder back under our names (d2t as target ids): the inverse of
    draft_tensors, for the round-trip test."""
    t = load_file(str(Path(folder) / "model.safetensors"))
    out = {}
    for key, v in t.items():
        if key == "t2d":
            continue
        if key == "d2t":
            out["d2t"] = v + torch.arange(len(v))
            continue
        out[{"lm_head.weight": "vocab_head.weight"}.get(key, key.replace("midlayer.", "layers.0.", 1))] = v
    return out


def draft_config(cfg: ModelConfig, draft: Draft, tok, dtype: str = "float32") -> dict:
    llm, d = draft.llm, cfg.draft
    layers = hf_indices(d.feature_layers)
    return {
        "architectures": [DRAFT_ARCHITECTURE], "model_type": "llama",
        "hidden_size": llm.hidden, "intermediate_size": llm.intermediate,
        "num_attention_heads": llm.heads, "num_key_value_heads": llm.kv_heads, "head_dim": llm.head_dim,
        "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": llm.norm_eps,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "vocab_size": llm.vocab_size, "draft_vocab_size": d.vocab or llm.vocab_size,
        "target_hidden_size": cfg.target.llm.hidden,
        # FlatRoPE: 1D positions, the target's theta (models/draft.py rope)
        "rope_theta": llm.rope_theta, "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": llm.rope_theta},
        "max_position_embeddings": SHAPES.max_len,
        "pad_token_id": tok.pad, "eos_token_id": tok.cot_end, "torch_dtype": dtype,
        # the target layers the draft fuses, HF hidden_states indices: Edge-LLM reads target_layer_ids,
        # vLLM / SpecForge eagle_aux_hidden_state_layer_ids (top level, or in eagle_config)
        "target_layer_ids": layers, "eagle_aux_hidden_state_layer_ids": layers,
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": layers},
    }


def action_unmapped(cfg: ModelConfig, tok) -> tuple[str, ...]:
    """What of our action expert Edge-LLM 0.11's Alpamayo action export does not carry as it is."""
    e, llm, fixed = cfg.expert, cfg.target.llm, EDGELLM_ACTION_FIXED
    out = []
    if list(llm.mrope_section) != fixed["mrope_section"]:
        out.append(f"rotary sections: Edge-LLM fixes mrope_section {fixed['mrope_section']} (head_dim 128); "
                   f"ours is {list(llm.mrope_section)} (head_dim {llm.head_dim})")
    if llm.rope_theta != fixed["rope_theta"]:
        out.append(f"rope_theta: Edge-LLM fixes {fixed['rope_theta']:g}; ours is {llm.rope_theta:g}")
    if llm.norm_eps != fixed["rms_norm_eps"]:
        out.append(f"rms_norm_eps: Edge-LLM fixes {fixed['rms_norm_eps']:g}; ours is {llm.norm_eps:g}")
    if e.action_dim != fixed["action_dims"]:
        out.append(f"action_dim {e.action_dim}: Edge-LLM's in/out projections are for 2 (accel, curvature)")
    if not e.non_causal:
        out.append("causal action tokens (expert.non_causal false): Edge-LLM's expert is non-causal")
    out.append(f"history tokens: Edge-LLM's runtime tokenizes the history itself into num_traj_tokens 1000 bins "
               f"(Alpamayo's delta quantizer) from traj_token_start {tok.hist_ids.start}; specdrive's history has "
               f"{len(tok.hist_ids)} bins of its own quantizer (prompt/trajectory.py), so feed the prompt's "
               "history ids as they are, not Edge-LLM's past-trajectory input")
    out.append("the trajectory draws and how they combine (planner profile: trajectory_samples, "
               "trajectory_combine) and the fallback trajectory: Edge-LLM's action runner decodes one")
    out.append("the latency budget and the lookup branch (runtime/): Edge-LLM has no equivalent")
    return tuple(out)


def export_edgellm(checkpoint: Path, out: Path, draft: str | None = None, dtype: str = "float16",
                   progress=print) -> EdgeLLMExport:
    checkpoint, out = Path(checkpoint), Path(out)
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: allowed {sorted(DTYPES)} (Edge-LLM's visual and action layers take "
                          "float16, its default)")
    tok, mcfg, target, expert = io.load_planner(checkpoint)
    check_target(mcfg, tok)
    models, drafts = io.scan_checkpoints(checkpoint)
    name = pick_draft(drafts, draft, checkpoint)
    mcfg, dmodel, _ = io.load_draft(drafts[name], mcfg, target, tok, io.target_sha256(models))
    check_draft(mcfg, name)
    out.mkdir(parents=True, exist_ok=True)
    target, expert = target.to(DTYPES[dtype]), expert.to(DTYPES[dtype])

    tdir = out / "target"
    save_hf(target, tdir)
    set_token_ids(tdir / "config.json", tok)
    shutil.copy(checkpoint / "tokenizer.json", tdir / "tokenizer.json")
    (tdir / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")
    (tdir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": SHAPES.max_len,
         "pad_token": tok.token(tok.pad), "eos_token": tok.token(tok.cot_end)}, indent=2) + "\n")
    progress(f"target -> {tdir} (Hugging Face {json.loads((tdir / 'config.json').read_text())['model_type']}, {dtype})")

    ddir = out / "draft"
    ddir.mkdir(parents=True, exist_ok=True)
    save_file(draft_tensors(dmodel, DTYPES[dtype]), str(ddir / "model.safetensors"), metadata={"format": "pt"})
    (ddir / "config.json").write_text(json.dumps(draft_config(mcfg, dmodel, tok, dtype), indent=2) + "\n")
    progress(f"draft {name!r} -> {ddir} (EAGLE-3, draft_vocab_size {mcfg.draft.vocab or mcfg.target.llm.vocab_size})")

    adir = out / "action"
    save_alpamayo(adir, target, expert, mcfg, vlm_name_or_path="", tokens=action_tokens(tok))
    inline_vlm_config(adir / "config.json", mcfg, tok)
    unmapped = action_unmapped(mcfg, tok)
    progress(f"action expert -> {adir} (Alpamayo-R1 layout; {len(unmapped)} parts do not map, see README.md)")

    layers = tuple(mcfg.draft.feature_layers)
    record = {"format": "specdrive-edgellm", "edgellm_version": EDGELLM_VERSION, "draft": name, "dtype": dtype,
              "feature_layers": list(layers), "hf_hidden_states": hf_indices(layers),
              "d2t": "offsets (target id = i + d2t[i])", "traj_token_start": tok.hist_ids.start,
              "sources": {k: file_sha256(Path(p) / f"{k}.safetensors") for k, p in
                          {"target": models["target"], "expert": models["expert"], "draft": drafts[name]}.items()},
              "unmapped": list(unmapped)}
    (out / "export.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "README.md").write_text(readme(name, mcfg, layers, unmapped, dtype))
    return EdgeLLMExport(out, name, layers, tuple(hf_indices(layers)), unmapped)


def token_ids(tok) -> dict:
    """The multimodal token ids Edge-LLM copies from config.json into its runtime configs, from the
    tokenizer (hf_config writes -1 for the ones TargetConfig does not model)."""
    return {"image_token_id": tok.image_pad, "vision_start_token_id": tok.vision_start,
            "vision_end_token_id": tok.vision_end, "video_token_id": -1}   # no video token: matches no id


def set_token_ids(path: Path, tok) -> None:
    config = json.loads(path.read_text())
    config.update(token_ids(tok))
    path.write_text(json.dumps(config, indent=2) + "\n")


def action_tokens(tok) -> dict:
    """The trajectory-token settings of specdrive's tokenizer in the release config's keys.
    Upstream (and Edge-LLM, which derives traj_token_start = traj_token_start_idx +
    traj_tokenizer_cfg.num_bins) places the future bins first and the history bins after them;
    ours are history first (<hist_0> ..), then future x and y, so no future bins precede the history."""
    hist, fx, fy = tok.hist_ids, tok.fut_x_ids, tok.fut_y_ids
    return {"traj_vocab_size": fy.stop - hist.start,
            "tokens_per_history_traj": 48,
            "traj_tokenizer_cfg": {"_target_": "specdrive prompt.trajectory future bins (x then y, after the "
                                               "history bins)", "num_bins": 0,
                                   "future_x_bins": len(fx), "future_y_bins": len(fy)},
            "hist_traj_tokenizer_cfg": {"_target_": "specdrive prompt.trajectory history bins", "num_bins": len(hist)}}


def inline_vlm_config(path: Path, cfg: ModelConfig, tok) -> None:
    """The VLM's config inside the action folder's config.json: its text_config and vision_config
    (models.alpamayo.load_alpamayo reads them there) and the text fields at the top level too, which
    Edge-LLM's default command reads when vlm_name_or_path names no model (the release's flat config
    names Qwen/Qwen3-VL-8B-Instruct, whose sizes are not ours), the tokenizer's token ids and its
    first trajectory token (traj_token_start_idx, which release_config leaves to the tokenizer)."""
    config = json.loads(path.read_text())
    vlm = hf_config(cfg.target)
    text = vlm["text_config"]
    config.update({k: v for k, v in text.items() if k not in ("model_type", "vocab_size")})
    config.update(text_config=text, vision_config=vlm["vision_config"], **token_ids(tok),
                  traj_token_start_idx=tok.hist_ids.start)   # the first trajectory token (action_tokens)
    path.write_text(json.dumps(config, indent=2) + "\n")


def readme(name: str, cfg: ModelConfig, layers, unmapped, dtype: str = "float16") -> str:
    llm, fixed = cfg.target.llm, EDGELLM_ACTION_FIXED
    n = llm.layers
    lines = [
        "# specdrive planner for TensorRT Edge-LLM",
        "",
        f"Written by `specdrive export edgellm` for tensorrt-edgellm {EDGELLM_VERSION} (its exporter, run on",
        f"these folders, is tests/test_edgellm.py), weights in {dtype}. Folders:",
        "",
        "- `target/`: the target as a Hugging Face Qwen-VL checkpoint, its tokenizer and `chat_template.jinja`",
        "  (specdrive's prompt layout: a user turn of images, then the history tokens as text between",
        "  `<|traj_history_start|>` and `<|traj_history_end|>`; the assistant turn opens with `<|cot_start|>`).",
        f"- `draft/`: the routine reasoner {name!r} as an EAGLE-3 draft ({DRAFT_ARCHITECTURE}); it was trained on",
        f"  the target's layers {list(layers)} of {n}, Edge-LLM's base hidden states {hf_indices(layers)}",
        "  (HF indexing, 0 = embeddings; config.json `target_layer_ids`, `eagle_aux_hidden_state_layer_ids`).",
        "  `d2t` holds offsets (target id = i + d2t[i]).",
        "- `action/`: the target and the action expert in the Alpamayo-R1 release layout (`model_type:",
        "  alpamayo_r1`), the VLM's config inside config.json.",
        "",
        "## On the Orin (JetPack with TensorRT Edge-LLM installed)",
        "",
        "```bash",
        f"pip install 'tensorrt-edgellm[export,tools]=={EDGELLM_VERSION}'   # tools: what its vision export imports",
        "# ONNX (on any machine with the package; CPU is enough)",
        "tensorrt-edgellm-export target onnx/base --eagle-base     # onnx/base/llm, onnx/base/visual",
        "tensorrt-edgellm-export draft onnx/draft                  # onnx/draft/llm",
        "tensorrt-edgellm-export action onnx/action                # onnx/action/{llm,visual,action}",
        "# engines (on the Orin)",
        "llm_build --onnxDir onnx/base/llm --engineDir engines/base --specBase --maxDraftTreeSize 16",
        "llm_build --onnxDir onnx/draft/llm --engineDir engines/draft --specDraft --maxDraftTreeSize 16",
        "visual_build --onnxDir onnx/base/visual --engineDir engines/visual",
        "# inference with the EAGLE-3 draft",
        "llm_inference --engineDir engines/base --draftEngineDir engines/draft --specDecode \\",
        "    --multimodalEngineDir engines/visual --inputFile input.json --outputFile output.json",
        "```",
        "",
        "The three export commands are run by tests/test_edgellm.py and exit 0. The build and inference",
        "binary names and flags are those of Edge-LLM's C++ examples; check `--help` of your installed",
        "version. Nothing here has been run on an Orin.",
        "",
        "## What does not map",
        "",
        f"- **the expert's rotary sections.** Edge-LLM's action export writes `rope_scaling.mrope_section`",
        f"  {fixed['mrope_section']} and `rope_theta` {fixed['rope_theta']:g} into `onnx/action/action/config.json`",
        "  whatever the checkpoint says (scripts/export.py `_build_action_config`); ours is",
        f"  {list(llm.mrope_section)} (head_dim {llm.head_dim}, theta {llm.rope_theta:g}).",
        "  The export raises no error: it exits 0, and the action graph takes `rope_rotary_cos_sin` as an",
        "  input that Edge-LLM's C++ runtime builds from those sections, so the expert would read other",
        "  rotary angles than it was trained with. The runtime reads the sections from that config.json, so",
        "  editing them there to ours may be the way around; not run here (the C++ runtime is not in the",
        "  Python package).",
        *[f"- {u}" for u in unmapped if not u.startswith("rotary sections")],
        "- the draft reads its rotary positions as 1D row indices (FlatRoPE); Edge-LLM's runtime gives",
        "  the draft positions of its own, which for text after images may differ from the row index",
        "  (not checked: the C++ runtime is not in the Python package).",
        "",
    ]
    return "\n".join(lines)
