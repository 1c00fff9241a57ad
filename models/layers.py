"""Building blocks shared by the target LLM, the draft and the action expert.

Public API (stable):
    RMSNorm(dim, eps)                      y = w * x / sqrt(mean(x^2) + eps), computed in fp32
    SwiGLU(dim, intermediate, bias=False)  down(silu(gate(x)) * up(x))
    attend(q, k, v, mask=None, causal=False) -> (B, Tq, H*D)
        q (B, H, Tq, D); k, v (B, KVH, Tk, D) from any source (a cache, another model's cache,
        concatenations); mask bool broadcastable to (B, H, Tq, Tk), True = may attend
    expand_kv(t, heads)                    (B, KVH, ..., D) -> (B, H, ..., D) (grouped query)
    image_mask(ids, image_token_id, n_embeds) -> (B, T, 1) bool: where image embeddings go
    cache_rows(start, T, max_len, device) -> rows (T,), mask (T, max_len)
    tree_mask(start, tree, max_len)       (T, T) token-tree mask of one call's rows -> (T, max_len)
    move_rows(buf, dim, start, rows)      rows `rows` of a cache along `dim` -> start, start+1, ..
    write_kv(cache, rows, k, v) -> (keys, values) of the whole layer cache
    Attention(hidden, heads, kv_heads, head_dim, qk_norm=False, qkv_bias=False, eps=1e-6)
        .qkv(x, cos, sin) -> q (B, H, T, D), k, v (B, KVH, T, D)   (norms and rope applied)
    DecoderBlock(cfg: LLMConfig)           pre-norm attention + SwiGLU, residuals
        .qkv(x, cos, sin)                  q, k, v of norm(x)
        .finish(x, attn)                   x + o_proj(attn), then + mlp(norm(.))
        .forward(x, cos, sin, cache=None, rows=None, mask=None)
    new_kv_cache(layers, batch, kv_heads, max_len, head_dim, dtype, device)
        -> zeros (layers, 2, B, kv_heads, max_len, head_dim)

The one cache contract (gpt-fast style): the KV cache is one preallocated buffer; a layer gets
its slice cache[i] (2, B, KVH, max_len, D). A forward of T tokens writes their K/V at `rows`
(a (T,) device tensor, start .. start+T-1) with index_copy_ and attends over all max_len rows
with `mask` (T, max_len): row i sees keys j <= start + i. Nothing in it depends on a host value,
so one code path runs eager on CPU, is captured in a CUDA graph (start a device tensor) and
exports to ONNX with static shapes. Rows past start+T are stale and masked, so rolling back is
the caller passing a smaller `start` next time. Module names follow transformers' Qwen naming
so that checkpoint I/O is a prefix mapping.
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


def image_mask(ids: torch.Tensor, image_token_id: int, n_embeds: int) -> torch.Tensor:
    """(B, T, 1) bool: the image-pad positions of `ids`, filled in row-major order by
    `x.masked_scatter(mask, embeds)`. Their count is checked against n_embeds when ids live on
    the host (not while tracing for export); on a device the caller checked the prompt (no
    read-back inside a forward)."""
    if image_token_id < 0:
        raise ValueError("image_embeds given but image_token_id is not set (-1); "
                         "set it from the tokenizer (tok.image_pad)")
    mask = ids == image_token_id
    if ids.device.type == "cpu" and not torch.compiler.is_compiling() and int(mask.sum()) != n_embeds:
        raise ValueError(f"{int(mask.sum())} image tokens (id {image_token_id}) in ids "
                         f"but {n_embeds} image embeddings; they must be equal")
    return mask.unsqueeze(-1)


def cache_rows(start, T: int, max_len: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (T,) = start + i and mask (T, max_len), mask[i, j] = j <= start + i.

    `start` is an int (checked against max_len here, on the host) or a (1,) device tensor
    (a CUDA-graph input: nothing is read back)."""
    if not torch.is_tensor(start) and start + T > max_len:
        raise ValueError(f"KV cache overflow: start={start} + T={T} > max_len={max_len}")
    rows = torch.arange(T, device=device) + (start.to(device) if torch.is_tensor(start) else start)
    return rows, torch.arange(max_len, device=device)[None, :] <= rows[:, None]


def tree_mask(start, tree: torch.Tensor, max_len: int) -> torch.Tensor:
    """A token tree's mask over the cache: tree (T, T) bool, tree[i, j] = row i of this call may
    see row j of this call (itself and its ancestors), written at rows start .. start+T-1.
    -> (T, max_len): every row before `start` (the accepted prefix) and the tree's own rows.
    A chain is the lower triangle, and this is then cache_rows' causal mask. `start` an int or
    a (1,) device tensor (CUDA graphs, ONNX export: nothing is read back)."""
    T = tree.shape[0]
    keys = torch.arange(max_len, device=tree.device)
    begin = start.to(tree.device) if torch.is_tensor(start) else start
    prefix = (keys < begin)[None, :].expand(T, max_len)
    rows = torch.arange(T, device=tree.device) + begin
    return prefix.index_copy(1, rows, tree.to(torch.bool))


