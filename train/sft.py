"""Target SFT: next-token loss on the CoC and on the future tokens, flow matching of the action
expert on the target's KV cache (full reasoning and reasoning cut at a random point).

Losses of one batch (each a per-scene mean, then a mean over scenes, so data-parallel ranks
with equal slices average to exactly the single-process loss):

    coc     CE of CoC words and <|cot_end|>, trajectory logits set to -inf (Alpamayo-R1: no
            trajectory token may be chosen while reasoning)
    future  CE of <|traj_future_start|>, 128 future bins, <|traj_future_end|>, <|im_end|>
    expert  flow matching on the cache rows [0, cot_end] (cot_end fed, as the runtime's
            `action` call does), plus `expert_cuts` draws of a cut c ~ U{reasoning_start ..
            cot_end}: rows [0, c) (c = reasoning_start is the prefill-only fallback)

The expert reads a detached cache by default (knowledge insulation: its gradients do not
move the reasoning); `expert_grad_to_target` lets them through.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models import io
from models.action_expert import ActionExpert
from models.config import ModelConfig, load_preset
from models.target import Target
from core.config import to_dict
from prompt.tokenizer import load_tokenizer
from train import data, dist, loop
from train.config import SFTConfig
from train.vision import load_into_target
from train.vocab import build_tokenizer, dataset_corpus


def build_models(preset: str, tok, seed: int, image_attention: str = "") -> tuple[ModelConfig, Target, ActionExpert]:
    """The preset with vocabulary-dependent fields set from `tok` (and llm.image_attention,
    unless ''); weights seeded by `seed`."""
    cfg = io.with_tokenizer(load_preset(preset), tok)
    if image_attention:
        llm = dataclasses.replace(cfg.target.llm, image_attention=image_attention)
        cfg = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, llm=llm))
    target, expert, _ = io.new_models(cfg, seed)
    return cfg, target, expert


def per_scene_mean(values: torch.Tensor, rows: torch.Tensor, B: int, weights=None) -> torch.Tensor:
    """values (N,) belonging to scenes rows (N,) -> mean over scenes of each scene's
    (weighted) mean: sum_i w_i v_i / sum_i w_i per scene."""
    w = torch.ones_like(values) if weights is None else weights
    sums = torch.zeros(B, dtype=values.dtype, device=values.device).index_add(0, rows, values * w)
    counts = torch.zeros(B, dtype=values.dtype, device=values.device).index_add(0, rows, w)
    return (sums / counts.clamp(min=1e-9)).mean()


def token_losses(logits: torch.Tensor, batch: data.Batch, traj_mask: torch.Tensor,
                 commitment_weight: float = 1.0) -> dict:
    """logits (B, T, V) -> {"coc", "future", "coc_acc", "future_acc", "commit_acc"}; the CoC
    loss weighs commitment words by `commitment_weight` (routine words and <|cot_end|> by 1)."""
    B = logits.shape[0]
    targets = batch.ids[:, 1:]
    out = {}
    for name, mask in (("coc", batch.coc[:, :-1]), ("future", batch.future[:, :-1])):
        rows = mask.nonzero()[:, 0]
        lg = logits[:, :-1][mask].float()                      # (N, V)
        weights = None
        if name == "coc":
            lg = lg.masked_fill(traj_mask, float("-inf"))
            commit = batch.commitment[:, :-1][mask]
            weights = 1.0 + (commitment_weight - 1.0) * commit.float()
            hit = lg.argmax(-1) == targets[mask]
            out["commit_acc"] = float(hit[commit].float().mean()) if commit.any() else 0.0
        tg = targets[mask]
        out[name] = per_scene_mean(F.cross_entropy(lg, tg, reduction="none"), rows, B, weights)
        out[f"{name}_acc"] = float((lg.argmax(-1) == tg).float().mean()) if len(tg) else 0.0
    return out


def expert_cache_lengths(batch: data.Batch, cuts: int, seed: int, step: int) -> torch.Tensor:
    """(1 + cuts, B) cache lengths: cot_end + 1, then cuts drawn per scene from its own rng."""
    rows = [batch.cot_end + 1]
    for c in range(cuts):
        cut = [int(torch.randint(int(s), int(e) + 1, (1,), generator=data.sample_rng(seed, step, int(i) * 16 + 1 + c)))
               for s, e, i in zip(batch.reasoning_start, batch.cot_end, batch.index)]
        rows.append(torch.tensor(cut))
    return torch.stack(rows)


def expert_loss(expert: ActionExpert, kv: torch.Tensor, lengths: torch.Tensor, batch: data.Batch,
                seed: int, step: int, salt: int) -> torch.Tensor:
    """Mean over scenes of the flow-matching loss on cache rows [0, lengths[b]) of scene b
    (one call per scene: the expert takes one cache length per call)."""
    losses = []
    for b in range(kv.shape[2]):
        g = data.sample_rng(seed, step, int(batch.index[b]) * 16 + 8 + salt, kv.device)
        losses.append(expert.loss(batch.actions[b:b + 1], kv[:, :, b:b + 1], int(lengths[b]),
                                  rope_delta=int(batch.rope_delta[b]), generator=g))
    return torch.stack(losses).mean()


def sft_step(target: Target, expert: ActionExpert, batch: data.Batch, cfg: SFTConfig,
             traj_mask: torch.Tensor, step: int) -> tuple[torch.Tensor, dict]:
    """One batch -> (weighted loss, logs)."""
    B, T = batch.ids.shape
    llm = target.cfg.llm
    embeds, deepstack = target.encode_images(batch.pixels, batch.grid_thw)
    cos, sin = target.rope(batch.positions)
    # one buffer per layer (not one tensor): autograd then sees each layer's writes separately
    cache = [torch.zeros(2, B, llm.kv_heads, T, llm.head_dim, device=batch.ids.device) for _ in range(llm.layers)]
    logits, _ = target(batch.ids, cos, sin, cache, 0, embeds, deepstack)
    losses = token_losses(logits, batch, traj_mask, cfg.commitment_weight)
    kv = torch.stack(cache if cfg.expert_grad_to_target else [c.detach() for c in cache])
    lengths = expert_cache_lengths(batch, cfg.expert_cuts, cfg.run.seed, step)
    fm = [expert_loss(expert, kv, lens, batch, cfg.run.seed, step, salt=j)
          for j, lens in enumerate(lengths)]
    losses["expert"] = fm[0]
    if len(fm) > 1:
        losses["expert_cut"] = torch.stack(fm[1:]).mean()
    loss = (cfg.coc_weight * losses["coc"] + cfg.future_weight * losses["future"]
            + cfg.expert_weight * torch.stack(fm).mean())
    return loss, {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in losses.items()}


def set_action_normalization(expert: ActionExpert, examples: list[data.Example]) -> None:
    """The expert sees (a - mean) / std: per-channel mean and std of the training targets."""
    acts = torch.from_numpy(np.stack([e.actions for e in examples])).reshape(-1, expert.cfg.action_dim)
    expert.action_mean.copy_(acts.mean(0))
    expert.action_std.copy_(acts.std(0).clamp(min=1e-3))


def save_target(folder, cfg: ModelConfig, target: Target, expert: ActionExpert, tok, extra: dict) -> None:
    """folder/target (kind target), folder/expert (kind expert), folder/tokenizer.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(folder / "tokenizer.json")
    extra = {**extra, "tokenizer_sha256": tok.fingerprint}     # the loaders refuse any other tokenizer
    io.save(folder / "target", {"target": target}, cfg, {"kind": "target", **extra})
    io.save(folder / "expert", {"expert": expert}, cfg, {"kind": "expert", **extra})


