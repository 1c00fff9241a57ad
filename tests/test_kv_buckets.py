"""The torch backend's kv buckets (TorchBackend(kv_buckets=True), on by default on CUDA): every call
that attends over the cache reads only its first kv_bucket(start + width) rows through the models'
inference path (fused q/k/v and gate/up, models.layers), and its graphs are keyed by (width,
bucket). It must decode what the reference forward (every max_len row) decodes, token for token,
across bucket edges, for chains, the device step, lookups, trees, and a planner's whole cycles
with vision reuse and streaming prefill.
"""
import functools

import numpy as np
import pytest
import torch

from helpers import CYCLES, GapRule, check_equal, frames_of, reuse_profile
from models.layers import kv_bucket
from policies import FixedK
from runtime.adaptive import CostModel, StepPolicy
from runtime.backends.torch import TorchBackend, noised_copy
from runtime.config import BudgetConfig
from runtime.loop import GreedyRule, generate
from runtime.tree import TreeShape
from tiny_torch import V, build, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")
MAX_LEN = 600           # buckets 256, 512, 600
DRIVE_SEED = 11


@pytest.fixture(scope="module")
def models():
    cfg = tiny_config()
    target, expert, routine = build(cfg)
    return cfg, target, expert, {"self": target, "noised": noised_copy(target, 0.05, 1), "routine": routine}


def backend(models, kind: str, kv: bool, static: bool = False, device_greedy: bool = True) -> TorchBackend:
    cfg, target, expert, drafts = models
    be = TorchBackend(cfg, target, expert, drafts[kind], "routine" if kind == "routine" else "self",
                      max_len=MAX_LEN, static=static, kv_buckets=kv)
    be.device_greedy = device_greedy
    return be


def prompt(i: int, length: int):
    return np.random.default_rng(50 + i).integers(0, V, length)


def test_the_buckets_of_a_cache():
    be = TorchBackend(*tiny_config_models(), max_len=MAX_LEN, static=True, kv_buckets=True)
    assert be.buckets() == [256, 512, 600]
    off = TorchBackend(*tiny_config_models(), max_len=MAX_LEN, static=True, kv_buckets=False)
    assert off.buckets() == [600]
    assert off.kv(250, 9) is None and be.kv(250, 9) == 512 and be.kv(0, 256) == 256
    assert TorchBackend(*tiny_config_models(), max_len=64).kv_buckets is False, "off by default on a CPU"


def tiny_config_models():
    cfg = tiny_config()
    target, expert, routine = build(cfg)
    return cfg, target, expert, routine, "routine"


@pytest.mark.parametrize("kind", ["self", "noised", "routine"])
def test_buckets_decode_as_the_reference_across_bucket_edges(models, kind):
    """Prompts that end just before 256 and 512 rows, 24 tokens decoded: plain decoding on the
    reference forward against plain, chains of k = 1, 4, 8 (the device step and the host path),
    eager and static, on the buckets."""
    ref_be = backend(models, kind, kv=False)
    ties, tokens = [], 0
    for i, length in enumerate((240, 250, 500, 505)):
        p = prompt(i, length)
        rule = GapRule()
        plain, _, _ = generate(ref_be, p, rule, FixedK(0), max_new=24)
        tokens += len(plain)
        for static in (False, True):
            for device_greedy in (True, False):
                be = backend(models, kind, kv=True, static=static, device_greedy=device_greedy)
                for k in (0, 1, 4, 8):
                    out, _, _ = generate(be, p, GreedyRule(), FixedK(k), max_new=24)
                    check_equal(out, plain, rule.gaps, f"{kind} len {length} k {k} static {static} "
                                f"device {device_greedy}", ties)
    assert len(ties) <= 0.01 * tokens, f"near-ties {ties}"


