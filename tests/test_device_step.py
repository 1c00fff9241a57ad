"""The torch backend's device-resident greedy step (runtime/backends/torch_step.py): the same
tokens as the host path, and one device-to-host read a step.

Reads are counted through torch's function hooks (TorchFunctionMode): every way a tensor's value
reaches Python (int(), float(), bool(), .item(), .tolist(), .numpy(), .cpu(), numpy's __array__)
is one, and so is a .cpu() or .to() that moves a device tensor to the host. On a GPU each is a
host sync. The host path (the loop's `_chain`: the draft's proposals
and the verify rows come back for the rule) is the reference and the control: it reads k + 1
times a step, so the count can fail.
"""
import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from policies import FixedK
from runtime.backends.torch import TorchBackend, noised_copy
from runtime.loop import DecodeState, GreedyRule, decode, generate
from runtime.reuse import CycleLookup, Lookup
from runtime.step import StepRecord
from tiny_torch import V, build, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

READS = {"__int__", "__float__", "__bool__", "__index__", "item", "tolist", "numpy", "__array__"}
COPIES = {"cpu", "to"}      # a read where they move a device tensor to the host


class CountReads(TorchFunctionMode):
    """Counts the tensor reads to the host made while it is active."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        out = func(*args, **(kwargs or {}))
        moved = name in COPIES and isinstance(out, torch.Tensor) and out.device.type == "cpu" \
            and args[0].device.type != "cpu"
        self.reads += name in READS or moved
        return out


def backend(kind: str, static: bool = False, device_greedy: bool = True) -> TorchBackend:
    cfg = tiny_config()
    target, expert, routine = build(cfg)
    draft = {"routine": routine, "self": target, "noised": noised_copy(target, 0.05, 1)}[kind]
    be = TorchBackend(cfg, target, expert, draft, "routine" if kind == "routine" else "self",
                      max_len=160, static=static)
    be.device_greedy = device_greedy
    return be


def prompts(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(4, V, size=int(rng.integers(4, 12))) for _ in range(n)]


def reads_per_step(be, k: int, prompt) -> list:
    """Decode after a prefill; each step's reads (the observer's own work is not counted)."""
    state = DecodeState.after_prefill(prompt, 5)
    be.prefill(_inputs(prompt), "argmax")
    counts, mode = [], CountReads()

    def observer(rec: StepRecord):
        counts.append(mode.reads)
        mode.reads = 0

    with mode:
        decode(be, state, GreedyRule(), FixedK(k), limit=len(state.seq) + 24, observer=observer)
    return counts


def _inputs(prompt):
    from runtime.backend import PrefillInputs
    ids = np.asarray(prompt, np.int64)
    return PrefillInputs(ids, np.repeat(np.arange(len(ids))[None], 3, axis=0), 0)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("kind", ["routine", "noised"])
def test_a_greedy_step_reads_the_device_once(kind, static):
    be = backend(kind, static)
    for k in (0, 1, 4, 8):
        counts = reads_per_step(be, k, prompts(1, k)[0])
        assert counts and max(counts) == 1, (k, counts)


def test_the_host_path_reads_once_per_token_so_the_count_can_fail():
    be = backend("noised", device_greedy=False)
    counts = reads_per_step(be, 4, prompts(1, 0)[0])
    assert counts[0] == max(counts) == 4 + 1, counts      # k draft tokens, then the verify rows


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("kind", ["routine", "self", "noised"])
def test_the_device_step_gives_the_host_paths_tokens(kind, static):
    """Token for token against the host path and plain decoding, for every k."""
    dev, host = backend(kind, static), backend(kind, static, device_greedy=False)
    for i, prompt in enumerate(prompts(6, 1)):
        plain, _, _ = generate(host, prompt, GreedyRule(), FixedK(0), max_new=20)
        for k in (1, 3, 8):
            out, _, stats = generate(dev, prompt, GreedyRule(), FixedK(k), max_new=20)
            ref, _, ref_stats = generate(host, prompt, GreedyRule(), FixedK(k), max_new=20)
            assert out == ref == plain, (kind, i, k)
            assert stats.ns == ref_stats.ns and stats.ks == ref_stats.ks


def test_lookup_proposals_go_through_the_device_verify():
    """A lookup's tokens (host ids) are verified and accepted on the device, as on the host path."""
    dev, host = backend("routine"), backend("routine", device_greedy=False)
    prompt = prompts(1, 2)[0]
    plain, _, _ = generate(host, prompt, GreedyRule(), FixedK(0), max_new=24)
    store = Lookup(cycles=1, ngram=1)
    store.remember([int(prompt[-1])] + plain)           # the last cycle said the same
    records = []
    out, _, stats = generate(dev, prompt, GreedyRule(), _TakesLookups(4), max_new=24,
                             lookup=CycleLookup(store, len(prompt) - 1), observer=records.append)
    assert out == plain
    assert stats.looked_up_accepted > 0 and any(r.path == "device" and r.source == "lookup" for r in records)


