"""AARL: action-aware RL post-training of the distilled flat draft (group-relative, KL anchor).

Per scene: the target prefills the prompt and picks the first CoC token; the draft then writes
`group` rollouts of the rest of the CoC as its own chain (own hidden as feature after the first
row, as when it drafts), sampled at `temperature` over text tokens. Each rollout is scored:

    r_action = -ADE(expert trajectory on the target's cache of prompt + text, future) / ade_scale
               - collision_penalty * [that trajectory overlaps a scene agent]
               text: the rollout (action_on: rollout), or what one exact verify pass of it lets
               through before a budget closes the reasoning (action_on: one_pass: the accepted
               run plus the target's bonus token), so the action depends on the draft as it does
               under a budget
    r_accept = fraction of rollout tokens equal to the target's greedy choice after the same
               prefix (one teacher-forced target pass); the leading run of such tokens is the
               length the target accepts (logged as `accepted`)
    R = action_weight * r_action + accept_weight * r_accept

Advantages are group-relative, A = (R - mean_group R) / (std_group R + 1e-6); the update is
on-policy (one step per batch, so the PPO ratio is 1 and needs no clip):

    loss = -mean_g A_g mean_i log q(d_i) + kl_coef * mean_i k3(q, q_ref),
    k3 = exp(log q_ref - log q) - (log q_ref - log q) - 1   (>= 0, unbiased KL(q || q_ref))

with q_ref the frozen distilled draft (the static reference). Under exact acceptance the
planner's output stays the target's; the reward moves what the draft proposes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models import io
from models.chain import rollout
from models.draft import shift_features
from prompt.config import to_dict
from scenes import dataset
from train import ckpt, data, dist, loop, metrics, reasoning
from train.config import AARLConfig


@torch.no_grad()
def prefill(target, ex: data.Example, feature_layers: tuple, banned: torch.Tensor):
    """Target prefill of one prompt -> (first CoC token (trajectory tokens `banned`), shifted
    draft features (1, T0+1, 3D), image embeds, T0)."""
    ids, pos, _, pixels, grid = reasoning.prompt_batch([ex], target.cfg.vision)
    embeds, deep = target.encode_images(pixels, grid)
    logits, hid = target(ids, *target.rope(pos), None, 0, embeds, deep, hidden_layers=feature_layers)
    feats = torch.cat(hid, -1)
    first = int(logits[0, -1].masked_fill(banned, float("-inf")).argmax())
    feats = shift_features(torch.cat([feats, torch.zeros_like(feats[:, :1])], 1))
    return first, feats, embeds, ids.shape[1]


def valid_mask(tokens: torch.Tensor, cot_end: int) -> torch.Tensor:
    """(G, n) True up to and including the first <|cot_end|> of each rollout."""
    ended = (tokens == cot_end).long().cumsum(1)
    return (ended == 0) | ((ended == 1) & (tokens == cot_end))


@torch.no_grad()
def _teacher_forced(target, ex, coc: list, tok):
    """One target pass over prompt + `coc` (+ <|cot_end|>) -> (cache, example, the target's greedy
    choice after each CoC prefix, whether each CoC token after the first equals it)."""
    if coc[-1] != tok.cot_end:
        coc = coc + [tok.cot_end]
    e = reasoning.with_reasoning(ex, np.array(coc), tok)
    b = data.collate([e], tok.pad, target.cfg.vision)
    embeds, deep = target.encode_images(b.pixels, b.grid_thw)
    cache = target.new_cache(1, len(e.ids))
    logits, _ = target(b.ids, *target.rope(b.positions), cache, 0, embeds, deep)
    banned = torch.from_numpy(tok.traj_mask())
    greedy = logits[0, e.reasoning_start:len(e.ids) - 1].masked_fill(banned, float("-inf")).argmax(-1)
    return cache, e, greedy, (greedy == b.ids[0, e.reasoning_start + 1:]).float()


@torch.no_grad()
def rewards(target, expert, ex, scene, first: int, tokens, valid, tok, cfg: AARLConfig) -> dict:
    """Score each rollout: action (ADE, collision) and the target's agreement."""
    out = {"r": [], "ade": [], "collision": [], "agree": [], "accepted": []}
    for g in range(tokens.shape[0]):
        coc = [first] + tokens[g][valid[g]].tolist()
        cache, e, greedy, match = _teacher_forced(target, ex, coc, tok)
        if cfg.action_on == "one_pass":     # the text one verify pass lets through: accepted + bonus
            n = int(torch.cumprod(match, 0).sum())
            cache, e, _, _ = _teacher_forced(target, ex, coc[:n + 1] + greedy[n:n + 1].tolist(), tok)
        gen = torch.Generator().manual_seed(int(ex.index))
        wp, _ = expert.sample(cache, len(e.ids), torch.tensor([ex.v0]), rope_delta=ex.rope_delta, generator=gen,
                              samples=cfg.trajectory_samples)
        ade = metrics.ade(wp[0].numpy(), ex.future)
        hit = metrics.collides(wp[0].numpy(), scene)
        agree = float(match.mean()) if len(match) else 1.0
        r = cfg.action_weight * (-ade / cfg.ade_scale - cfg.collision_penalty * hit) + cfg.accept_weight * agree
        for key, val in (("r", r), ("ade", ade), ("collision", float(hit)), ("agree", agree),
                         ("accepted", float(torch.cumprod(match, 0).sum()))):
            out[key].append(val)
    return {k: torch.tensor(v) for k, v in out.items()}


