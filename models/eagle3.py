"""EAGLE-3's midlayer: the one decoder layer of an EAGLE-3 draft (DraftConfig.arch = "eagle3").

    layer = Eagle3Layer(llm)                     llm: the draft's LLMConfig (no q/k norm)
    x2 = torch.cat([embed(ids), h], -1)          (B, T, 2D): what Draft.inputs gives this arch
    out = layer(x2, cos, sin, cache, rows, mask) (B, T, D)

With e = x2[..., :D] (the token embedding) and h = x2[..., D:] (fc(target features), or the
draft's own previous hidden in the chain):

    a   = attn(q, k, v of cat(input_layernorm(e), hidden_norm(h)))   q/k/v: (2D -> heads * hd)
    h'  = h + o_proj(a)                                               the residual is h alone
    out = h' + mlp(post_attention_layernorm(h'))

The module names are EAGLE-3's (`midlayer.` in its checkpoints is this draft's `layers.0.`), so
export/edgellm.py maps them by prefix. `qkv` and `finish` are the two halves around the
attention, as DecoderBlock's, so models/chain.py trains this layer unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

from models.config import LLMConfig
from models.layers import AttnPlan, RMSNorm, SwiGLU, attend, attend_plan, plain_path, write_kv
from models.rope import apply_rope


class Eagle3Attention(nn.Module):
    """q/k/v over the 2 x hidden concatenation, o_proj back to hidden (Llama attention)."""

    def __init__(self, cfg: LLMConfig):
        super().__init__()
        D, hd = cfg.hidden, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, hd
        self.q_proj = nn.Linear(2 * D, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * D, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * D, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, D, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.hidden = cfg.hidden
        self.hidden_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.intermediate)

    def qkv(self, x2: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x2 (B, T, 2D) = [embed, hidden] -> q (B, H, T, hd), k, v (B, KVH, T, hd), rope applied."""
        e, h = x2[..., :self.hidden], x2[..., self.hidden:]
        return self.self_attn.qkv(torch.cat([self.input_layernorm(e), self.hidden_norm(h)], -1), cos, sin)

    def finish(self, x2: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x2 (B, T, 2D), attn (B, T, H*hd) -> the layer's output (B, T, D) on the hidden stream."""
        h = x2[..., self.hidden:] + self.self_attn.o_proj(attn)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, x2, cos, sin, cache: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, plan: AttnPlan | None = None) -> torch.Tensor:
        """The one cache contract of models/layers.py (DecoderBlock.forward's); a plan: attention
        over its kv_len rows (the projections and norms as they are)."""
        q, k, v = self.qkv(x2, cos, sin)
        if cache is not None:
            k, v = write_kv(cache, rows, k, v)
        if plan is not None and not plain_path():
            return self.finish(x2, attend_plan(q, k, v, plan))
        return self.finish(x2, attend(q, k, v, mask, causal=mask is None))
