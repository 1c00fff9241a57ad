"""The target VLA (deliberative reasoner): vision tower + Qwen3/Qwen2.5-style decoder LLM with
M-RoPE + LM head over text and trajectory tokens. One readable page; blocks live in layers.py.

    t = Target(cfg)                                      cfg: models.config.TargetConfig
    embeds, deepstack = t.encode_images(pixel_patches, grid_thw)
    cos, sin = t.rope(position_ids)                      (3, B, T) M-RoPE or (B, T) 1D ids
    cache = t.new_cache(batch, max_len)                  (layers, 2, B, kv_heads, max_len, D)
    logits, hiddens = t(ids, cos, sin, cache, start, embeds, deepstack, hidden_layers=(2, 6, 9))

Image layout (cfg.llm.image_attention): "causal" is HF Qwen-VL's; under "frame_local" the rows
of each image block (<|vision_start|> pads <|vision_end|>) attend to their own block alone and
every other row to everything before it (models.layers.frame_local_mask, docs/architecture.md).
A frame_local block's K before rope and its V depend on its pixels only: image_block_kv computes
them on their own, write_image_blocks rotates the keys into a cache (streaming prefill).

Prefill writes rows [0, T); each decode or verify call writes rows start..start+k-1 (index_copy_)
and attends over the whole cache under a mask that hides rows > start + i (one static shape per
k). Verifying k draft tokens is one call with T = k; rolling back after a rejection is passing
a smaller `start` next time (stale rows are masked, and get overwritten).
"""
from __future__ import annotations

import torch
from torch import nn

from models.config import TargetConfig
from models.layers import (DecoderBlock, RMSNorm, attend, cache_rows, frame_local_mask, image_mask,
                           inference_plan, new_kv_cache)
from models.rope import apply_rope, rope_cos_sin
from models.vision import VisionTower


