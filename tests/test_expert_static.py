"""The trajectory stage with static shapes (ActionExpert.sample_bucketed, the torch backend's
StaticRunner.expert): every draw and Euler step of a request in one call over a kv bucket of the
cache, the rows past the context masked on the device, so that on CUDA it is one graph replay.
Run uncaptured here (static=True), it must give the eager expert's trajectory to 1e-4 m."""
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.backends.torch import TorchBackend
from helpers import reuse_profile
from runtime.config import ExpertRequest, with_overrides
from tiny_torch import V, build, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")
MAX_LEN = 600
DRIVE_SEED = 11
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def models():
    """Random tiny weights (std 0.2): for what must hold exactly whatever the weights."""
    cfg = tiny_config()
    return cfg, *build(cfg, std=0.2)


def filled(models, static: bool, kv: bool) -> TorchBackend:
    cfg, target, expert, draft = models
    be = TorchBackend(cfg, target, expert, draft, "routine", max_len=MAX_LEN, static=static, kv_buckets=kv)
    be.write(np.random.default_rng(3).integers(0, V, 590), 0)
    be.delta = 7
    return be


def planner(static: bool, kv: bool, cfg):
    from runtime.artifacts import ModelSource, backend_spec
    from runtime.backends.torch import create
    from runtime.planner import Planner

    _, spec = backend_spec(ModelSource(checkpoint=ROOT / "checkpoints" / "tiny", kv_buckets=kv), cfg.max_len,
                           k_max=cfg.spec.k_max)
    spec.static = static
    return Planner(create(spec), spec.tokenizer, cfg)


REQUESTS = {"one": (1, None, "mean"), "mean4": (4, 3, "mean"), "medoid5": (5, None, "medoid"),
            "profile": (8, 2, "mean")}      # the cpu, orin and thor profiles' request


def profile(name: str):
    samples, steps, combine = REQUESTS[name]
    return with_overrides(reuse_profile(24), {"trajectory_samples": samples, "euler_steps": steps,
                                              "trajectory_combine": combine}, "test profile")


@pytest.mark.parametrize("kv, request_", [(True, "one"), (True, "mean4"), (True, "medoid5"), (False, "profile")])
def test_the_static_expert_gives_the_eager_trajectory(drive, kv, request_):
    """checkpoints/tiny on a drive's cycles. With kv buckets the eager expert runs the static
    computation itself (sample_bucketed): the same trajectory to 1e-4 m, for every request.
    Without, the eager expert is the reference over exactly its rows and the static one reads
    every max_len row with the rest masked: only float rounding differs. With the profiles' mean
    of 8 draws that moved the trajectory by at most 6e-6 m here, held to 1e-3 m (the streaming
    tests' bound). A single draw amplifies the rounding (a 1e-7 relative change of the noise
    moved a cycle's waypoints by 0.5-1 mm; the padding by up to 4.3 mm with one draw), and a
    medoid may pick another draw, so the other requests are checked in float64 below instead."""
    cfg = profile(request_)
    eager, static = planner(False, kv, cfg), planner(True, kv, cfg)
    bound = 1e-4 if kv else 1e-3
    for c in drive.cycles[:3]:
        a, b = eager.plan(c.images, c.history), static.plan(c.images, c.history)
        assert a.error is None and b.error is None and a.reasoning_ids == b.reasoning_ids
        err = float(np.abs(a.trajectory - b.trajectory).max())
        assert err < bound, f"cycle at {c.time}: {err:.3g} m"


@pytest.mark.parametrize("request_", list(REQUESTS))
def test_the_bucketed_expert_is_the_exact_one_in_float64(drive, request_):
    """A cycle's cache (checkpoints/tiny), the expert in float64: sample_bucketed over its exact
    rows, a bucket and every row gives sample's waypoints to 1e-6 m (the fp32 state between Euler
    steps is the only rounding left): the padding and the device-side mask change nothing else."""
    import copy

    cfg = profile(request_)
    p = planner(False, False, cfg)
    c = drive.cycles[0]
    res = p.plan(c.images, c.history)
    be, r = p.backend, cfg.expert_request()
    rows = res.prompt_len + len(res.reasoning_ids)
    expert, cache = copy.deepcopy(be.expert_model).double(), be.cache.double()
    noise = torch.randn(r.samples, expert.cfg.n_waypoints, expert.cfg.action_dim, generator=torch.Generator().manual_seed(0))
    v0 = torch.tensor([4.0], dtype=torch.float64)
    steps = r.steps or expert.cfg.euler_steps
    with torch.no_grad():
        want, _ = expert.sample(cache, rows, v0, steps, rope_delta=be.delta, noise=noise, samples=r.samples,
                                combine=r.combine)
        for kv in (rows, be.max_len):
            got, _ = expert.sample_bucketed(cache, kv, torch.tensor([rows]), v0, steps,
                                            rope_delta=torch.tensor([be.delta]), noise=noise, samples=r.samples,
                                            combine=r.combine)
            assert float((want - got).abs().max()) < 1e-6, (kv, float((want - got).abs().max()))


def test_the_static_expert_reads_no_row_past_its_context(models):
    """Rows past `rows` inside the bucket are masked: changing them changes nothing; a row inside
    changes the trajectory (the control)."""
    be = filled(models, True, True)
    r = ExpertRequest(2, 2, "mean")
    before = be.expert(300, 2.0, 0, r)
    with torch.no_grad():
        be.cache[:, :, :, :, 300:512] = torch.randn_like(be.cache[:, :, :, :, 300:512]) * 5
    assert np.array_equal(be.expert(300, 2.0, 0, r), before)
    with torch.no_grad():
        be.cache[:, :, :, :, 290:300] = torch.randn_like(be.cache[:, :, :, :, 290:300]) * 5
    assert float(np.abs(be.expert(300, 2.0, 0, r) - before).max()) > 1e-3


def test_an_expert_call_past_the_cache_is_refused(models):
    be = filled(models, True, True)
    with pytest.raises(ValueError, match="allowed 1..max_len=600"):
        be.expert(601, 1.0, 0, ExpertRequest())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_the_expert_graph_gives_the_eager_trajectory_on_gpu(drive):
    """Captured when the planner is made (warm_expert, every bucket), replayed per cycle: the eager
    trajectory to 1e-4 m on a drive, nothing captured inside a cycle."""
    cfg = with_overrides(reuse_profile(24), {"trajectory_samples": 4, "euler_steps": 3}, "test profile")
    from runtime.artifacts import ModelSource, open_backend
    from runtime.planner import Planner

    def make(eager: bool, kv: bool):
        src = ModelSource(checkpoint=ROOT / "checkpoints" / "tiny", device="cuda", eager=eager, kv_buckets=kv)
        be, tok = open_backend(src, cfg.max_len, k_max=cfg.spec.k_max)
        return Planner(be, tok, cfg)
    fast, ref = make(False, True), make(True, True)      # graphed and eager: the same computation
    keys = set(fast.backend.graphs.graphs)
    assert {("expert", b, 4, 3, "mean") for b in fast.backend.buckets()} <= keys, sorted(keys)
    for c in drive.cycles:
        a, b = ref.plan(c.images, c.history), fast.plan(c.images, c.history)
        assert a.reasoning_ids == b.reasoning_ids
        assert float(np.abs(a.trajectory - b.trajectory).max()) < 1e-4, c.time
    assert set(fast.backend.graphs.graphs) == keys, f"captured inside a cycle: {sorted(set(fast.backend.graphs.graphs) - keys)}"
