"""Routine-reasoner distillation: each draft learns the target's own greedy reasoning.

1. The target writes its greedy CoC for every training scene (batched, cached as safetensors).
2. One no-grad target pass over prompt + reasoning gives the teacher: the fused features of
   `feature_layers` at every row, and at the reasoning rows the next-token logits and the top
   hidden state (kept in memory as fp16; every draft and seed reuses them).
3. Each draft trains teacher-forced with the chain passes of `train.ttt`:
       loss = mean_p [ KL(p_target || q_draft) + feature_weight * smoothL1(h_draft, h_target_top) ]
   over the text vocabulary (trajectory tokens are masked while reasoning, for both), on rows
   rs + p <= j < cot_end (row j predicts token j+1; the first CoC token is the target's own).
   A standalone draft (no features) has one pass and no feature loss.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models import io
from models.draft import Draft, shift_features
from prompt.config import to_dict
from prompt.positions import flat_position_ids
from train import ckpt, data, dist, loop, reasoning
from train.config import DistillConfig, RunConfig
from train.ttt import chain_forward

CHAIN_PASSES = 4      # draft-chain steps trained per row (EAGLE-3 training-time test)


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
        b = data.collate(chunk, 0, target.cfg.vision)
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


def draft_inputs(teachers: list[Teacher], draft: Draft, pad_id: int):
    """Right-padded ids (B, T), cos/sin of the draft's rope, shifted features, image embeds."""
    B, T = len(teachers), max(len(t.ids) for t in teachers)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mpos = torch.zeros(3, B, T, dtype=torch.long)
    feats = torch.zeros(B, T, teachers[0].feats.shape[-1])
    for b, t in enumerate(teachers):
        n = len(t.ids)
        ids[b, :n] = torch.from_numpy(t.ids)
        mpos[:, b, :n] = torch.from_numpy(t.positions)
        mpos[:, b, n:] = mpos[:, b, n - 1:n] + torch.arange(1, T - n + 1)
        feats[b, :n] = t.feats.float()
    flat = torch.from_numpy(flat_position_ids(T))[None].expand(B, T)
    cos, sin = draft.rope(flat if draft.cfg.rope == "flat" else mpos)
    image_embeds = torch.cat([t.image_embeds.float() for t in teachers])
    features = shift_features(feats) if draft.cfg.features == "fused" else None
    return ids, cos, sin, features, image_embeds


def distill_loss(draft: Draft, teachers: list[Teacher], text_ids: torch.Tensor, cfg: DistillConfig,
                 pad_id: int) -> tuple[torch.Tensor, dict]:
    first = teachers[0].first
    if any(t.first != first for t in teachers):
        raise ValueError("all prompts of a batch must share one layout (one reasoning_start)")
    ids, cos, sin, features, image_embeds = draft_inputs(teachers, draft, pad_id)
    passes = chain_forward(draft, ids, cos, sin, features, image_embeds, first, CHAIN_PASSES)
    losses, logs = [], {}
    for p, (logits, hidden, rows) in enumerate(passes):
        per_scene, agree = [], []
        for b, t in enumerate(teachers):
            j = rows[(rows < t.cot_end)] - first             # teacher rows of this pass
            if len(j) == 0:
                continue
            r = j - (rows[0] - first)                        # rows inside this pass's output
            p_log = F.log_softmax(t.logits[j][:, text_ids].float() / cfg.temperature, -1)
            q_log = F.log_softmax(logits[b, r][:, text_ids].float() / cfg.temperature, -1)
            kl = (p_log.exp() * (p_log - q_log)).sum(-1).mean()
            feat = F.smooth_l1_loss(hidden[b, r].float(), t.top[j].float()) if features is not None else 0.0
            per_scene.append(cfg.kl_weight * kl + cfg.feature_weight * feat)
            agree.append((p_log.argmax(-1) == q_log.argmax(-1)).float().mean())
        if per_scene:
            losses.append(torch.stack(per_scene).mean())
            logs[f"acc{p}"] = float(torch.stack(agree).mean())
    loss = torch.stack(losses).mean()
    return loss, logs


def train_draft(variant: str, seed: int, cfg: DistillConfig, model_cfg, target, teachers, tok,
                out: Path) -> Path:
    """One draft of `variant` from seed `seed`; returns its checkpoint folder."""
    torch.manual_seed(seed)
    draft = Draft(ckpt.draft_config(model_cfg, variant), target.embed_tokens, target.lm_head)
    text_ids = torch.from_numpy(np.flatnonzero(tok.text_mask()))
    run = RunConfig(**{**to_dict(cfg.run), "out": str(out), "seed": seed})

    def step_fn(step):
        idx = data.batch_indices(len(teachers), run.batch_size, step, seed)
        return distill_loss(draft, [teachers[i] for i in idx], text_ids, cfg, tok.pad)

    def on_checkpoint(step):
        ckpt.save_draft(out / "ckpt", variant, model_cfg, draft,
                        {"stage": "distill", "step": step, "seed": seed, "target": cfg.target,
                         "scenes": len(teachers)})

    loop.fit(run, {"draft": draft}, step_fn, dist.World(), on_checkpoint, {"config": to_dict(cfg)})
    (out / "done.json").write_text(json.dumps({"steps": run.steps}) + "\n")
    return out / "ckpt" / f"draft-{variant}"


def run(cfg: DistillConfig) -> list[Path]:
    from train.sft import load_examples

    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    tok, model_cfg, target, _ = ckpt.load_planner(cfg.target)
    for p in target.parameters():
        p.requires_grad_(False)
    examples = load_examples(cfg.data, tok, model_cfg.target.vision)
    out = Path(cfg.run.out)
    source = io.read_meta(Path(cfg.target) / "target")["modules"]["target"]["sha256"]
    cache = reasoning.cache_reasoning(out / "reasoning.safetensors", target, examples, tok,
                                      cfg.max_new_tokens, cfg.gen_batch, source)
    print("greedy reasoning:", reasoning.summary(cache, tok))
    with_r = [reasoning.with_reasoning(e, cache["tokens"][i][:int(cache["lengths"][i])].numpy(), tok)
              for i, e in enumerate(examples)]
    teachers = build_teachers(target, with_r, tuple(model_cfg.draft.feature_layers), cfg.gen_batch)
    return [train_draft(v, s, cfg, model_cfg, target, teachers, tok, out / f"{v}-s{s}")
            for v in cfg.drafts for s in cfg.seeds]
