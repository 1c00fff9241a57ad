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
