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
               length the target accepts (logged as `accepted`); accept_on: leading scores
               that run's share of the rollout instead
    R = action_weight * r_action + accept_weight * r_accept

Advantages are group-relative, A = (R - mean_group R) / (std_group R + 1e-6); the update is
on-policy (one step per batch, so the PPO ratio is 1 and needs no clip):

    loss = -mean_g A_g mean_i log q(d_i) + kl_coef * mean_i k3(q, q_ref),
    k3 = exp(log q_ref - log q) - (log q_ref - log q) - 1   (>= 0, unbiased KL(q || q_ref))

with q_ref the frozen distilled draft (the static reference). Under exact acceptance the
planner's output stays the target's; the reward moves what the draft proposes.

A step's cost (aarl_step): the policy's rollouts are sampled and scored in one differentiable
chain that ends once every member has written <|cot_end|>; the prefill's target cache serves
every rollout's reward pass, all rollouts of a scene in one target pass and one expert call
(`rewards_batched`; `rewards` is its plain per-rollout form). What is left is mostly the
expert's trajectory_samples draws per rollout, integrated in full.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models import io
from models.chain import rollout
from models.draft import shift_features
from core.config import to_dict
from scenes import dataset
from train import ckpt, data, dist, loop, metrics, reasoning
from train.config import AARLConfig


@torch.no_grad()
def prefill(target, ex: data.Example, feature_layers: tuple, banned: torch.Tensor, max_new: int = 0):
    """Target prefill of one prompt -> (first CoC token (trajectory tokens `banned`), shifted
    draft features (1, T0+1, 3D), image embeds, T0); with `max_new` > 0 also the target's cache
    (T0 + max_new + 2 rows, the prompt's written), which `rewards` continues for every rollout."""
    ids, pos, _, pixels, grid = reasoning.prompt_batch([ex], target.cfg.vision)
    dev = target.embed_tokens.weight.device
    embeds, deep = target.encode_images(pixels.to(dev), grid)
    cache = target.new_cache(1, ids.shape[1] + max_new + 2) if max_new else None
    logits, hid = target(ids.to(dev), *target.rope(pos), cache, 0, embeds, deep, hidden_layers=feature_layers)
    feats = torch.cat(hid, -1)
    first = int(logits[0, -1].masked_fill(banned.to(dev), float("-inf")).argmax())
    feats = shift_features(torch.cat([feats, torch.zeros_like(feats[:, :1])], 1))
    return (first, feats, embeds, ids.shape[1]) + ((cache,) if max_new else ())


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


def accept_score(match: torch.Tensor, cfg: AARLConfig) -> float:
    """r_accept of one rollout from its per-token agreement with the target (module docstring)."""
    if not len(match):
        return 1.0
    return float(match.mean()) if cfg.accept_on == "agree" else float(torch.cumprod(match, 0).sum()) / len(match)


@torch.no_grad()
def rewards(target, expert, ex, scene, first: int, tokens, valid, tok, cfg: AARLConfig) -> dict:
    """Score each rollout: action (ADE, collision) and the target's agreement; one full target
    pass and one expert call per rollout (the plain form of `rewards_batched`, which training uses)."""
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
        r = cfg.action_weight * (-ade / cfg.ade_scale - cfg.collision_penalty * hit) + \
            cfg.accept_weight * accept_score(match, cfg)
        for key, val in (("r", r), ("ade", ade), ("collision", float(hit)), ("agree", agree),
                         ("accepted", float(torch.cumprod(match, 0).sum()))):
            out[key].append(val)
    return {k: torch.tensor(v) for k, v in out.items()}


@torch.no_grad()
def _continued(target, ex, cocs: list, prompt_cache, tok):
    """`_teacher_forced` for several CoCs at once on the prompt's cache: one batched target pass
    over the CoC rows only (each + <|cot_end|>, padded at the end) -> (cache (layers, 2, U, ...),
    host lengths (U,), [greedy (n_u - 1,)], [match (n_u - 1,)])."""
    cocs = [c if c[-1] == tok.cot_end else c + [tok.cot_end] for c in cocs]
    T0, U, n = ex.reasoning_start, len(cocs), max(len(c) for c in cocs)
    ids = torch.full((U, n), tok.pad, dtype=torch.long)
    for u, c in enumerate(cocs):
        ids[u, :len(c)] = torch.tensor(c)
    pos = (torch.arange(T0, T0 + n) + ex.rope_delta).view(1, 1, n).expand(3, U, n)
    cache = prompt_cache.repeat(1, 1, U, 1, 1, 1)
    logits, _ = target(ids.to(cache.device), *target.rope(pos), cache, T0)
    banned = torch.from_numpy(tok.traj_mask()).to(logits.device)
    greedy = logits.masked_fill(banned, float("-inf")).argmax(-1).cpu()          # (U, n)
    greedy = [greedy[u, :len(c) - 1] for u, c in enumerate(cocs)]
    match = [(g == ids[u, 1:len(cocs[u])]).float() for u, g in enumerate(greedy)]
    return cache, torch.tensor([T0 + len(c) for c in cocs]), greedy, match


