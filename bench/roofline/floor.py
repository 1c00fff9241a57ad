"""The measured floor of every engine call of a preset, on any device (`tools.measure_c --floor`).

    measure_floor(cfg, FloorRun(device="cuda", dtype="bf16", max_len=2048, cached=1200, ...)) -> dict

Random weights built on the device in `dtype`, batch 1, the models' own forward (Target,
Draft, ActionExpert): by default their inference path (models/layers.py: attention over the
kv_bucket of the cache, fused projections), `path="reference"` the masked forward over all
max_len rows. Each call is timed as a CUDA graph replay where `graphs` (CUDA only; CUDA events,
median of `runs` after `warmup`), else eagerly (perf_counter, synchronised). Calls:

    target      one target forward of w tokens at rows cached .. cached+w-1, per width w
                (w = 1: a decode step; w = k + 1: a verify), logits of every row
    draft_feed  one draft row with the target's features (through fc); draft_chain: its own hidden
    vision      the ViT over `images` images of image_hw (eager)
    prefill     the target, then the draft, over a prompt of those images (eager, logits of every row)
    expert      one Euler step of the action expert: `samples` draws over cached rows

Each call carries the bytes it must read and write and its FLOPs (bench/common/costs.py's
Shapes, engine layout: the valid cache rows, the logits rows the forward computes), ms, the
bandwidth it reached (GB/s) and its share of the copy bandwidth measured in the same run (a
device-to-device copy of `copy_mb` MiB: read + write bytes over its time). `kernels` counts what
one eager call launches (torch.profiler: CUDA kernels on a GPU; on a CPU the top-level aten ops).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from bench.common.costs import Shapes
from models.layers import fuse_projections, kv_bucket
from core.config import ConfigError, check_choice, check_range
from core.graphs import DRAFT_CHAIN, DRAFT_FEED

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PATHS = ("inference", "reference")


@dataclass(frozen=True)
class FloorRun:
    device: str = "cpu"
    dtype: str = "fp32"
    max_len: int = 2048
    cached: int = 1200
    widths: tuple = (1, 2, 3, 4, 5, 9, 17, 33, 65)
    images: int = 8
    image_hw: tuple = (64, 96)
    samples: int = 8
    runs: int = 30
    warmup: int = 5
    graphs: bool = True         # CUDA graphs on a GPU (ignored on a CPU)
    path: str = "inference"
    copy_mb: int = 512
    seed: int = 0

    def __post_init__(self):
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("path", self.path, PATHS)
        check_range("max_len", self.max_len, lo=2)
        check_range("cached", self.cached, lo=0, hi=self.max_len - 1)
        if not self.widths or any(not 1 <= w <= self.max_len - self.cached for w in self.widths):
            raise ConfigError(f"widths {list(self.widths)}: each in 1..max_len - cached = "
                              f"{self.max_len - self.cached}")
        for name in ("images", "samples", "runs", "copy_mb"):
            check_range(name, getattr(self, name), lo=1)
        check_range("warmup", self.warmup, lo=0)


def measure_floor(cfg, q: FloorRun) -> dict:
    dev = torch.device(q.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {q.device}: torch sees no CUDA device here")
    cfg = _with_image_ids(cfg)
    target, draft, expert = _build(cfg, dev, DTYPES[q.dtype], q)
    timer = Timer(dev, q.runs, q.warmup, q.graphs and dev.type == "cuda")
    copy = copy_gbps(dev, q.copy_mb, timer)
    shapes = Shapes(cfg, q.dtype, "engine")
    out = {"device": q.device, "device_name": _device_name(dev), "dtype": q.dtype, "path": q.path,
           "graphs": timer.graphs, "torch": torch.__version__, "max_len": q.max_len, "cached": q.cached,
           "runs": q.runs, "copy_gbps": copy, "copy_mb": q.copy_mb,
           "threads": torch.get_num_threads() if dev.type == "cpu" else None}
    calls = {"target": {}}
    with torch.inference_mode():
        cache = torch.randn_like(target.new_cache(1, q.max_len))
        dcache = torch.randn_like(draft.new_cache(1, q.max_len))
        for w in q.widths:
            fn = target_call(target, cache, q, w)
            calls["target"][str(w)] = _row(timer.time(fn), shapes.target(w, q.cached + w, q.max_len, w), copy)
        feed, chain = draft_calls(draft, dcache, q)
        calls[DRAFT_FEED] = _row(timer.time(feed), shapes.draft(1, q.cached + 1, q.max_len, 1), copy)
        calls[DRAFT_CHAIN] = _row(timer.time(chain), shapes.draft(1, q.cached + 1, q.max_len, 1, fc=False),
                                    copy)
        vision, prefill, rows = prompt_calls(cfg, target, draft, cache, dcache, q)
        calls["vision"] = {**_row(timer.time(vision, graph=False), shapes.vision(q.images, q.image_hw), copy),
                           "images": q.images, "image_hw": list(q.image_hw)}
        cost = shapes.target(rows, rows, q.max_len, rows)
        cost.extend(shapes.draft(rows, rows, q.max_len, rows))
        calls["prefill"] = {**_row(timer.time(prefill, graph=False), cost, copy), "rows": rows}
        step, graphed = expert_call(expert, cache, q, timer)
        calls["expert"] = {**_row(step, shapes.expert(q.samples, q.cached), copy), "samples": q.samples,
                           "ctx": q.cached, "graph": graphed}
        out["kernels"] = {"target_1": count_kernels(target_call(target, cache, q, 1), dev),
                          DRAFT_FEED: count_kernels(feed, dev), DRAFT_CHAIN: count_kernels(chain, dev)}
    out["calls"] = calls
    out["kernels_how"] = ("CUDA kernels of one eager call (torch.profiler)" if dev.type == "cuda" else
                          "top-level aten ops of one eager call (torch.profiler; a CPU launches no kernels)")
    return out


def _row(ms: float, cost, copy: float) -> dict:
    gbps = cost.bytes / ms / 1e6
    return {"ms": ms, "bytes": cost.bytes, "flops": cost.flops, "gbps": gbps, "share": gbps / copy}


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return platform.processor() or platform.machine()


def _with_image_ids(cfg):
    """Shape presets leave the image token ids unset (-1): the last vocabulary ids stand in."""
    t = cfg.target
    if t.image_token_id >= 0:
        return cfg
    return dataclasses.replace(cfg, target=dataclasses.replace(t, image_token_id=t.llm.vocab_size - 1))


def _build(cfg, dev: torch.device, dtype, q: FloorRun):
    """The three models, allocated and initialised on the device in `dtype` (a 10B target never
    passes through host memory)."""
    from models.action_expert import ActionExpert
    from models.draft import Draft
    from models.target import Target

    torch.manual_seed(q.seed)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with dev:
            target = Target(cfg.target).eval()
            draft = Draft(cfg, target.embed_tokens, target.lm_head).eval()
            expert = ActionExpert(cfg.expert, cfg.target.llm).eval()
    finally:
        torch.set_default_dtype(old)
    if q.path == "inference":
        fuse_projections(target), fuse_projections(draft), fuse_projections(expert)
    return target, draft, expert


def _kv(q: FloorRun, rows: int):
    return kv_bucket(rows, q.max_len) if q.path == "inference" else None


def target_call(target, cache, q: FloorRun, w: int):
    dev = cache.device
    ids = torch.ones(1, w, dtype=torch.long, device=dev)
    cos, sin = target.rope(torch.arange(q.cached, q.cached + w, device=dev)[None])
    start, kv = torch.tensor([q.cached], device=dev), _kv(q, q.cached + w)
    return lambda: target(ids, cos, sin, cache, start, kv_len=kv)[0]


def draft_calls(draft, cache, q: FloorRun):
    """(feed, chain) of one row at row `cached` (models.sizes.draft_steps, on the device)."""
    dev, D = cache.device, draft.llm.hidden
    ids = torch.ones(1, 1, dtype=torch.long, device=dev)
    cos, sin = draft.rope(torch.tensor([[q.cached]], device=dev))
    start, kv = torch.tensor([q.cached], device=dev), _kv(q, q.cached + 1)
    dtype = draft.norm.weight.dtype
    if draft.cfg.features != "fused":
        feed = lambda: draft(ids, cos, sin, cache, start, None, kv_len=kv)[0]     # noqa: E731
        return feed, feed
    feats = torch.randn(1, 1, len(draft.cfg.feature_layers) * D, device=dev, dtype=dtype)
    own = torch.randn(1, 1, D, device=dev, dtype=dtype)
    return (lambda: draft(ids, cos, sin, cache, start, feats, kv_len=kv)[0],
            lambda: draft(ids, cos, sin, cache, start, own, kv_len=kv)[0])


def prompt_calls(cfg, target, draft, cache, dcache, q: FloorRun):
    """(vision, prefill, rows): the ViT over q.images images, and the target then the draft over
    their prompt (16 text rows, the image blocks, 16 text rows) from row 0."""
    from prompt.pixels import images_to_patches

    v, t, dev = cfg.target.vision, cfg.target, cache.device
    rng = np.random.default_rng(q.seed)
    pixels, grid = images_to_patches(rng.integers(0, 256, (q.images, *q.image_hw, 3), dtype=np.uint8),
                                     v.patch, v.temporal_patch, v.merge)
    patches = torch.tensor(pixels, device=dev, dtype=target.embed_tokens.weight.dtype)
    per = int(np.prod(grid, axis=1).sum()) // v.merge ** 2 // len(grid)
    block = [2] + [t.image_token_id] * per + [2]          # a text row on each side, as the prompt's
    ids = torch.tensor([[1] * 16 + block * len(grid) + [1] * 16], device=dev)
    rows = ids.shape[1]
    if rows > q.max_len:
        raise ConfigError(f"{q.images} images make a prompt of {rows} rows, more than max_len={q.max_len}")
    embeds, deep = target.encode_images(patches, grid)
    pos = torch.arange(rows, device=dev)[None]
    cos, sin = target.rope(pos)
    dcos, dsin = draft.rope(pos)
    D, kv = cfg.target.llm.hidden, _kv(q, rows)
    feats = None if draft.cfg.features != "fused" else torch.randn(
        1, rows, len(draft.cfg.feature_layers) * D, device=dev, dtype=embeds.dtype)

    def prefill():
        target(ids, cos, sin, cache, 0, embeds, deep, kv_len=kv)
        return draft(ids, dcos, dsin, dcache, 0, feats, embeds, kv_len=kv)[0]
    return (lambda: target.encode_images(patches, grid)[0]), prefill, rows


def expert_call(expert, cache, q: FloorRun, timer: "Timer") -> tuple[float, bool]:
    """ms of one Euler step of q.samples draws over q.cached rows; graphed where it captures (a
    mask the expert builds on the host is a copy a capture refuses: then eager)."""
    dev, e = cache.device, expert.cfg
    x = torch.randn(q.samples, e.n_waypoints, e.action_dim, device=dev)
    t = torch.full((q.samples,), 0.5, device=dev)
    cos, sin = expert.rope(q.cached, 0, q.samples)
    fn = lambda: expert.velocity(x, t, cache, q.cached, cos, sin)       # noqa: E731
    if timer.graphs:
        try:
            return timer.time(fn), True
        except RuntimeError:
            torch.cuda.synchronize(dev)
    return timer.time(fn, graph=False), False


class Timer:
    """Median ms of a call: a CUDA graph replay between CUDA events, or an eager call
    (synchronised on a GPU, perf_counter on a CPU)."""

    def __init__(self, dev: torch.device, runs: int, warmup: int, graphs: bool):
        self.dev, self.runs, self.warmup, self.graphs = dev, runs, warmup, graphs

    def time(self, fn, graph: bool = True) -> float:
        if self.dev.type != "cuda":
            return self._host(fn)
        run = self._capture(fn) if graph and self.graphs else fn
        for _ in range(self.warmup):
            run()
        times = []
        for _ in range(self.runs):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    def _host(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.runs):
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)

    def _capture(self, fn):
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay


def copy_gbps(dev: torch.device, mb: int, timer: Timer) -> float:
    """Read + write bytes of a device-to-device copy of `mb` MiB over its median time (GB/s)."""
    src = torch.ones(mb * 2 ** 20 // 4, device=dev)
    dst = torch.empty_like(src)
    ms = timer.time(lambda: dst.copy_(src), graph=False)
    return 2 * src.numel() * 4 / ms / 1e6


def count_kernels(fn, dev: torch.device) -> int:
    """What one eager call launches: CUDA kernels on a GPU, top-level aten ops on a CPU."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    events = prof.events()
    if dev.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None and _computes(e))


