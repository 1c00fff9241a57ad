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
        .forward(x, cos, sin, cache=None, rows=None, mask=None, plan=None)   plan: the inference path
    new_kv_cache(layers, batch, kv_heads, max_len, head_dim, dtype, device)
        -> zeros (layers, 2, B, kv_heads, max_len, head_dim)
    kv_bucket(need, max_len, smallest=256) -> the static kv length of a call that reads `need` rows
    attn_plan(mask, kv_len, heads, kv_heads, cos, sin, dtype) -> AttnPlan (once per forward)
    attend_plan(q, k, v, plan) -> (B, Tq, H*D): attention over the first plan.kv_len cache rows
    fuse_projections(module, on=True)      q/k/v and gate/up as one product each (inference)

The one cache contract (gpt-fast style): the KV cache is one preallocated buffer; a layer gets
its slice cache[i] (2, B, KVH, max_len, D). A forward of T tokens writes their K/V at `rows`
(a (T,) device tensor, start .. start+T-1) with index_copy_ and attends over all max_len rows
with `mask` (T, max_len): row i sees keys j <= start + i. Nothing in it depends on a host value,
so one code path runs eager on CPU, is captured in a CUDA graph (start a device tensor) and
exports to ONNX with static shapes. Rows past start+T are stale and masked, so rolling back is
the caller passing a smaller `start` next time. Module names follow transformers' Qwen naming
so that checkpoint I/O is a prefix mapping.

The inference path (a forward given `kv_len`, models.target / models.draft): a call attends over
the first `kv_len` cache rows only, a static length the caller picks (kv_bucket: the smallest
power-of-two multiple of 256 rows that holds start + T, capped at max_len), so a CUDA graph is
captured per (width, bucket) and a replay reads the valid rows and at most as many stale ones,
not all max_len. What varies per replay stays on the device: `start` (a (1,) tensor) makes the
rows and the mask, and the mask hides the stale rows inside the bucket exactly as the full
mask hides them (their scores are -inf either way, so the result is the masked attention's up
to the order of float sums). The bucket itself cannot be a device value: a graph's shapes are
fixed at capture, so the host chooses it from the start it already knows (an int) before the
replay. The same path computes with fewer, larger kernels: the mask is made additive, cut to
the bucket and tiled over the query groups once per forward (AttnPlan), the query heads of one
KV head are attended as one block of rows (no repeat of K/V), q and k are normed and rotated
together (RMSNorm through F.rms_norm, rotary as one roll and one fused multiply-add, the
tables cast once per forward), and the residual adds ride on the o/down products (addmm).
fuse_projections adds one product for q/k/v and one for gate/up: the concatenated weights are
built when first used and rebuilt whenever a part changes (its storage or version), held
outside the state_dict (the checkpoint format, calibration and the exports see the separate
modules), at the cost of a second copy of those weights; a quantized or wrapped projection
(not a plain nn.Linear) is never fused. Under ONNX export or tracing the plain path runs.
"""
from __future__ import annotations

from dataclasses import dataclass

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

    def fast(self, x: torch.Tensor) -> torch.Tensor:
        """forward in one op where x and the weight share a dtype (F.rms_norm; its sums in fp32)."""
        if x.dtype != self.weight.dtype or plain_path():
            return self(x)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class SwiGLU(nn.Module):
    fuse = False        # fuse_projections: gate and up as one product

    def __init__(self, dim: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(dim, intermediate, bias=bias)
        self.up_proj = nn.Linear(dim, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def residual(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x + forward(h), the inference path's kernels: one gate-up product where fused, the add
        on the down product."""
        fused = fused_linear(self, "_gate_up", (self.gate_proj, self.up_proj)) if self.fuse else None
        if fused is None:
            g, u = self.gate_proj(h), self.up_proj(h)
        else:
            g, u = F.linear(h, *fused).chunk(2, dim=-1)
        return add_linear(x, F.silu(g) * u, self.down_proj)


def plain_path() -> bool:
    """True while exporting or tracing: the models then run the reference ops only."""
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing() or torch.compiler.is_compiling()


def fused_linear(owner: nn.Module, name: str, parts) -> tuple | None:
    """(weight, bias) of the nn.Linear `parts` concatenated along out_features, kept on `owner`
    outside its state_dict and rebuilt when a part's weight or bias is replaced or changed in
    place (data pointer or version). None where a part is not a plain nn.Linear (quantized,
    wrapped), or while exporting: the caller then runs the parts one by one."""
    if plain_path() or any(type(m) is not nn.Linear for m in parts):
        return None
    key = version_key([t for m in parts for t in (m.weight, m.bias) if t is not None])
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != key:
        with torch.no_grad():
            weight = torch.cat([m.weight for m in parts]).detach()
            bias = None if parts[0].bias is None else torch.cat([m.bias for m in parts]).detach()
        cached = (key, (weight, bias))
        owner.__dict__[name] = cached
    return cached[1]