@torch.no_grad()
def rollouts(draft, target, ex: data.Example, tok, cfg: AARLConfig):
    """Target prefill, then `group` sampled draft chains -> (first token, prefix (1, T0+1),
    features, image embeds, tokens (G, max_new_tokens)). Seed torch's RNG before calling."""
    first, feats, embeds, T0 = prefill(target, ex, tuple(draft.cfg.feature_layers), torch.from_numpy(tok.traj_mask()))
    prefix = torch.cat([torch.from_numpy(ex.ids[:T0]), torch.tensor([first])])[None]
    tokens, _ = rollout(draft, prefix, feats, embeds, cfg.max_new_tokens, torch.from_numpy(tok.sampling_mask()),
                        cfg.temperature, group=cfg.group)
    return first, prefix, feats, embeds, tokens


def aarl_step(policy, ref, target, expert, items, tok, cfg: AARLConfig, step: int):
    """items: [(Example, Scene)] of this step -> (loss, logs)."""
    text = torch.from_numpy(tok.sampling_mask())
    losses, logs = [], {}
    for ex, scene in items:
        torch.manual_seed(cfg.run.seed * 100_003 + step * 1009 + int(ex.index))
        first, prefix, feats, embeds, tokens = rollouts(policy, target, ex, tok, cfg)
        with torch.no_grad():
            _, ref_lp = rollout(ref, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature, tokens, cfg.group)
        valid = valid_mask(tokens, tok.cot_end)
        _, lp = rollout(policy, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature, tokens, cfg.group)
        sc = rewards(target, expert, ex, scene, first, tokens, valid, tok, cfg)
        adv = (sc["r"] - sc["r"].mean()) / (sc["r"].std() + 1e-6)
        m = valid.float()
        pg = -(adv * (lp * m).sum(1) / m.sum(1)).mean()
        d = ref_lp - lp
        kl = ((d.exp() - d - 1) * m).sum(1) / m.sum(1)
        losses.append(pg + cfg.kl_coef * kl.mean())
        for key, val in {"reward": sc["r"].mean(), "ade": sc["ade"].mean(), "collision": sc["collision"].mean(),
                         "agree": sc["agree"].mean(), "accepted": sc["accepted"].mean(), "kl": kl.mean(),
                         "length": m.sum(1).mean()}.items():
            logs[key] = logs.get(key, 0.0) + float(torch.as_tensor(val).detach()) / len(items)
    return torch.stack(losses).mean(), logs


@torch.no_grad()
def score_draft(draft, target, expert, items, tok, cfg: AARLConfig, seed: int = 0) -> dict:
    """The reward of `draft` on fixed scenes, without an update: `group` rollouts per scene,
    seeded by (seed, scene index) only, so two drafts are scored on the same draws. The
    training curve mixes in which scenes each step drew; this is the before/after measure.
    Returns the mean reward, its action part (-ADE / ade_scale - collision penalty), ADE,
    collision rate, agreement with the target and accepted length."""
    rows = []
    for ex, scene in items:
        torch.manual_seed(seed * 100_003 + int(ex.index))
        first, _, _, _, tokens = rollouts(draft, target, ex, tok, cfg)
        sc = rewards(target, expert, ex, scene, first, tokens, valid_mask(tokens, tok.cot_end), tok, cfg)
        action = -sc["ade"] / cfg.ade_scale - cfg.collision_penalty * sc["collision"]
        rows.append({"reward": sc["r"].mean(), "action_reward": action.mean(), "ade": sc["ade"].mean(),
                     "collision": sc["collision"].mean(), "agree": sc["agree"].mean(),
                     "accepted": sc["accepted"].mean()})
    return {k: float(np.mean([float(r[k]) for r in rows])) for k in rows[0]} | {"scenes": len(rows)}


def run(cfg: AARLConfig) -> Path:
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    world = dist.init()
    tok, model_cfg, target, expert = io.load_planner(cfg.target)
    source = ckpt.target_sha256(cfg.target)          # recorded with every checkpoint of the draft
    for p in [*target.parameters(), *expert.parameters()]:
        p.requires_grad_(False)
    _, policy, meta = io.load_draft(cfg.draft, model_cfg, target, target_sha=source)
    if meta.variant != "flat":
        raise ValueError(f"{cfg.draft}: AARL post-trains the 'flat' draft, this is {meta.variant!r}")
    ref = policy.frozen_copy()
    policy.train()
    examples = data.load_examples(cfg.data, tok, model_cfg.target.vision)
    scenes = dataset.load(cfg.data.dir, cfg.data.split)
    out = Path(cfg.run.out)

    def step_fn(step):
        idx = data.batch_indices(len(examples), cfg.run.batch_size, step, cfg.run.seed, world.rank, world.size)
        return aarl_step(policy, ref, target, expert, [(examples[i], scenes[int(examples[i].index)]) for i in idx],
                         tok, cfg, step)

    def on_checkpoint(step):
        ckpt.save_draft(out / "ckpt", "flat-aarl", model_cfg, policy,
                        {"stage": "aarl", "step": step, "init": cfg.draft, "target": cfg.target,
                         "target_sha256": source})

    loop.fit(cfg.run, {"draft": policy}, step_fn, world, on_checkpoint, {"config": to_dict(cfg)})
    return out / "ckpt" / "draft-flat-aarl"
