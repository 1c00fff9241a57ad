"""AARL: the rollout chain is the draft drafting (its scores equal the cached draft's logits),
rollouts end at <|cot_end|>, the collision term sees an overlap, and a few-step AARL run logs
reward, KL and accepted length and writes the flat-aarl draft."""
import numpy as np
import pytest
import torch

from models.chain import rollout
from models.draft import Draft
from train import aarl, ckpt, metrics, sft
from train.vocab import build_tokenizer
from train_inputs import examples, micro_preset, scenes

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rollout_scores_equal_the_cached_draft_chain(tmp_path):
    tok = build_tokenizer()
    cfg, target, _ = sft.build_models(micro_preset(tmp_path), tok, seed=0)
    torch.manual_seed(2)
    draft = Draft(ckpt.draft_config(cfg, "flat"), target.embed_tokens, target.lm_head)
    ex = examples(1, tok, cfg.target.vision)[0]
    banned = torch.from_numpy(tok.traj_mask())
    first, feats, embeds, T0 = aarl.prefill(target.eval(), ex, tuple(cfg.draft.feature_layers), banned)
    prefix = torch.cat([torch.from_numpy(ex.ids[:T0]), torch.tensor([first])])[None]
    text = torch.from_numpy(tok.text_mask())
    with torch.no_grad():
        tokens, logq = rollout(draft, prefix, feats, embeds, 5, text, 1.0, group=3)
        _, again = rollout(draft, prefix, feats, embeds, 5, text, 1.0, tokens, group=3)
    assert torch.allclose(logq, again, atol=1e-5), "scoring the sampled tokens changed their log q"
    assert not tok.traj_mask()[tokens.numpy()].any()
    # the same chain through Draft.forward with its KV cache, rollout 0
    cache = draft.new_cache(1, T0 + 6)
    pos = torch.arange(T0 + 6)[None]
    cos, sin = draft.rope(pos)
    with torch.no_grad():
        logits, h = draft(prefix, cos[:, :T0 + 1], sin[:, :T0 + 1], cache, 0, feats, embeds)
        h = h[:, -1:]
        ref = [torch.log_softmax(logits[0, -1].masked_fill(~text, float("-inf")), -1)[tokens[0, 0]]]
        for i in range(4):
            r = T0 + 1 + i
            logits, h = draft(tokens[:1, i:i + 1], cos[:, r:r + 1], sin[:, r:r + 1], cache, r, h)
            ref.append(torch.log_softmax(logits[0, -1].masked_fill(~text, float("-inf")), -1)[tokens[0, i + 1]])
    err = (torch.stack(ref) - logq[0]).abs().max().item()
    assert err < 1e-4, f"rollout log q differs from the cached draft: {err}"


def test_valid_mask_stops_after_cot_end():
    t = torch.tensor([[5, 13, 7, 13], [5, 6, 7, 8]])
    m = aarl.valid_mask(t, cot_end=13)
    assert m.tolist() == [[True, True, False, False], [True, True, True, True]]


def test_collision_term_sees_an_overlap():
    scene = next(s for s in scenes(6) if any(a["kind"] not in metrics.NON_SOLID for a in s.agents))
    assert not metrics.collides(scene.future, scene), "the expert future never touches an agent"
    i = next(i for i, a in enumerate(scene.agents) if a["kind"] not in metrics.NON_SOLID)
    through = np.repeat(scene.agent_poses[i, 16:17], 64, axis=0)   # sit on the agent at t0 + 0.1 s
    assert metrics.collides(through, scene)