def version_key(tensors) -> tuple:
    """What changes when a parameter is replaced (storage, device, dtype) or written in place
    (torch's version counter, bumped by every in-place op: copy_, an optimizer step, load)."""
    return tuple((t.data_ptr(), t._version, t.device, t.dtype) for t in tensors)


def add_linear(x: torch.Tensor, h: torch.Tensor, linear: nn.Module) -> torch.Tensor:
    """x + linear(h) with the add inside the product (addmm) for a plain bias-free nn.Linear."""
    if type(linear) is not nn.Linear or linear.bias is not None or plain_path():
        return x + linear(h)
    out = torch.addmm(x.reshape(-1, x.shape[-1]), h.reshape(-1, h.shape[-1]), linear.weight.t())
    return out.view(x.shape)


def fuse_projections(module: nn.Module, on: bool = True) -> nn.Module:
    """Turn the one-product q/k/v and gate/up of every attention and SwiGLU under `module` on (or
    off) for the inference path (a forward given kv_len). The fused weights are a second copy,
    built on first use (module docstring); the state_dict is unchanged. Returns `module`."""
    for m in module.modules():
        if isinstance(m, (Attention, SwiGLU)):
            m.fuse = on
            m.__dict__.pop("_qkv", None), m.__dict__.pop("_gate_up", None)
    return module


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


def kv_bucket(need: int, max_len: int, smallest: int = 256) -> int:
    """The static kv length of a call that must read `need` cache rows (start + T): the smallest
    `smallest` x 2^i >= need, capped at max_len (module docstring). A few buckets per cache keep
    the CUDA graphs few (one per width and bucket) and a replay within 2x of the rows it needs."""
    if not 1 <= need <= max_len:
        raise ValueError(f"need={need} cache rows: allowed 1..max_len={max_len}")
    if smallest < 1:
        raise ValueError(f"smallest={smallest}: the first bucket, an int >= 1")
    size = smallest
    while size < need:
        size *= 2
    return min(size, max_len)


@dataclass
class AttnPlan:
    """What every layer of one inference forward shares (attn_plan, made once per forward)."""
    kv_len: int              # cache rows attended: 0 .. kv_len-1 (static: one CUDA graph's)
    mask: torch.Tensor       # additive, (B | 1, 1, G*T, kv_len): query group g, row t at g*T + t
    groups: int              # G = query heads per KV head
    cos: torch.Tensor        # (B, T, 1, D) in the activations' dtype
    sin: torch.Tensor        # (B, T, 1, D), its first half negated: rotate_half as a roll


def attn_plan(mask: torch.Tensor, kv_len: int, heads: int, kv_heads: int, cos: torch.Tensor,
              sin: torch.Tensor, dtype: torch.dtype) -> AttnPlan:
    """mask (T, L) or (B, 1, T, L) bool over the whole cache (cache_rows, tree_mask,
    frame_local_mask), kv_len <= L -> the plan of attend_plan and DecoderBlock's inference path."""
    if not 1 <= kv_len <= mask.shape[-1]:
        raise ValueError(f"kv_len={kv_len}: allowed 1..max_len={mask.shape[-1]}")
    m = mask[..., :kv_len]
    m = m.reshape(1, 1, *m.shape) if m.dim() == 2 else m                  # (B | 1, 1, T, kv_len)
    G = heads // kv_heads
    m = m[:, :, None].expand(m.shape[0], 1, G, *m.shape[2:]).reshape(m.shape[0], 1, G * m.shape[2], kv_len)
    add = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, float("-inf"))
    half = cos.shape[-1] // 2
    sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return AttnPlan(kv_len, add, G, cos.to(dtype).unsqueeze(2), sin.to(dtype).unsqueeze(2))


def inference_plan(llm: LLMConfig, cache, start, T: int, kv_len: int, mask, cos, sin, dtype):
    """The AttnPlan of a forward given kv_len (Target's and Draft's): kv_len checked against the
    cache and, where `start` is a host int, against start + T (a device start is the caller's:
    a CUDA graph replay cannot check it)."""
    if cache is None:
        raise ValueError("kv_len needs a cache (it says how many of its rows to read)")
    max_len = cache[0][0].shape[-2]
    if not torch.is_tensor(start) and not start + T <= kv_len <= max_len:
        raise ValueError(f"kv_len={kv_len}: allowed start + T = {start + T} .. max_len = {max_len}")
    return attn_plan(mask, kv_len, llm.heads, llm.kv_heads, cos, sin, dtype)


