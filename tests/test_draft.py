"""Routine reasoner: shares (never copies) the target's embedding and head, cached forward ==
full forward (fused, standalone, with images), M-RoPE variant, EAGLE feature alignment."""
import dataclasses

import numpy as np
import pytest
import torch

from models.config import load_preset
from models.draft import Draft, shift_features, target_features
from models.target import Target
from prompt.positions import flat_position_ids, mrope_position_ids
from prompt.vocab import SPECIAL

IMG, VSTART = SPECIAL.index("<|image_pad|>"), SPECIAL.index("<|vision_start|>")
TOL = 1e-5


def make_cfg(**draft):
    cfg = load_preset("tiny")
    target = dataclasses.replace(cfg.target, image_token_id=IMG, vision_start_id=VSTART)
    return dataclasses.replace(cfg, target=target, draft=dataclasses.replace(cfg.draft, **draft))


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return Target(make_cfg().target).eval()


def make_draft(target, **draft):
    torch.manual_seed(1)
    return Draft(make_cfg(**draft), target.embed_tokens, target.lm_head).eval()


def prompt(T=30, image_at=5, n_img=6, seed=0):
    """ids (1, T) with one 2x3 image (grid t=1, h=4, w=6 patches, merge 2) after vision_start."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(40, 1000, (1, T), generator=g)
    ids[0, image_at - 1] = VSTART
    ids[0, image_at:image_at + n_img] = IMG
    return ids


def flat_rope(draft, T, start=0):
    return draft.rope(torch.as_tensor(flat_position_ids(T, start))[None])


def test_state_dict_holds_no_embedding_or_head(target):
    draft = make_draft(target)
    state = draft.state_dict()
    assert not [k for k in state if "embed" in k or "lm_head" in k], sorted(state)
    shared = {target.embed_tokens.weight.data_ptr(), target.lm_head.weight.data_ptr()}
    assert not [k for k, t in state.items() if t.data_ptr() in shared]
    own = {id(p) for p in draft.parameters()}
    assert id(target.embed_tokens.weight) not in own and id(target.lm_head.weight) not in own
    # shared by reference: the draft reads the target's current head, not a copy
    ids, feats = prompt(T=4, image_at=2, n_img=0), torch.randn(1, 4, 3 * 128)
    before, _ = draft(ids, *flat_rope(draft, 4), None, 0, feats)
    with torch.no_grad():
        target.lm_head.weight.mul_(2.0)
    after, _ = draft(ids, *flat_rope(draft, 4), None, 0, feats)
    with torch.no_grad():
        target.lm_head.weight.div_(2.0)
    assert torch.allclose(after, 2 * before, atol=1e-5)


def cached_vs_full(draft, ids, feats, image_embeds, split=(12, 15)):
    """Full causal forward vs prefill [0, a) + a 3-row chunk [a, b) + one row at a time."""
    T = ids.shape[1]
    cos, sin = flat_rope(draft, T)
    full, hidden = draft(ids, cos, sin, None, 0, feats, image_embeds)
    cache = draft.new_cache(1, T + 4)
    a, b = split
    f = (lambda s, e: None) if feats is None else (lambda s, e: feats[:, s:e])
    outs = [draft(ids[:, :a], cos[:, :a], sin[:, :a], cache, 0, f(0, a), image_embeds)[0],
            draft(ids[:, a:b], cos[:, a:b], sin[:, a:b], cache, a, f(a, b))[0]]
    for j in range(b, T):
        outs.append(draft(ids[:, j:j + 1], cos[:, j:j + 1], sin[:, j:j + 1], cache, j, f(j, j + 1))[0])
    diff = (torch.cat(outs, 1) - full).abs().max()
    assert diff < TOL, f"cached vs full forward: max |diff| {diff:.2e}"
    return full, hidden


@pytest.mark.parametrize("features", ["fused", "none"])
def test_cached_forward_equals_full_forward(target, features):
    draft = make_draft(target, features=features)
    ids = prompt()
    feats = torch.randn(1, 30, 3 * 128) if features == "fused" else None
    full, hidden = cached_vs_full(draft, ids, feats, torch.randn(6, 128))
    assert full.shape == (1, 30, 1100) and hidden.shape == (1, 30, 128)
    assert torch.isfinite(full).all()


def test_images_enter_through_the_target_embeddings(target):
    draft = make_draft(target)
    ids, feats = prompt(), torch.randn(1, 30, 3 * 128)
    cos, sin = flat_rope(draft, 30)
    a, _ = draft(ids, cos, sin, None, 0, feats, torch.randn(6, 128))
    b, _ = draft(ids, cos, sin, None, 0, feats, torch.randn(6, 128))
    assert not torch.allclose(a[:, 5:], b[:, 5:]) and torch.equal(a[:, :5], b[:, :5])
    with pytest.raises(ValueError, match="6 image tokens .* but 4 image embeddings"):
        draft(ids, cos, sin, None, 0, feats, torch.randn(4, 128))


def test_own_hidden_feeds_back_as_feature(target):
    """After the first drafted token the draft feeds its own `hidden` (B, T, D) instead of the
    fused target features (B, T, 3D): both shapes are accepted and give different inputs."""
    draft = make_draft(target)
    ids = prompt(T=8, image_at=2, n_img=0)
    cos, sin = flat_rope(draft, 8)
    _, hidden = draft(ids, cos, sin, None, 0, torch.randn(1, 8, 3 * 128))
    logits, again = draft(ids, cos, sin, None, 0, hidden)
    assert logits.shape == (1, 8, 1100) and again.shape == hidden.shape
    with pytest.raises(ValueError, match=r"expected \(B, T, 384\) target hiddens .* or \(B, T, 128\)"):
        draft(ids, cos, sin, None, 0, torch.randn(1, 8, 200))
    with pytest.raises(ValueError, match="features"):
        draft(ids, cos, sin, None, 0, None)


def test_eagle_alignment_of_target_features(target):
    """Row j gets the target's hidden states at position j-1 (the state that produced ids_j)."""
    cfg = make_cfg()
    ids = prompt(T=10, image_at=2, n_img=0)
    cos, sin = target.rope(torch.arange(10)[None])
    with torch.no_grad():
        _, hiddens = target(ids, cos, sin, hidden_layers=cfg.draft.feature_layers)
    feats = target_features(hiddens)
    rows = shift_features(feats)
    assert feats.shape == (1, 10, 3 * 128)
    assert torch.equal(rows[:, 1:], feats[:, :-1]) and rows[:, 0].abs().max() == 0
    assert torch.equal(feats[..., 128:256], hiddens[1])   # low | mid | top, in that order


