"""Streaming prefill (PlannerConfig.reuse.prefill, runtime/reuse.py): on a frame_local target a
planner that keeps each frame's image-block K/V delivers the reasoning of a planner that prefills
every cycle in full, on every cycle of a drive, with cache rows equal to float rounding; a frame
whose pixels changed under a known identity is recomputed, never served stale; streaming asked of
a causal target is refused naming why."""
import functools

import numpy as np
import pytest
import torch

from models.layers import frame_local_mask, image_blocks
from core.config import ConfigError
from runtime.artifacts import ModelSource, open_backend
from runtime.config import ReuseConfig
from runtime.planner import Planner
from helpers import CYCLES, frames_of, reuse_profile

pytestmark = pytest.mark.usefixtures("one_thread")
DRIVE_SEED = 11
profile = functools.partial(reuse_profile, 24)      # a planner profile with these reuse settings


def target_cache(be) -> np.ndarray:
    if be.name == "torch":
        return be.cache.numpy()
    if be.name == "onnxruntime":
        return np.asarray(be.cache)
    t = be.meta.target                      # the TensorRT double: device memory read back
    host = np.zeros((t.layers, 2, 1, t.kv_heads, be.max_len, t.head_dim),
                    np.float16 if be.cache.dtype.itemsize == 2 else np.float32)
    be.cuda.d2h(host, be.cache.ptr, be.stream)
    return host.astype(np.float32)


def run_drive(open_planner, drive):
    """A full-prefill planner and a streaming one on every cycle -> per cycle (reasoning equal,
    largest trajectory difference in m, largest prompt-row cache difference, prefill counts)."""
    full = open_planner(profile(vision=True))
    stream = open_planner(profile(vision=True, prefill=True))
    out = []
    for c in drive.cycles:
        frames = frames_of(c, full.cfg.cameras)
        a = full.plan(c.images, c.history, frames=frames)
        b = stream.plan(c.images, c.history, frames=frames)
        assert a.error is None and b.error is None, (a.error, b.error)
        rows = a.prompt_len
        ca, cb = target_cache(full.backend)[..., :rows, :], target_cache(stream.backend)[..., :rows, :]
        out.append((a.reasoning_ids == b.reasoning_ids, float(np.abs(a.trajectory - b.trajectory).max()),
                    float(np.abs(ca - cb).max() / max(1.0, np.abs(ca).max())), b.reuse["prefill"]))
    full.close(), stream.close()
    return out


def assert_exact(per_cycle, n_images=8):
    same = [s for s, *_ in per_cycle]
    assert all(same), f"streaming changed the reasoning on cycles {[i for i, s in enumerate(same) if not s]}"
    worst_traj = max(t for _, t, _, _ in per_cycle)
    worst_cache = max(c for _, _, c, _ in per_cycle)
    assert worst_cache < 1e-5, f"streamed cache rows differ from a full prefill by {worst_cache:.3g} (relative)"
    assert worst_traj < 1e-3, f"streamed trajectories differ by {worst_traj:.3g} m"
    kept = [p["reused"] for *_, p in per_cycle]
    half = n_images // 2
    assert kept == [0] * 5 + [half] * (CYCLES - 5), f"image blocks kept per cycle {kept}"
    assert all(p["computed"] == n_images - p["reused"] for *_, p in per_cycle)


def test_streaming_prefill_is_exact_on_a_drive_torch(drive, frame_local_ckpt):
    def torch_planner(cfg):
        be, tok = open_backend(ModelSource(checkpoint=frame_local_ckpt), cfg.max_len, k_max=cfg.spec.k_max)
        return Planner(be, tok, cfg)
    assert_exact(run_drive(torch_planner, drive))


def test_a_changed_frame_under_a_known_identity_is_recomputed(drive, frame_local_ckpt):
    be, tok = open_backend(ModelSource(checkpoint=frame_local_ckpt), 512)
    full_be, _ = open_backend(ModelSource(checkpoint=frame_local_ckpt), 512)
    stream, full = Planner(be, tok, profile(vision=True, prefill=True)), Planner(full_be, tok, profile())
    c = drive.cycles[0]
    frames = frames_of(c, stream.cfg.cameras)
    stream.plan(c.images, c.history, frames=frames)
    other = np.array(c.images)
    other[1, 0] = 255 - other[1, 0]                    # same (camera, time), other pixels
    res = stream.plan(other, c.history, frames=frames)
    want = full.plan(other, c.history)
    assert res.reuse["prefill"] == {"reused": 7, "computed": 1}
    assert "frame_changed" in res.flags
    assert res.reasoning_ids == want.reasoning_ids
    rows = want.prompt_len
    diff = np.abs(be.cache.numpy()[..., :rows, :] - full_be.cache.numpy()[..., :rows, :]).max()
    assert diff < 1e-4, f"a stale image block was served (cache rows differ by {diff:.3g})"


