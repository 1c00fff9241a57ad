"""Target VLA: cache semantics (incremental = full, verify k = k steps, rollback), rope in torch
vs the numpy reference, hidden states, vision shapes, configs and presets, clear errors."""
import dataclasses

import numpy as np
import pytest
import torch

from models.config import (ConfigError, LLMConfig, ModelConfig, VisionConfig,
                           load_preset)
from models.layers import cache_rows
from models.rope import rope_cos_sin
from models.target import Target
from core.config import from_dict
from prompt.pixels import images_to_patches
from prompt.positions import mrope_decode_position_ids, mrope_position_ids, rope_tables

from tiny_targets import IMG, V, VE, VS, tiny_cfg
TOL = 1e-5


@pytest.fixture(scope="module", params=["qwen3", "qwen2.5"])
def setup(request):
    """A random target, one image prompt, its positions, and a fixed 12-token continuation."""
    torch.manual_seed(0)
    target = Target(tiny_cfg(request.param)).eval()
    rng = np.random.default_rng(0)
    pixels, grid = images_to_patches(rng.integers(0, 256, (1, 16, 24, 3), dtype=np.uint8), 4, 2, 2)
    ids = rng.integers(0, 50, 3).tolist() + [VS] + [IMG] * 6 + [VE] + rng.integers(0, 50, 4).tolist()
    pos, delta = mrope_position_ids(np.array(ids), grid, 2, IMG, VS)
    cont = rng.integers(0, 50, 12)
    with torch.no_grad():
        embeds, deepstack = target.encode_images(torch.tensor(pixels), grid)
    full_pos = np.concatenate([pos, mrope_decode_position_ids(len(ids), len(cont), delta)], 1)
    return dict(target=target, prompt=torch.tensor([ids]), cont=torch.as_tensor(cont)[None],
                pos=full_pos, img=(embeds, deepstack))


def run(s, ids, start, cache, with_images=False):
    """Forward ids (1, T) written at cache rows [start, start+T) with the right positions."""
    t = s["target"]
    cos, sin = t.rope(torch.as_tensor(s["pos"][:, None, start:start + ids.shape[1]]))
    embeds, deepstack = s["img"] if with_images else (None, None)
    with torch.no_grad():
        return t(ids, cos, sin, cache, start, embeds, deepstack)[0]


def test_incremental_decoding_equals_full_forward(setup):
    s, T = setup, setup["prompt"].shape[1]
    full = run(s, torch.cat([s["prompt"], s["cont"]], 1), 0, None, with_images=True)
    cache = s["target"].new_cache(1, 32)
    steps = [run(s, s["prompt"], 0, cache, with_images=True)]
    for i in range(s["cont"].shape[1]):
        steps.append(run(s, s["cont"][:, i:i + 1], T + i, cache))
    diff = (full - torch.cat(steps, 1)).abs().max().item()
    assert diff <= TOL, f"max |full - incremental| = {diff:.3g}"


def test_verify_k_equals_k_steps_and_rollback(setup):
    s, T = setup, setup["prompt"].shape[1]
    cache = s["target"].new_cache(1, 32)
    run(s, s["prompt"], 0, cache, with_images=True)
    k = 5
    block = run(s, s["cont"][:, :k], T, cache)                       # verify k in one call
    singles = s["target"].new_cache(1, 32)
    run(s, s["prompt"], 0, singles, with_images=True)
    steps = torch.cat([run(s, s["cont"][:, i:i + 1], T + i, singles) for i in range(k)], 1)
    diff = (block - steps).abs().max().item()
    assert diff <= TOL, f"max |verify k - k steps| = {diff:.3g}"
    # rollback: accept 2 of the k, write k rejected tokens over rows T+2.., then re-decode
    run(s, torch.full((1, k), 7), T + 2, cache)
    again = run(s, s["cont"][:, 2:2 + k], T + 2, cache)
    diff = (again - run(s, s["cont"][:, 2:2 + k], T + 2, singles)).abs().max().item()
    assert diff <= TOL, f"max |after rollback - clean| = {diff:.3g}"
    stale = (run(s, s["cont"][:, 2:3], T + 2, cache) - steps[:, 2:3]).abs().max().item()
    assert stale <= TOL, f"a stale row was read: {stale:.3g}"


def test_batch_rows_are_independent(setup):
    s = setup
    ids = torch.cat([s["prompt"], s["cont"]], 1)
    t = s["target"]
    pos = torch.as_tensor(s["pos"][:, None]).expand(3, 2, -1)
    other = torch.randint(0, 50, ids.shape)
    with torch.no_grad():
        both = t(torch.cat([ids, other]), *t.rope(pos))[0]
        one = t(ids, *t.rope(pos[:, :1]))[0]
    assert (both[:1] - one).abs().max().item() <= TOL


