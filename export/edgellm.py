"""`specdrive export edgellm`: a planner folder -> the folders TensorRT Edge-LLM's exporter reads.

    OUT/target/   the target as a Hugging Face Qwen-VL folder (models/hf.py save_hf) with
                  tokenizer.json and chat_template.jinja (the prompt layout, below)
    OUT/draft/    the EAGLE-3 draft as an EAGLE-3 checkpoint: config.json (LlamaForCausalLMEagle3,
                  draft_vocab_size, target_hidden_size, rope) + model.safetensors (fc, midlayer.*,
                  norm, lm_head, d2t as offsets, t2d)
    OUT/action/   the action expert in the Alpamayo-R1 release layout (models/alpamayo.py), the
                  layout Edge-LLM's Alpamayo action export reads, and what does not map (README)
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
  template"); we write chat_template.jinja for specdrive's layout (prompt/layout.py).

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
from models.hf import check_causal, save_hf
from prompt.config import ConfigError, file_sha256
from prompt.graphs import SHAPES

EDGELLM_VERSION = "0.11.0"
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


def draft_tensors(draft: Draft) -> dict[str, torch.Tensor]:
    """The draft's weights under EAGLE-3's checkpoint names; d2t as offsets, t2d a bool mask."""
    V, D = draft.llm.vocab_size, draft.llm.hidden
    out = {}
    for name, t in draft.state_dict().items():
        if name == "d2t":
            continue
        key = {"vocab_head.weight": "lm_head.weight"}.get(name, name.replace("layers.0.", "midlayer.", 1))
        out[key] = t.detach().float().contiguous().cpu()
    if draft.cfg.vocab:
        d2t = draft.d2t.detach().long().cpu()
    else:   # a full head: the target's rows, the identity map
        out["lm_head.weight"] = draft.lm_head.weight.detach().float().contiguous().cpu()
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


def draft_config(cfg: ModelConfig, draft: Draft, tok) -> dict:
    llm, d = draft.llm, cfg.draft
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
        "pad_token_id": tok.pad, "eos_token_id": tok.cot_end, "torch_dtype": "float32",
    }


def action_unmapped(cfg: ModelConfig) -> tuple[str, ...]:
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
    out.append("the trajectory draws and how they combine (planner profile: trajectory_samples, "
               "trajectory_combine) and the fallback trajectory: Edge-LLM's action runner decodes one")
    out.append("the latency budget and the lookup branch (runtime/): Edge-LLM has no equivalent")
    return tuple(out)


def export_edgellm(checkpoint: Path, out: Path, draft: str | None = None, progress=print) -> EdgeLLMExport:
    checkpoint, out = Path(checkpoint), Path(out)
    tok, mcfg, target, expert = io.load_planner(checkpoint)
    check_target(mcfg, tok)
    models, drafts = io.scan_checkpoints(checkpoint)
    name = pick_draft(drafts, draft, checkpoint)
    mcfg, dmodel, _ = io.load_draft(drafts[name], mcfg, target, tok, io.target_sha256(models))
    check_draft(mcfg, name)
    out.mkdir(parents=True, exist_ok=True)

    tdir = out / "target"
    save_hf(target, tdir)
    shutil.copy(checkpoint / "tokenizer.json", tdir / "tokenizer.json")
    (tdir / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")
    (tdir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": SHAPES.max_len,
         "pad_token": tok.token(tok.pad), "eos_token": tok.token(tok.cot_end)}, indent=2) + "\n")
    progress(f"target -> {tdir} (Hugging Face {json.loads((tdir / 'config.json').read_text())['model_type']})")

    ddir = out / "draft"
    ddir.mkdir(parents=True, exist_ok=True)
    save_file(draft_tensors(dmodel), str(ddir / "model.safetensors"), metadata={"format": "pt"})
    (ddir / "config.json").write_text(json.dumps(draft_config(mcfg, dmodel, tok), indent=2) + "\n")
    progress(f"draft {name!r} -> {ddir} (EAGLE-3, draft_vocab_size {mcfg.draft.vocab or mcfg.target.llm.vocab_size})")

    adir = out / "action"
    save_alpamayo(adir, target, expert, mcfg)
    unmapped = action_unmapped(mcfg)
    progress(f"action expert -> {adir} (Alpamayo-R1 layout; {len(unmapped)} parts do not map, see README.md)")

    layers = tuple(mcfg.draft.feature_layers)
    record = {"format": "specdrive-edgellm", "edgellm_version": EDGELLM_VERSION, "draft": name,
              "feature_layers": list(layers), "hf_hidden_states": hf_indices(layers),
              "d2t": "offsets (target id = i + d2t[i])",
              "sources": {k: file_sha256(Path(p) / f"{k}.safetensors") for k, p in
                          {"target": models["target"], "expert": models["expert"], "draft": drafts[name]}.items()},
              "unmapped": list(unmapped)}
    (out / "export.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "README.md").write_text(readme(name, mcfg, layers, unmapped))
    return EdgeLLMExport(out, name, layers, tuple(hf_indices(layers)), unmapped)


def readme(name: str, cfg: ModelConfig, layers, unmapped) -> str:
    n = cfg.target.llm.layers
    lines = [
        "# specdrive planner for TensorRT Edge-LLM",
        "",
        f"Written by `specdrive export edgellm` for tensorrt-edgellm {EDGELLM_VERSION} (its exporter, run on",
        "these folders, is tests/test_edgellm.py). Folders:",
        "",
        "- `target/`: the target as a Hugging Face Qwen-VL checkpoint, its tokenizer and `chat_template.jinja`",
        "  (specdrive's prompt layout: a user turn of images, then the history tokens as text between",
        "  `<|traj_history_start|>` and `<|traj_history_end|>`; the assistant turn opens with `<|cot_start|>`).",
        f"- `draft/`: the routine reasoner {name!r} as an EAGLE-3 draft ({DRAFT_ARCHITECTURE}); it was trained on",
        f"  the target's layers {list(layers)} of {n}, Edge-LLM's base hidden states {hf_indices(layers)}",
        "  (HF indexing, 0 = embeddings). `d2t` holds offsets (target id = i + d2t[i]).",
        "- `action/`: the action expert in the Alpamayo-R1 release layout (`model_type: alpamayo_r1`).",
        "",
        "## On the Orin (JetPack with TensorRT Edge-LLM installed)",
        "",
        "```bash",
        "pip install 'tensorrt-edgellm[export]==" + EDGELLM_VERSION + "'",
        "# ONNX (on any machine with the package; CPU is enough)",
        "tensorrt-edgellm-export target onnx/base --eagle-base",
        "tensorrt-edgellm-export draft onnx/draft",
        "# engines (on the Orin)",
        "llm_build --onnxDir onnx/base/llm --engineDir engines/base --specBase --maxDraftTreeSize 16",
        "llm_build --onnxDir onnx/draft/llm --engineDir engines/draft --specDraft --maxDraftTreeSize 16",
        "visual_build --onnxDir onnx/base/visual --engineDir engines/visual",
        "# inference with the EAGLE-3 draft",
        "llm_inference --engineDir engines/base --draftEngineDir engines/draft --specDecode \\",
        "    --multimodalEngineDir engines/visual --inputFile input.json --outputFile output.json",
        "```",
        "",
        "The build and inference binary names and flags are those of Edge-LLM's C++ examples; check",
        "`--help` of your installed version. Nothing here has been run on an Orin.",
        "",
        "## What does not map",
        "",
        *[f"- {u}" for u in unmapped],
        "- the draft reads its rotary positions as 1D row indices (FlatRoPE); Edge-LLM's runtime gives",
        "  the draft positions of its own, which for text after images may differ from the row index",
        "  (not checked: the C++ runtime is not in the Python package).",
        "",
    ]
    return "\n".join(lines)
