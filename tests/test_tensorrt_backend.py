"""The TensorRT backend (issue 14) against test doubles of TensorRT and cuda-python
(tests/trt_doubles.py): the backend's own logic (manifest checks, profile selection, shapes,
buffer sizes and bindings, CUDA graphs per verify width, host<->device traffic) runs here; the
doubles execute the same ONNX graphs with ONNX Runtime. Real engines: the `tensorrt` / `gpu` test at
the end, which skips here with the reason."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engines import build as eb
from engines.profile import load_profile
from core.config import ConfigError, file_sha256
from core.artifacts import stamp_facts
from prompt.tokenizer import load_tokenizer
from runtime.artifacts import ModelSource, open_backend
from runtime.config import PlannerConfig, SpecConfig, load_planner_config, with_overrides
from runtime.planner import Planner
from scenes.world import make_scene
from tests.fake_engines import SHIPPED, TRT, build_fake_engines
from tests.folders import copy_of
from tests.trt_doubles import ContractError, FakeCudaRuntime, FakeTensorRT, install

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engines(tiny_onnx, tmp_path_factory):
    """The session's export of the shipped checkpoint (tests/conftest.py), engines "built" by the double."""
    out = tmp_path_factory.mktemp("engines") / "tiny-trt"
    shutil.copytree(tiny_onnx, out)
    build_fake_engines(out)
    return out


@pytest.fixture
def doubles(monkeypatch):
    cuda = FakeCudaRuntime(sm=87)
    trt = FakeTensorRT(cuda, TRT)
    install(monkeypatch, trt, cuda)
    return trt, cuda


def planner(engines, backend="tensorrt", eager=False, **cfg):
    be, tok = open_backend(ModelSource(engines=engines, backend=backend, eager=eager), 512, k_max=8)
    return Planner(be, tok, PlannerConfig(fallback="on_failure", euler_steps=2, trajectory_samples=8,
                                          max_len=512, **cfg)), be


def test_speculative_equals_plain_and_the_onnxruntime_backend(engines, doubles):
    """20 scenes x k in {1, 4, 8, adaptive} (and a length limit of 13 reasoning tokens) on the
    TensorRT backend (CUDA graphs on): the same reasoning and trajectory as plain decoding of the
    same engines, every loop branch hit; plain decoding equals the onnxruntime backend's."""
    limits = (64, 13)
    plain = {m: planner(engines, spec=SpecConfig(k=0, adaptive=False), max_reasoning_tokens=m)[0] for m in limits}
    ort = planner(engines, backend=None, spec=SpecConfig(k=0, adaptive=False))[0]
    modes = [SpecConfig(k=1, adaptive=False), SpecConfig(k=4, adaptive=False),
             SpecConfig(k=8, adaptive=False), SpecConfig(k=4, adaptive=True)]
    spec = [(64, planner(engines, spec=s)[0]) for s in modes]
    spec.append((13, planner(engines, spec=modes[2], max_reasoning_tokens=13)[0]))
    branches, worst = Counter(), 0.0
    for i in range(20):
        s = make_scene(100 + i, split="test")
        ref = {m: plain[m].plan(s.images, s.history) for m in limits}
        if i < 5:
            o = ort.plan(s.images, s.history)
            worst = max(worst, float(np.abs(o.trajectory - ref[64].trajectory).max()))
            assert o.reasoning_ids == ref[64].reasoning_ids, i
        for m, p in spec:
            r = p.plan(s.images, s.history)
            assert r.reasoning_ids == ref[m].reasoning_ids, (i, m, p.cfg.spec)
            assert np.array_equal(r.trajectory, ref[m].trajectory), (i, m, p.cfg.spec)
            branches.update(r.decode["branches"])
    print(dict(branches), f"trajectory vs onnxruntime: max abs diff {worst:.2e}")
    assert worst <= 1e-5
    for b in ("all_accepted", "partial", "first_rejected", "stop_in_block", "max_length"):
        assert branches[b] > 0, (b, dict(branches))
    trt, cuda = doubles
    # 7 backends, each capturing its 9 verify widths and 3 tree widths up front, none later
    assert cuda.log["graph_launch"] > 0 and cuda.log["graph_instantiate"] <= 7 * (9 + 3)