def test_hidden_layers_are_the_residual_stream(setup):
    t, ids = setup["target"], setup["prompt"]
    with torch.no_grad():
        logits, (h0, h1) = t(ids, *t.rope(torch.as_tensor(setup["pos"][:, None, :ids.shape[1]])),
                             hidden_layers=(0, 1))
        assert torch.allclose(t.lm_head(t.norm(h1)), logits)
        assert h0.shape == (1, ids.shape[1], 64) and not torch.allclose(h0, h1)
        with pytest.raises(ValueError, match=r"hidden_layers \[5\] out of range"):
            t(ids, *t.rope(torch.zeros(3, 1, ids.shape[1], dtype=torch.long)), hidden_layers=(5,))


def test_image_errors_are_clear(setup):
    t, ids = setup["target"], setup["prompt"]
    embeds, _ = setup["img"]
    cos, sin = t.rope(torch.zeros(3, 1, ids.shape[1], dtype=torch.long))
    with pytest.raises(ValueError, match="6 image tokens .* but 5 image embeddings"):
        t(ids, cos, sin, image_embeds=embeds[:5])
    unset = Target(dataclasses.replace(t.cfg, image_token_id=-1))
    with pytest.raises(ValueError, match="image_token_id is not set"):
        unset(ids, cos, sin, image_embeds=embeds)
    with pytest.raises(ValueError, match="KV cache overflow: start=30 \\+ T=15 > max_len=32"):
        t(ids, cos, sin, t.new_cache(1, 32), 30)


def test_vision_shapes(setup):
    t = setup["target"]
    embeds, deepstack = setup["img"]
    assert embeds.shape == (6, 64) and len(deepstack) == len(t.cfg.vision.deepstack_layers)
    with pytest.raises(ValueError, match="pixel_patches shape"):
        t.encode_images(torch.zeros(10, t.cfg.vision.patch_dim), [[1, 4, 6]])


@pytest.mark.parametrize("section,interleaved", [((), False), ((6, 5, 5), True), ((4, 6, 6), False)])
def test_torch_rope_matches_numpy_tables(section, interleaved):
    pos = np.random.default_rng(0).integers(0, 5000, (3, 2, 9))
    ids = pos if section else pos[0]
    cos, sin = rope_cos_sin(torch.as_tensor(ids), 32, 5e6, section, interleaved)
    ref_cos, ref_sin = rope_tables(ids, 32, 5e6, section or None, interleaved)
    assert np.abs(cos.numpy() - ref_cos).max() < 1e-5 and np.abs(sin.numpy() - ref_sin).max() < 1e-5


def test_cache_rows_and_mask():
    rows, m = cache_rows(3, 2, 6)
    assert rows.tolist() == [3, 4]
    assert m.tolist() == [[True] * 4 + [False] * 2, [True] * 5 + [False]]
    rows_t, m_t = cache_rows(torch.tensor([3]), 2, 6)        # a device start: same rows, same mask
    assert torch.equal(rows_t, rows) and torch.equal(m_t, m)


def test_presets_load_and_tiny_builds():
    tiny = load_preset("tiny")
    assert tiny.target.llm.layers == 12 and tiny.target.llm.hidden == 128
    for name in ("alpamayo-r1-10b", "edge-2b"):
        big = load_preset(name)
        assert big.expert.head_dim == big.target.llm.head_dim == 128
    target = Target(tiny.target)
    n = sum(p.numel() for p in target.parameters())
    assert 1e6 < n < 5e6, f"tiny target has {n} parameters"
    with pytest.raises(ConfigError, match="known presets: .*tiny"):
        load_preset("nope")


def test_config_errors_name_the_value():
    with pytest.raises(ConfigError, match=r"mrope_section=\[4, 4, 4\] must be 3 ints summing to"):
        LLMConfig(head_dim=16, mrope_section=(4, 4, 4))
    with pytest.raises(ConfigError, match="heads=4 must be a multiple of kv_heads=3"):
        LLMConfig(kv_heads=3)
    with pytest.raises(ConfigError, match="vision.style='clip'"):
        VisionConfig(style="clip")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['depht'\]"):
        from_dict(VisionConfig, {"depht": 2})
    with pytest.raises(ConfigError, match="must equal the target head_dim=32"):
        from_dict(ModelConfig, {"expert": {"hidden": 48, "heads": 2}})
    with pytest.raises(ConfigError, match=r"draft.feature_layers=\[1, 12\]"):
        from_dict(ModelConfig, {"draft": {"feature_layers": [1, 12]}})