def test_streaming_asked_of_a_causal_target_is_refused(causal_ckpt):
    be, tok = open_backend(ModelSource(checkpoint=causal_ckpt), 512)
    with pytest.raises(ConfigError, match="frame_local.*causal|causal.*frame_local"):
        Planner(be, tok, profile(vision=True, prefill=True))
    with pytest.raises(ConfigError, match="reuse.vision"):
        ReuseConfig(prefill=True)


def test_the_frame_local_mask_keeps_each_image_block_to_itself():
    IMG, VS, VE = 9, 7, 8
    ids = torch.tensor([[1, 2, VS, IMG, IMG, VE, VS, IMG, VE, 3, 4]])
    assert image_blocks(ids, IMG).tolist() == [[0, 0, 1, 1, 1, 1, 2, 2, 2, 0, 0]]
    T = ids.shape[1]
    rows = torch.arange(T)
    m = frame_local_mask(ids, IMG, rows, rows[None, :] <= rows[:, None])[0, 0]
    assert m[4].tolist() == [False] * 2 + [True] * 3 + [False] * 6      # a pad sees its block up to itself
    assert m[6].tolist() == [False] * 6 + [True] + [False] * 4          # the next block's start: itself only
    assert m[9].tolist() == [True] * 10 + [False]                       # text after: everything before
    assert m[1].tolist() == [True, True] + [False] * 9


@pytest.fixture(scope="module")
def frame_local_onnx(tiny_onnx):
    """The shipped checkpoint's ONNX export (its target is frame_local: with the image_blocks graph)."""
    assert open_backend(ModelSource(engines=tiny_onnx, threads=1), 512)[0].image_attention == "frame_local"
    return tiny_onnx


@pytest.fixture(scope="module")
def causal_onnx(tiny_onnx, tmp_path_factory):
    """An export of a causal target as the backends read it: the shipped export's meta.json says
    llm.image_attention causal and lists no image_blocks graph (restamped; for the refusals only,
    no inference: the graphs themselves were traced frame-local)."""
    import json
    import shutil

    import onnx

    from folders import edit_meta
    from core.config import file_sha256

    out = tmp_path_factory.mktemp("engines") / "tiny-causal-ort"
    shutil.copytree(tiny_onnx, out)

    for graph in out.glob("*.onnx"):     # the graphs' own record of the layout says causal too
        model = onnx.load(str(graph), load_external_data=False)
        for prop in model.metadata_props:
            if prop.key == "specdrive.rope":
                rope = json.loads(prop.value)
                rope.get("target", {})["image_attention"] = "causal"
                prop.value = json.dumps(rope)
        onnx.save(model, str(graph))

    def rehash(node):
        if isinstance(node, dict):
            if "file" in node and "sha256" in node and (out / node["file"]).is_file():
                node["sha256"] = file_sha256(out / node["file"])
            for v in node.values():
                rehash(v)
        elif isinstance(node, list):
            for v in node:
                rehash(v)

    def causal(meta):
        meta["target"]["image_attention"] = "causal"
        del meta["graphs"]["image_blocks"]
        rehash(meta)
    edit_meta(out, causal, restamp=True)
    return out


def test_streaming_prefill_is_exact_on_a_drive_onnxruntime(drive, frame_local_onnx):
    calls = []

    def ort_planner(cfg):
        be, tok = open_backend(ModelSource(engines=frame_local_onnx, threads=1), cfg.max_len, k_max=cfg.spec.k_max)
        assert be.streams_prefill and be.image_attention == "frame_local"
        be.watch_graphs = lambda g, inputs: calls.append((cfg.reuse.prefill, g, inputs))
        return Planner(be, tok, cfg)
    assert_exact(run_drive(ort_planner, drive))
    streamed = [(g, i) for p, g, i in calls if p]
    assert not any(g == "prefill" for g, _ in streamed), "a streaming planner ran the whole prefill graph"
    blocks = [i["ids"].shape[0] for g, i in streamed if g == "image_blocks"]
    assert blocks == [8] * 5 + [4] * (CYCLES - 5), f"image blocks computed per call {blocks}"


def test_a_causal_export_has_no_streaming(causal_onnx):
    be, tok = open_backend(ModelSource(engines=causal_onnx, threads=1), 512)
    assert be.image_attention == "causal" and not be.streams_prefill
    with pytest.raises(ConfigError, match="frame_local"):
        Planner(be, tok, profile(vision=True, prefill=True))


