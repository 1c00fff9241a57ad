"""Reuse across cycles (PlannerConfig.reuse, runtime/reuse.py) on a short drive (conftest's
`drive`): a planner that reuses vision features and drafts from the last cycles' reasoning delivers the
features, reasoning and trajectory of a planner without reuse on every cycle, on every backend
(torch, onnxruntime, the TensorRT double); a known frame identity with other pixels is encoded
afresh, never served stale; bad frame identities end in an input error; the cache stays bounded."""
import functools

import numpy as np
import pytest
import torch

from core.config import ConfigError, from_dict
from prompt.vocab import Tokenizer
from runtime.artifacts import ModelSource, open_backend
from runtime.config import PlannerConfig, ReuseConfig
from runtime.planner import Planner
from runtime.reuse import VisionCache
from scenes.config import DT, FRAME_OFFSETS
from helpers import CYCLES, frames_of, reuse_profile
from table_backend import TableBackend

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVE_SEED = 7
profile = functools.partial(reuse_profile, 16)      # a planner profile with these reuse settings


def features(be):
    """The vision features the backend holds for prefill, as numpy arrays."""
    if be.name == "torch":
        embeds, deep = be.images
        return [embeds.numpy()] + [d.numpy() for d in deep]
    if be.name == "onnxruntime":
        return [np.asarray(x) for x in be.images]
    v = be.engines["vision"]
    out = []
    for name in ("image_embeds", "deepstack"):
        dims = be.meta.graphs["vision"].dims(name, "outputs")
        host = np.zeros(dims, v.dtype[name])
        be.cuda.d2h(host, v.buf[name], be.stream)
        out.append(host)
    return out


def run_drive(open_planner, drive, fresh=False):
    """Both planners on every cycle: (cycles whose features, reasoning or trajectory differ, max
    feature difference, reused and encoded frames, lookup-proposed tokens of the reuse planner).
    The reference has no reuse; fresh: it encodes every frame afresh every cycle the way the
    reuse planner encodes a new one (vision_frames, its cache emptied before each cycle)."""
    plain = open_planner(profile(vision=True) if fresh else profile())
    reuse = open_planner(profile(vision=True, lookup=True))
    bad, worst, reused, encoded, looked = [], 0.0, [], 0, 0
    for i, c in enumerate(drive.cycles):
        if fresh:
            plain.forget()
        a = plain.plan(c.images, c.history)
        b = reuse.plan(c.images, c.history, frames=frames_of(c, reuse.cfg.cameras))
        fa, fb = features(plain.backend), features(reuse.backend)
        diff = max(float(np.abs(x - y).max()) for x, y in zip(fa, fb))
        worst = max(worst, diff)
        same_traj = a.trajectory is not None and np.array_equal(a.trajectory, b.trajectory)
        if diff or a.reasoning_ids != b.reasoning_ids or not same_traj or b.error:
            bad.append(i)
        reused.append(b.reuse["vision"]["reused"])
        encoded += b.reuse["vision"]["encoded"]
        looked += b.reuse["lookup"]["proposed"]
    plain.close(), reuse.close()
    return bad, worst, reused, encoded, looked


def assert_exact(result, n_images=8):
    bad, worst, reused, encoded, looked = result
    assert not bad, f"reuse differs from no reuse on cycles {bad} (max feature difference {worst:.3g})"
    half = n_images // 2
    assert reused[:5] == [0] * 5 and reused[5:] == [half] * (CYCLES - 5), f"frames reused per cycle {reused}"
    assert encoded == CYCLES * n_images - sum(reused)
    assert looked > 0, "lookup never proposed on a drive"


def torch_planner(cfg):
    be, tok = open_backend(ModelSource(checkpoint=ROOT / "checkpoints" / "tiny"), cfg.max_len, k_max=cfg.spec.k_max)
    return Planner(be, tok, cfg)


def test_reuse_is_exact_on_a_drive_torch(drive):
    torch.set_num_threads(1)
    assert_exact(run_drive(torch_planner, drive))


