"""The torch backend's loading and expert calls: checkpoints identified by meta.json, refused
when they do not match the tokenizer, the prefill fallback beside the reasoning."""
import json

import numpy as np
import pytest
import torch

from models import io
from core.config import ConfigError
from prompt.vocab import Tokenizer
from runtime.artifacts import find_checkpoints
from models.io import with_tokenizer
from runtime.backend import BackendSpec, expert_noise
from runtime.config import ExpertRequest
from runtime.backends.torch import create
from policies import FixedK
from runtime.loop import GreedyRule, generate
from tiny_torch import build, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

TOK = Tokenizer.build("ego is cruising at 12 m/s , so keep speed".split())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint folder as training writes it: target/, expert/, draft/ (any names), tokenizer.json."""
    root = tmp_path_factory.mktemp("ckpt")
    cfg = with_tokenizer(tiny_config(len(TOK)), TOK)
    target, expert, draft = build(cfg, seed=3)
    TOK.save(root / "tokenizer.json")
    io.save(root / "a", {"target": target}, cfg, {"kind": "target"})
    io.save(root / "b", {"expert": expert}, cfg, {"kind": "expert"})
    io.save(root / "c", {"draft": draft}, cfg, {"kind": "draft"})
    return root, (target, expert, draft)


def test_checkpoints_load_and_decode_like_the_models_they_came_from(saved):
    root, (target, expert, draft) = saved
    be = create(BackendSpec(TOK, checkpoints=find_checkpoints(root), max_len=128))
    prompt = np.arange(20, 40)
    out, _, _ = generate(be, prompt, GreedyRule(), FixedK(3), max_new=12)
    with torch.no_grad():
        seq = list(prompt)
        for _ in range(12):
            logits, _ = target(torch.tensor([seq]), *target.rope(torch.arange(len(seq))[None]))
            seq.append(int(logits[0, -1].argmax()))
    assert out == seq[len(prompt):]
    assert be.draft_kind == "routine" and not be.draft_keeps_proposals


def test_a_checkpoint_of_another_vocabulary_is_refused(saved):
    root, _ = saved
    other = Tokenizer.build("a b c".split())
    with pytest.raises(ConfigError, match="another vocabulary"):
        create(BackendSpec(other, checkpoints=find_checkpoints(root)))


def test_a_target_only_checkpoint_needs_a_draft_choice(saved, tmp_path):
    root, _ = saved
    ckpts = {k: v for k, v in find_checkpoints(root).items() if k != "draft"}
    with pytest.raises(ConfigError, match="--draft self or --draft none"):
        create(BackendSpec(TOK, checkpoints=ckpts))
    be = create(BackendSpec(TOK, checkpoints=ckpts, draft="none", max_len=64))
    out, _, stats = generate(be, np.arange(20, 30), GreedyRule(), FixedK(0), max_new=5)
    assert len(out) == 5 and stats.drafted == 0
    with pytest.raises(ConfigError, match="k = 0"):
        be.draft(np.array([1]), 0, 2)


def test_the_fallback_expert_runs_beside_the_reasoning(saved):
    """The expert on the prefill rows [0, T) in a worker thread while the main thread keeps
    verifying rows >= T gives the same waypoints as when it runs alone."""
    from concurrent.futures import ThreadPoolExecutor

    root, _ = saved
    be = create(BackendSpec(TOK, checkpoints=find_checkpoints(root), max_len=128))
    prompt = np.arange(20, 50)
    generate(be, prompt, GreedyRule(), FixedK(0), max_new=1)
    alone = be.action(np.zeros(0, np.int64), len(prompt), 8.0, seed=7)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(be.action, np.zeros(0, np.int64), len(prompt), 8.0, 7)
        for i in range(10):
            be.verify(np.array([5 + i]), len(prompt) + i, "argmax")
        beside = fut.result()
    assert alone.shape == (64, 3) and np.isfinite(alone).all()
    np.testing.assert_allclose(beside, alone, rtol=1e-5, atol=1e-5)
    tail = be.action(np.array([TOK.cot_end]), len(prompt), 8.0, seed=7)
    assert np.abs(tail - alone).max() > 0            # the final expert reads the reasoning rows too


def test_the_final_expert_depends_on_the_text_not_on_how_its_rows_were_written(saved):
    """The planner passes the whole reasoning to `action` at the prompt length: the rows are
    rewritten in one pass, so stale or differently rounded reasoning rows (verify passes of
    other widths) cannot reach the trajectory."""
    root, _ = saved
    be = create(BackendSpec(TOK, checkpoints=find_checkpoints(root), max_len=128))
    prompt, coc = np.arange(20, 50), np.array([31, 32, 33, TOK.cot_end])
    generate(be, prompt, GreedyRule(), FixedK(0), max_new=1)
    clean = be.action(coc, len(prompt), 8.0, seed=7)
    be.cache[:, :, :, :, len(prompt):len(prompt) + 4] += 1e-3      # rows as another decode wrote them
    assert np.abs(be.action(np.zeros(0, np.int64), len(prompt) + 4, 8.0, seed=7) - clean).max() > 0
    np.testing.assert_array_equal(be.action(coc, len(prompt), 8.0, seed=7), clean)


def test_the_mean_of_several_expert_draws_is_the_experts_own_mean(saved):
    """action(samples=S) returns the waypoints of ActionExpert.sample(samples=S) on the same
    cache and host-drawn noise of the seed (one batch of S draws averaged in action space), and it differs from one draw."""
    root, (_, expert, _) = saved
    be = create(BackendSpec(TOK, checkpoints=find_checkpoints(root), max_len=128))
    prompt = np.arange(20, 50)
    generate(be, prompt, GreedyRule(), FixedK(0), max_new=1)
    one = be.action(np.zeros(0, np.int64), len(prompt), 8.0, seed=7)
    four = be.action(np.zeros(0, np.int64), len(prompt), 8.0, seed=7, request=ExpertRequest(samples=4))
    noise = torch.from_numpy(expert_noise(7, 4, expert.cfg.n_waypoints, expert.cfg.action_dim))
    want, _ = expert.sample(be.cache, len(prompt), torch.tensor([8.0]), rope_delta=be.delta,
                            noise=noise, samples=4)
    np.testing.assert_allclose(four, want[0].numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(four - one).max() > 1e-4