class _TakesLookups(FixedK):
    def plan(self, pending, proposal=None, trees=False):
        from runtime.step import lookup_or_plain
        return lookup_or_plain(proposal[:self.k]) if proposal is not None and len(proposal) else super().plan(pending)


def test_the_step_brings_back_the_draft_and_times():
    be = backend("noised")
    prompt = prompts(1, 3)[0]
    be.prefill(_inputs(prompt), "argmax")
    out = be.greedy_step(np.asarray([5]), len(prompt), np.asarray([5]), len(prompt), 4, None, _clock())
    assert out.draft.shape == (4,) and 0 <= out.accepted <= 4 and 0 <= out.bonus < V
    assert out.draft_ms > 0 and out.verify_ms > 0
    with pytest.raises(ValueError, match="k_max"):
        be.greedy_step(np.asarray([5]), len(prompt), np.asarray([5]), len(prompt), 99, None, _clock())


def _clock():
    import time
    return lambda: time.perf_counter() * 1e3


def test_every_host_read_of_the_torch_backend_goes_through_its_link():
    """No .cpu()/.item()/int(tensor) in the backend's source besides HostLink.down."""
    import inspect
    from runtime.backends import torch as tb, torch_step
    src = inspect.getsource(tb) + inspect.getsource(torch_step).split("class StepTimer")[1]
    for needle in (".cpu()", ".item()", ".tolist()", ".numpy()"):
        assert needle not in src, needle


def test_the_bench_reports_each_steps_path_syncs_and_calls_against_their_floor():
    from bench.bench.measure import host_terms, in_loop_vs_raw
    dev, host = backend("noised"), backend("noised", device_greedy=False)
    for be, path, syncs in ((dev, "device", 1.0), (host, "host", 5.0)):
        recs = []
        generate(be, prompts(1, 4)[0], GreedyRule(), FixedK(4), max_new=40, observer=recs.append)
        full = [r for r in recs if r.k == 4]
        terms = host_terms(full)
        assert terms["paths"] == {path: len(full)} and terms["syncs_per_step"] == syncs
        assert 0.0 <= terms["host_share"] < 1.0 and terms["step_wall_ms"] >= terms["step_calls_ms"]
        calls = in_loop_vs_raw(be, full)
        assert set(calls["verify"]) == {"5"} and set(calls["draft"]) == {"4"}
        assert calls["verify"]["5"]["raw_ms"] > 0 and calls["draft"]["4"]["raw_ms"] > 0


def test_kernel_busy_takes_the_union_of_kernel_intervals():
    from bench.profile.command import kernel_busy
    events = [{"cat": "kernel", "ts": 0, "dur": 100}, {"cat": "kernel", "ts": 50, "dur": 100},
              {"cat": "cpu_op", "ts": 0, "dur": 1000}, {"cat": "kernel", "ts": 300, "dur": 100}]
    assert kernel_busy(events) == {"kernels": 3, "busy_ms": 0.25, "busy_share": 0.625}
    assert kernel_busy([])["kernels"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs, sync debug mode)")
def test_on_cuda_the_graphed_device_step_equals_eager_and_syncs_once():
    """CUDA graphs, the device path: the host path's tokens (eager), and nothing synchronizes in a
    greedy step under torch.cuda.set_sync_debug_mode('error') but the link's one copy back."""
    cfg = tiny_config()
    target, expert, routine = build(cfg)
    for kind, draft in (("self", noised_copy(target, 0.05, 1)), ("routine", routine)):
        eager = TorchBackend(cfg, target, expert, draft, kind, device="cuda", max_len=160, eager=True)
        eager.device_greedy = False
        graphs = TorchBackend(cfg, target, expert, draft, kind, device="cuda", max_len=160, eager=False, k_max=8)
        down = graphs.link.down

        def one_sync(x):
            torch.cuda.set_sync_debug_mode(0)
            try:
                return down(x)
            finally:
                torch.cuda.set_sync_debug_mode("error")
        graphs.link.down = one_sync
        for i, prompt in enumerate(prompts(8, 5)):
            for k in (1, 4, 8):
                a, _, _ = generate(eager, prompt, GreedyRule(), FixedK(k), max_new=20)
                state = DecodeState.after_prefill(prompt, int(graphs.prefill(_inputs(prompt), "argmax")[0]))
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    decode(graphs, state, GreedyRule(), FixedK(k), limit=len(prompt) + 20)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
                assert state.seq[len(prompt):] == a, (kind, i, k)