def test_reuse_is_exact_on_a_drive_onnxruntime(drive, tiny_onnx):
    """The one-image graph (vision_frame) is another graph than the 8-image one: its features
    differ from vision()'s by float rounding (bounded here), so the reference encodes every
    frame afresh through it; reuse itself changes no bit."""
    def ort_planner(cfg):
        be, tok = open_backend(ModelSource(engines=tiny_onnx, threads=1), cfg.max_len, k_max=cfg.spec.k_max)
        assert "vision_frame" in be.sessions, "the export has no one-image vision graph"
        return Planner(be, tok, cfg)
    calls = []

    def counting(cfg):
        p = ort_planner(cfg)
        p.backend.watch_graphs = lambda g, inputs: calls.append((cfg.reuse.lookup, g))
        return p
    assert_exact(run_drive(counting, drive, fresh=True))
    runs = [g for _, g in calls if g.startswith("vision")]
    assert runs.count("vision") == 0, "a reuse planner ran the whole vision graph"
    assert runs.count("vision_frame") == 2 * CYCLES * 8 - 4 * (CYCLES - 5)
    be, _ = open_backend(ModelSource(engines=tiny_onnx, threads=1), 512)
    imgs = drive.cycles[0].images
    be.vision(imgs)
    whole = be.images
    be.use_vision(be.vision_frames(imgs.reshape(-1, *imgs.shape[-3:])))
    for a, b in zip(whole, be.images):
        assert np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max()), "vision_frame is not the vision graph"


def test_an_export_without_the_frame_graph_reuses_through_the_whole_graph(drive, tiny_onnx):
    def ort_planner(cfg):
        be, tok = open_backend(ModelSource(engines=tiny_onnx, threads=1), cfg.max_len, k_max=cfg.spec.k_max)
        del be.sessions["vision_frame"]         # an older export: frames padded to 8 images
        return Planner(be, tok, cfg)
    assert_exact(run_drive(ort_planner, drive))


def test_reuse_is_exact_on_a_drive_tensorrt_double(drive, tiny_onnx, tmp_path, monkeypatch):
    from fake_engines import engines_on_the_double

    out = engines_on_the_double(tiny_onnx, tmp_path / "tiny-trt", monkeypatch)

    def trt_planner(cfg):
        be, tok = open_backend(ModelSource(engines=out, backend="tensorrt"), cfg.max_len, k_max=cfg.spec.k_max)
        assert "vision_frame" in be.engines
        return Planner(be, tok, cfg)
    assert_exact(run_drive(trt_planner, drive, fresh=True))


# --- the cache's guarantees on the table backend (fast) -------------------------------------------

TOK = Tokenizer.build("ego is cruising at 12 m/s , so keep speed the lead brakes slow down".split())
HISTORY = np.stack([8 * np.arange(-15, 1) * 0.1, np.zeros(16), np.zeros(16)], 1)
CAMS = PlannerConfig().cameras


def table_planner(**reuse):
    be = TableBackend(len(TOK), max_len=1024, draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3)
    return Planner(be, TOK, PlannerConfig(reuse=ReuseConfig(**reuse))), be


def images(seed):
    return np.random.default_rng(seed).integers(0, 256, (4, 2, 64, 96, 3), dtype=np.uint8)


def test_a_repeated_identity_with_other_pixels_gets_fresh_features():
    p, be = table_planner(vision=True)
    ref, ref_be = table_planner()
    frames = [[(c, 0.0), (c, 0.5)] for c in CAMS]
    first = p.plan(images(1), HISTORY, frames=frames)
    ref.plan(images(1), HISTORY)
    assert first.reuse["vision"] == {"reused": 0, "encoded": 8, "changed": 0}
    other = images(2)
    other[0, 0] = images(1)[0, 0]           # one frame really is the same, seven are not
    res = p.plan(other, HISTORY, frames=frames)
    assert res.reuse["vision"] == {"reused": 1, "encoded": 7, "changed": 7}
    assert "frame_changed" in res.flags and res.notes
    want = ref.plan(other, HISTORY)
    assert np.array_equal(be.image_feats, ref_be.image_feats), "stale features served"
    assert res.reasoning_ids == want.reasoning_ids and np.array_equal(res.trajectory, want.trajectory)


def test_without_identities_frames_are_keyed_by_content():
    p, be = table_planner(vision=True)
    a, b = images(3), images(4)
    p.plan(a, HISTORY)
    mixed = a.copy()
    mixed[:, 1] = b[:, 1]
    res = p.plan(mixed, HISTORY)
    assert res.reuse["vision"] == {"reused": 4, "encoded": 4, "changed": 0}
    one_pixel = mixed.copy()
    one_pixel[2, 0, 10, 10, 1] ^= 1         # one bit of one pixel: a new frame
    assert p.plan(one_pixel, HISTORY).reuse["vision"]["encoded"] == 1


