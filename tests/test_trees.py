"""Token trees (runtime/tree.py): the host logic, and greedy tree decoding on the torch backend
equal to plain decoding token for token, with the accepted rows moved where a chain has them.

Random tiny models (tests/tiny_torch.py) for the sweep and the cache checks; the shipped
checkpoint on real test scenes through the planner for the end-to-end equality."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import GapRule, check_equal
from policies import FixedK
from core.config import ConfigError
from runtime.adaptive import StepPolicy
from runtime.budget import CostModel, CycleBudget
from runtime.step import Chain, StepRecord, TreeStep
from runtime.config import BudgetConfig, SpecConfig
from runtime.backend import PrefillInputs
from runtime.loop import DecodeState, GreedyRule, decode, generate
from runtime.tree import Tree, TreeBuilder, TreeShape, accept_greedy_tree, chain_tree, greedy_run, layout
from tiny_torch import V

ROOT = Path(__file__).resolve().parents[1]
SHAPES = (TreeShape(8, 4, 2), TreeShape(12, 5, 3), TreeShape(6, 6, 1), TreeShape(16, 3, 6))

pytestmark = pytest.mark.usefixtures("one_thread")


class FixedTree(FixedK):
    """Every step the tree `shape` (a chain of its depth where the loop cannot take one)."""

    def __init__(self, shape: TreeShape):
        super().__init__(shape.depth)
        self.tree, self.tree_steps = shape, 0

    def plan(self, pending: int, proposal=None, trees: bool = False):
        return TreeStep(self.tree, self.k) if trees else Chain(self.k)

    def record(self, rec) -> None:
        self.tree_steps += isinstance(rec.step, TreeStep)


def scene(i: int):
    rng = np.random.default_rng(2000 + i)
    return rng.integers(0, V, rng.integers(6, 24))


def random_tree(rng, n: int) -> Tree:
    parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)], np.int64)
    depths = np.zeros(n, np.int64)
    for i in range(n):
        depths[i] = 1 if parents[i] < 0 else depths[parents[i]] + 1
    tokens = np.zeros(n, np.int64)      # siblings differ (as a node's top-K do), in a random order
    for p in set(parents.tolist()):
        kids = np.flatnonzero(parents == p)
        tokens[kids] = rng.permutation(8)[:len(kids)] if len(kids) <= 8 else np.arange(len(kids))
    return Tree(tokens, parents, depths, np.full(n, -1, np.int64))


# --- host logic ----------------------------------------------------------------------------------
def test_layout_sees_exactly_the_pending_rows_the_ancestors_and_itself():
    rng = np.random.default_rng(0)
    for _ in range(50):
        tree, P = random_tree(rng, int(rng.integers(1, 12))), int(rng.integers(1, 4))
        offsets, mask = layout(tree, P)
        assert list(offsets[:P]) == list(range(P))
        for i in range(len(tree)):
            anc = set(tree.path(i))
            want = [True] * P + [j in anc for j in range(len(tree))]
            assert list(mask[P + i]) == want
            assert offsets[P + i] == P - 1 + len(tree.path(i))
        assert (mask[:P, :P] == np.tril(np.ones((P, P), bool))).all() and not mask[:P, P:].any()


def test_a_chain_tree_is_the_causal_layout():
    offsets, mask = layout(chain_tree([4, 2, 7]), 2)
    assert list(offsets) == [0, 1, 2, 3, 4] and (mask == np.tril(np.ones((5, 5), bool))).all()


def test_greedy_walk_follows_the_targets_argmax_down_the_tree():
    """Against a brute force: the longest root path whose every token is the argmax at its parent."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        tree = random_tree(rng, int(rng.integers(1, 10)))
        argmax = rng.integers(0, 3, len(tree) + 1)
        path, bonus = accept_greedy_tree(tree, argmax)
        good = [i for i in range(len(tree))
                if all(tree.tokens[j] == argmax[(tree.parents[j] + 1)] for j in tree.path(i))]
        longest = max((len(tree.path(i)) for i in good), default=0)
        assert len(path) == longest
        assert path == (tree.path(path[-1]) if path else [])
        assert bonus == argmax[path[-1] + 1 if path else 0]