def test_the_kv_cache_element_size_is_the_engines_kv_dtype(engines, tmp_path, doubles):
    """Engines whose KV tensors TensorRT reports as fp16 get a cache of 2-byte elements, its rows
    copied at that pitch (a 4-byte literal would size and stride the cache for fp32): a cycle runs
    and the cache holds the onnxruntime backend's rows, rounded to fp16."""
    e = copy_of(engines, tmp_path)
    build_fake_engines(e, kv_dtype="float16")
    trt, cuda = doubles
    p, be = planner(e, spec=SpecConfig(k=4, adaptive=False))
    assert be.cache.dtype.itemsize == be.draft_cache.dtype.itemsize == 2
    ref, ort = planner(e, backend=None, spec=SpecConfig(k=0, adaptive=False))
    s = make_scene(100, split="test")
    r, _ = p.plan(s.images, s.history), ref.plan(s.images, s.history)
    assert r.trajectory is not None and r.reasoning_ids
    got = cuda.region(be.cache.ptr, be.cache.nbytes).view(np.float16).reshape(ort.cache.shape)
    rows = slice(0, 8)                              # prompt rows: both backends' prefill wrote them
    want = ort.cache[..., rows, :]
    diff = float(np.abs(got[..., rows, :].astype(np.float32) - want).max())
    print(f"fp16 cache vs onnxruntime's fp32: max abs diff {diff:.2e}")
    assert diff <= 1e-2 * max(1.0, float(np.abs(want).max())), diff


def test_sampling_reads_the_same_logits_as_the_onnxruntime_backend(engines, doubles):
    """Sampled decoding (the "logits" readout: masked logits back to the host, the loop samples):
    with the same seed, the TensorRT backend's reasoning is the onnxruntime backend's, token for
    token, on the same graphs; k = 4 speculative sampling and plain sampling both."""
    for k in (0, 4):
        spec = SpecConfig(decoding="sample", k=k, adaptive=False, seed=3)
        trt_p, ort_p = planner(engines, spec=spec)[0], planner(engines, backend=None, spec=spec)[0]
        for i in range(3):
            s = make_scene(300 + i, split="test")
            a, b = trt_p.plan(s.images, s.history), ort_p.plan(s.images, s.history)
            assert a.reasoning_ids and a.reasoning_ids == b.reasoning_ids, (k, i)


def test_cuda_graphs_equal_eager_and_every_width_is_captured_up_front(engines, doubles):
    """eager=True (no graphs) gives the same tokens; with graphs, every verify width 1..k_max+1
    is captured when the backend is made (after an eager run at that width), and the cycles,
    adaptive k reaching new widths included, only replay them: nothing is captured in a cycle."""
    trt, cuda = doubles
    pg, be = planner(engines, spec=SpecConfig(k=4, adaptive=True))
    runner = be.verify_graphs
    assert set(runner.execs) == set(range(1, be.k_max + 2))
    captured, launches = cuda.log["graph_instantiate"], cuda.log["graph_launch"]
    pe, be_eager = planner(engines, eager=True, spec=SpecConfig(k=4, adaptive=True))
    assert cuda.log["graph_instantiate"] == captured and not be_eager.verify_graphs.execs
    for i in range(3):
        s = make_scene(300 + i, split="test")
        a, b = pg.plan(s.images, s.history), pe.plan(s.images, s.history)
        assert a.reasoning_ids == b.reasoning_ids and np.array_equal(a.trajectory, b.trajectory)
    assert cuda.log["graph_instantiate"] == captured, "a graph was captured inside a cycle"
    assert cuda.log["graph_launch"] > launches


