"""The inference path of Target / Draft (a forward given kv_len: attention over the bucket's
rows, fused projections, norms and rotary) against the reference path (all max_len rows, one
module per product): logits within float tolerance, greedy tokens identical, the cache written
alike, and the checkpoint format untouched (models/layers.py docstring)."""
import dataclasses

import numpy as np
import pytest
import torch

from models.config import DraftConfig, ExpertConfig, ModelConfig
from models.draft import Draft
from models.layers import fuse_projections, kv_bucket, tree_mask
from models.target import Target
from prompt.pixels import images_to_patches
from prompt.positions import mrope_decode_position_ids, mrope_position_ids

from tiny_targets import IMG, V, VE, VS, tiny_cfg
TOL = 2e-5


def models(style: str = "qwen3", arch: str = "specdrive", seed: int = 0):
    """A random target from test_target's config (qwen3: q/k norm; qwen2.5: qkv bias) and a fused
    draft over it."""
    torch.manual_seed(seed)
    tcfg = tiny_cfg(style)
    cfg = ModelConfig(target=tcfg, draft=DraftConfig(layers=1, arch=arch, feature_layers=(0, 1, 1)),
                      expert=ExpertConfig(hidden=32, heads=2, intermediate=32))
    target = Target(tcfg).eval()
    return target, Draft(cfg, target.embed_tokens, target.lm_head).eval()


def pair(target, L, seed=1):
    """Two equal random caches (stale rows are random, as a cache that rolled back has)."""
    torch.manual_seed(seed)
    a = torch.randn_like(target.new_cache(1, L))
    return a, a.clone()


def rope(target, start, T):
    return target.rope(torch.arange(start, start + T).view(1, 1, T).expand(3, 1, T))


@pytest.mark.parametrize("style", ["qwen3", "qwen2.5"])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("start,T,kv_len", [(20, 1, 32), (20, 9, 29), (0, 7, 64), (100, 5, 128)])
def test_target_step_equals_the_masked_reference(style, fused, start, T, kv_len):
    target, _ = models(style)
    ref_cache, cache = pair(target, 128)
    ids = torch.randint(0, 50, (1, T))
    cos, sin = rope(target, start, T)
    with torch.no_grad():
        want, wh = target(ids, cos, sin, ref_cache, start, hidden_layers=(0, 1))
        fuse_projections(target, fused)
        got, gh = target(ids, cos, sin, cache, torch.tensor([start]), hidden_layers=(0, 1), kv_len=kv_len)
    assert (got - want).abs().max() < TOL
    assert all((g - w).abs().max() < TOL for g, w in zip(gh, wh))
    assert (cache - ref_cache).abs().max() < TOL      # the same rows written, the rest untouched
    assert torch.equal(cache[:, :, :, :, start + T:], ref_cache[:, :, :, :, start + T:])


def test_tree_verify_equals_the_masked_reference():
    target, _ = models()
    ref_cache, cache = pair(target, 64)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    ids, (cos, sin) = torch.randint(0, 50, (1, 4)), rope(target, 30, 4)
    mask = tree_mask(30, tree, 64)
    with torch.no_grad():
        want, _ = target(ids, cos, sin, ref_cache, 30, tree=mask)
        got, _ = fuse_projections(target)(ids, cos, sin, cache, 30, tree=mask, kv_len=34)
    assert (got - want).abs().max() < TOL


def image_prompt(target):
    rng = np.random.default_rng(0)
    pixels, grid = images_to_patches(rng.integers(0, 256, (2, 16, 24, 3), dtype=np.uint8), 4, 2, 2)
    ids = rng.integers(0, 50, 3).tolist() + ([VS] + [IMG] * 6 + [VE]) * 2 + rng.integers(0, 50, 4).tolist()
    pos, delta = mrope_position_ids(np.array(ids), grid, 2, IMG, VS)
    with torch.no_grad():
        embeds, deep = target.encode_images(torch.tensor(pixels), grid)
    return torch.tensor([ids]), pos, delta, embeds, deep