def test_streaming_prefill_is_exact_on_a_drive_tensorrt_double(drive, frame_local_onnx, tmp_path, monkeypatch):
    from fake_engines import engines_on_the_double

    out = engines_on_the_double(frame_local_onnx, tmp_path / "tiny-frame-local-trt", monkeypatch)

    def trt_planner(cfg):
        be, tok = open_backend(ModelSource(engines=out, backend="tensorrt"), cfg.max_len, k_max=cfg.spec.k_max)
        assert be.streams_prefill and be.image_attention == "frame_local"
        return Planner(be, tok, cfg)
    assert_exact(run_drive(trt_planner, drive))


def test_the_approximate_mode_is_off_by_default_flagged_and_exact_until_it_keeps_a_frame(drive, causal_ckpt):
    """reuse.approximate_prefill on a causal target (the shipped weights declared causal): cycles that keep no frame are a full
    prefill's (the new blocks computed in place are causal prefill rows); every cycle that keeps
    one is flagged approximate_prefill; it is refused on a frame_local target and off by default."""
    assert not ReuseConfig().approximate_prefill
    be, tok = open_backend(ModelSource(checkpoint=causal_ckpt), 512)
    full_be, _ = open_backend(ModelSource(checkpoint=causal_ckpt), 512)
    approx = Planner(be, tok, profile(vision=True, approximate_prefill=True))
    full = Planner(full_be, tok, profile(vision=True))
    for i, c in enumerate(drive.cycles):
        frames = frames_of(c, full.cfg.cameras)
        a, b = full.plan(c.images, c.history, frames=frames), approx.plan(c.images, c.history, frames=frames)
        kept = b.reuse["prefill"]["reused"]
        assert kept == (0 if i < 5 else 4), (i, b.reuse)
        assert ("approximate_prefill" in b.flags) == (kept > 0)
        if not kept:
            assert a.reasoning_ids == b.reasoning_ids, i
            rows = a.prompt_len
            diff = np.abs(be.cache.numpy()[..., :rows, :] - full_be.cache.numpy()[..., :rows, :]).max()
            assert diff < 1e-4, (i, diff)


def test_the_approximate_mode_is_refused_where_it_does_not_apply(frame_local_ckpt, causal_onnx):
    be, tok = open_backend(ModelSource(checkpoint=frame_local_ckpt), 512)
    with pytest.raises(ConfigError, match="exact: use reuse.prefill"):
        Planner(be, tok, profile(vision=True, approximate_prefill=True))
    ort_be, tok = open_backend(ModelSource(engines=causal_onnx, threads=1), 512)
    with pytest.raises(ConfigError, match="torch only"):
        Planner(ort_be, tok, profile(vision=True, approximate_prefill=True))
    with pytest.raises(ConfigError, match="exclude each other"):
        ReuseConfig(vision=True, prefill=True, approximate_prefill=True)


def test_runtimes_with_their_own_causal_mask_refuse_a_frame_local_target(frame_local_ckpt, tmp_path):
    """An HF folder (transformers, Edge-LLM) or a TensorRT-LLM checkpoint of a frame_local target
    would be run as a causal model, with other output: refused, naming the layout."""
    from models import io
    from models.hf import save_hf

    _, _, target, _ = io.load_planner(frame_local_ckpt)
    with pytest.raises(ConfigError, match="frame_local.*causal mask"):
        save_hf(target, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_streaming_is_refused_where_image_blocks_and_prefill_differ_in_precision(tiny_onnx, tmp_path):
    """A calibrated export whose prefill is quantized and whose image_blocks is not would stream
    blocks that are not the full prefill's: refused, naming both precisions."""
    import shutil

    from folders import edit_meta

    out = tmp_path / "int8-prefill"
    shutil.copytree(tiny_onnx, out)

    def int8_prefill(meta):      # what calibration's entry says (the graph file itself stays fp32)
        meta["graphs"]["prefill"].update(precision="int8", quantization={"method": "stand-in"})
        meta["precision"] = {**meta["precision"], "prefill": "int8"}
    edit_meta(out, int8_prefill, restamp=True)
    be, tok = open_backend(ModelSource(engines=out, threads=1), 512)
    assert be.streams_prefill and "image_blocks graph is fp32 and the prefill graph int8" in be.stream_mismatch
    with pytest.raises(ConfigError, match="reuse.prefill: the image_blocks graph is fp32 and the prefill graph int8"):
        Planner(be, tok, profile(vision=True, prefill=True))
    Planner(be, tok, profile(vision=True))                  # without streaming it runs
    same, _ = open_backend(ModelSource(engines=tiny_onnx, threads=1), 512)
    assert same.stream_mismatch is None