@pytest.mark.parametrize("frames,word", [
    ([[("front_wide", 0.0)]] * 4, "expected 2"),
    ([[("front_tele", 0.0), ("front_tele", 0.1)]] + [[(c, 0.0), (c, 0.1)] for c in CAMS[1:]], "camera"),
    ([[(c, float("nan")), (c, 0.1)] for c in CAMS], "not finite"),
    ([[(c, "soon"), (c, 0.1)] for c in CAMS], "pair"),
    ([[(c, True), (c, 0.1)] for c in CAMS], "a time is a number of seconds, not bool"),
    ([[(c, 0.0), (c, "0.1")] for c in CAMS], "a time is a number of seconds, not str"),
    ({c: [0.0, 1e303] for c in CAMS}, "time 1e+303 s is out of range; allowed finite, |t| <= 1e+09 s"),
    ([[(c, -1e303), (c, 0.1)] for c in CAMS], "out of range"),
    ({"front_wide": [0.0, 0.1]}, "needs exactly"),
    ("front_wide", "sequence"),
])
def test_bad_frame_identities_end_in_an_input_error_and_the_next_cycle_works(frames, word):
    p, _ = table_planner(vision=True)
    res = p.plan(images(5), HISTORY, frames=frames)
    assert "input_error" in res.flags and word in res.error, res.error
    ok = p.plan(images(5), HISTORY, frames={c: [0.0, 0.1] for c in CAMS})
    assert ok.error is None and ok.reuse["vision"]["encoded"] == 8


def test_the_cache_is_bounded_and_drops_frames_that_left_the_window():
    be = TableBackend(len(TOK))
    cache = VisionCache(max_frames=10)
    keys = lambda t: [(c, round((t - k * DT) * 1e6)) for c in CAMS for k in FRAME_OFFSETS]  # noqa: E731
    for n in range(12):
        cache.encode(be, images(n), keys(n * DT))
        assert len(cache.entries) <= 10
        lo = min(t for _, t in keys(n * DT))
        assert all(t >= lo for _, t in cache.entries), "a frame older than the cycle's oldest stayed"
    content = VisionCache(max_frames=8)
    for n in range(4):
        content.encode(be, images(n), None)
        assert len(content.entries) == 8


def test_reuse_settings_load_from_a_profile_and_are_checked():
    cfg = from_dict(PlannerConfig, {"reuse": {"vision": True, "lookup": True, "max_frames": 24}})
    assert cfg.reuse.vision and cfg.reuse.lookup and cfg.reuse.max_frames == 24
    assert PlannerConfig().reuse == ReuseConfig(vision=False, lookup=False)
    with pytest.raises(ConfigError, match="max_frames"):
        PlannerConfig(reuse=ReuseConfig(vision=True, max_frames=4))
    with pytest.raises(ConfigError, match="unknown key"):
        from_dict(PlannerConfig, {"reuse": {"kv": True}})

    class NoReuse(TableBackend):
        reuses_vision = False
    with pytest.raises(ConfigError, match="reuse.vision"):
        Planner(NoReuse(len(TOK)), TOK, PlannerConfig(reuse=ReuseConfig(vision=True)))


def test_the_projection_of_a_drive_encodes_new_frames_only_and_prices_lookup_steps_without_a_draft():
    import math

    from bench.common.costs import Device, Workload
    from bench.roofline.projection import drive_cycle, project
    from models.config import load_preset

    cfg = load_preset("alpamayo-r1-10b")
    dev = Device("test", dram_gbps=200.0, memory_gb=64.0, fp32_tflops=5.0, fp16_tflops=50.0, int8_tops=100.0)
    w = Workload(images=16, k=4, tau=3.0, reasoning_tokens=30, precision="int8")
    snap, d0, d1 = project(cfg, dev, w), drive_cycle(cfg, dev, w, 4, 0.0), drive_cycle(cfg, dev, w, 4, 1.0)
    assert d0["stages_ms"]["vision"] < snap["stages_ms"]["vision"]
    assert d0["stages_ms"]["prefill"] == snap["stages_ms"]["prefill"]      # the prompt still has 16 images
    steps, st = math.ceil(30 / 3.0), d1["stages_ms"]
    assert d1["speculative"]["reasoning_ms"] == pytest.approx(steps * st["verify_5"])
    assert d0["speculative"]["reasoning_ms"] == pytest.approx(steps * (4 * st["draft_step"] + st["verify_5"]))
    with pytest.raises(ConfigError, match="lookup_share"):
        Workload(lookup_share=1.5)


class _FailingUse:
    """A backend double: encodes frames, then fails to take them (a failed vision call)."""
    def vision_frames(self, frames):
        return [object() for _ in frames]

    def use_vision(self, features):
        raise RuntimeError("vision failed (test)")


def test_a_failed_vision_call_leaves_the_cache_within_its_limit():
    """Issue 50, 5: after a failed vision call the cache held 35 entries against a limit of 32
    until the next cycle."""
    cache = VisionCache(max_frames=4)
    images = np.arange(6 * 2 * 2 * 3, dtype=np.uint8).reshape(6, 2, 2, 3)     # 6 distinct frames
    with pytest.raises(RuntimeError, match="vision failed"):
        cache.encode(_FailingUse(), images, None)
    assert len(cache.entries) <= 4, len(cache.entries)