def test_host_device_traffic_per_step(engines, doubles):
    """Per verify of n tokens: n ids in, n arg-max ids out (greedy); per draft call: the fed ids in,
    the k proposals out once; no allocation in a step; everything freed by close()."""
    trt, cuda = doubles
    p, be = planner(engines, spec=SpecConfig(k=4, adaptive=False))
    s = make_scene(7, split="test")
    p.plan(s.images, s.history)
    for n in (1, 5, 5, 5, 9):
        cuda.log.clear(), cuda.bytes.clear()
        out = be.verify(np.arange(10, 10 + n), 300, "argmax")
        assert out.shape == (n,) and out.dtype == np.int64
        assert cuda.bytes["cudaMemcpyHostToDevice"] == 8 * n, cuda.bytes
        assert cuda.bytes["cudaMemcpyDeviceToHost"] == 8 * n, cuda.bytes
        assert cuda.log["cudaMemcpyHostToDevice"] == 1 and cuda.log["cudaMemcpyDeviceToHost"] == 1
        assert cuda.log["malloc_device"] == cuda.log["malloc_host"] == 0
    for fed, k in ((1, 4), (2, 8)):
        cuda.log.clear(), cuda.bytes.clear()
        props, _ = be.draft(np.arange(10, 10 + fed), 300, k)
        assert props.shape == (k,)
        assert cuda.bytes["cudaMemcpyHostToDevice"] == 8 * fed and cuda.bytes["cudaMemcpyDeviceToHost"] == 8 * k
        assert cuda.log["malloc_device"] == cuda.log["malloc_host"] == 0
    be.close()
    assert cuda.live("device") == cuda.live("host") == 0 and not cuda.streams


def test_the_fallback_expert_runs_on_its_own_stream(engines, doubles):
    trt, cuda = doubles
    _, be = planner(engines)
    streams = {g: e.stream for g, e in be.engines.items()}
    assert streams["action_velocity"] is streams["action_output"] is be.action_stream
    assert all(streams[g] is be.stream for g in streams if not g.startswith("action"))
    assert be.action_stream is not be.stream


# --- the doubles enforce the contracts: misuse raises ------------------------------------------------

@pytest.fixture
def step(engines, doubles):
    """The step engine, a context on profile 0 (verify widths 1..9), every tensor bound to buffers
    sized for width 9."""
    trt, cuda = doubles
    e = trt.Runtime(None).deserialize_cuda_engine((engines / "trt" / "step.engine").read_bytes())
    ctx = e.create_execution_context()
    _, stream = cuda.cudaStreamCreateWithFlags(1)
    assert ctx.set_optimization_profile_async(0, int(stream))
    for n in e.input_names:
        if -1 in e.get_tensor_shape(n):
            assert ctx.set_input_shape(n, e.get_tensor_profile_shape(n, 0)[2])
    buffers = {}
    for n in e.names:
        nbytes = int(np.prod(ctx.get_tensor_shape(n))) * np.dtype(e.io[n]["dtype"]).itemsize
        buffers[n] = cuda.cudaMalloc(nbytes)[1]
        assert ctx.set_tensor_address(n, buffers[n])
    return e, ctx, stream, cuda, buffers


def width(ctx, n, hd=32, V=None):
    V = V or len(load_tokenizer(SHIPPED))
    return all([ctx.set_input_shape("ids", (1, n)), ctx.set_input_shape("cos", (1, n, hd)),
                ctx.set_input_shape("sin", (1, n, hd)), ctx.set_input_shape("allowed", (n, V))])


def test_a_bound_context_runs(step):
    e, ctx, stream, cuda, _ = step
    assert width(ctx, 3) and ctx.execute_async_v3(int(stream))


def test_missing_set_input_shape_raises(step):
    e, ctx, stream, cuda, _ = step
    fresh = e.create_execution_context()
    assert fresh.set_optimization_profile_async(1, int(stream))
    for n in e.names:
        fresh.set_tensor_address(n, ctx.addresses[n])
    with pytest.raises(ContractError, match="set_input_shape was not called"):
        fresh.execute_async_v3(int(stream))


def test_an_undersized_buffer_raises(step):
    e, ctx, stream, cuda, _ = step
    small = cuda.cudaMalloc(8 * 4)[1]                 # argmax of width 4 does not fit width 5
    assert ctx.set_tensor_address("argmax", small) and width(ctx, 5)
    with pytest.raises(ContractError, match="run past its allocation"):
        ctx.execute_async_v3(int(stream))


def test_a_shape_outside_the_profile_is_refused(step, engines):
    """set_input_shape returns False outside the active profile; the backend says which profiles."""
    e, ctx, stream, cuda, _ = step
    assert not ctx.set_input_shape("ids", (1, 10))         # profile 0 covers widths 1..9
    assert not e.create_execution_context().set_optimization_profile_async(0, int(stream))  # profile taken
    from runtime.backends.tensorrt.engine import Engine
    assert Engine.profile_for(types_ns(e), {"ids": (1, 9)}) == 0
    with pytest.raises(ConfigError, match="outside every optimization profile"):
        Engine.profile_for(types_ns(e), {"ids": (1, 449)})


