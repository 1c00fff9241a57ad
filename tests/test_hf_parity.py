"""Parity with transformers' own Qwen3-VL and Qwen2.5-VL (code we did not write).

Tiny random HF models are built offline with transformers' classes, their weights perturbed
(so norms are not all ones and biases not all zeros), saved with save_pretrained, and loaded
through models.hf.load_hf. Same prompt (two images of different shapes + text): same 3D
positions as get_rope_index, same logits (<= 1e-4 fp32), same 32-token greedy continuation
as HF generate; save_hf -> from_pretrained gives the same logits again.
"""
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_prompt import IMG, TOL, V, VE, VID, VS, hf_logits, our_logits, our_positions, two_image_prompt  # noqa: E402
from models.hf import load_hf, save_hf  # noqa: E402
from models.target import greedy_generate  # noqa: E402
from prompt.pixels import images_to_patches  # noqa: E402

STYLES = ["qwen3", "qwen2.5", "qwen3-tied"]


def hf_config(style: str):
    text = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64)
    ids = dict(image_token_id=IMG, video_token_id=VID, vision_start_token_id=VS,
               vision_end_token_id=VE)
    if style == "qwen2.5":  # sectioned M-RoPE, qkv bias, window attention (2x2 merged units)
        text["rope_parameters"] = dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 3, 3])
        vision.update(window_size=32, fullatt_block_indexes=[1])
        return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    text.update(head_dim=16, rope_parameters=dict(rope_type="default", rope_theta=5e6,
                                                  mrope_section=[4, 2, 2], mrope_interleaved=True))
    vision.update(num_position_embeddings=36, deepstack_visual_indexes=[0, 1])
    return transformers.Qwen3VLConfig(text_config=text, vision_config=vision,
                                      tie_word_embeddings=style.endswith("tied"), **ids)


def hf_class(style: str):
    return (transformers.Qwen2_5_VLForConditionalGeneration if style == "qwen2.5"
            else transformers.Qwen3VLForConditionalGeneration)


@pytest.fixture(scope="module")
def prompt():
    return two_image_prompt()


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """style -> (HF model, its save_pretrained dir, our Target loaded from it), built once."""
    built = {}

    def get(style):
        if style not in built:
            torch.manual_seed(0)
            hf = hf_class(style)(hf_config(style)).eval()
            with torch.no_grad():
                for p in hf.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            path = tmp_path_factory.mktemp(style)
            hf.save_pretrained(path)
            built[style] = (hf, path, load_hf(path)[0].eval())
        return built[style]
    return get


@pytest.fixture(params=STYLES)
def pair(request, build):
    """(style, HF model, our Target loaded through load_hf, the checkpoint dir)."""
    hf, path, ours = build(request.param)
    return request.param, hf, ours, path


def test_positions_match_get_rope_index(pair, prompt):
    _, hf, _, _ = pair
    hpos, hdelta = hf.model.get_rope_index(prompt["ids"], (prompt["ids"] == IMG).int(),
                                           prompt["grid"])
    pos, delta = our_positions(prompt)
    assert np.array_equal(hpos[:, 0].numpy(), pos), f"ours {pos}\nHF {hpos[:, 0].numpy()}"
    assert delta == int(hdelta) and delta < 0


def test_logits_match(pair, prompt):
    _, hf, ours, _ = pair
    pos, _ = our_positions(prompt)
    diff = (hf_logits(hf, prompt) - our_logits(ours, prompt, pos)).abs().max().item()
    print(f"max |logit diff| = {diff:.3g}")
    assert diff <= TOL, f"max |logit diff| = {diff:.3g} > {TOL}"
    # the comparison is sensitive: plain 1D positions instead of M-RoPE must show up
    flat = np.arange(pos.shape[1])[None].repeat(3, 0)
    off = (hf_logits(hf, prompt) - our_logits(ours, prompt, flat)).abs().max().item()
    assert off > 100 * TOL, f"1D positions changed logits by only {off:.3g}"


def test_greedy_32_tokens_match(pair, prompt):
    _, hf, ours, _ = pair
    T = prompt["ids"].shape[1]
    with torch.no_grad():
        ref = hf.generate(input_ids=prompt["ids"], pixel_values=prompt["pixels"],
                          image_grid_thw=prompt["grid"], mm_token_type_ids=(prompt["ids"] == IMG).int(),
                          max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, T:]
        embeds, deepstack = ours.encode_images(prompt["pixels"], prompt["grid"])
    pos, delta = our_positions(prompt)
    got = greedy_generate(ours, prompt["ids"], torch.as_tensor(pos)[:, None], delta, 32,
                          embeds, deepstack)
    assert got.tolist() == ref.tolist(), f"ours {got.tolist()}\nHF   {ref.tolist()}"