def test_the_fixed_scene_score_draws_the_same_rollouts_for_every_draft(tmp_path):
    from train.config import AARLConfig

    tok = build_tokenizer()
    cfg, target, expert = sft.build_models(micro_preset(tmp_path), tok, seed=0)
    target.eval()
    torch.manual_seed(2)
    draft = Draft(ckpt.draft_config(cfg, "flat"), target.embed_tokens, target.lm_head).eval()
    items = list(zip(examples(2, tok, cfg.target.vision), scenes(2)))
    acfg = AARLConfig(group=2, max_new_tokens=4)
    one = aarl.score_draft(draft, target, expert, items, tok, acfg)
    assert one == aarl.score_draft(draft, target, expert, items, tok, acfg)
    assert one["scenes"] == 2 and one["action_reward"] == pytest.approx(-one["ade"] / 2.0 - one["collision"])
    with torch.no_grad():      # the draft's own weights (not the target's shared embedding and head)
        for p in [*draft.layers.parameters(), *draft.fc.parameters(), *draft.in_proj.parameters()]:
            p.add_(3.0 * torch.randn_like(p))
    assert aarl.score_draft(draft, target, expert, items, tok, acfg) != one   # other rollouts, other scores


def test_one_pass_scores_the_action_on_what_one_verify_pass_lets_through(tmp_path):
    """action_on: one_pass: the expert plans on the accepted run of the rollout plus the target's
    bonus token, then <|cot_end|>: the text a budget of one exact verify pass lets through."""
    from train.config import AARLConfig

    tok = build_tokenizer()
    cfg, target, expert = sft.build_models(micro_preset(tmp_path), tok, seed=0)
    target.eval()
    ex, scene = examples(1, tok, cfg.target.vision)[0], scenes(1)[0]
    first = int(tok.encode("ego")[0])
    words = [int(t) for t in tok.encode("ego is driving at 5.0 m/s")]
    tokens = torch.tensor([words[1:] + [tok.cot_end]])
    valid = aarl.valid_mask(tokens, tok.cot_end)
    _, _, greedy, match = aarl._teacher_forced(target, ex, [first] + tokens[0].tolist(), tok)
    n = int(torch.cumprod(match, 0).sum())
    through = [first] + tokens[0, :n].tolist() + greedy[n:n + 1].tolist()
    cache, e, _, _ = aarl._teacher_forced(target, ex, through, tok)
    g = torch.Generator().manual_seed(int(ex.index))
    wp, _ = expert.sample(cache, len(e.ids), torch.tensor([ex.v0]), rope_delta=ex.rope_delta, generator=g)
    want = metrics.ade(wp[0].detach().numpy(), ex.future)
    one = aarl.rewards(target, expert, ex, scene, first, tokens, valid, tok, AARLConfig(action_on="one_pass"))
    roll = aarl.rewards(target, expert, ex, scene, first, tokens, valid, tok, AARLConfig())
    assert float(one["ade"][0]) == pytest.approx(want, rel=1e-5)
    assert float(one["accepted"][0]) == float(roll["accepted"][0]) == n   # acceptance is the rollout's
    if n < len(words) - 1:       # a rejection inside the rollout: the two texts differ, and so may the plans
        assert len(through) < len(words) + 1


def _plain_step(policy, ref, target, expert, items, tok, cfg, step):
    """AARL's step as first written (the reference of the fast one): rollouts sampled under
    no_grad to max_new_tokens, scored again by the policy with autograd and by the reference,
    each rollout's reward from its own full target pass (`aarl.rewards`)."""
    text = torch.from_numpy(tok.sampling_mask())
    losses, rolled = [], []
    for ex, scene in items:
        torch.manual_seed(cfg.run.seed * 100_003 + step * 1009 + int(ex.index))
        first, feats, embeds, T0 = aarl.prefill(target, ex, tuple(policy.cfg.feature_layers),
                                                torch.from_numpy(tok.traj_mask()))
        prefix = torch.cat([torch.from_numpy(ex.ids[:T0]), torch.tensor([first])])[None]
        with torch.no_grad():
            tokens, _ = rollout(policy, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature,
                                group=cfg.group)
            _, ref_lp = rollout(ref, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature, tokens,
                                cfg.group)
        valid = aarl.valid_mask(tokens, tok.cot_end)
        _, lp = rollout(policy, prefix, feats, embeds, cfg.max_new_tokens, text, cfg.temperature, tokens, cfg.group)
        sc = aarl.rewards(target, expert, ex, scene, first, tokens, valid, tok, cfg)
        adv = (sc["r"] - sc["r"].mean()) / (sc["r"].std() + 1e-6)
        m = valid.float()
        d = ref_lp - lp
        kl = ((d.exp() - d - 1) * m).sum(1) / m.sum(1)
        losses.append(-(adv * (lp * m).sum(1) / m.sum(1)).mean() + cfg.kl_coef * kl.mean())
        rolled.append((tokens, valid, sc))
    return torch.stack(losses).mean(), rolled