def types_ns(e):
    import types
    ranges = [{n: [tuple(s) for s in e.get_tensor_profile_shape(n, p)] for n in ("ids",)}
              for p in range(e.num_optimization_profiles)]
    return types.SimpleNamespace(name="step", ranges=ranges)


def test_a_graph_replayed_at_another_width_raises(step):
    e, ctx, stream, cuda, _ = step
    assert width(ctx, 4) and ctx.execute_async_v3(int(stream))          # warm-up at width 4
    cuda.cudaStreamBeginCapture(stream, 1)
    ctx.execute_async_v3(int(stream))
    _, graph = cuda.cudaStreamEndCapture(stream)
    _, exe = cuda.cudaGraphInstantiate(graph, 0)
    cuda.cudaGraphLaunch(exe, stream)                                    # same width: fine
    assert width(ctx, 6)
    with pytest.raises(ContractError, match="replayed with the context at"):
        cuda.cudaGraphLaunch(exe, stream)


def test_a_capture_right_after_a_shape_change_raises(step):
    e, ctx, stream, cuda, _ = step
    assert width(ctx, 2)
    cuda.cudaStreamBeginCapture(stream, 1)
    with pytest.raises(ContractError, match="enqueue once eagerly"):
        ctx.execute_async_v3(int(stream))


def test_a_context_on_two_streams_raises(step):
    e, ctx, stream, cuda, _ = step
    _, other = cuda.cudaStreamCreateWithFlags(1)
    assert width(ctx, 2)
    with pytest.raises(ContractError, match="after stream"):
        ctx.execute_async_v3(int(other))


def test_copies_out_of_bounds_or_of_the_wrong_kind_raise(doubles):
    trt, cuda = doubles
    _, s = cuda.cudaStreamCreateWithFlags(1)
    _, d = cuda.cudaMalloc(64)
    host = np.zeros(16, np.int64)
    with pytest.raises(ContractError, match="run past"):
        cuda.cudaMemcpyAsync(d, host.ctypes.data, 128, cuda.cudaMemcpyKind.cudaMemcpyHostToDevice, s)
    with pytest.raises(ContractError, match="not device memory"):
        cuda.cudaMemcpyAsync(host.ctypes.data, d, 8, cuda.cudaMemcpyKind.cudaMemcpyHostToDevice, s)
    with pytest.raises(ContractError, match="width"):
        cuda.cudaMemcpy2DAsync(d, 8, d, 16, 16, 2, cuda.cudaMemcpyKind.cudaMemcpyDeviceToDevice, s)


# --- the manifest: engines that do not match this runtime are refused, naming the difference ---------

