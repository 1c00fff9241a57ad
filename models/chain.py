"""The draft's chain forwards for training and evaluation, over the draft's own blocks
(`Draft.inputs`, `DecoderBlock.qkv` / `finish`, `Draft.head`): what train/ calls instead of
writing decoder arithmetic of its own.

    chain_forward(draft, ids, cos, sin, features, image_embeds, first, passes)
        teacher-forced passes of a draft chain (EAGLE-3's "training-time test")
    rollout(draft, prefix, feats, image_embeds, n, text, temperature, tokens=None, group=1, stop=None)
        the draft as it drafts, sampled or scoring given tokens, with autograd (AARL)
    attention_probs(draft, ids, cos, sin, features, image_embeds) -> [(B, H, T, T)] per layer

chain_forward: pass 0 is the draft's plain forward over the whole sequence (rows carry the
target's features shifted by one, `models.draft.shift_features`). Pass p >= 1 simulates the
p-th drafted token: its row j carries token ids_j and, as feature, the draft's own hidden of
row j-1 from pass p-1, and attends to what the draft's cache would hold at that moment:

    pass-0 keys of rows <= j - p      (the verified prefix, written with target features)
    pass-i key of row j - p + i       (i = 1..p: the draft's own earlier chain rows)

Row j of every pass predicts ids_{j+1}. Passes >= 1 only run on rows [first, T) (the
reasoning); a standalone draft (no features) gives the same output in every pass, so it
needs pass 0 only.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.draft import Draft
from models.layers import attend, expand_kv


def _chain_attention(q, k0, v0, ks, vs, rows: torch.Tensor, p: int) -> torch.Tensor:
    """q (B, H, n, D) at rows (n,); k0/v0 (B, KVH, T, D) pass-0 keys; ks/vs: pass-1..p keys at
    the same n rows, each already aligned to row j - p + i. -> (B, n, H*D)."""
    B, H, n, D = q.shape
    k0, v0 = expand_kv(k0, H), expand_kv(v0, H)
    scores = q @ k0.transpose(-1, -2) / math.sqrt(D)                      # (B, H, n, T)
    visible = torch.arange(k0.shape[2], device=q.device)[None, :] <= (rows.to(q.device) - p)[:, None]  # (n, T)
    scores = scores.masked_fill(~visible, float("-inf"))
    diag = [(q * expand_kv(k, H)).sum(-1, keepdim=True) / math.sqrt(D) for k in ks]  # (B, H, n, 1)
    probs = torch.softmax(torch.cat([scores, *diag], -1).float(), -1).to(q.dtype)
    out = probs[..., :k0.shape[2]] @ v0
    for i, v in enumerate(vs):
        out = out + probs[..., k0.shape[2] + i:k0.shape[2] + i + 1] * expand_kv(v, H)
    return out.transpose(1, 2).reshape(B, n, H * D)


def _causal_pass(draft: Draft, x, cos, sin):
    """The draft's layers over x (B, T, D), causal -> (hidden, [(k, v)] per layer)."""
    kv = []
    for layer in draft.layers:
        q, k, v = layer.qkv(x, cos, sin)
        kv.append((k, v))
        x = layer.finish(x, attend(q, k, v, causal=True))
    return x, kv


def chain_forward(draft: Draft, ids, cos, sin, features, image_embeds, first: int, passes: int):
    """-> [(logits (B, n_p, V), hidden (B, n_p, D), rows_p)] for p = 0..passes-1, where pass 0
    covers rows [first, T) of the full forward and pass p rows [first + p, T)."""
    T = ids.shape[1]
    hidden, kv0 = _causal_pass(draft, draft.inputs(ids, features, image_embeds), cos, sin)
    rows = torch.arange(first, T)
    out = [(draft.head(hidden[:, first:]), hidden[:, first:], rows)]
    if draft.cfg.features != "fused":
        return out
    keys = []                                  # per pass >= 1: per layer (k, v) at its rows
    prev_hidden, prev_rows = hidden, torch.arange(T)
    for p in range(1, passes):
        rows = torch.arange(first + p, T)
        if len(rows) == 0:
            break
        feat = prev_hidden[:, rows - 1 - prev_rows[0]]       # draft hidden of row j-1, pass p-1
        x = draft.inputs(ids[:, rows], feat)                 # reasoning rows: no image tokens
        layer_kv = []
        for li, layer in enumerate(draft.layers):
            q, k, v = layer.qkv(x, cos[:, rows], sin[:, rows])
            layer_kv.append((k, v))
            ks = [_align(keys[i - 1][li][0], i, p, rows, first) for i in range(1, p)] + [k]
            vs = [_align(keys[i - 1][li][1], i, p, rows, first) for i in range(1, p)] + [v]
            x = layer.finish(x, _chain_attention(q, *kv0[li], ks, vs, rows, p))
        keys.append(layer_kv)
        prev_hidden, prev_rows = x, rows
        out.append((draft.head(x), x, rows))
    return out