def test_the_builder_keeps_a_tree_of_the_best_scored_candidates():
    rng = np.random.default_rng(2)
    for _ in range(100):
        depth = int(rng.integers(1, 6))
        shape = TreeShape(int(rng.integers(depth, 20)), depth, int(rng.integers(1, 5)))
        b, row = TreeBuilder(shape), 0

        def top(n):
            lp = np.sort(np.log(rng.dirichlet(np.ones(shape.topk + 2), n)), -1)[:, ::-1][:, :shape.topk]
            return rng.integers(0, 50, (n, shape.topk)), lp
        ids, lp = top(1)
        b.root(ids[0], lp[0])
        while (nodes := b.expand()) is not None:
            ids, lp = top(len(nodes))
            b.children(nodes, range(row, row + len(nodes)), ids, lp)
            row += len(nodes)
        tree = b.tree()
        assert len(tree) == min(shape.nodes, len(b.tokens)) and tree.depth <= shape.depth
        assert all(p < i for i, p in enumerate(tree.parents))            # breadth-first, a tree
        scores = np.asarray(b.scores)
        assert sorted(scores[b.kept]) == sorted(scores)[len(scores) - len(tree):]   # the N best
        for i, c in enumerate(b.kept):                                     # the same nodes, re-indexed
            assert tree.tokens[i] == b.tokens[c]
            assert (tree.parents[i] < 0) == (b.parents[c] < 0)
            assert tree.parents[i] < 0 or b.kept[tree.parents[i]] == b.parents[c]
        # an expanded kept node has its ancestors expanded: the fed rows are a prefix of any path
        for i in range(len(tree)):
            fed = [tree.draft_rows[j] >= 0 for j in tree.path(i)]
            assert fed == sorted(fed, reverse=True)


@pytest.mark.parametrize("text, match", [("0,1,1", "nodes=0"), ("8,0,2", "depth=0"), ("8,2,0", "topk=0"),
                                         ("4,8,2", "at most 4 deep"), ("8,2", "N,d,K"), ("99,4,2", "1..64"),
                                         # issue 50: deeper than the chains the backends draft, more
                                         # children than nodes, digits of other scripts
                                         ("17,17,1", r"depth=17 is not allowed; allowed 1\.\.16"),
                                         ("64,64,1", r"depth=64 is not allowed; allowed 1\.\.16"),
                                         ("16,8,17", r"top-K=17 is not allowed; allowed 1\.\.nodes=16"),
                                         ("\uff11\uff16,8,4", "N,d,K"), ("16,\u0668,4", "N,d,K")])
def test_bad_tree_shapes_are_refused_naming_what_is_allowed(text, match):
    with pytest.raises(ConfigError, match=match):
        SpecConfig(tree=text)


