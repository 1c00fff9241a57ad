"""Parameter counts and KV-cache bytes of a ModelConfig, from shapes alone (nothing allocated),
and the measured cost ratio c = (draft step time) / (target step time).

    param_counts(cfg) -> {"vision", "llm", "target", "draft", "expert", "expert_decoder", "total"}
    kv_cache_bytes(cfg, batch, max_len, bytes_per_value=2) -> {"target", "draft"}
    step_cost_ratio(cfg, cached=400, runs=200) -> dict with c and the median step times

Each count mirrors one module's constructor (vision.py, layers.py, target.py, draft.py,
action_expert.py); tests/test_sizes.py holds them equal to sum(p.numel()) of allocated models.
A tied LM head is counted once (it is the embedding).
"""
from __future__ import annotations

import statistics
import time

import torch

from models.action_expert import expert_llm, in_proj_shape
from models.config import LLMConfig, ModelConfig, VisionConfig


def linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def decoder_layer_params(llm: LLMConfig) -> int:
    """RMSNorm x2, q/k/v/o projections (q/k/v bias for Qwen2.5), q/k RMSNorm (Qwen3), SwiGLU."""
    D, hd = llm.hidden, llm.head_dim
    attn = (linear(D, llm.heads * hd, llm.qkv_bias) + 2 * linear(D, llm.kv_heads * hd, llm.qkv_bias)
            + linear(llm.heads * hd, D, False) + (2 * hd if llm.qk_norm else 0))
    return 2 * D + attn + 3 * D * llm.intermediate


def vision_params(v: VisionConfig, out_hidden: int) -> int:
    """Qwen3: patch Linear with bias, learned positions, LayerNorm blocks with a GELU MLP, a
    merger per DeepStack layer. Qwen2.5: patch without bias, RMSNorm blocks, SwiGLU with bias."""
    H, I, big = v.hidden, v.intermediate, v.hidden * v.merge * v.merge
    qwen3 = v.style == "qwen3"
    norms = 4 * H if qwen3 else 2 * H
    mlp = linear(H, I) + linear(I, H) if qwen3 else 2 * linear(H, I) + linear(I, H)
    block = norms + linear(H, 3 * H) + linear(H, H) + mlp
    merger_mlp = linear(big, big) + linear(big, out_hidden)
    if qwen3:
        mergers = (2 * H + merger_mlp) + len(v.deepstack_layers) * (2 * big + merger_mlp)
        stem = linear(v.patch_dim, H) + v.num_position_embeddings * H
    else:
        mergers, stem = H + merger_mlp, linear(v.patch_dim, H, False)
    return stem + v.depth * block + mergers


def llm_params(llm: LLMConfig) -> int:
    head = 0 if llm.tie_embeddings else llm.vocab_size * llm.hidden
    return llm.vocab_size * llm.hidden + llm.layers * decoder_layer_params(llm) + llm.hidden + head


def draft_params(cfg: ModelConfig) -> int:
    """Own weights only: fc (3D -> D) and in_proj (2D -> D) when fused, its layers, final norm."""
    llm = cfg.draft_llm()
    D = llm.hidden
    fused = len(cfg.draft.feature_layers) * D * D + 2 * D * D if cfg.draft.features == "fused" else 0
    return fused + llm.layers * decoder_layer_params(llm) + D


def expert_decoder_params(cfg: ModelConfig) -> int:
    """One decoder layer per target layer and the final norm: upstream's `expert` module alone
    (AlpamayoR1.expert, the text model with embed_tokens deleted)."""
    layer = expert_llm(cfg.expert, cfg.target.llm)
    return layer.layers * decoder_layer_params(layer) + cfg.expert.hidden


def expert_params(cfg: ModelConfig) -> int:
    """Action in-projection MLP + LayerNorm, the decoder (expert_decoder_params), out-proj."""
    e = cfg.expert
    feats, layers, hidden = in_proj_shape(e)
    in_proj = linear(feats * (e.action_dim + 1), hidden) + 2 * e.hidden
    for i in range(layers):
        in_proj += hidden + linear(hidden, e.hidden if i == layers - 1 else hidden)
    return in_proj + expert_decoder_params(cfg) + linear(e.hidden, e.action_dim)


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    vision = vision_params(cfg.target.vision, cfg.target.llm.hidden)
    llm = llm_params(cfg.target.llm)
    counts = {"vision": vision, "llm": llm, "target": vision + llm,
              "draft": draft_params(cfg), "expert": expert_params(cfg)}
    counts["total"] = counts["target"] + counts["draft"] + counts["expert"]
    counts["expert_decoder"] = expert_decoder_params(cfg)   # part of "expert", not added again
    return counts


def kv_cache_bytes(cfg: ModelConfig, batch: int, max_len: int, bytes_per_value: int = 2) -> dict:
    """Bytes of the preallocated caches (layers, 2, B, kv_heads, max_len, head_dim). The expert
    keeps no cache of its own (it reads the target's)."""
    def size(llm: LLMConfig) -> int:
        return llm.layers * 2 * batch * llm.kv_heads * max_len * llm.head_dim * bytes_per_value
    return {"target": size(cfg.target.llm), "draft": size(cfg.draft_llm())}


@torch.inference_mode()
def step_cost_ratio(cfg: ModelConfig, cached: int = 400, runs: int = 200, warmup: int = 20,
                    seed: int = 0) -> dict:
    """Median wall time of one decode step (batch 1, one new token after `cached` rows) of the
    draft and of the target, on CPU in float32, and c = draft / target. Cache contents are
    random: the step's cost does not depend on them."""
    from models.draft import Draft
    from models.target import Target

    torch.manual_seed(seed)
    target = Target(cfg.target).eval()
    draft = Draft(cfg, target.embed_tokens, target.lm_head).eval()
    tcache = torch.randn_like(target.new_cache(1, cached + 1))
    dcache = torch.randn_like(draft.new_cache(1, cached + 1))
    ids = torch.tensor([[1]])
    tcos, tsin = target.rope(torch.full((3, 1, 1), cached))
    dcos, dsin = draft.rope(torch.full((1, 1), cached))
    n_feats = len(cfg.draft.feature_layers) if cfg.draft.features == "fused" else 0
    feats = torch.randn(1, 1, n_feats * cfg.target.llm.hidden) if n_feats else None
    target_s, draft_s = _median_times([lambda: target(ids, tcos, tsin, tcache, cached),
                                       lambda: draft(ids, dcos, dsin, dcache, cached, feats)],
                                      runs, warmup)
    return {"c": draft_s / target_s, "draft_s": draft_s, "target_s": target_s,
            "cached": cached, "runs": runs, "threads": torch.get_num_threads()}


def _median_times(steps, runs: int, warmup: int) -> list[float]:
    """Median seconds of each step; the steps alternate so that both see the same machine load
    (other processes on a shared CPU), which a ratio needs more than absolute accuracy."""
    times = [[] for _ in steps]
    for i in range(warmup + runs):
        for step, out in zip(steps, times):
            t0 = time.perf_counter()
            step()
            if i >= warmup:
                out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]