@pytest.mark.parametrize("action_on", ["rollout", "one_pass"])
def test_the_fast_step_gives_the_plain_steps_rollouts_losses_and_gradients(action_on, monkeypatch):
    """The shipped planner on two training scenes (rollout groups that end at <|cot_end|> inside
    the budget, so the early end is exercised): the same rollout tokens as the plain step; the
    same rewards to the expert's round-off; given the same rewards, the same loss and gradient.
    The expert integrates 10 Euler steps through 12 layers: a 2e-6 change in the target's cache
    (the prompt prefilled alone vs with the CoC) moved its waypoints by up to 8e-3 m (measured on
    these scenes), so ADE and reward are compared to 2e-2 and the token-level scores exactly."""
    from models import io
    from train.config import AARLConfig, RunConfig

    tok, mcfg, target, expert = io.load_planner("checkpoints/tiny")
    _, policy, _ = io.load_draft("checkpoints/tiny/draft-flat", mcfg, target)
    ref = policy.frozen_copy()
    with torch.no_grad():       # a policy off its reference, so the KL term and its gradient are not 0
        for p in policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    items = list(zip(examples(2, tok, mcfg.target.vision), scenes(2)))
    cfg = AARLConfig(group=4, max_new_tokens=96, temperature=0.7, trajectory_samples=8, kl_coef=0.1,
                     action_on=action_on, run=RunConfig(seed=3))
    plain, rolled = _plain_step(policy, ref, target, expert, items, tok, cfg, step=5)
    want = torch.autograd.grad(plain, list(policy.parameters()))
    ends = [int(aarl.valid_mask(t, tok.cot_end).sum(1).max()) for t, _, _ in rolled]
    assert min(ends) < cfg.max_new_tokens, f"no rollout group ended early (lengths {ends}): the case tests nothing"
    for (tokens, valid, sc), (ex, scene) in zip(rolled, items):   # the fast path's rollouts, drawn again
        torch.manual_seed(cfg.run.seed * 100_003 + 5 * 1009 + int(ex.index))
        first, _, _, _, again, cache = aarl.rollouts(policy, target, ex, tok, cfg)
        assert torch.equal(aarl.valid_mask(again, tok.cot_end), valid)
        assert torch.equal(again[valid], tokens[valid])
        fast_sc = aarl.rewards_batched(target, expert, ex, scene, first, again, valid, tok, cfg, cache)
        for k in ("agree", "accepted", "collision"):
            assert torch.equal(fast_sc[k], sc[k]), (k, fast_sc[k], sc[k])
        for k in ("r", "ade"):
            assert torch.allclose(fast_sc[k], sc[k], rtol=0, atol=2e-2), (k, fast_sc[k], sc[k])
    plain_rewards = iter([sc for _, _, sc in rolled])
    monkeypatch.setattr(aarl, "rewards_batched", lambda *a, **k: next(plain_rewards))
    fast, _ = aarl.aarl_step(policy, ref, target, expert, items, tok, cfg, step=5)
    got = torch.autograd.grad(fast, list(policy.parameters()))
    fast, plain = float(fast.detach()), float(plain.detach())
    assert abs(fast - plain) < 1e-5 * max(1.0, abs(plain)), (fast, plain)
    for g, w in zip(got, want):     # float round-off: the prompt prefilled with and without a cache
        assert float((g - w).norm()) <= 1e-4 * float(w.norm()), float((g - w).norm() / w.norm())
    assert sum(float(w.abs().sum()) for w in want) > 0