def test_bench_refuses_a_tree_deeper_than_the_backends_draft_with_exit_2(tmp_path, capsys):
    """Issue 50, 4: --trees 17,17,1 passed validation, every cycle failed and the plot crashed."""
    from tools.cli import main

    for trees in ("17,17,1", "64,64,1", "16,8,4;\uff11\uff17,8,4"):
        with pytest.raises(SystemExit) as e:
            main(["bench", "--preset", "tiny", "--random-init", "0", "--trees", trees,
                  "--json", str(tmp_path / "b.json")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--trees" in err and "allowed" in err and "Traceback" not in err, err
        assert not (tmp_path / "b.json").exists()


def test_sampling_keeps_chains():
    with pytest.raises(ConfigError, match="sampling keeps chains"):
        SpecConfig(decoding="sample", tree="8,4,2")


def test_a_tree_wider_than_the_backend_takes_is_refused(tiny_backends):
    from runtime.cycle import check_trees
    from runtime.config import PlannerConfig

    be = tiny_backends["self"]
    be.tree_width = 9
    try:
        with pytest.raises(ConfigError, match="allowed nodes <= 8"):
            check_trees(be, PlannerConfig(spec=SpecConfig(tree="12,4,3")))
        check_trees(be, PlannerConfig(spec=SpecConfig(tree="8,4,3")))
    finally:
        be.tree_width = None


def test_the_budget_prices_the_whole_tree_and_falls_back_to_a_chain():
    from runtime.budget import tree_key

    costs = CostModel(BudgetConfig())
    costs.observe("draft", 1.0)
    shape = TreeShape(16, 4, 4)
    assert costs.worst(tree_key(shape)) == pytest.approx(4 * costs.worst("draft"))    # before it is measured
    costs.observe(tree_key(shape), 10.0)
    costs.observe(("verify", 17), 30.0)
    assert costs.tree_worst(shape) == pytest.approx(1.5 * 10.0 + 1.5 * 30.0)
    policy = StepPolicy(costs, 4, False, 8, tree=shape)
    planned = policy.plan(1, trees=True)
    assert planned == TreeStep(shape, 4) and policy.plan(1) == Chain(4)
    refuse = SimpleNamespace(cap=lambda k, p, free=False: k - 1, cap_tree=lambda s, p: None)
    assert CycleBudget.fit(refuse, planned, 1) == Chain(3)
    take = SimpleNamespace(cap=lambda k, p, free=False: k, cap_tree=lambda s, p: s)
    assert CycleBudget.fit(take, planned, 1) == planned


# --- torch: greedy tree decoding is plain decoding ----------------------------------------------
def test_greedy_trees_equal_plain_decoding_every_draft_and_shape(tiny_backends):
    ties, steps, moved = [], 0, 0
    for name, be in tiny_backends.items():
        original = be.keep_rows

        def keep_rows(start, rows, *rest, _orig=original):
            nonlocal moved
            moved += bool(len(rows)) and list(rows) != list(range(start, start + len(rows)))
            _orig(start, rows, *rest)
        be.keep_rows = keep_rows
        try:
            for i in range(30):
                rule = GapRule()
                plain, _, _ = generate(be, scene(i), rule, FixedK(0), max_new=16)
                for shape in SHAPES:
                    policy = FixedTree(shape)
                    out, _, stats = generate(be, scene(i), GreedyRule(), policy, max_new=16)
                    check_equal(out, plain, rule.gaps, f"{name} {shape} scene {i}", ties)
                    steps += stats.trees
        finally:
            del be.keep_rows
    assert steps > 500 and moved > 20, (steps, moved)      # trees ran, and paths off the first branch
    assert len(ties) <= 2, ties


def test_a_self_draft_tree_of_top1_is_a_fully_accepted_chain(tiny_backends):
    for i in range(10):
        _, _, stats = generate(tiny_backends["self"], scene(i), GreedyRule(), FixedTree(TreeShape(5, 5, 1)), max_new=16)
        assert stats.trees >= stats.steps - 1 and all(n == 5 for n in stats.ns[:-1]), stats.ns   # the last: no room


def test_without_the_row_move_tree_decoding_is_wrong(tiny_backends):
    """The check above can fail: keeping the accepted rows where the tree had them breaks it."""
    be = tiny_backends["noised"]
    be.keep_rows = lambda *args: None
    try:
        wrong = sum(generate(be, scene(i), GreedyRule(), FixedTree(TreeShape(12, 4, 3)), max_new=16)[0] !=
                    generate(be, scene(i), GreedyRule(), FixedK(0), max_new=16)[0] for i in range(20))
    finally:
        del be.keep_rows
    assert wrong >= 3


def test_the_caches_after_tree_decoding_hold_plain_decodings_rows(tiny_backends):
    """Target rows [0, t_len) and the draft's kept rows [0, d_len) (a self draft keeps its
    proposals' rows) equal those of the same tokens fed plainly, within float rounding."""
    be = tiny_backends["noised"]
    for i in range(8):
        ids = np.asarray(scene(i), np.int64)
        pos = np.repeat(np.arange(len(ids))[None], 3, 0)
        state = DecodeState.after_prefill(ids, be.prefill(PrefillInputs(ids, pos, 0), "argmax")[0])
        decode(be, state, GreedyRule(), FixedTree(TreeShape(12, 4, 3)), limit=len(ids) + 16)
        seq = torch.as_tensor(state.seq)[None]
        tree_target = be.cache[..., :state.t_len, :].clone()
        tree_draft = be.draft_cache[..., :state.d_len, :].clone()
        ref = be.target.new_cache(1, be.max_len)
        be.target(seq, *be.target.rope(torch.arange(seq.shape[1])[None]), ref, 0)
        assert torch.allclose(tree_target, ref[..., :state.t_len, :], atol=1e-4)
        ref = be.draft_model.new_cache(1, be.max_len)
        be.draft_model(seq, *be.target.rope(torch.arange(seq.shape[1])[None]), ref, 0)
        assert state.d_len > len(ids) and torch.allclose(tree_draft, ref[..., :state.d_len, :], atol=1e-4)


def test_shipped_checkpoint_trees_equal_plain_on_real_scenes():
    """checkpoints/tiny, its flat draft, the cpu profile: the planner's reasoning with a tree equals
    plain decoding's on test scenes, and the tree steps accept past their first branch."""
    from runtime.artifacts import ModelSource, backend_spec
    from runtime.backend import load_backend
    from runtime.config import load_planner_config, with_overrides
    from runtime.planner import Planner
    from scenes.world import make_scene

    prof = load_planner_config("cpu")
    name, spec = backend_spec(ModelSource(checkpoint=ROOT / "checkpoints" / "tiny",
                                          draft=str(ROOT / "checkpoints" / "tiny" / "draft-flat")), prof.max_len, None)
    be = load_backend(name, spec)
    scenes = [make_scene(i, split="test") for i in range(4)]
    outs, taus = {}, {}
    for mode, sp in (("plain", {"k": 0, "adaptive": False}), ("tree", {"k": 8, "adaptive": False, "tree": "24,8,4"})):
        planner = Planner(be, spec.tokenizer, with_overrides(prof, {"spec": sp, "budget": {"budget_ms": 0.0}}))
        res = [planner.plan(np.asarray(s.images), np.asarray(s.history, np.float32)) for s in scenes]
        outs[mode] = [r.reasoning_ids for r in res]
        taus[mode] = [r.decode["tau"] for r in res]
        if mode == "tree":
            assert all(r.decode["trees"] == r.decode["steps"] for r in res)
    assert outs["tree"] == outs["plain"] and all(len(o) > 10 for o in outs["plain"])
    assert np.mean(taus["tree"]) > 3.0


# --- onnxruntime: the export's step_tree graph ---------------------------------------------------
def _planner_outputs(be, tok, prof, spec_changes, scenes):
    from runtime.config import with_overrides
    from runtime.planner import Planner

    planner = Planner(be, tok, with_overrides(prof, {"spec": spec_changes, "budget": {"budget_ms": 0.0}}))
    return [planner.plan(np.asarray(s.images), np.asarray(s.history, np.float32)) for s in scenes]


def test_onnxruntime_trees_equal_plain_on_real_scenes(tiny_onnx):
    """The exported step_tree graph verifies the tree (the draft graphs expand one node per depth):
    the reasoning equals plain decoding's on the same export, and trees were taken."""
    from runtime.artifacts import ModelSource, backend_spec
    from runtime.backend import load_backend
    from runtime.config import load_planner_config
    from scenes.world import make_scene

    prof = load_planner_config("cpu")
    name, spec = backend_spec(ModelSource(engines=tiny_onnx, backend="onnxruntime", threads=1), prof.max_len, None)
    be = load_backend(name, spec)
    assert be.takes_trees and be.tree_width == be.meta.k_max + 1
    scenes = [make_scene(i, split="test") for i in range(3)]
    plain = _planner_outputs(be, spec.tokenizer, prof, {"k": 0, "adaptive": False}, scenes)
    tree = _planner_outputs(be, spec.tokenizer, prof, {"k": 8, "adaptive": False, "tree": "8,6,3"}, scenes)
    assert [r.reasoning_ids for r in tree] == [r.reasoning_ids for r in plain]
    assert all(r.decode["trees"] > 0 for r in tree) and np.mean([r.decode["tau"] for r in tree]) > 2.0
    from runtime.config import PlannerConfig
    from runtime.cycle import check_trees

    with pytest.raises(ConfigError, match="allowed nodes <= 8"):
        check_trees(be, PlannerConfig(spec=SpecConfig(tree="12,6,3")))
    del be.sessions["step_tree"]            # an export made before token trees
    with pytest.raises(ConfigError, match="cannot verify token trees"):
        check_trees(be, PlannerConfig(spec=SpecConfig(tree="8,6,3")))


def _tree_policy(tree_tokens: float | None = None):
    """An adaptive policy with a 16,4,4 tree beside chains whose runs end at the first or second
    token (the best chain gives ~1.5 tokens per ~6 ms; the tree costs ~12.7 ms a step); with
    tree_tokens, the tree is measured at that many tokens per step and past its first looks."""
    from runtime.budget import tree_key

    costs = CostModel(BudgetConfig())
    costs.observe("draft", 1.0)
    for w in range(1, 18):
        costs.observe(("verify", w), 5.0 + 0.1 * w)
    shape = TreeShape(16, 4, 4)
    costs.observe(tree_key(shape), 6.0)
    p = StepPolicy(costs, 4, True, 8, tree=shape)
    for n in (0, 1) * 5:
        p.rate.observe(4, n)
        if tree_tokens is not None:
            p.tree_tau.observe(tree_tokens)
    if tree_tokens is not None:
        p.tree_tau.asked = 1                # past the first measuring steps, not a re-measuring one
    return p, shape


def test_the_adaptive_choice_takes_the_tree_only_when_its_measured_rate_wins():
    p, shape = _tree_policy(4.5)            # 4.5 tokens per 12.7 ms beats the chain
    assert p.plan(1, trees=True) == TreeStep(shape, 4)
    p, shape = _tree_policy(1.2)            # 1.2 tokens per 12.7 ms does not
    assert isinstance(p.plan(1, trees=True), Chain)


def test_a_tree_that_keeps_losing_is_looked_at_less_and_less_and_a_winner_every_step():
    p, shape = _tree_policy()               # measured at 1.2 tokens a step: loses to the chain
    looks = []
    for ask in range(300):
        if isinstance(p.plan(1, trees=True), TreeStep):
            looks.append(ask)
            p.tree_tau.observe(1.2)
    # two measuring steps, then looks 8, 16, 32, 64, 128 and 256 asks apart at most
    assert looks[:2] == [0, 1] and len(looks) <= 2 + 6
    gaps = np.diff(looks[2:])
    assert len(gaps) >= 3 and all(b > a for a, b in zip(gaps, gaps[1:]))
    p, shape = _tree_policy()
    for _ in range(2):
        p.tree_tau.observe(4.5)             # wins: taken every step
    assert all(p.plan(1, trees=True) == TreeStep(shape, 4) for _ in range(50))


def test_a_tree_step_measures_the_greedy_chain_it_competes_with():
    # depth 1: a (the root's most likely), b; depth 2: c, d under a (c first), e under b; depth 3: f under c
    tree = Tree(np.array([10, 11, 12, 13, 14, 15]), np.array([-1, -1, 0, 0, 1, 2]),
                np.array([1, 1, 2, 2, 2, 3]), np.full(6, -1))
    assert greedy_run(tree, [0, 2, 5]) == (3, 3)     # the whole line: a chain of 3 accepts all
    assert greedy_run(tree, [0, 3]) == (3, 1)        # leaves it at depth 2: rejected at token 2
    assert greedy_run(tree, [1, 4]) == (3, 0)
    assert greedy_run(tree, []) == (3, 0)
    shape = TreeShape(6, 3, 2)
    policy = StepPolicy(CostModel(BudgetConfig()), 4, True, 8, tree=shape)
    policy.record(StepRecord(TreeStep(shape, 3), 3, np.array([10, 13, 15]), 2, 7, 1.0, 2.0, [10, 13, 99],
                             nodes=6, chain=greedy_run(tree, [0, 3])))
    assert policy.rate.at_risk[0, :3].tolist() == [1.0, 1.0, 0.0] and policy.rate.ended[0, 1] == 1.0