@pytest.mark.parametrize("layout", ["causal", "frame_local"])
def test_greedy_decoding_is_identical(layout):
    """Prefill of an image prompt, then 24 greedy steps: the same tokens on both paths, every
    step's logits within tolerance; the inference path picks its bucket per call (kv_bucket)."""
    target, _ = models()
    target.cfg = dataclasses.replace(target.cfg, llm=dataclasses.replace(target.cfg.llm, image_attention=layout))
    ids, pos, delta, embeds, deep = image_prompt(target)
    T, L, n = ids.shape[1], 64, 24
    out = {}
    for fast in (False, True):
        fuse_projections(target, fast)
        cache, toks, logits = target.new_cache(1, L), [], []
        with torch.no_grad():
            cos, sin = target.rope(torch.as_tensor(pos[:, None]))
            kw = {"kv_len": kv_bucket(T, L, 16)} if fast else {}
            lg, _ = target(ids, cos, sin, cache, 0, embeds, deep, **kw)
            for i in range(T, T + n):
                toks.append(int(lg[0, -1].argmax()))
                logits.append(lg[0, -1])
                p = torch.as_tensor(mrope_decode_position_ids(i, 1, delta))[:, None]
                kw = {"kv_len": kv_bucket(i + 1, L, 16)} if fast else {}
                lg, _ = target(torch.tensor([[toks[-1]]]), *target.rope(p), cache, i, **kw)
        out[fast] = toks, torch.stack(logits)
    assert out[True][0] == out[False][0]
    assert (out[True][1] - out[False][1]).abs().max() < TOL


@pytest.mark.parametrize("arch", ["specdrive", "eagle3"])
def test_draft_feed_and_chain_equal_the_reference(arch):
    target, draft = models(arch=arch)
    ref_cache, cache = pair(draft, 64)
    D = target.cfg.llm.hidden
    for T, feats in ((3, torch.randn(1, 3, 3 * D)), (1, torch.randn(1, 1, D))):
        ids, (cos, sin) = torch.randint(0, 50, (1, T)), draft.rope(torch.arange(40, 40 + T)[None])
        with torch.no_grad():
            fuse_projections(draft, False)
            want, wh = draft(ids, cos, sin, ref_cache, 40, feats)
            fuse_projections(draft)
            got, gh = draft(ids, cos, sin, cache, torch.tensor([40]), feats, kv_len=48)
        assert (got - want).abs().max() < TOL and (gh - wh).abs().max() < TOL
        assert (cache - ref_cache).abs().max() < TOL


def test_bf16_step_within_bf16_tolerance():
    """The GPU's dtype, on CPU: the inference path against the reference, both in bf16."""
    target, _ = models()
    target = target.to(torch.bfloat16)
    ref_cache, cache = pair(target, 64)
    ids, (cos, sin) = torch.randint(0, 50, (1, 9)), rope(target, 20, 9)
    with torch.no_grad():
        want, _ = target(ids, cos, sin, ref_cache, 20)
        got, _ = fuse_projections(target)(ids, cos, sin, cache, 20, kv_len=32)
    scale = want.float().abs().max()
    assert (got.float() - want.float()).abs().max() < 0.03 * scale


def test_fused_weights_follow_the_modules():
    """Fused products are rebuilt when a projection changes in place, is loaded, or moves dtype;
    the state_dict keeps its names and shapes (the checkpoint format)."""
    target, _ = models()
    keys = {k: tuple(v.shape) for k, v in target.state_dict().items()}
    fuse_projections(target)
    ids, (cos, sin) = torch.randint(0, 50, (1, 2)), rope(target, 10, 2)

    def both():
        ref_cache, cache = pair(target, 32)
        with torch.no_grad():
            want, _ = target(ids, cos, sin, ref_cache, 10)
            got, _ = target(ids, cos, sin, cache, 10, kv_len=16)
        return (got - want).abs().max().item()

    assert both() < TOL
    with torch.no_grad():
        target.layers[0].self_attn.k_proj.weight.mul_(3.0)
        target.layers[1].mlp.up_proj.weight.add_(0.5)
    assert both() < TOL
    other, _ = models(seed=5)
    target.load_state_dict(other.state_dict())
    assert both() < TOL
    target.double()
    cos, sin = cos.double(), sin.double()
    assert both() < TOL
    assert {k: tuple(v.shape) for k, v in target.state_dict().items()} == keys