def rope_rows(x: torch.Tensor, plan: AttnPlan) -> torch.Tensor:
    """apply_rope on x (B, T, N, D) with the plan's tables: x cos + roll(x, D/2) sin' (sin' the
    table with its first half negated, so that roll(x) sin' = rotate_half(x) sin)."""
    return torch.addcmul(x * plan.cos, torch.roll(x, x.shape[-1] // 2, dims=-1), plan.sin)


def attend_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: AttnPlan) -> torch.Tensor:
    """attend(q, k, v, mask) over the first plan.kv_len rows of k, v (B, KVH, L, D): the G query
    heads of a KV head as one block of G*T rows (no K/V repeat), the plan's additive mask."""
    B, H, T, D = q.shape
    kvh = k.shape[1]
    qg = q.reshape(B, kvh, plan.groups * T, D)
    out = F.scaled_dot_product_attention(qg, k[:, :, :plan.kv_len], v[:, :, :plan.kv_len],
                                         attn_mask=plan.mask)
    return out.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)    # a kernel may lay it out (B, G*T, KVH, D)


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
    fuse = False        # fuse_projections: q, k and v as one product

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

    def qkv_plan(self, x: torch.Tensor, plan: AttnPlan):
        """qkv on the inference path: one product where fused, q and k normed and rotated as one
        (B, T, H + KVH, D) block."""
        B, T, _ = x.shape
        H, kvh, D = self.heads, self.kv_heads, self.head_dim
        fused = fused_linear(self, "_qkv", (self.q_proj, self.k_proj, self.v_proj)) if self.fuse else None
        if fused is None:
            parts = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
            qk = torch.cat(parts[:2], dim=-1).view(B, T, H + kvh, D)
            v = parts[2].view(B, T, kvh, D)
        else:
            out = F.linear(x, *fused).view(B, T, H + 2 * kvh, D)
            qk, v = out[:, :, :H + kvh], out[:, :, H + kvh:]
        if isinstance(self.q_norm, RMSNorm):
            qk = F.rms_norm(qk, (D,), None, self.q_norm.eps) * self._qk_norm_weight()
        qk = rope_rows(qk, plan)
        return qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v.transpose(1, 2)

    def _qk_norm_weight(self) -> torch.Tensor:
        """(H + KVH, D): q_norm's weight for each query head, k_norm's for each KV head."""
        w = (self.q_norm.weight, self.k_norm.weight)
        key = version_key(w)
        cached = self.__dict__.get("_qk_w")
        if cached is None or cached[0] != key:
            with torch.no_grad():
                both = torch.cat([w[0].expand(self.heads, -1), w[1].expand(self.kv_heads, -1)])
            cached = (key, both)
            self.__dict__["_qk_w"] = cached
        return cached[1]


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
                mask: torch.Tensor | None = None, plan: AttnPlan | None = None) -> torch.Tensor:
        """cache (2, B, KVH, max_len, D) written at rows (T,), attended under mask (T, max_len);
        without a cache: attention over the T rows, causal unless `mask` says otherwise. With a
        plan (and a cache): the inference path, over the plan's kv_len rows (module docstring)."""
        if plan is not None and not plain_path():
            return self.forward_plan(x, cache, rows, plan)
        q, k, v = self.qkv(x, cos, sin)
        if cache is not None:
            k, v = write_kv(cache, rows, k, v)
        return self.finish(x, attend(q, k, v, mask, causal=mask is None))

    def forward_plan(self, x, cache, rows: torch.Tensor, plan: AttnPlan) -> torch.Tensor:
        """The inference path: forward's result with fewer, larger kernels (module docstring)."""
        q, k, v = self.self_attn.qkv_plan(self.input_layernorm.fast(x), plan)
        k, v = write_kv(cache, rows, k, v)
        x = add_linear(x, attend_plan(q, k, v, plan), self.self_attn.o_proj)
        return self.mlp.residual(x, self.post_attention_layernorm.fast(x))


def new_kv_cache(layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device=None) -> torch.Tensor:
    """Zeroed buffer (layers, 2, B, kv_heads, max_len, head_dim); index 0 = K, 1 = V."""
    return torch.zeros(layers, 2, batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