@torch.no_grad()
def rewards_batched(target, expert, ex, scene, first: int, tokens, valid, tok, cfg: AARLConfig,
                    prompt_cache) -> dict:
    """`rewards` on the prompt's cache (`prefill(..., max_new)`): the rollouts' distinct CoCs in
    one target pass and one expert call (each with the expert noise `rewards` draws for the
    scene), so every rollout's scores are those of `rewards`, to float round-off."""
    cocs = [[first] + tokens[g][valid[g]].tolist() for g in range(tokens.shape[0])]
    distinct = list(dict.fromkeys(map(tuple, cocs)))          # first-seen order
    cache, lens, greedy, match = _continued(target, ex, [list(c) for c in distinct], prompt_cache, tok)
    if cfg.action_on == "one_pass":     # the text one verify pass lets through: accepted + bonus
        run = [int(torch.cumprod(m, 0).sum()) for m in match]
        through = [list(c[:n + 1]) + g[n:n + 1].tolist() for c, n, g in zip(distinct, run, greedy)]
        cache, lens, _, _ = _continued(target, ex, through, prompt_cache, tok)
    S, U = cfg.trajectory_samples, len(distinct)
    dev = cache.device
    noise = data.expert_noise(expert, ex.index, S, dev).repeat(U, 1, 1)
    wp, _ = expert.sample(cache, lens, torch.full((U,), float(ex.v0), device=dev), rope_delta=ex.rope_delta,
                          noise=noise, samples=S)
    wp = wp.cpu().numpy()
    rows = []
    for u in range(U):
        ade, hit = metrics.ade(wp[u], ex.future), metrics.collides(wp[u], scene)
        agree = float(match[u].mean()) if len(match[u]) else 1.0
        r = cfg.action_weight * (-ade / cfg.ade_scale - cfg.collision_penalty * hit) + \
            cfg.accept_weight * accept_score(match[u], cfg)
        rows.append((r, ade, float(hit), agree, float(torch.cumprod(match[u], 0).sum())))
    pick = [rows[distinct.index(tuple(c))] for c in cocs]
    return {k: torch.tensor([p[i] for p in pick]) for i, k in enumerate(("r", "ade", "collision", "agree", "accepted"))}


@torch.no_grad()
def rollouts(draft, target, ex: data.Example, tok, cfg: AARLConfig):
    """Target prefill, then `group` sampled draft chains -> (first token, prefix (1, T0+1),
    features, image embeds, tokens (G, max_new_tokens), the target's prompt cache). Seed torch's
    RNG before calling."""
    first, prefix, feats, embeds, cache = _prefix(draft, target, ex, tok, cfg)
    text = torch.from_numpy(tok.sampling_mask()).to(prefix.device)
    tokens, _ = rollout(draft, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature, group=cfg.group,
                        stop=tok.cot_end)
    return first, prefix, feats, embeds, tokens, cache


def _prefix(draft, target, ex, tok, cfg: AARLConfig):
    """-> (first token, the draft's prefix (1, T0+1), features, image embeds, target cache)."""
    banned = torch.from_numpy(tok.traj_mask()).to(draft.norm.weight.device)
    first, feats, embeds, T0, cache = prefill(target, ex, tuple(draft.cfg.feature_layers), banned,
                                              cfg.max_new_tokens)
    prefix = torch.cat([torch.from_numpy(ex.ids[:T0]), torch.tensor([first])])[None].to(feats.device)
    return first, prefix, feats, embeds, cache


def aarl_step(policy, ref, target, expert, items, tok, cfg: AARLConfig, step: int):
    """items: [(Example, Scene)] of this step -> (loss, logs). Per scene: the policy's rollouts
    are sampled and scored in one differentiable chain (ending when every member has written
    <|cot_end|>), the reference scores them, `rewards_batched` scores them against the target."""
    dev = policy.norm.weight.device
    text = torch.from_numpy(tok.sampling_mask()).to(dev)
    losses, logs = [], {}
    for ex, scene in items:
        torch.manual_seed(cfg.run.seed * 100_003 + step * 1009 + int(ex.index))
        first, prefix, feats, embeds, cache = _prefix(policy, target, ex, tok, cfg)
        tokens, lp = rollout(policy, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature,
                             group=cfg.group, stop=tok.cot_end)
        with torch.no_grad():
            _, ref_lp = rollout(ref, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature, tokens,
                                cfg.group, stop=tok.cot_end)
        valid = valid_mask(tokens, tok.cot_end)
        sc = rewards_batched(target, expert, ex, scene, first, tokens.cpu(), valid.cpu(), tok, cfg, cache)
        loss, part = _loss(sc, lp, ref_lp, valid, cfg)
        losses.append(loss)
        for key, val in part.items():
            logs[key] = logs.get(key, 0.0) + val / len(items)
    return torch.stack(losses).mean(), logs


def _loss(sc: dict, lp, ref_lp, valid, cfg: AARLConfig):
    """Group-relative policy gradient + k3 KL anchor of one scene -> (loss, logs)."""
    r = sc["r"].to(lp.device)
    adv = (r - r.mean()) / (r.std() + 1e-6)
    m = valid.float()
    pg = -(adv * (lp * m).sum(1) / m.sum(1)).mean()
    d = ref_lp - lp
    kl = ((d.exp() - d - 1) * m).sum(1) / m.sum(1)
    logs = {"reward": sc["r"].mean(), "ade": sc["ade"].mean(), "collision": sc["collision"].mean(),
            "agree": sc["agree"].mean(), "accepted": sc["accepted"].mean(), "kl": kl.mean(), "length": m.sum(1).mean()}
    return pg + cfg.kl_coef * kl.mean(), {k: float(torch.as_tensor(v).detach()) for k, v in logs.items()}


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
        first, _, _, _, tokens, cache = rollouts(draft, target, ex, tok, cfg)
        tokens = tokens.cpu()
        sc = rewards_batched(target, expert, ex, scene, first, tokens, valid_mask(tokens, tok.cot_end), tok, cfg, cache)
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
    dev = loop.device(cfg.run.device)
    for p in [*target.parameters(), *expert.parameters()]:
        p.requires_grad_(False)
    target.to(dev)
    expert.to(dev)
    _, policy, meta = io.load_draft(cfg.draft, model_cfg, target, target_sha=source)
    policy.to(dev)
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