def test_standalone_draft_refuses_features(target):
    draft = make_draft(target, features="none")
    assert not any(k.startswith(("fc.", "in_proj.")) for k in draft.state_dict())
    ids = prompt(T=6, image_at=2, n_img=0)
    with pytest.raises(ValueError, match="features='none'"):
        draft(ids, *flat_rope(draft, 6), None, 0, torch.randn(1, 6, 384))


def test_mrope_variant(target):
    """rope='mrope' copies the target's M-RoPE: it runs on 3D ids of a prompt with an image, and
    on text-only ids (t = h = w) it equals the FlatRoPE draft with the same weights."""
    flat, mrope = make_draft(target), make_draft(target, rope="mrope")
    mrope.load_state_dict(flat.state_dict())
    ids, feats, img = prompt(), torch.randn(1, 30, 3 * 128), torch.randn(6, 128)
    pos, delta = mrope_position_ids(ids[0].numpy(), np.array([[1, 4, 6]]), 2, IMG, VSTART)
    assert delta < 0   # the image's 6 tokens span only 3 positions
    out3d, _ = mrope(ids, *mrope.rope(torch.as_tensor(pos)[:, None]), None, 0, feats, img)
    assert torch.isfinite(out3d).all()
    text = torch.arange(30)[None]
    a, _ = mrope(ids, *mrope.rope(text[None].expand(3, 1, 30)), None, 0, feats, img)
    b, _ = flat(ids, *flat.rope(text), None, 0, feats, img)
    assert (a - b).abs().max() < TOL
    assert (out3d - b).abs().max() > 1e-4   # the 3D image positions do change the result
    with pytest.raises(ValueError, match=r"FlatRoPE draft takes \(B, T\)"):
        flat.rope(torch.as_tensor(pos)[:, None])


def test_two_layer_draft_with_cache(target):
    draft = make_draft(target, layers=2)
    assert draft.new_cache(1, 8).shape == (2, 2, 1, 2, 8, 32)
    cached_vs_full(draft, prompt(T=20), torch.randn(1, 20, 384), torch.randn(6, 128))
