"""The PyTorch reference backend in fp32 on CPU: greedy speculative output equals plain
decoding token for token on 200 scenes for every k in 1..8 and adaptive k (budget off).

Scenes are synthetic token prompts (text-only, positions 0..T-1 on all M-RoPE axes) for a tiny
random-weight model (hidden 32, 2 layers) so the sweep fits CI; a few real image prompts go
through vision + M-RoPE prefill. Drafts rotate per scene: the target itself (tau = k + 1),
a noised copy of it (partial acceptance) and the random FlatRoPE routine draft (EAGLE
features, mostly first-token rejections). Each scene's stop token is one its plain output
reaches mid-way, so <|cot_end|>-like stops land inside draft blocks.
"""
from collections import Counter

import numpy as np
import pytest
import torch

from prompt.vocab import Tokenizer
from runtime.adaptive import CostModel, StepPolicy
from models.io import with_tokenizer
from runtime.backend import PrefillInputs
from runtime.backends.torch import TorchBackend
from runtime.config import BudgetConfig
from helpers import GapRule, check_equal
from policies import FixedK
from tiny_torch import V, build, tiny_config
from runtime.loop import GreedyRule, generate

SCENES, MAX_NEW = 200, 16


pytestmark = pytest.mark.usefixtures("one_thread")


def scene(i: int):
    rng = np.random.default_rng(1000 + i)
    return rng.integers(0, V, rng.integers(6, 24))


