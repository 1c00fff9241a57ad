"""Shape-only parameter counts and cache bytes equal those of allocated models, for the tiny
preset and for variants that exercise every branch (Qwen2.5 vision, tied head, qkv bias,
standalone 2-layer draft, wider expert); the shape-only presets land on the published sizes."""
import dataclasses

import pytest
import torch

from models.action_expert import ActionExpert
from models.config import ExpertConfig, LLMConfig, ModelConfig, TargetConfig, VisionConfig, load_preset
from models.draft import Draft
from models.sizes import draft_steps, kv_cache_bytes, param_counts, step_cost_ratio
from models.target import Target
from core.config import ConfigError


def qwen25_variant() -> ModelConfig:
    vision = VisionConfig(style="qwen2.5", depth=2, hidden=32, heads=2, intermediate=48,
                          deepstack_layers=(), window_size=32, fullatt_blocks=(1,))
    llm = LLMConfig(layers=3, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                    vocab_size=300, mrope_section=(2, 3, 3), interleaved=False, qk_norm=False,
                    qkv_bias=True, tie_embeddings=True)
    cfg = load_preset("tiny")
    return ModelConfig(target=TargetConfig(vision=vision, llm=llm),
                       draft=dataclasses.replace(cfg.draft, layers=2, features="none", feature_layers=()),
                       expert=ExpertConfig(hidden=64, heads=4, intermediate=96))


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())   # a tied head is counted once


@pytest.mark.parametrize("make", [lambda: load_preset("tiny"), qwen25_variant], ids=["tiny", "qwen2.5-tied"])
def test_counts_equal_allocated_models(make):
    cfg = make()
    torch.manual_seed(0)
    target = Target(cfg.target)
    draft = Draft(cfg, target.embed_tokens, target.lm_head)
    expert = ActionExpert(cfg.expert, cfg.target.llm)
    counts = param_counts(cfg)
    got = {"vision": n_params(target.visual), "target": n_params(target), "draft": n_params(draft),
           "expert": n_params(expert)}
    assert {k: counts[k] for k in got} == got
    assert counts["llm"] == got["target"] - got["vision"]
    assert counts["total"] == got["target"] + got["draft"] + got["expert"]


def test_cache_bytes_equal_allocated_buffers():
    tiny = load_preset("tiny")
    cfg = dataclasses.replace(tiny, draft=dataclasses.replace(tiny.draft, layers=2))
    target = Target(cfg.target)
    draft = Draft(cfg, target.embed_tokens, target.lm_head)
    got = kv_cache_bytes(cfg, batch=3, max_len=50, bytes_per_value=2)
    for name, module in (("target", target), ("draft", draft)):
        cache = module.new_cache(3, 50, dtype=torch.float16)
        assert got[name] == cache.numel() * cache.element_size(), name


def test_shape_only_presets_match_published_sizes():
    """Alpamayo-R1-10B: Qwen3-VL-8B backbone (~8.8B) + ~2.3B expert; edge: Qwen3-VL-2B-like."""
    big = param_counts(load_preset("alpamayo-r1-10b"))
    assert 8.6e9 < big["target"] < 9.0e9 and 2.2e9 < big["expert"] < 2.4e9, big
    assert 5.5e8 < big["vision"] < 6.0e8, big
    edge = param_counts(load_preset("edge-2b"))
    assert 1.9e9 < edge["target"] < 2.3e9, edge
    kv = kv_cache_bytes(load_preset("alpamayo-r1-10b"), batch=1, max_len=1)
    assert kv["target"] == 36 * 2 * 8 * 128 * 2   # 147,456 bytes per cached token in fp16


def test_step_cost_ratio_runs():
    out = step_cost_ratio(load_preset("tiny"), cached=64, runs=20, warmup=5)
    assert out["target_s"] > 0 and out["draft_s"] > 0
    assert out["c"] < 0.6, f"1-layer draft step should cost well under a 12-layer target step: {out}"


def test_a_reduced_draft_head_is_counted_and_timed_per_vocabulary():
    cfg = load_preset("tiny")
    small = dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, vocab=64))
    target = Target(small.target)
    draft = Draft(small, target.embed_tokens, target.lm_head)
    assert param_counts(small)["draft"] == sum(p.numel() for p in draft.parameters())
    assert param_counts(small)["draft"] - param_counts(cfg)["draft"] == 64 * cfg.target.llm.hidden
    out = step_cost_ratio(cfg, cached=32, runs=5, warmup=1, draft_vocabs=(0, 64), target_layers=3)
    assert [r["draft_vocab"] for r in out["by_vocab"]] == [cfg.target.llm.vocab_size, 64]
    assert out["target_s"] > 0 and "3 of 12 layers" in out["target_s_how"]
    with pytest.raises(ConfigError, match="target_layers"):
        step_cost_ratio(cfg, runs=1, warmup=0, target_layers=12)
    with pytest.raises(ConfigError, match="draft vocab"):
        step_cost_ratio(cfg, runs=1, warmup=0, draft_vocabs=(10 ** 6,))


def _fc_calls(draft, step) -> int:
    calls = []
    handle = draft.fc.register_forward_hook(lambda *a: calls.append(1))
    try:
        step()
    finally:
        handle.remove()
    return len(calls)


def test_the_feed_step_runs_the_fusion_and_the_chain_step_does_not():
    """One draft call = a feed step on the target's features (fc 3D -> D) + k - 1 chain steps on
    the draft's own hidden (no fc): draft_steps gives both, the way the backends' loops call them."""
    cfg = load_preset("tiny")
    target = Target(cfg.target).eval()
    draft = Draft(cfg, target.embed_tokens, target.lm_head).eval()
    cache = draft.new_cache(1, 9)
    cos, sin = draft.rope(torch.full((1, 1), 8))
    feed, chain = draft_steps(draft, torch.tensor([[1]]), cos, sin, cache, 8)
    with torch.inference_mode():
        assert chain is not feed
        assert _fc_calls(draft, feed) == 1 and _fc_calls(draft, chain) == 0
        assert feed()[0].shape == chain()[0].shape == (1, 1, cfg.target.llm.vocab_size)
    alone = dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, features="none"))
    standalone = Draft(alone, target.embed_tokens, target.lm_head).eval()
    feed, chain = draft_steps(standalone, torch.tensor([[1]]), cos, sin, standalone.new_cache(1, 9), 8)
    assert chain is feed and not hasattr(standalone, "fc")


def test_c_is_the_per_proposal_cost_of_one_feed_and_k_minus_1_chain_steps():
    cfg = load_preset("tiny")
    out = step_cost_ratio(cfg, cached=16, runs=3, warmup=1, draft_vocabs=(0, 64), k=5)
    assert out["k"] == 5 and out["feed_rows"] == 1
    for r in out["by_vocab"]:
        assert r["c"] == pytest.approx((r["c_feed"] + 4 * r["c_chain"]) / 5)
        assert r["draft_s"] == pytest.approx((r["feed_s"] + 4 * r["chain_s"]) / 5)
        assert r["c_feed"] == pytest.approx(r["feed_s"] / out["target_s"])
    alone = dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, features="none"))
    r = step_cost_ratio(alone, cached=16, runs=3, warmup=1, k=5)
    assert r["c_feed"] == r["c_chain"] == pytest.approx(r["c"])     # one call, timed once
    with pytest.raises(ConfigError, match="k=0"):
        step_cost_ratio(cfg, runs=1, warmup=0, k=0)


def test_measure_c_refuses_a_draft_length_below_one():
    from tools import measure_c
    with pytest.raises(SystemExit) as e:
        measure_c.main(["--k", "0"])
    assert e.value.code == 2
