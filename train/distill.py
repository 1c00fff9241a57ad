"""Routine-reasoner distillation: each draft learns the target's own greedy reasoning.

1. The target writes its greedy CoC for every training scene (batched, cached as safetensors).
2. One no-grad target pass over prompt + reasoning gives the teacher: the fused features of
   `feature_layers` at every row, and at the reasoning rows the next-token logits and the top
   hidden state (kept in memory as fp16; every draft and seed reuses them).
3. Each draft trains teacher-forced with the chain passes of `models.chain`:
       loss = mean_p [ KL(p_target || q_draft) + feature_weight * smoothL1(h_draft, h_target_top) ]
   over the text vocabulary (trajectory tokens are masked while reasoning, for both), on rows
   rs + p <= j < cot_end (row j predicts token j+1; the first CoC token is the target's own).
   A standalone draft (no features) has one pass and no feature loss.
   A reduced head (`draft_vocab: N`) is the N tokens the target writes most on the training
   split's CoCs (+ <|cot_end|> and the other special tokens, prompt/draft_vocab.py), its rows
   initialised from the target head's; its KL is over the head's text tokens, p renormalised
   there (EAGLE-3): KL(p restricted to the head || q).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models import io
from models.chain import chain_forward
from models.draft import Draft
from prompt import draft_vocab
from core.config import to_dict
from train import ckpt, data, dist, loop, reasoning, vocab
from train.config import DistillConfig, RunConfig
from train.teachers import Teacher, build_teachers, draft_inputs

CHAIN_PASSES = 4      # draft-chain steps trained per row (EAGLE-3 training-time test)


def distill_loss(draft: Draft, teachers: list[Teacher], text_ids, cfg: DistillConfig,
                 pad_id: int) -> tuple[torch.Tensor, dict]:
    """text_ids: (K,) target ids the KL runs over, or a pair ((K,) target ids, (K,) the same
    tokens' rows of the draft's reduced head)."""
    text_ids, head_ids = text_ids if isinstance(text_ids, tuple) else (text_ids, text_ids)
    first = teachers[0].first
    if any(t.first != first for t in teachers):
        raise ValueError("all prompts of a batch must share one layout (one reasoning_start)")
    ids, cos, sin, features, image_embeds = draft_inputs(teachers, draft, pad_id, cfg.position_gap)
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
            q_log = F.log_softmax(logits[b, r][:, head_ids].float() / cfg.temperature, -1)
            kl = (p_log.exp() * (p_log - q_log)).sum(-1).mean()
            feat = F.smooth_l1_loss(hidden[b, r].float(), t.top[j].float()) if features is not None else 0.0
            per_scene.append(cfg.kl_weight * kl + cfg.feature_weight * feat)
            agree.append((p_log.argmax(-1) == q_log.argmax(-1)).float().mean())
        if per_scene:
            losses.append(torch.stack(per_scene).mean())
            logs[f"acc{p}"] = float(torch.stack(agree).mean())
    loss = torch.stack(losses).mean()
    return loss, logs


def head_map(cfg: DistillConfig, tok) -> np.ndarray:
    """d2t of the `draft_vocab`-token head, counted on the data's train-split CoCs, each closed by
    <|cot_end|> as the target writes it."""
    texts = vocab.dataset_corpus(cfg.data.dir)
    counts = draft_vocab.token_counts(texts, tok)
    counts[tok.cot_end] += len(texts)
    d2t = draft_vocab.build_d2t(counts, tok, cfg.draft_vocab)
    print(f"draft head: {cfg.draft_vocab} tokens cover {draft_vocab.coverage(counts, d2t):.2%} of the "
          f"{int(counts.sum())} CoC tokens of {len(texts)} train texts")
    return d2t


def train_draft(variant: str, seed: int, cfg: DistillConfig, model_cfg, target, teachers, tok,
                out: Path, d2t: np.ndarray | None = None, source: str | None = None) -> Path:
    """One draft of `variant` from seed `seed` (with the reduced head `d2t`, if given); returns
    its checkpoint folder. `source`: the target weights' sha256, recorded in its meta.json."""
    torch.manual_seed(seed)
    vocab_n = 0 if d2t is None else len(d2t)
    draft = Draft(ckpt.draft_config(model_cfg, variant, vocab_n), target.embed_tokens, target.lm_head)
    draft.to(target.embed_tokens.weight.device)
    text_ids = torch.from_numpy(np.flatnonzero(tok.text_mask()))
    if d2t is not None:
        draft.set_vocab(d2t)
        rows = np.flatnonzero(tok.text_mask()[d2t])       # head rows holding text tokens
        text_ids = (torch.from_numpy(d2t[rows]), torch.from_numpy(rows))
    run = RunConfig(**{**to_dict(cfg.run), "out": str(out), "seed": seed})

    def step_fn(step):
        idx = data.batch_indices(len(teachers), run.batch_size, step, seed)
        return distill_loss(draft, [teachers[i] for i in idx], text_ids, cfg, tok.pad)

    def on_checkpoint(step):
        ckpt.save_draft(out / "ckpt", variant, model_cfg, draft,
                        {"stage": "distill", "step": step, "seed": seed, "target": cfg.target,
                         "target_sha256": source, "scenes": len(teachers), "position_gap": cfg.position_gap})

    loop.fit(run, {"draft": draft}, step_fn, dist.World(), on_checkpoint, {"config": to_dict(cfg)})
    (out / "done.json").write_text(json.dumps({"steps": run.steps}) + "\n")
    return out / "ckpt" / f"draft-{ckpt.variant_name(variant, vocab_n)}"


def run(cfg: DistillConfig) -> list[Path]:
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    tok, model_cfg, target, _ = io.load_planner(cfg.target)
    target.to(loop.device(cfg.run.device))
    for p in target.parameters():
        p.requires_grad_(False)
    examples = data.load_examples(cfg.data, tok, model_cfg.target.vision)
    out = Path(cfg.run.out)
    source = ckpt.target_sha256(cfg.target)
    cache = reasoning.cache_reasoning(cfg.reasoning_cache or out / "reasoning.safetensors", target, examples, tok,
                                      cfg.max_new_tokens, cfg.gen_batch, source)
    print("greedy reasoning:", reasoning.summary(cache, tok))
    with_r = [reasoning.with_reasoning(e, cache["tokens"][i][:int(cache["lengths"][i])].numpy(), tok)
              for i, e in enumerate(examples)]
    teachers = {}        # per feature layers (an EAGLE-3 draft reads other target layers)
    d2t = head_map(cfg, tok) if cfg.draft_vocab else None
    out_dirs = []
    for v in cfg.drafts:
        layers = tuple(ckpt.draft_config(model_cfg, v).draft.feature_layers)
        if layers not in teachers:
            teachers[layers] = build_teachers(target, with_r, layers, cfg.gen_batch)
        out_dirs += [train_draft(v, s, cfg, model_cfg, target, teachers[layers], tok,
                                 out / f"{ckpt.variant_name(v, cfg.draft_vocab)}-s{s}", d2t, source)
                     for s in cfg.seeds]
    return out_dirs