class Calls:
    """(start, width, kv_len) of every forward over a cache of the target and the draft."""

    def __init__(self, *modules):
        self.seen, self.handles = [], []
        for m in dict.fromkeys(modules):
            self.handles.append(m.register_forward_pre_hook(self.hook, with_kwargs=True))

    def hook(self, module, args, kwargs):
        cache = args[3] if len(args) > 3 else kwargs.get("cache")
        if cache is None:
            return
        start = args[4] if len(args) > 4 else kwargs.get("start", 0)
        self.seen.append((int(start), args[0].shape[1], kwargs.get("kv_len")))

    def close(self):
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize("kv", [True, False])
def test_every_call_over_the_cache_reads_its_bucket(models, kv):
    """Prefill, draft feeds and chains, verify passes, plain writes and both halves of a token
    tree: each reads kv_bucket(start + width) rows with the buckets on, every row without."""
    _, target, _, drafts = models
    for static in (False, True):
        be = backend(models, "routine", kv=kv, static=static)
        calls = Calls(target, drafts["routine"])
        try:
            generate(be, prompt(0, 250), GreedyRule(), FixedK(4), max_new=20)
            tree = StepPolicy(CostModel(BudgetConfig()), 4, False, 8, tree=TreeShape.parse("8,3,2"))
            _, _, stats = generate(be, prompt(1, 505), GreedyRule(), tree, max_new=20)
            be.write(np.arange(3), 253)
        finally:
            calls.close()
        assert stats.trees, "the second prompt decoded in token trees"
        widths = {w for _, w, _ in calls.seen}
        assert {250, 505, 1, 5} <= widths, sorted(widths)
        for start, w, got in calls.seen:
            assert got == (kv_bucket(start + w, MAX_LEN) if kv else None), (start, w, got)
        assert {got for *_, got in calls.seen} == ({256, 512, 600} if kv else {None})


def test_a_planner_on_buckets_delivers_the_reference_on_a_drive(drive, frame_local_ckpt):
    """The shipped weights (frame-local), every cycle of a drive: spec with vision reuse, lookup
    and streaming prefill on the buckets against plain full prefills on the reference forward:
    the same reasoning and the trajectory within 1e-3 m."""
    from runtime.artifacts import ModelSource, open_backend
    from runtime.planner import Planner

    def planner(kv: bool, cfg):
        be, tok = open_backend(ModelSource(checkpoint=frame_local_ckpt, kv_buckets=kv), cfg.max_len,
                               k_max=cfg.spec.k_max)
        assert be.kv_buckets is kv
        return Planner(be, tok, cfg)

    profile = functools.partial(reuse_profile, 24)
    ref = planner(False, profile())
    fast = planner(True, profile(vision=True, prefill=True, lookup=True))
    streamed = 0
    for c in drive.cycles:
        frames = frames_of(c, ref.cfg.cameras)
        a, b = ref.plan(c.images, c.history, frames=frames), fast.plan(c.images, c.history, frames=frames)
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.reasoning_ids == b.reasoning_ids, c.time
        assert float(np.abs(a.trajectory - b.trajectory).max()) < 1e-3, c.time
        streamed += b.reuse["prefill"]["reused"] > 0
    assert len(drive.cycles) == CYCLES and streamed == CYCLES - 5
    ref.close(), fast.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_graphs_on_buckets_equal_the_eager_reference_on_gpu(models):
    """CUDA graphs per (width, bucket), all captured when the backend is made, against the eager
    reference forward, across bucket edges; nothing captured inside a cycle."""
    cfg, target, expert, drafts = models
    for kind in ("self", "routine"):
        draft = drafts[kind]
        ref = TorchBackend(cfg, target, expert, draft, "self" if kind == "self" else "routine", device="cuda",
                           max_len=MAX_LEN, eager=True, kv_buckets=False)
        fast = TorchBackend(cfg, target, expert, draft, "self" if kind == "self" else "routine", device="cuda",
                            max_len=MAX_LEN, eager=False, kv_buckets=True, k_max=8)
        keys = set(fast.graphs.graphs)
        assert {("target", w, b) for w in range(1, 10) for b in (256, 512, 600)} <= keys, sorted(keys)
        ties = []
        for i, length in enumerate((240, 500)):
            rule = GapRule()
            plain, _, _ = generate(ref, prompt(i, length), rule, FixedK(0), max_new=24)
            for k in (1, 4, 8):
                out, _, _ = generate(fast, prompt(i, length), GreedyRule(), FixedK(k), max_new=24)
                check_equal(out, plain, rule.gaps, f"{kind} len {length} k {k}", ties)
        assert set(fast.graphs.graphs) == keys, f"captured inside a cycle: {sorted(set(fast.graphs.graphs) - keys)}"