def run_tokenizer(out: Path, world, data_dir=None):
    """The run's tokenizer: BPE trained on the dataset's train-split CoCs (or the language's
    corpus without a dataset) at the first start and saved in the run folder (by rank 0), then
    always reloaded from there (a resumed run keeps its vocabulary)."""
    path = out / "tokenizer.json"
    if world.main and not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        build_tokenizer(dataset_corpus(data_dir) if data_dir is not None else None).save(path)
    dist.barrier(world)
    return load_tokenizer(out)


def run(cfg: SFTConfig) -> Path:
    """Train (or resume) the target + expert; writes RUN/ckpt/{target,expert,tokenizer.json}."""
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    world = dist.init()
    out = Path(cfg.run.out)
    tok = run_tokenizer(out, world, cfg.data.dir)
    model_cfg, target, expert = build_models(cfg.preset, tok, cfg.run.seed, cfg.image_attention)
    if cfg.init_vision:
        load_into_target(target, cfg.init_vision)
    examples, keys = data.load_examples(cfg.data, tok, model_cfg.target.vision, keys=True)
    set_action_normalization(expert, examples)
    dev = loop.device(cfg.run.device)
    target.to(dev)
    expert.to(dev)
    traj_mask = torch.from_numpy(tok.traj_mask()).to(dev)
    weights = data.balance_weights(keys, cfg.data.balance)

    def step_fn(step):
        idx = data.batch_indices(len(examples), cfg.run.batch_size, step, cfg.run.seed, world.rank, world.size,
                                 weights)
        batch = data.collate([examples[i] for i in idx], tok.pad, model_cfg.target.vision).to(dev)
        return sft_step(target, expert, batch, cfg, traj_mask, step)

    manifest = hashlib.sha256((Path(cfg.data.dir) / "manifest.json").read_bytes()).hexdigest()

    def on_checkpoint(step):
        save_target(out / "ckpt", model_cfg, target, expert, tok,
                    {"stage": "sft", "step": step, "of_steps": cfg.run.steps, "scenes": len(examples),
                     "data": cfg.data.dir, "data_manifest_sha256": manifest})

    loop.fit(cfg.run, {"target": target, "expert": expert}, step_fn, world, on_checkpoint,
             {"config": to_dict(cfg)})
    if world.main:
        (out / "done.json").write_text(json.dumps({"steps": cfg.run.steps}) + "\n")
    return out / "ckpt"