@pytest.mark.parametrize("how,word", [
    ("sm", "built for sm_87, this GPU is sm_90"),
    ("version", "TensorRT 10.4.0 here"),
    ("k_max", "shapes.k_max=8 but the planner asks for k_max=6"),
    ("hash", "sha256 does not match the manifest"),
    ("precision", "meta.json says int8, the manifest fp16"),
    ("range", "outside the profile's range [8.6, 10.3)"),
])
def test_a_mismatched_manifest_is_refused(engines, tmp_path, monkeypatch, how, word):
    e = copy_of(engines, tmp_path)
    cuda = FakeCudaRuntime(sm=90 if how == "sm" else 87)
    install(monkeypatch, FakeTensorRT(cuda, "10.4.0" if how == "version" else TRT), cuda)
    k_max = 6 if how == "k_max" else 8
    m = json.loads((e / "manifest.json").read_text())
    if how == "hash":
        (e / "trt" / "step.engine").write_bytes((e / "trt" / "step.engine").read_bytes() + b" ")
    elif how == "precision":
        meta = json.loads((e / "meta.json").read_text())
        meta["graphs"]["step"]["precision"] = "int8"
        (e / "meta.json").write_text(json.dumps(stamp_facts(meta)))     # past the facts hash
        m["onnx_meta_sha256"] = file_sha256(e / "meta.json")
    elif how == "range":
        m["tensorrt_range"] = ["8.6", "10.3"]
    (e / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=word.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        open_backend(ModelSource(engines=e, backend="tensorrt"), 512, k_max=k_max)


def test_an_unbuilt_folder_or_no_tensorrt_is_refused_with_the_install_route(engines, tmp_path):
    e = copy_of(engines, tmp_path)
    m = json.loads((e / "manifest.json").read_text())
    with pytest.raises(ConfigError, match=r"needs the 'tensorrt' Python package.*JetPack"):
        open_backend(ModelSource(engines=e, backend="tensorrt"), 512)       # no doubles: no tensorrt here
    m.update(built=False, needs={"install": eb.INSTALL_TENSORRT["orin"]})
    (e / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=r"built: false.*'tensorrt' Python package is not installed.*JetPack"):
        open_backend(ModelSource(engines=e, backend="tensorrt"), 512)


def test_the_plan_command_without_tensorrt_exits_2_naming_the_package(engines, tmp_path):
    e = copy_of(engines, tmp_path)
    code = ("import sys\nfrom tools.cli import main\n"
            f"sys.exit(main(['plan', '--engines', {str(e)!r}, '--backend', 'tensorrt', '--scenes', '1', "
            f"'--out', {str(tmp_path / 'o')!r}, '--quiet']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "'tensorrt'" in r.stderr and "JetPack" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_importing_the_runtime_loads_neither_tensorrt_nor_cuda():
    code = ("import runtime, runtime.artifacts, runtime.backends.graphs, sys\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'cuda', 'onnxruntime')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


# --- the real thing ---------------------------------------------------------------------------------

def real_tensorrt():
    try:
        import tensorrt  # noqa: F401
        from cuda.bindings import runtime as rt
        err, n = rt.cudaGetDeviceCount()
        return n > 0
    except Exception:
        return False


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not real_tensorrt(), reason="needs TensorRT, cuda-python and a CUDA GPU (none here)")
def test_real_engines_speculative_equals_plain(tmp_path):
    """On a device: `specdrive engines build` for the device's profile (ENGINE_PROFILE, else
    orin-fp16 on sm_87 and hopper-fp8 elsewhere), then the TensorRT backend: CUDA graphs against
    eager and speculative against plain, token for token, budget off."""
    from cuda.bindings import runtime as rt
    props = rt.cudaGetDeviceProperties(0)[1]
    name = os.environ.get("ENGINE_PROFILE") or ("orin-fp16" if props.major * 10 + props.minor == 87 else "hopper-fp8")
    prof = load_profile(name)
    out = tmp_path / "engines"
    r = subprocess.run([sys.executable, "-m", "tools.cli", "engines", "build", "--profile", name,
                        "--checkpoint", str(SHIPPED), "--out", str(out)], cwd=ROOT)
    assert r.returncode == 0
    cfg = load_planner_config(prof.planner)

    def real(eager, spec):
        be, tok = open_backend(ModelSource(engines=out, backend="tensorrt", eager=eager), cfg.max_len,
                               k_max=cfg.spec.k_max)
        changes = {"spec": dataclasses.asdict(spec), "fallback": "on_failure", "budget": {"budget_ms": 0.0}}
        return Planner(be, tok, with_overrides(cfg, changes))
    plain = real(False, SpecConfig(k=0, adaptive=False))
    others = [real(False, SpecConfig(k=4, adaptive=True)), real(True, SpecConfig(k=4, adaptive=True))]
    for i in range(8):
        s = make_scene(100 + i, split="test")
        ref = plain.plan(s.images, s.history)
        for p in others:
            assert p.plan(s.images, s.history).reasoning_ids == ref.reasoning_ids, i


def test_the_same_seed_gives_the_same_waypoints_on_every_backend(engines, doubles):
    """Issue 23.3: the expert's noise was drawn by torch on the torch backend and by numpy on
    the graph backends, so the same seed gave trajectories up to 3.5 m apart. Now it is drawn
    once on the host (runtime.backend.expert_noise): torch, onnxruntime and the TensorRT double
    deliver the same reasoning and the same waypoints within float tolerance."""
    cfg = dict(spec=SpecConfig(k=4, adaptive=False))
    torch_be, tok = open_backend(ModelSource(checkpoint=SHIPPED), 512)
    ref = Planner(torch_be, tok, PlannerConfig(fallback="on_failure", euler_steps=2, trajectory_samples=8,
                                               max_len=512, **cfg))
    others = {"onnxruntime": planner(engines, backend="onnxruntime", **cfg)[0],
              "tensorrt": planner(engines, **cfg)[0]}
    worst = 0.0
    for i in range(4):
        s = make_scene(300 + i, split="test")
        want = ref.plan(s.images, s.history)
        assert want.source == "reasoning", (want.flags, want.error)
        for name, p in others.items():
            got = p.plan(s.images, s.history)
            assert got.reasoning_ids == want.reasoning_ids, (name, i)
            diff = float(np.abs(got.trajectory - want.trajectory).max())
            worst = max(worst, diff)
            assert diff < 2e-3, (name, i, diff)
    print(f"largest waypoint difference across backends: {worst:.2e} m")


# --- token trees: the step_tree engine, a profile and a CUDA graph per tree width ---------------------

def test_greedy_trees_equal_plain_decoding_a_profile_and_a_graph_per_tree_width(engines, doubles):
    """step_tree is built with an optimization profile per tree width (9, 17, 33: the widths above
    the one before, tuned at the width); each width's CUDA graph is captured when the backend is
    made and a tree's pass is padded to a captured width. Greedy trees of three shapes (passes of
    at most 9, 17 and 25 rows) give plain decoding's reasoning token for token on 4 test scenes,
    the accepted paths' rows moved on the device, and nothing is captured inside a cycle."""
    trt, cuda = doubles
    plain = planner(engines, spec=SpecConfig(k=0, adaptive=False))[0]
    shapes = ("8,6,3", "16,8,4", "24,8,4")
    trees = {t: planner(engines, spec=SpecConfig(k=8, adaptive=False, tree=t)) for t in shapes}
    be = trees["16,8,4"][1]
    ranges = [r["ids"] for r in be.engines["step_tree"].ranges]
    assert ranges == [[(1, 1), (1, 9), (1, 9)], [(1, 10), (1, 17), (1, 17)], [(1, 18), (1, 33), (1, 33)]]
    assert be.takes_trees and be.tree_width == 33 and set(be.tree_graphs.execs) == {9, 17, 33}
    captured, launches = cuda.log["graph_instantiate"], cuda.log["graph_launch"]
    moves = Counter()
    original = type(be).keep_rows

    def counting(self, start, rows, *rest):
        moves[self is be] += list(rows) != list(range(start, start + len(rows)))
        original(self, start, rows, *rest)
    type(be).keep_rows = counting
    try:
        for i in range(4):
            s = make_scene(100 + i, split="test")
            ref = plain.plan(s.images, s.history)
            for t, (p, _) in trees.items():
                r = p.plan(s.images, s.history)
                assert r.reasoning_ids == ref.reasoning_ids, (i, t)
                assert r.decode["trees"] == r.decode["steps"] and r.decode["tau"] > 1.5, (i, t, r.decode)
    finally:
        type(be).keep_rows = original
    assert cuda.log["graph_instantiate"] == captured, "a graph was captured inside a cycle"
    assert cuda.log["graph_launch"] > launches and sum(moves.values()) > 0, moves


def test_a_tree_wider_than_the_built_widths_is_refused_naming_them(engines, doubles, tmp_path, capsys):
    """A tree whose pass is wider than step_tree's widest profile (33) exits 2 naming the allowed
    nodes (`specdrive plan` with a profile asking for it); a build without step_tree takes no trees."""
    from tools.cli import main

    profile = tmp_path / "wide.yaml"
    profile.write_text((ROOT / "configs" / "planner" / "cpu.yaml").read_text().replace(
        "spec:\n", "spec:\n  tree: '40,8,4'\n", 1))
    with pytest.raises(SystemExit) as e:
        main(["plan", "--engines", str(engines), "--backend", "tensorrt", "--profile", str(profile), "--scenes", "1",
              "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "wider than this backend takes (33); allowed nodes <= 32" in err, err
    _, be = planner(engines, spec=SpecConfig(k=8, adaptive=False, tree="32,8,8"))
    del be.engines["step_tree"]
    from runtime.cycle import check_trees
    with pytest.raises(ConfigError, match="cannot verify token trees"):
        check_trees(be, PlannerConfig(spec=SpecConfig(tree="8,6,3")))