def test_kv_len_errors_name_the_range():
    target, _ = models()
    cache = target.new_cache(1, 64)
    ids, (cos, sin) = torch.randint(0, 50, (1, 4)), rope(target, 30, 4)
    with pytest.raises(ValueError, match="kv_len=32: allowed start \\+ T = 34 .. max_len = 64"):
        target(ids, cos, sin, cache, 30, kv_len=32)
    with pytest.raises(ValueError, match="allowed start \\+ T = 34 .. max_len = 64"):
        target(ids, cos, sin, cache, 30, kv_len=65)
    with pytest.raises(ValueError, match="kv_len needs a cache"):
        target(ids, cos, sin, None, 0, kv_len=4)


def test_kv_bucket():
    assert [kv_bucket(n, 2048) for n in (1, 256, 257, 1200, 2048)] == [256, 256, 512, 2048, 2048]
    assert kv_bucket(300, 400) == 400 and kv_bucket(9, 64, 8) == 16
    for bad in (0, 2049):
        with pytest.raises(ValueError, match="allowed 1..max_len=2048"):
            kv_bucket(bad, 2048)


def graphed(fn):
    """fn captured in a CUDA graph (warm-up on a side stream first); -> replay, its output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_decoding_equals_eager_reference(dtype):
    """On a GPU: 40 greedy steps replaying one graph per kv bucket (start a device tensor, the
    fused kernels) against the eager masked reference in the same dtype. fp32: the same greedy
    tokens, logits within 1e-4; bf16 (whose rounding may break a near tie either way): fed the
    reference's tokens, every step's logits within 3 % of the largest."""
    target, _ = models()
    target = target.to("cuda", dtype)
    L, T, n = 256, 9, 40
    ids = torch.randint(0, 50, (1, T), device="cuda")
    rows = torch.arange(L, device="cuda")[None]
    cos_all, sin_all = target.rope(rows.expand(3, 1, L))
    out = {}
    with torch.inference_mode():
        for fast in (False, True):
            fuse_projections(target, fast)
            cache = target.new_cache(1, L)
            lg, _ = target(ids, cos_all[:, :T], sin_all[:, :T], cache, 0)
            tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
            start = torch.zeros(1, dtype=torch.long, device="cuda")
            cos, sin = cos_all[:, :1].clone(), sin_all[:, :1].clone()
            graphs, toks, logits = {}, [], []
            for i in range(T, T + n):
                own = int(lg[0, -1].argmax())
                toks.append(own if dtype == torch.float32 or not fast else out[False][0][i - T])
                logits.append(lg[0, -1].float().clone())      # a graph output is overwritten
                tok.fill_(toks[-1]), start.fill_(i), cos.copy_(cos_all[:, i:i + 1]), sin.copy_(sin_all[:, i:i + 1])
                if not fast:
                    lg, _ = target(tok, cos, sin, cache, start)
                    continue
                kv = kv_bucket(i + 1, L, 16)
                if kv not in graphs:
                    graphs[kv] = graphed(lambda: target(tok, cos, sin, cache, start, kv_len=kv)[0])
                graphs[kv][0]()
                lg = graphs[kv][1]
            out[fast] = toks, torch.stack(logits)
    assert out[True][0] == out[False][0]
    tol = 1e-4 if dtype == torch.float32 else 0.03 * out[False][1].abs().max()
    assert (out[True][1] - out[False][1]).abs().max() < tol
