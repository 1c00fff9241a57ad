"""Parameter counts and KV-cache bytes of a ModelConfig, from shapes alone (nothing allocated),
and the measured cost ratio c of one draft proposal to one target step.

    param_counts(cfg) -> {"vision", "llm", "target", "draft", "expert", "expert_decoder", "total"}
    kv_cache_bytes(cfg, batch, max_len, bytes_per_value=2) -> {"target", "draft"}
    step_cost_ratio(cfg, cached=400, runs=200, draft_vocabs=(0,), target_layers=0, k=8)
        -> dict with c, c_feed, c_chain and the median step times (per draft head size: by_vocab)

c, as the speedup tau / (1 + k c) uses it, is the draft's cost per proposal. One draft call
`draft(tokens, start, k)` is one feed step (the target's features, 3D wide, through the draft's
fc fusion, then its layers and head) and k - 1 chain steps (the draft's own hidden, D wide: no
fc). So c_feed = feed step / target step, c_chain = chain step / target step and
c = c_k = (c_feed + (k - 1) c_chain) / k. A standalone draft (features "none") has no fusion:
its feed and chain steps are the same call, timed once, c_feed == c_chain == c. The feed is
timed over one row (the loop feeds the accepted tokens and the bonus, ~tau rows: at batch 1 a
memory-bound step costs about the same).

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
from core.config import ConfigError


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
    """Own weights only: fc (3D -> D) and in_proj (2D -> D) when fused, its layers, final norm,
    and a reduced head's N x D rows (draft.vocab = N; a full head is the target's)."""
    llm = cfg.draft_llm()
    D = llm.hidden
    fused = len(cfg.draft.feature_layers) * D * D + 2 * D * D if cfg.draft.features == "fused" else 0
    return fused + llm.layers * decoder_layer_params(llm) + D + cfg.draft.vocab * D


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
                    seed: int = 0, draft_vocabs=(0,), target_layers: int = 0, k: int = 8) -> dict:
    """Median wall time of one decode step (batch 1, one new token after `cached` rows) of the
    target and of the draft's feed and chain steps (`draft_steps`), on CPU in float32, and
    c_feed, c_chain and c = (c_feed + (k - 1) c_chain) / k against the target step (module
    docstring); draft_s = c x target_s, the mean draft time per proposal. Cache contents are
    random: the step's cost does not depend on them.

    draft_vocabs: the draft head sizes to time (0 = the target's shared head; N = a reduced head
    of N rows whose logits are scattered to the target vocabulary, as Draft.forward does), one
    draft each, sharing one decoder layer. target_layers: 0 builds the whole target; M > 0
    builds only M of its layers (a target too large for this machine's memory) and gives the
    whole target's step as head + L x (M-layer step - head) / M, the head (embedding, final
    norm, LM head) timed on its own in the same loop ("target_s_how" says which)."""
    from models.draft import Draft
    from models.target import Target

    L = cfg.target.llm.layers
    if k < 1:
        raise ConfigError(f"k={k}: the draft length per call, an int >= 1")
    if target_layers and not 1 <= target_layers < L:
        raise ConfigError(f"target_layers={target_layers}: 0 (the whole target) or 1..{L - 1}")
    built = _truncated(cfg, target_layers) if target_layers else cfg
    torch.manual_seed(seed)
    target = Target(built.target).eval()
    tcache = torch.randn_like(target.new_cache(1, cached + 1))
    ids = torch.tensor([[1]])
    tcos, tsin = target.rope(torch.full((3, 1, 1), cached))
    steps = [lambda: target(ids, tcos, tsin, tcache, cached)]
    if target_layers:
        x = torch.randn(1, 1, cfg.target.llm.hidden)
        steps.append(lambda: target.head(x + target.embed_tokens(ids)))
    drafts = _drafts(built, target, draft_vocabs)
    dcache = torch.randn_like(drafts[0].new_cache(1, cached + 1))
    dcos, dsin = drafts[0].rope(torch.full((1, 1), cached))
    pairs = [draft_steps(d, ids, dcos, dsin, dcache, cached) for d in drafts]
    for feed, chain in pairs:
        steps += [feed] if chain is feed else [feed, chain]
    times = _median_times(steps, runs, warmup)
    target_s, how = times[0], "the whole target"
    if target_layers:
        head_s = times[1]
        target_s = head_s + L * (times[0] - head_s) / target_layers
        how = f"{target_layers} of {L} layers built: head {head_s:.4f} s + {L} x (step - head) / {target_layers}"
    per, i = [], 2 if target_layers else 1
    for n, (feed, chain) in zip(draft_vocabs, pairs):
        feed_s = times[i]
        chain_s = feed_s if chain is feed else times[i + 1]
        i += 1 if chain is feed else 2
        draft_s = (feed_s + (k - 1) * chain_s) / k
        per.append({"draft_vocab": n or cfg.target.llm.vocab_size, "c": draft_s / target_s,
                    "c_feed": feed_s / target_s, "c_chain": chain_s / target_s,
                    "draft_s": draft_s, "feed_s": feed_s, "chain_s": chain_s})
    return {**per[0], "k": k, "target_s": target_s, "target_s_how": how, "cached": cached,
            "runs": runs, "feed_rows": 1, "threads": torch.get_num_threads(),
            **({"by_vocab": per} if len(per) > 1 else {})}


def draft_steps(draft, ids, cos, sin, cache, start: int):
    """(feed, chain): the two draft steps of one draft call over one row. feed gives the draft
    the target's features (fused: (1, 1, 3D), through fc), chain its own hidden ((1, 1, D), no
    fc). A standalone draft (features "none") reads no features: chain is feed (the same call)."""
    if draft.cfg.features != "fused":
        feed = lambda: draft(ids, cos, sin, cache, start, None)     # noqa: E731
        return feed, feed
    D = draft.llm.hidden
    target_feats = torch.randn(1, 1, len(draft.cfg.feature_layers) * D)
    own_hidden = torch.randn(1, 1, D)
    return (lambda: draft(ids, cos, sin, cache, start, target_feats),
            lambda: draft(ids, cos, sin, cache, start, own_hidden))


def _truncated(cfg: ModelConfig, layers: int) -> ModelConfig:
    """cfg with only `layers` target layers (the draft reads features of layers it has)."""
    import dataclasses

    llm = dataclasses.replace(cfg.target.llm, layers=layers)
    feats = (0, layers // 2, layers - 1) if cfg.draft.features == "fused" else ()
    return dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, llm=llm),
                               draft=dataclasses.replace(cfg.draft, feature_layers=feats))


def _drafts(cfg: ModelConfig, target, vocabs) -> list:
    """One draft per head size, all sharing the first one's decoder layers (memory); a reduced
    head maps to evenly spread target ids (for cost, which ids does not matter)."""
    import dataclasses

    from models.draft import Draft

    V, out = cfg.target.llm.vocab_size, []
    for n in vocabs:
        if not 0 <= n <= V:
            raise ConfigError(f"draft vocab {n}: 0 (the target's head) or 1..{V}")
        d = Draft(dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, vocab=n)),
                  target.embed_tokens, target.lm_head).eval()
        if n:
            d.set_vocab(torch.arange(n) * V // n)
        if out:
            d.layers = out[0].layers
            if cfg.draft.features == "fused":
                d.fc, d.in_proj = out[0].fc, out[0].in_proj
        out.append(d)
    return out


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
