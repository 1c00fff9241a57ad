"""The HF-loader defects an independent check against transformers found (issue 12), fixed:
load_hf reads the weight files transformers reads (model.safetensors, or the shards of
model.safetensors.index.json), not every *.safetensors; a Qwen2.5 target without windows
(window_size 0) exports a config transformers can run; a config without mrope_section and an
image grid not divisible by the merge size are refused with a message, not a KeyError / reshape."""
import json

import pytest
import torch
from safetensors.torch import save_file

transformers = pytest.importorskip("transformers")

from models.config import LLMConfig, TargetConfig, VisionConfig  # noqa: E402
from models.hf import config_from_hf, hf_config, load_hf, save_hf  # noqa: E402
from models.target import Target  # noqa: E402
from hf_prompt import IMG, TOL, VS, hf_logits, our_logits, our_positions, two_image_prompt  # noqa: E402


def qwen25_target(window_size: int) -> Target:
    vision = VisionConfig(style="qwen2.5", depth=2, hidden=32, heads=2, intermediate=64, patch=8,
                          deepstack_layers=(), window_size=window_size,
                          fullatt_blocks=(1,) if window_size else ())
    llm = LLMConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab_size=300,
                    mrope_section=(2, 3, 3), interleaved=False, qk_norm=False, qkv_bias=True)
    torch.manual_seed(0)
    target = Target(TargetConfig(vision=vision, llm=llm, image_token_id=IMG, vision_start_id=VS)).eval()
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return target


def test_window_size_0_exports_a_config_transformers_runs(tmp_path):
    prompt, ours = two_image_prompt(), qwen25_target(0)
    save_hf(ours, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())["vision_config"]
    assert written["window_size"] > 0 and written["fullatt_block_indexes"] == [0, 1]
    back = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path).eval()
    diff = (hf_logits(back, prompt) - our_logits(ours, prompt, our_positions(prompt)[0])).abs().max().item()
    print(f"window_size 0 -> transformers: max |logit diff| {diff:.3g}")
    assert diff <= TOL
    back_vision = load_hf(tmp_path)[1].target.vision                 # read back as no windows
    assert (back_vision.window_size, back_vision.fullatt_blocks) == (0, ())


def test_only_the_weight_files_transformers_reads_are_read(tmp_path):
    ours = qwen25_target(16)
    save_hf(ours, tmp_path)
    save_file({"lora.weight": torch.zeros(2)}, str(tmp_path / "adapter.safetensors"))
    assert torch.equal(load_hf(tmp_path)[0].lm_head.weight, ours.lm_head.weight)
    (tmp_path / "model.safetensors").rename(tmp_path / "weights.safetensors")
    with pytest.raises(FileNotFoundError, match=r"no model.safetensors and no model.safetensors.index.json"):
        load_hf(tmp_path)


def test_missing_mrope_section_and_odd_grid_are_named():
    cfg = hf_config(qwen25_target(16).cfg)
    del cfg["text_config"]["rope_parameters"]["mrope_section"]
    with pytest.raises(ValueError, match="has no mrope_section"):
        config_from_hf(cfg)
    target = qwen25_target(16)
    v = target.cfg.vision
    grid = torch.tensor([[1, 4, 3]])      # 3 patches wide: not divisible by merge 2
    with pytest.raises(ValueError, match=r"image 0: patch grid \(1, 4, 3\).*not divisible by the spatial merge 2"):
        target.encode_images(torch.zeros(12, v.patch_dim), grid)
