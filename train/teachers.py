"""What a draft learns from and is measured against: one no-grad target pass over prompt +
reasoning per scene (the teacher), and the draft's inputs over a batch of teachers. Shared by
distillation (train.distill) and evaluation (train.evaluate).

    Teacher           ids, positions, first/cot_end rows, image embeds, fused features,
                      target logits and top hidden at the reasoning rows (fp16)
    build_teachers(target, examples, feature_layers, batch) -> [Teacher]
    draft_inputs(teachers, draft, pad_id, gap=0) -> ids, cos, sin, shifted features, image embeds

`gap` (the FlatRoPE dose-response): the draft's position ids of the reasoning rows move on by
`gap` copies of the prompt's image region, as if that many more image blocks sat between the
history and the reasoning: by the region's row count under FlatRoPE, by its M-RoPE span under
M-RoPE (`image_span`). The target, its features and every token stay as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.draft import Draft, shift_features
from prompt.positions import flat_position_ids
from train import data


@dataclass
class Teacher:
    ids: np.ndarray          # (T,) prompt + greedy reasoning up to <|cot_end|>
    positions: np.ndarray    # (3, T) target M-RoPE ids
    first: int               # reasoning_start: first row a draft writes
    cot_end: int
    image_embeds: torch.Tensor   # (n_vision, D) fp16
    feats: torch.Tensor      # (T, 3D) fp16 target hiddens of feature_layers (unshifted)
    logits: torch.Tensor     # (cot_end - first, V) fp16 target logits at rows first..cot_end-1
    top: torch.Tensor        # (cot_end - first, D) fp16 target last-layer hidden at those rows


@torch.no_grad()
def build_teachers(target, examples: list, feature_layers: tuple, batch: int) -> list[Teacher]:
    out, last = [], target.cfg.llm.layers - 1
    for s in range(0, len(examples), batch):
        chunk = examples[s:s + batch]
        b = data.collate(chunk, 0, target.cfg.vision).to(target.embed_tokens.weight.device)
        embeds, deep = target.encode_images(b.pixels, b.grid_thw)
        logits, hid = target(b.ids, *target.rope(b.positions), None, 0, embeds, deep,
                             hidden_layers=(*feature_layers, last))
        feats, top = torch.cat(hid[:-1], -1), hid[-1]
        n_img = embeds.shape[0] // len(chunk)
        for i, e in enumerate(chunk):
            n, f, c = len(e.ids), e.reasoning_start, e.cot_end
            out.append(Teacher(e.ids, e.positions, f, c, embeds[i * n_img:(i + 1) * n_img].half(),
                               feats[i, :n].half(), logits[i, f:c].half(), top[i, f:c].half()))
    return out


def image_span(t: Teacher, image_token_id: int) -> tuple[int, int]:
    """(rows, M-RoPE span) of the prompt's image region: from the first <|vision_start|> (the row
    before the first image pad) to the row after the last <|vision_end|>."""
    pads = np.flatnonzero(t.ids == image_token_id)
    if pads.size == 0:
        raise ValueError("a position gap needs image tokens in the prompt; this one has none")
    s, e = int(pads[0]) - 1, int(pads[-1]) + 2
    return e - s, int(t.positions[0, e] - t.positions[0, s])


def draft_inputs(teachers: list[Teacher], draft: Draft, pad_id: int, gap: int = 0):
    """Right-padded ids (B, T), cos/sin of the draft's rope, shifted features, image embeds;
    `gap` image regions' worth of positions before the reasoning rows (module docstring)."""
    B, T = len(teachers), max(len(t.ids) for t in teachers)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mpos = torch.zeros(3, B, T, dtype=torch.long)
    flat = torch.from_numpy(flat_position_ids(T))[None].repeat(B, 1)
    feats = torch.zeros(B, T, teachers[0].feats.shape[-1])
    for b, t in enumerate(teachers):
        n = len(t.ids)
        ids[b, :n] = torch.from_numpy(t.ids)
        mpos[:, b, :n] = torch.from_numpy(t.positions)
        mpos[:, b, n:] = mpos[:, b, n - 1:n] + torch.arange(1, T - n + 1)
        if gap:
            rows, span = image_span(t, draft.image_token_id)
            flat[b, t.first:] += gap * rows
            mpos[:, b, t.first:] += gap * span
        feats[b, :n] = t.feats.float()
    cos, sin = draft.rope(flat if draft.cfg.rope == "flat" else mpos)
    image_embeds = torch.cat([t.image_embeds.float() for t in teachers])
    dev = draft.norm.weight.device
    features = shift_features(feats.to(dev)) if draft.cfg.features == "fused" else None
    return ids.to(dev), cos, sin, features, image_embeds
