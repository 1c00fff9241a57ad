"""The target's own greedy reasoning on training scenes, batched, cached to disk (safetensors).

Every prompt of the synthetic world has the same layout (8 images of one size, 48 history
tokens), so a batch of prompts shares one length and one cache: prefill B prompts, then one
row per scene per decode call, each scene at M-RoPE position (row + its rope_delta). Trajectory
tokens are masked while reasoning; a scene stops at <|cot_end|> (later rows are ignored).

    RUN/reasoning.safetensors   tokens (N, max_new) int64 (pad after <|cot_end|>), lengths (N,),
                                index (N,) scene indices; metadata: target sha256, max_new
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from train import data


def prompt_batch(examples: list, vision) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inference prompts ids[:reasoning_start] -> ids (B, T0), positions (3, B, T0), rope
    delta (B,), pixels, grid_thw. All prompts must have one length (one layout)."""
    lengths = {e.reasoning_start for e in examples}
    if len(lengths) != 1:
        raise ValueError(f"prompts of different lengths {sorted(lengths)} cannot share a batch")
    T0 = lengths.pop()
    ids = torch.from_numpy(np.stack([e.ids[:T0] for e in examples]))
    pos = torch.from_numpy(np.stack([e.positions[:, :T0] for e in examples], axis=1))
    delta = torch.tensor([e.rope_delta for e in examples])
    pixels = torch.from_numpy(np.concatenate(
        [data.patchify(e.images, vision.patch, vision.temporal_patch, vision.merge)[0] for e in examples]))
    grid = torch.from_numpy(np.concatenate([e.grid_thw for e in examples]))
    return ids, pos, delta, pixels, grid


@torch.no_grad()
def greedy_reasoning(target, examples: list, tok, max_new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> tokens (B, max_new) (pad after <|cot_end|>), lengths (B,) (cot_end included; max_new
    when the budget ran out first)."""
    ids, pos, delta, pixels, grid = prompt_batch(examples, target.cfg.vision)
    B, T0 = ids.shape
    dev = target.embed_tokens.weight.device
    embeds, deepstack = target.encode_images(pixels.to(dev), grid)
    cache = target.new_cache(B, T0 + max_new)
    logits, _ = target(ids.to(dev), *target.rope(pos), cache, 0, embeds, deepstack)
    banned = torch.from_numpy(tok.traj_mask()).to(dev)
    out = torch.full((B, max_new), tok.pad, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    lengths = torch.full((B,), max_new, dtype=torch.long)
    for i in range(max_new):
        nxt = logits[:, -1].masked_fill(banned, float("-inf")).argmax(-1).cpu()
        nxt = torch.where(done, torch.full_like(nxt, tok.pad), nxt)
        out[:, i] = nxt
        ended = (nxt == tok.cot_end) & ~done
        lengths[ended] = i + 1
        done |= ended
        if bool(done.all()) or i == max_new - 1:
            break
        row = T0 + i                                    # cache row of the token just chosen
        p = (row + delta).view(1, B, 1).expand(3, B, 1)
        logits, _ = target(nxt[:, None].to(dev), *target.rope(p), cache, row)
    return out, lengths


def cache_reasoning(path, target, examples: list, tok, max_new: int, batch: int, source: str) -> dict:
    """Generate (or reuse, when `source` and `max_new` match) the cached greedy reasoning."""
    path = Path(path)
    meta = {"source": source, "max_new": str(max_new), "scenes": str(len(examples))}
    if path.is_file():
        with safetensors.safe_open(str(path), "pt") as f:
            if f.metadata() == meta:
                return {k: f.get_tensor(k) for k in f.keys()}
    toks, lens = [], []
    for s in range(0, len(examples), batch):
        t, n = greedy_reasoning(target, examples[s:s + batch], tok, max_new)
        toks.append(t)
        lens.append(n)
    out = {"tokens": torch.cat(toks), "lengths": torch.cat(lens),
           "index": torch.tensor([e.index for e in examples])}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    safetensors.torch.save_file(out, str(tmp), metadata=meta)
    tmp.rename(path)                    # atomic: a concurrent reader sees all or nothing
    return out


def with_reasoning(ex: data.Example, tokens: np.ndarray, tok) -> data.Example:
    """The example's prompt followed by the target's greedy reasoning (no future tokens):
    positions continue as text after the prompt (row + rope_delta on all three axes)."""
    T0 = ex.reasoning_start
    ids = np.concatenate([ex.ids[:T0], np.asarray(tokens, np.int64)])
    rows = np.arange(T0, len(ids))
    pos = np.concatenate([ex.positions[:, :T0], np.repeat((rows + ex.rope_delta)[None], 3, 0)], axis=1)
    ends = np.flatnonzero(np.asarray(tokens) == tok.cot_end)
    cot_end = T0 + int(ends[0]) if ends.size else len(ids) - 1
    return data.Example(ids, pos, ex.rope_delta, np.zeros(len(ids), np.int8), ex.images, ex.grid_thw,
                        T0, cot_end, ex.actions, ex.v0, ex.future, ex.history, ex.index)


def summary(cache: dict, tok) -> str:
    n = cache["lengths"].float()
    return json.dumps({"scenes": len(n), "mean_tokens": round(float(n.mean()), 2),
                       "ended": float((cache["tokens"] == tok.cot_end).any(1).float().mean())})
