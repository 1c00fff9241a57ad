"""Teacher-forced draft forward that also trains the later steps of a draft chain (EAGLE-3's
"training-time test"), over the draft's own modules.

Pass 0 is the draft's plain forward over the whole sequence (rows carry the target's features
shifted by one, `models.draft.shift_features`). Pass p >= 1 simulates the p-th drafted token:
its row j carries token ids_j and, as feature, the draft's own hidden of row j-1 from pass p-1,
and attends to what the draft's cache would hold at that moment:

    pass-0 keys of rows <= j - p      (the verified prefix, written with target features)
    pass-i key of row j - p + i       (i = 1..p: the draft's own earlier chain rows)

Row j of every pass predicts ids_{j+1}. Passes >= 1 only run on rows [first, T) (the
reasoning); a standalone draft (no features) gives the same output in every pass, so it
needs pass 0 only.
"""
from __future__ import annotations

import math

import torch

from models.draft import Draft
from models.layers import attend


def _qkv(layer, x, cos, sin):
    return layer.self_attn.qkv(layer.input_layernorm(x), cos, sin)


def _finish(layer, x, attn):
    x = x + layer.self_attn.o_proj(attn)
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _expand(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, KVH, ..., D) -> (B, H, ..., D): query head h reads KV head h // (H / KVH)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _chain_attention(q, k0, v0, ks, vs, rows: torch.Tensor, p: int) -> torch.Tensor:
    """q (B, H, n, D) at rows (n,); k0/v0 (B, KVH, T, D) pass-0 keys; ks/vs: pass-1..p keys at
    the same n rows, each already aligned to row j - p + i. -> (B, n, H*D)."""
    B, H, n, D = q.shape
    k0, v0 = _expand(k0, H), _expand(v0, H)
    scores = q @ k0.transpose(-1, -2) / math.sqrt(D)                      # (B, H, n, T)
    visible = torch.arange(k0.shape[2])[None, :] <= (rows - p)[:, None]     # (n, T)
    scores = scores.masked_fill(~visible, float("-inf"))
    diag = [(q * _expand(k, H)).sum(-1, keepdim=True) / math.sqrt(D) for k in ks]  # (B, H, n, 1)
    probs = torch.softmax(torch.cat([scores, *diag], -1).float(), -1).to(q.dtype)
    out = probs[..., :k0.shape[2]] @ v0
    for i, v in enumerate(vs):
        out = out + probs[..., k0.shape[2] + i:k0.shape[2] + i + 1] * _expand(v, H)
    return out.transpose(1, 2).reshape(B, n, H * D)


def chain_forward(draft: Draft, ids, cos, sin, features, image_embeds, first: int, passes: int):
    """-> [(logits (B, n_p, V), hidden (B, n_p, D), rows_p)] for p = 0..passes-1, where pass 0
    covers rows [first, T) of the full forward and pass p rows [first + p, T)."""
    B, T = ids.shape
    emb = draft._embed(ids, image_embeds)
    fused = draft.cfg.features == "fused"
    x = draft.in_proj(torch.cat([emb, draft._fuse(features, ids.shape)], -1)) if fused else emb
    keys = []                                                  # per pass: per layer (k, v) at its rows
    kv0 = []
    for layer in draft.layers:                                 # pass 0: plain causal forward
        q, k, v = _qkv(layer, x, cos, sin)
        kv0.append((k, v))
        x = _finish(layer, x, attend(q, k, v, causal=True))
    hidden = x
    rows = torch.arange(first, T)
    out = [(draft.lm_head(draft.norm(hidden[:, first:])), hidden[:, first:], rows)]
    if not fused:
        return out
    prev_hidden, prev_rows = hidden, torch.arange(T)
    for p in range(1, passes):
        rows = torch.arange(first + p, T)
        if len(rows) == 0:
            break
        feat = prev_hidden[:, rows - 1 - prev_rows[0]]       # draft hidden of row j-1, pass p-1
        x = draft.in_proj(torch.cat([emb[:, rows], feat], -1))
        layer_kv = []
        for li, layer in enumerate(draft.layers):
            q, k, v = _qkv(layer, x, cos[:, rows], sin[:, rows])
            layer_kv.append((k, v))
            ks = [_align(keys[i - 1][li][0], i, p, rows, first) for i in range(1, p)] + [k]
            vs = [_align(keys[i - 1][li][1], i, p, rows, first) for i in range(1, p)] + [v]
            x = _finish(layer, x, _chain_attention(q, *kv0[li], ks, vs, rows, p))
        keys.append(layer_kv)
        prev_hidden, prev_rows = x, rows
        out.append((draft.lm_head(draft.norm(x)), x, rows))
    return out


def _align(k: torch.Tensor, i: int, p: int, rows: torch.Tensor, first: int) -> torch.Tensor:
    """Pass-i keys (B, KVH, n_i, D) stored at rows [first + i, T) -> the rows j - p + i of the
    pass-p queries."""
    return k[:, :, rows - p + i - (first + i)]