def test_save_hf_loads_in_transformers(pair, prompt, tmp_path):
    style, hf, ours, _ = pair
    save_hf(ours, tmp_path)
    back, info = hf_class(style).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    pos, _ = our_positions(prompt)
    diff = (hf_logits(back.eval(), prompt) - our_logits(ours, prompt, pos)).abs().max().item()
    assert diff <= TOL, f"max |logit diff| after save_hf = {diff:.3g} > {TOL}"


def _rewrite(src, dst, edit):
    from safetensors.torch import load_file, save_file
    tensors = edit(load_file(str(src / "model.safetensors")))
    dst.mkdir(exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_load_errors_name_the_tensor(build, tmp_path):
    _, path, _ = build("qwen3")
    key = "model.language_model.layers.1.self_attn.k_proj.weight"
    drop = _rewrite(path, tmp_path / "drop", lambda t: {k: v for k, v in t.items() if k != key})
    with pytest.raises(ValueError, match=rf"missing.*{key} \(expected shape \(32, 64\)\)"):
        load_hf(drop)
    extra = _rewrite(path, tmp_path / "extra", lambda t: {**t, "model.extra.weight": torch.ones(2)})
    with pytest.raises(ValueError, match="unexpected.*model.extra.weight"):
        load_hf(extra)
    bad = _rewrite(path, tmp_path / "bad", lambda t: {**t, key: torch.ones(8, 64)})
    with pytest.raises(ValueError, match=rf"mis-shaped.*{key}: file \(8, 64\), expected \(32, 64\)"):
        load_hf(bad)


def test_legacy_layout_loads(build, prompt, tmp_path):
    """Hub Qwen2.5-VL files use `visual.*` and `model.layers.*`; they load to the same model."""
    hf, path, _ = build("qwen2.5")
    legacy = _rewrite(path, tmp_path / "legacy", lambda t: {
        k.replace("model.visual.", "visual.").replace("model.language_model.", "model."): v
        for k, v in t.items()})
    config = json.loads((legacy / "config.json").read_text())
    text = config.pop("text_config")
    (legacy / "config.json").write_text(json.dumps({**config, **text, "model_type": "qwen2_5_vl"}))
    ours, _ = load_hf(legacy)
    pos, _ = our_positions(prompt)
    diff = (hf_logits(hf, prompt) - our_logits(ours.eval(), prompt, pos)).abs().max().item()
    assert diff <= TOL, f"max |logit diff| from the legacy layout = {diff:.3g}"


def test_pixels_match_hf_image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    images = np.random.default_rng(1).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)
    proc = Qwen2VLImageProcessorPil(do_resize=False, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                    patch_size=8, temporal_patch_size=2, merge_size=2)
    ref = proc([im for im in images], return_tensors="np")
    patches, grid = images_to_patches(images, patch=8, temporal_patch=2, merge=2)
    assert np.array_equal(grid, ref["image_grid_thw"])
    diff = np.abs(patches - ref["pixel_values"]).max()
    assert patches.shape == ref["pixel_values"].shape and diff < 1e-6, f"max diff {diff}"


def test_the_frame_local_layout_is_expressible_in_transformers_as_a_4d_mask(build, prompt):
    """transformers' Qwen3-VL takes a prepared 4D mask as it is (with position_ids given: its rope
    index reads only a 2D mask), so HF with models.layers.frame_local_mask as an additive mask
    gives our frame_local target's logits; without it (HF's own causal mask) the logits differ."""
    import dataclasses

    from models.layers import frame_local_mask

    hf, _, ours = build("qwen3")
    local = type(ours)(dataclasses.replace(ours.cfg, llm=dataclasses.replace(ours.cfg.llm, image_attention="frame_local")))
    local.load_state_dict(ours.state_dict())
    local.eval()
    pos, _ = our_positions(prompt)
    ids = prompt["ids"]
    T = ids.shape[1]
    rows = torch.arange(T)
    allowed = frame_local_mask(ids, IMG, rows, rows[None, :] <= rows[:, None])
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        theirs = hf(input_ids=ids, pixel_values=prompt["pixels"], image_grid_thw=prompt["grid"],
                    mm_token_type_ids=(ids == IMG).int(), attention_mask=additive,
                    position_ids=torch.as_tensor(pos)[:, None]).logits
    mine = our_logits(local, prompt, pos)
    diff = (theirs - mine).abs().max().item()
    assert diff <= TOL, f"max |logit diff| = {diff:.3g} > {TOL}"
    assert (hf_logits(hf, prompt) - mine).abs().max().item() > 100 * TOL, "the layout changed nothing"