class Target(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        llm = cfg.llm
        self.visual = VisionTower(cfg.vision, llm.hidden)
        self.embed_tokens = nn.Embedding(llm.vocab_size, llm.hidden)
        self.layers = nn.ModuleList(DecoderBlock(llm) for _ in range(llm.layers))
        self.norm = RMSNorm(llm.hidden, llm.norm_eps)
        self.lm_head = nn.Linear(llm.hidden, llm.vocab_size, bias=False)
        self.apply(_init_weights)
        if llm.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def rope(self, position_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """(3, B, T) M-RoPE ids or (B, T) 1D ids (torch or numpy) -> cos, sin (B, T, head_dim)."""
        llm = self.cfg.llm
        pos = torch.as_tensor(position_ids, device=self.embed_tokens.weight.device)
        return rope_cos_sin(pos, llm.head_dim, llm.rope_theta, llm.mrope_section, llm.interleaved)

    def new_cache(self, batch: int, max_len: int, dtype=None, device=None) -> torch.Tensor:
        w = self.embed_tokens.weight
        llm = self.cfg.llm
        return new_kv_cache(llm.layers, batch, llm.kv_heads, max_len, llm.head_dim,
                            dtype or w.dtype, device or w.device)

    def encode_images(self, pixel_patches: torch.Tensor, grid_thw):
        """(N_patches, C*tp*p*p) + grid_thw (n, 3) -> (embeds (N, D), deepstack list[(N, D)])."""
        return self.visual(pixel_patches, grid_thw)

    def forward(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: torch.Tensor | None = None, start=0,
                image_embeds: torch.Tensor | None = None, deepstack=None,
                hidden_layers=(), tree=None, kv_len: int | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids (B, T); cos/sin (B, T, head_dim) -> logits (B, T, V) and, for each index i in
        hidden_layers, the residual stream after layer i (B, T, D) (DeepStack included).

        cache (layers, 2, B, KVH, max_len, D), or a list of per-layer (2, B, KVH, max_len, D)
        buffers, or None (causal over the T rows): the K/V of the
        T tokens are written at rows start .. start+T-1 and attention runs over all max_len
        rows under a mask (models.layers); `start` an int or a (1,) device tensor.
        image_embeds (N, D) fill the image tokens of `ids` in row-major (batch, then position)
        order. DeepStack: after LLM layer i (i < len(deepstack)) the image positions get
        deepstack[i] (N, D) added; the vision tokens must be in this call's `ids`.
        tree (T, max_len) bool, with a cache and no images: replaces the causal mask (a token
        tree: models.layers.tree_mask; the rows are still start .. start+T-1).
        kv_len (an int, with a cache): the inference path, attending over cache rows
        0 .. kv_len-1 only (start + T <= kv_len; models.layers.kv_bucket picks it), with the
        fused kernels (models.layers docstring); None: over all max_len rows, the reference.
        """
        x = self.embed_tokens(ids)
        mask = None
        if image_embeds is not None:
            mask = image_mask(ids, self.cfg.image_token_id, image_embeds.shape[0])
            x = x.masked_scatter(mask, image_embeds.to(x.dtype))
        deepstack = list(deepstack or [])
        if deepstack and mask is None:
            raise ValueError("deepstack features need image_embeds in the same call")
        missing = [i for i in hidden_layers if not 0 <= i < len(self.layers)]
        if missing:
            raise ValueError(f"hidden_layers {missing} out of range; allowed 0..{len(self.layers) - 1}")
        rows, attn_mask = (None, None) if cache is None else \
            cache_rows(start, ids.shape[1], cache[0][0].shape[-2], ids.device)
        if tree is not None:
            if cache is None or mask is not None:
                raise ValueError("a tree mask needs a cache and a call without images")
            attn_mask = tree
        if mask is not None and self.cfg.llm.image_attention == "frame_local":
            if cache is None:
                rows, causal = cache_rows(0, ids.shape[1], ids.shape[1], ids.device)
                attn_mask = frame_local_mask(ids, self.cfg.image_token_id, rows, causal)
                rows = None
            else:
                attn_mask = frame_local_mask(ids, self.cfg.image_token_id, rows, attn_mask)
        plan = None if kv_len is None else inference_plan(self.cfg.llm, cache, start, ids.shape[1], kv_len,
                                                           attn_mask, cos, sin, x.dtype)
        hiddens = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], rows, attn_mask, plan)
            if i < len(deepstack):  # x[image positions] += deepstack[i], out of place
                x = x + torch.zeros_like(x).masked_scatter(mask, deepstack[i].to(x.dtype))
            hiddens[i] = x
        logits = self.head(x) if plan is None else self.lm_head(self.norm.fast(x))
        return logits, [hiddens[i] for i in hidden_layers]

    def image_block_kv(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       image_embeds: torch.Tensor, deepstack=(), hidden_layers=()
                       ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor]]:
        """Frame-local targets: the K (before rope) and V of image blocks computed on their own.

        ids (n, L): n whole image blocks (<|vision_start|> pads <|vision_end|>) of one length;
        cos/sin (n, L, head_dim) at any positions (only differences reach the attention);
        image_embeds / deepstack: the n images' features in order. Returns per layer (k, v),
        each (n, KVH, L, D). Under "frame_local" a block's rows attend to that block alone, so
        these are the rows a full prefill writes, before its keys are rotated to their slot
        (write_image_blocks): a function of the image's pixels alone. Also the residual stream
        after each layer of hidden_layers (n, L, D), as forward() gives it."""
        if self.cfg.llm.image_attention != "frame_local":
            raise ValueError("image_block_kv needs a frame_local target (llm.image_attention); "
                             f"this one is {self.cfg.llm.image_attention!r}")
        x = self.embed_tokens(ids)
        mask = image_mask(ids, self.cfg.image_token_id, image_embeds.shape[0])
        x = x.masked_scatter(mask, image_embeds.to(x.dtype))
        deepstack, out, hiddens = list(deepstack or []), [], {}
        for i, layer in enumerate(self.layers):
            q, k, v = layer.self_attn.project(layer.input_layernorm(x))
            out.append((k, v))
            attn = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, causal=True)
            x = layer.finish(x, attn)
            if i < len(deepstack):
                x = x + torch.zeros_like(x).masked_scatter(mask, deepstack[i].to(x.dtype))
            hiddens[i] = x
        return out, [hiddens[i] for i in hidden_layers]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Residual stream (B, T, D) -> logits (B, T, V)."""
        return self.lm_head(self.norm(x))


def write_image_blocks(cache, block_kv, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Write image blocks' K/V (Target.image_block_kv: per layer (k, v) (n, KVH, L, D), k before
    rope) into a batch-1 cache at `rows` (n*L,), the n blocks in order; the keys rotated by
    cos/sin (1, n*L, head_dim), this cycle's positions of those rows."""
    for layer, (k, v) in zip(cache, block_kv):
        n, kvh, L, d = k.shape
        k = k.permute(1, 0, 2, 3).reshape(1, kvh, n * L, d)
        v = v.permute(1, 0, 2, 3).reshape(1, kvh, n * L, d)
        layer[0].index_copy_(2, rows, apply_rope(k, cos, sin).to(layer[0].dtype))
        layer[1].index_copy_(2, rows, v.to(layer[1].dtype))


def _init_weights(module: nn.Module, std: float = 0.02) -> None:
    """N(0, 0.02) weights, zero biases (transformers' Qwen initializer_range)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@torch.no_grad()
def greedy_generate(target: Target, ids: torch.Tensor, position_ids, rope_delta: int,
                    n_new: int, image_embeds=None, deepstack=None) -> torch.Tensor:
    """Reference greedy decoding with the cache: prefill, then one token per call.

    ids (1, T) prompt; position_ids (3, 1, T) (or (1, T) for 1D); later tokens at cache row
    i get position i + rope_delta on all three axes. Returns (n_new,) new token ids.
    """
    T = ids.shape[1]
    cache = target.new_cache(1, T + n_new)
    logits, _ = target(ids, *target.rope(position_ids), cache, 0, image_embeds, deepstack)
    out = [int(logits[0, -1].argmax())]
    for i in range(T, T + n_new - 1):
        pos = torch.full((1, 1), i + rope_delta, dtype=torch.long)
        pos = pos.expand(3, 1, 1) if target.cfg.llm.mrope_section else pos
        logits, _ = target(torch.tensor([[out[-1]]]), *target.rope(pos), cache, i)
        out.append(int(logits[0, -1].argmax()))
    return torch.tensor(out)