def move_rows(buf: torch.Tensor, dim: int, start: int, rows: torch.Tensor) -> None:
    """buf's slices `rows` (n,) along `dim` -> start .. start+n-1, in place (read first, so the
    ranges may overlap): a token tree's accepted path moved to the rows a chain would have
    written, so the cache stays contiguous and rolling back stays a smaller `start`."""
    dst = torch.arange(start, start + len(rows), device=buf.device)
    buf.index_copy_(dim, dst, buf.index_select(dim, rows.to(buf.device)))


def image_blocks(ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(B, T) ids -> (B, T) int64 block number: k >= 1 on the rows of the k-th image block
    (<|vision_start|>, its <|image_pad|> run, <|vision_end|>), 0 on every other row. A block is
    found from its pad run alone: the row before the run and the row after it belong to it."""
    pad = ids == image_token_id
    before = torch.zeros_like(pad)
    before[:, :-1] = pad[:, 1:] & ~pad[:, :-1]                 # <|vision_start|>: a pad run follows
    after = torch.zeros_like(pad)
    after[:, 1:] = pad[:, :-1] & ~pad[:, 1:]                   # <|vision_end|>: a pad run precedes
    number = torch.cumsum(before.long(), dim=1)
    return torch.where(pad | before | after, number, torch.zeros_like(number))


def frame_local_mask(ids: torch.Tensor, image_token_id: int, rows: torch.Tensor,
                     causal: torch.Tensor) -> torch.Tensor:
    """The frame-local attention layout (LLMConfig.image_attention = "frame_local").

    ids (B, T) written at cache rows `rows` (T,); causal (T, L) the call's causal mask over L
    key rows. Returns (B, 1, T, L) bool: a row of an image block (image_blocks) sees only the
    rows of its own block at or before it (not the text before the image, not other images);
    every other row sees every row at or before it, as under "causal". Key rows outside this
    call are never in a block of this call, so the blocks must be written by the call that
    holds them (prefill), as DeepStack already requires."""
    seg = image_blocks(ids, image_token_id)                                  # (B, T)
    keys = torch.full((ids.shape[0], causal.shape[-1]), -1, dtype=seg.dtype, device=seg.device)
    keys = keys.index_copy(1, rows, seg)                                     # (B, L)
    own = seg[:, :, None] == keys[:, None, :]
    return (causal[None] & ((seg == 0)[:, :, None] | own))[:, None]


def write_kv(cache, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """cache (2, B, KVH, max_len, D) (or a pair [K, V] of (B, KVH, max_len, D): the export's
    per-layer copies) <- k, v (B, KVH, T, D) at `rows` (T,); -> all K, all V."""
    cache[0].index_copy_(2, rows, k.to(cache[0].dtype))
    cache[1].index_copy_(2, rows, v.to(cache[1].dtype))
    return cache[0], cache[1]


def expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, KVH, ..., D) -> (B, H, ..., D): query head h reads KV head h // (H / KVH)."""
    groups = heads // t.shape[1]
    return t.repeat_interleave(groups, dim=1) if groups > 1 else t


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) v, grouped-query: each KV head serves H/KVH query heads.

    q (B, H, Tq, D); k, v (B, KVH, Tk, D); returns (B, Tq, H*D).
    """
    B, H, Tq, D = q.shape
    k, v = expand_kv(k, H), expand_kv(v, H)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    return out.transpose(1, 2).reshape(B, Tq, H * D)


class Attention(nn.Module):
    """The projections of one attention layer; the attention itself is `attend`."""

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

    def project(self, x: torch.Tensor):
        """x (B, T, hidden) -> q (B, H, T, D), k, v (B, KVH, T, D) before rope (norms applied)."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, T, hidden) -> q (B, H, T, D), k, v (B, KVH, T, D); rope on q and k."""
        q, k, v = self.project(x)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class DecoderBlock(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(x)): the Qwen2/Qwen3 decoder layer.

    qkv and finish are the two halves around the attention, public for forwards whose keys
    come from elsewhere (the action expert's [target cache, own rows], the draft chain's
    training passes); forward is the layer over the one cache contract."""

    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attn = Attention(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim,
                                   cfg.qk_norm, cfg.qkv_bias, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.intermediate)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, T, hidden) -> q (B, H, T, D), k, v (B, KVH, T, D) of norm(x), rope applied."""
        return self.self_attn.qkv(self.input_layernorm(x), cos, sin)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x (B, T, hidden), attn (B, T, H*D) -> the layer's output (B, T, hidden)."""
        x = x + self.self_attn.o_proj(attn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, cos, sin, cache: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """cache (2, B, KVH, max_len, D) written at rows (T,), attended under mask (T, max_len);
        without a cache: attention over the T rows, causal unless `mask` says otherwise."""
        q, k, v = self.qkv(x, cos, sin)
        if cache is not None:
            k, v = write_kv(cache, rows, k, v)
        return self.finish(x, attend(q, k, v, mask, causal=mask is None))


def new_kv_cache(layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device=None) -> torch.Tensor:
    """Zeroed buffer (layers, 2, B, kv_heads, max_len, head_dim); index 0 = K, 1 = V."""
    return torch.zeros(layers, 2, batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