@pytest.mark.slow
def test_greedy_speculative_equals_plain_on_200_scenes_every_k_and_adaptive(tiny_backends):
    kinds = list(tiny_backends)
    branches = {k: Counter() for k in kinds}
    ties, tokens = [], 0
    for i in range(SCENES):
        kind = kinds[i % 3]
        be, prompt = tiny_backends[kind], scene(i)
        rule = GapRule()
        full, _, _ = generate(be, prompt, rule, FixedK(0), max_new=MAX_NEW)
        stop = [full[len(full) // 2]]
        max_new = 7 if i % 4 == 0 else MAX_NEW            # every 4th scene ends at max length
        plain = full[:full.index(stop[0]) + 1][:max_new]
        tokens += len(plain)
        for k in [*range(1, 9), "adaptive"]:
            policy = StepPolicy(CostModel(BudgetConfig()), 4 if k == "adaptive" else k, k == "adaptive", 8)
            out, _, stats = generate(be, prompt, GreedyRule(), policy, stop_ids=stop, max_new=max_new)
            branches[kind].update(stats.branches)
            check_equal(out, plain, rule.gaps, f"scene {i} draft {kind} k {k}", ties)
    assert len(ties) <= 0.001 * tokens * 9, f"near-ties {len(ties)} exceed 0.1% of {tokens * 9} tokens"
    print(f"\nnear-ties {len(ties)} of {tokens * 9} tokens; branches {branches}")
    assert branches["self"]["all_accepted"] and branches["self"]["stop_in_block"]
    assert branches["noised"]["partial"] and branches["noised"]["all_accepted"]
    assert branches["routine"]["first_rejected"]
    assert sum(b["max_length"] for b in branches.values())


def test_self_draft_tau_is_k_plus_1(tiny_backends):
    for k in (2, 5):
        _, _, stats = generate(tiny_backends["self"], scene(1), GreedyRule(), FixedK(k), max_new=1 + 3 * (k + 1))
        assert stats.tau == k + 1 and stats.accepted == stats.drafted


@torch.no_grad()
def test_cached_plain_decoding_equals_full_recompute(tiny_backends):
    """The backend's plain decoding (cache, rollback by start) against a forward over the whole
    sequence without any cache, token by token."""
    be = tiny_backends["routine"]
    for i in range(5):
        prompt = scene(i)
        out, _, _ = generate(be, prompt, GreedyRule(), FixedK(3), max_new=12)
        seq = list(prompt)
        for _ in range(12):
            ids = torch.tensor([seq])
            pos = torch.arange(len(seq))[None]
            logits, _ = be.target(ids, *be.target.rope(pos))
            seq.append(int(logits[0, -1].argmax()))
        assert out == seq[len(prompt):]


def test_static_forward_equals_eager(tiny_backends):
    """The graph path's static forward (index_copy_ writes, masked attention over max_len),
    run uncaptured on CPU, gives the eager tokens for every draft kind."""
    for kind, be in tiny_backends.items():
        static = TorchBackend(be.cfg, be.target, be.expert_model, be.draft_model, be.draft_kind, max_len=128, static=True)
        for i in range(6):
            a, _, _ = generate(be, scene(i), GreedyRule(), FixedK(3), max_new=12)
            b, _, _ = generate(static, scene(i), GreedyRule(), FixedK(3), max_new=12)
            assert a == b, f"{kind} scene {i}: static {b} != eager {a}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_cuda_graphs_equal_eager_on_gpu(tiny_backends):
    cfg = tiny_backends["self"].cfg
    target, expert, routine = build(cfg)
    for kind, draft in (("self", target), ("routine", routine)):
        eager = TorchBackend(cfg, target, expert, draft, kind, device="cuda", max_len=128, eager=True)
        graphs = TorchBackend(cfg, target, expert, draft, kind, device="cuda", max_len=128, eager=False)
        for i in range(20):
            for k in (1, 4, 8):
                a, _, _ = generate(eager, scene(i), GreedyRule(), FixedK(k), max_new=16)
                b, _, _ = generate(graphs, scene(i), GreedyRule(), FixedK(k), max_new=16)
                assert a == b, f"{kind} scene {i} k {k}: graphs {b} != eager {a}"
        assert graphs.graphs.graphs, "no CUDA graph was captured"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_every_cuda_graph_is_captured_when_the_backend_is_made(tiny_backends):
    """Every verify width and draft feed width 1..k_max+1 and the chain step are captured by the
    constructor; decoding at every k then only replays them (nothing captured inside a cycle)."""
    cfg = tiny_backends["self"].cfg
    target, expert, routine = build(cfg)
    be = TorchBackend(cfg, target, expert, routine, "routine", device="cuda", max_len=128, eager=False, k_max=8)
    keys = set(be.graphs.graphs)
    assert {("target", w, kv) for w in range(1, 10) for kv in be.buckets()} <= keys, sorted(keys)
    assert {k[1] for k in keys if k[0] == "draft"} >= set(range(1, 10)), sorted(keys)
    for i in range(5):
        for k in (1, 4, 8):
            generate(be, scene(i), GreedyRule(), FixedK(k), max_new=16)
    assert set(be.graphs.graphs) == keys, f"captured inside a cycle: {sorted(set(be.graphs.graphs) - keys)}"


def test_planner_prompts_with_images_spec_equals_plain():
    """Real prompts: 8 camera images through vision + M-RoPE prefill, then reasoning."""
    from prompt.layout import build_prompt
    from prompt.positions import mrope_position_ids
    from runtime.backend import PrefillInputs
    from runtime.config import PlannerConfig, SpecConfig
    from runtime.planner import Planner

    tok = Tokenizer.build("ego is cruising at 12 m/s , so keep speed the lead brakes slow down".split())
    cfg = with_tokenizer(tiny_config(), tok)
    target, expert, routine = build(cfg, seed=2, std=0.2)
    rng = np.random.default_rng(0)
    t = np.arange(-15, 1) * 0.1
    history = np.stack([8 * t, 0 * t, 0 * t], 1)
    images = [rng.integers(0, 256, (4, 2, 64, 96, 3), dtype=np.uint8) for _ in range(3)]
    outs, trajs = {}, {}
    for k, adaptive in ((0, False), (3, False), (4, True)):
        be = TorchBackend(cfg, target, expert, routine, "routine", max_len=512)
        planner = Planner(be, tok, PlannerConfig(spec=SpecConfig(k=k, adaptive=adaptive), max_reasoning_tokens=24))
        results = [planner.plan(img, history) for img in images]
        outs[(k, adaptive)] = [r.reasoning_ids for r in results]
        trajs[(k, adaptive)] = np.stack([r.trajectory for r in results])
        planner.close()
    plain = outs.pop((0, False))
    assert all(o == plain for o in outs.values()) and any(plain)
    # the same text gives the same waypoints, bit for bit, however it was decoded
    for mode, traj in trajs.items():
        assert np.array_equal(traj, trajs[(0, False)]), f"{mode}: max diff {np.abs(traj - trajs[(0, False)]).max()}"
    rows = []
    be.set_mask(None)
    for img in images[:2]:   # the images reach the prefill: its last logits row differs
        be.vision(img)
        prompt = build_prompt(tok, [24] * 8, history)
        pos, delta = mrope_position_ids(prompt.ids, *be.vision_grid(img.shape), tok.image_pad, tok.vision_start)
        rows.append(be.prefill(PrefillInputs(prompt.ids, pos, delta, prompt.image_spans), "logits"))
    assert np.abs(rows[0] - rows[1]).max() > 1e-3


def test_sampling_through_the_torch_backend(tiny_backends):
    """Speculative sampling with the target as its own draft: p == q, so every draft token is
    accepted (tau = k + 1) and the output is a valid sample; the random routine draft is often
    rejected."""
    from runtime.loop import SamplingRule

    rng = np.random.default_rng(0)
    _, _, stats = generate(tiny_backends["self"], scene(3), SamplingRule(0.6, 0.98, rng), FixedK(4), max_new=21)
    assert stats.accepted == stats.drafted and stats.tau == 5
    out, _, stats = generate(tiny_backends["routine"], scene(3), SamplingRule(1.0, 1.0, rng), FixedK(4), max_new=40)
    assert len(out) == 40 and 0 < stats.accepted < stats.drafted and all(0 <= t < V for t in out)


def test_static_runner_logits_within_1e6_of_eager(tiny_backends):
    """The static runner runs Target.forward / Draft.forward with `start` a device tensor: the
    verify logits, the fused features and the draft's cache match eager within 1e-6 (CPU)."""
    worst = {}
    for kind, be in tiny_backends.items():
        static = TorchBackend(be.cfg, be.target, be.expert_model, be.draft_model, be.draft_kind, max_len=128, static=True)
        ids = np.asarray(scene(3), np.int64)
        pos = np.tile(np.arange(len(ids)), (3, 1))
        for b in (be, static):
            b.set_mask(None)
            b.prefill(PrefillInputs(ids, pos, 0), "argmax")
        start, diffs = len(ids), []
        for width in (1, 3, 4, 2):
            toks = np.arange(width) + 5 * width
            a, s = be.verify(toks, start, "logits"), static.verify(toks, start, "logits")
            diffs.append(np.abs(a - s).max())
            assert np.array_equal(be.draft(toks, start, 3)[0], static.draft(toks, start, 3)[0]), f"{kind}: drafts differ"
            start += width
        diffs.append(float((be.feats[:start] - static.feats[:start]).abs().max()))   # rows written here
        if be.draft_cache is not None:
            diffs.append(float((be.draft_cache[..., :start, :] - static.draft_cache[..., :start, :]).abs().max()))
        worst[kind] = max(diffs)
    assert max(worst.values()) <= 1e-6, f"eager vs static max abs diff per draft kind: {worst}"
    print("eager vs static max abs diff per draft kind:", worst)
