"""Building blocks shared by the target LLM, the draft and the action expert.

Public API (stable):
    RMSNorm(dim, eps)                      y = w * x / sqrt(mean(x^2) + eps), computed in fp32
    SwiGLU(dim, intermediate, bias=False)  down(silu(gate(x)) * up(x))
    attend(q, k, v, mask=None, causal=False) -> (B, Tq, H*D)
        q (B, H, Tq, D); k, v (B, KVH, Tk, D) from any source (a cache, another model's cache,
        concatenations); mask bool broadcastable to (B, H, Tq, Tk), True = may attend
    causal_mask(start, T, device) -> (T, start+T) bool: row i sees keys j <= start + i
    Attention(hidden, heads, kv_heads, head_dim, qk_norm=False, qkv_bias=False, eps=1e-6)
        .qkv(x, cos, sin) -> q (B, H, T, D), k, v (B, KVH, T, D)   (norms and rope applied)
        .forward(x, cos, sin, cache=None, start=0, mask=None) -> (B, T, hidden)
    DecoderBlock(cfg: LLMConfig)           pre-norm attention + SwiGLU, residuals
        .forward(x, cos, sin, cache=None, start=0, mask=None)
    new_kv_cache(layers, batch, kv_heads, max_len, head_dim, dtype, device)
        -> zeros (layers, 2, B, kv_heads, max_len, head_dim)

KV cache: one preallocated buffer; a layer gets its slice cache[i] (2, B, KVH, max_len, D).
A forward writes its T new rows at [start, start+T) and attends to rows [0, start+T), causal
inside the new block. Rows past start+T are stale and never read, so rolling back is the caller
passing a smaller `start` next time. Module names follow transformers' Qwen naming so that
checkpoint I/O is a prefix mapping.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.config import LLMConfig
from models.rope import apply_rope


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(dim, intermediate, bias=bias)
        self.up_proj = nn.Linear(dim, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def causal_mask(start: int, T: int, device=None) -> torch.Tensor:
    """(T, start+T) bool: query i sits at absolute row start+i and sees keys j <= start+i."""
    rows = torch.arange(T, device=device)[:, None] + start
    return torch.arange(start + T, device=device)[None, :] <= rows


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) v, grouped-query: each KV head serves H/KVH query heads.

    q (B, H, Tq, D); k, v (B, KVH, Tk, D); returns (B, Tq, H*D).
    """
    B, H, Tq, D = q.shape
    groups = H // k.shape[1]
    if groups > 1:  # (B, KVH, Tk, D) -> (B, H, Tk, D); query head h reads KV head h // groups
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    return out.transpose(1, 2).reshape(B, Tq, H * D)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 qk_norm: bool = False, qkv_bias: bool = False, eps: float = 1e-6):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        # Qwen3: RMSNorm over each head's D before rope; Qwen2.5 has none
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, T, hidden) -> q (B, H, T, D), k, v (B, KVH, T, D); rope on q and k."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, cache: torch.Tensor | None = None, start: int = 0,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """cache (2, B, KVH, max_len, D) or None; mask overrides the causal default."""
        q, k, v = self.qkv(x, cos, sin)
        T = x.shape[1]
        if cache is None:
            return self.o_proj(attend(q, k, v, mask, causal=True))
        if start + T > cache.shape[3]:
            raise ValueError(f"KV cache overflow: start={start} + T={T} > max_len={cache.shape[3]}")
        cache[0, :, :, start:start + T] = k
        cache[1, :, :, start:start + T] = v
        if mask is None and T > 1:
            mask = causal_mask(start, T, x.device)
        return self.o_proj(attend(q, cache[0, :, :, :start + T], cache[1, :, :, :start + T], mask))


class DecoderBlock(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(x)): the Qwen2/Qwen3 decoder layer."""

    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attn = Attention(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim,
                                   cfg.qk_norm, cfg.qkv_bias, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.intermediate)

    def forward(self, x, cos, sin, cache=None, start: int = 0, mask=None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def new_kv_cache(layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device=None) -> torch.Tensor:
    """Zeroed buffer (layers, 2, B, kv_heads, max_len, head_dim); index 0 = K, 1 = V."""
    return torch.zeros(layers, 2, batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