def _align(k: torch.Tensor, i: int, p: int, rows: torch.Tensor, first: int) -> torch.Tensor:
    """Pass-i keys (B, KVH, n_i, D) stored at rows [first + i, T) -> the rows j - p + i of the
    pass-p queries."""
    return k[:, :, rows - p + i - (first + i)]


def _attend_all(q, k, v):
    """Non-causal attention of q (G, H, 1, D) over all keys k, v (G, KVH, n, D) -> (G, 1, H*D)."""
    H = q.shape[1]
    p = torch.softmax(q @ expand_kv(k, H).transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
    return (p @ expand_kv(v, H)).transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def rollout(draft: Draft, prefix: torch.Tensor, feats, image_embeds, n: int, text: torch.Tensor,
            temperature: float, tokens: torch.Tensor | None = None, group: int = 1, stop: int | None = None):
    """The draft as it drafts, differentiable: rows of `prefix` (1, T0+1) in one causal pass
    with target features `feats` (1, T0+1, 3D), then one row per token with its own previous
    hidden as feature, sampled at `temperature` over the `text` (V,) bool tokens. Samples `n`
    tokens per group member (tokens None) or scores the given tokens (G, n). The chain's keys
    grow by concatenation, not in a cache buffer: autograd keeps every step's keys.
    `stop` (a token id, e.g. <|cot_end|>): once every member has written it, the chain ends;
    the remaining columns hold `stop` with log q 0 (what a caller masks after the first stop;
    the earlier columns, and the RNG draws behind them, are those of the full chain).
    Returns (tokens (G, n), log q of each (G, n)). A reduced-head draft (draft.vocab) is refused:
    its samples would be head ids, and AARL scores target ids."""
    if draft.cfg.vocab:
        raise ValueError(f"rollout: a draft with a reduced head ({draft.cfg.vocab} rows) is not supported "
                         "(AARL post-trains full-head drafts)")
    T = prefix.shape[1]
    pos = torch.arange(T + n, device=prefix.device)[None]
    cos, sin = draft.rope(pos)
    x, kv = _causal_pass(draft, draft.inputs(prefix, feats, image_embeds), cos[:, :T], sin[:, :T])
    kv = [[k.expand(group, -1, -1, -1), v.expand(group, -1, -1, -1)] for k, v in kv]
    h = x[:, -1:].expand(group, -1, -1)
    out, logq = [], []
    ended = torch.zeros(group, dtype=torch.bool, device=prefix.device)
    for i in range(n):
        logits = draft.head(h)[:, 0].float().masked_fill(~text, float("-inf"))
        lp = F.log_softmax(logits / temperature, -1)
        tok = torch.multinomial(lp.detach().exp(), 1)[:, 0] if tokens is None else tokens[:, i]
        out.append(tok)
        logq.append(lp.gather(1, tok[:, None])[:, 0])
        if stop is not None:
            ended = ended | (tok == stop)
        if i == n - 1 or (stop is not None and bool(ended.all())):
            break
        x = draft.inputs(tok[:, None], h)
        r = slice(T + i, T + i + 1)
        for li, layer in enumerate(draft.layers):
            q, k, v = layer.qkv(x, cos[:, r].expand(group, -1, -1), sin[:, r].expand(group, -1, -1))
            kv[li] = [torch.cat([kv[li][0], k], 2), torch.cat([kv[li][1], v], 2)]
            x = layer.finish(x, _attend_all(q, *kv[li]))
        h = x
    tokens_out, logq = torch.stack(out, 1), torch.stack(logq, 1)
    if tokens_out.shape[1] < n:                       # ended early: every member wrote `stop`
        rest = n - tokens_out.shape[1]
        tokens_out = torch.cat([tokens_out, tokens_out.new_full((group, rest), stop)], 1)
        logq = torch.cat([logq, logq.new_zeros(group, rest)], 1)
    return tokens_out, logq


def attention_probs(draft: Draft, ids, cos, sin, features, image_embeds) -> list[torch.Tensor]:
    """The draft's causal forward (pass 0), returning each layer's attention probabilities
    (B, H, T, T), averaged nowhere (the caller sums them over the keys it cares about)."""
    x = draft.inputs(ids, features, image_embeds)
    T = ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    out = []
    for layer in draft.layers:
        q, k, v = layer.qkv(x, cos, sin)
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
        scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~causal, float("-inf"))
        p = torch.softmax(scores, -1)                                   # (B, H, T, T)
        out.append(p)
        x = layer.finish(x, (p @ v).transpose(1, 2).reshape(ids.shape[0], T, -1))
    return out