VIEWS = {"aten::" + n for n in ("view", "select", "slice", "transpose", "t", "alias", "unsqueeze", "squeeze",
                                "expand", "chunk", "split", "as_strided", "permute", "detach", "_unsafe_view",
                                "narrow", "unbind", "empty", "lift_fresh")}
MAYBE_COPIES = {"aten::reshape", "aten::to", "aten::contiguous", "aten::flatten"}


def _computes(e) -> bool:
    """A top-level CPU op that would be a kernel on a GPU: not a view, and a reshape / to only
    where it copied (a no-op .to or a viewable reshape launches nothing)."""
    if e.name in VIEWS:
        return False
    if e.name in MAYBE_COPIES:
        return any(c.name in ("aten::copy_", "aten::clone", "aten::_to_copy") for c in _descendants(e))
    return True


def _descendants(e):
    for c in e.cpu_children:
        yield c
        yield from _descendants(c)


def format_floor(r: dict) -> str:
    c = r["calls"]
    lines = [f"{r['preset']} on {r['device_name']} ({r['device']}, {r['dtype']}, {r['path']} path, "
             f"{'CUDA graphs' if r['graphs'] else 'eager'}): cache {r['max_len']} rows, {r['cached']} cached; "
             f"copy bandwidth {r['copy_gbps']:.1f} GB/s",
             "| call | ms | MB read+written | GB/s | share of copy |", "|---|---|---|---|---|"]
    rows = [(f"target width {w}", v) for w, v in c["target"].items()]
    rows += [(k, c[k]) for k in (DRAFT_FEED, DRAFT_CHAIN, "vision", "prefill", "expert")]
    for name, v in rows:
        lines.append(f"| {name} | {v['ms']:.3f} | {v['bytes'] / 1e6:.1f} | {v['gbps']:.1f} | {v['share']:.1%} |")
    k = r["kernels"]
    lines.append(f"per eager call ({r['kernels_how']}): target width 1 {k['target_1']}, draft feed "
                 f"{k[DRAFT_FEED]}, chain {k[DRAFT_CHAIN]}")
    return "\n".join(lines)
