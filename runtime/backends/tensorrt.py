"""The TensorRT backend: the engines of `specdrive engines build` (one per graph of
`specdrive export onnx`) driven with numpy, TensorRT's Python API and cuda-python only.

The folder is the one the build wrote: ONNX graphs + meta.json (what the graphs are) and
manifest.json (profile, shapes, precision per graph, target SM, TensorRT range, engine hashes).
An engine whose manifest does not match this runtime (shapes, k_max, precision, SM, TensorRT
version, hashes) is refused naming the difference (`check_manifest`).

Device memory, allocated once (cuda-python's `cudaMalloc`; pycuda is not used: it cannot be built
without the CUDA headers, and NVIDIA maintains cuda-python):

    cache, draft_cache   (layers, 2, 1, kv_heads, max_len, head_dim) fp32 KV, written by index
    feats                (max_len + 1, F) target features; row r at index r + 1, index 0 zeros
    rope, draft_rope     (max_len, hd) cos / sin of every cache row (target: per prompt's delta)
    mask                 (P + rows, V) bool: the periodic mask tiled, a call reads n rows from
                         row (index0 - first) % P
    arange               (max_len,) int64 0..max_len-1: a call's `start` input is one element
    proposals            (max_len + k_max,) int64: the draft chain's arg-maxes, fed back on device
    I/O buffers          per engine, sized for the largest shape any optimization profile allows

A target step copies its inputs into the step engine's static buffers (device to device, from the
tables above), runs the engine (a CUDA graph per verify width, captured at start), writes the new K/V rows
into the cache with one cudaMemcpy2DAsync and reads back the arg-max. Per verify of n tokens the
host sends the n ids and reads n ids back (greedy); per draft call it sends the fed ids and reads
the k proposals once. The action expert runs on its own stream: it waits on an event recorded after
the last cache write, copies the cache rows it reads into its context buffer, and its Euler update
runs on the host (the export has no axpy graph; two (S, W, A) copies per Euler step).

Documentation followed (TensorRT 10.3 Python API and Developer Guide; CUDA Runtime API 12.x):
  IExecutionContext.set_optimization_profile_async / set_input_shape / set_tensor_address /
  execute_async_v3; ICudaEngine.get_tensor_profile_shape / num_io_tensors / get_tensor_name /
  get_tensor_mode (Developer Guide, "Working with Dynamic Shapes", "Optimization Profiles");
  CUDA graphs over execute_async_v3 (Developer Guide, "CUDA Graphs": enqueue once after a shape
  change before capturing; a graph holds the shapes and addresses of its capture);
  cudaStreamBeginCapture / cudaStreamEndCapture / cudaGraphInstantiate / cudaGraphLaunch
  (CUDA Runtime API, "Graph Management", "Stream Management"); cudaMemcpy2DAsync ("Memory
  Management"). cuda-python returns (error, value...) tuples from every call.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from prompt.config import ConfigError, file_sha256
from prompt.graphs import ACTION_GRAPHS, ACTION_OUTPUT, ACTION_VELOCITY, DRAFT_CHAIN, DRAFT_FEED, DRAFT_PREFILL, PREFILL, STEP, VISION, VISION_FRAME
from runtime.backend import BackendSpec, PrefillInputs
from runtime.backends.graphs import GraphBackend, output_dims, split_frames

INSTALL = ("on Jetson Orin (JetPack 6.1+): `sudo apt install python3-libnvinfer` (TensorRT 10.3); on "
           "DRIVE OS 6 TensorRT 8.6 comes with the DRIVE OS SDK; on x86 GPUs: `pip install tensorrt`; "
           "and cuda-python for device memory and streams: `pip install 'cuda-python>=12'` (pycuda is "
           "not needed)")
# a graph's Q/DQ precision (meta.json, calibration/) -> the engine precision it must be built at;
# fp32 graphs build at the profile's fp32 / fp16 / bf16
QUANTIZED = {"int8": "int8", "int8_sq": "int8", "fp8": "fp8"}


def import_libraries():
    """(tensorrt, cuda runtime) imported now, or a ConfigError naming the package and the route."""
    try:
        import tensorrt as trt
    except ImportError:
        raise ConfigError("--backend tensorrt needs the 'tensorrt' Python package, which is not "
                          f"installed here; install it: {INSTALL}") from None
    try:
        from cuda.bindings import runtime as cudart          # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart                          # older cuda-python 12.x
        except ImportError:
            raise ConfigError("--backend tensorrt needs 'cuda-python', which is not installed here; "
                              "install it: pip install 'cuda-python>=12'") from None
    return trt, cudart


class Cuda:
    """cuda-python's runtime API with its (error, value...) results checked, and every allocation
    this backend made (freed by close)."""

    def __init__(self, rt):
        self.rt, self.ok = rt, rt.cudaError_t.cudaSuccess
        self.kind = rt.cudaMemcpyKind
        self.device, self.host = [], []

    def __call__(self, name: str, *args):
        err, *values = getattr(self.rt, name)(*args)
        if err != self.ok:
            raise RuntimeError(f"CUDA {name}: {err}")
        return values[0] if len(values) == 1 else (tuple(values) or None)

    def malloc(self, nbytes: int) -> int:
        ptr = int(self("cudaMalloc", max(int(nbytes), 1)))
        self.device.append(ptr)
        return ptr

    def pinned(self, shape, dtype) -> np.ndarray:
        """Page-locked host memory (cudaMallocHost) as a numpy array: async copies from it."""
        nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
        ptr = int(self("cudaMallocHost", nbytes))
        self.host.append(ptr)
        return np.frombuffer((ctypes.c_byte * nbytes).from_address(ptr), dtype).reshape(shape)

    def h2d(self, dst: int, host: np.ndarray, stream) -> None:
        self("cudaMemcpyAsync", dst, host.ctypes.data, host.nbytes, self.kind.cudaMemcpyHostToDevice, stream)

    def d2h(self, host: np.ndarray, src: int, stream) -> None:
        self("cudaMemcpyAsync", host.ctypes.data, src, host.nbytes, self.kind.cudaMemcpyDeviceToHost, stream)

    def d2d(self, dst: int, src: int, nbytes: int, stream) -> None:
        self("cudaMemcpyAsync", dst, src, nbytes, self.kind.cudaMemcpyDeviceToDevice, stream)

    def blocks(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, stream) -> None:
        """`height` blocks of `width` bytes, pitches in bytes (cudaMemcpy2DAsync, device to device)."""
        self("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height,
             self.kind.cudaMemcpyDeviceToDevice, stream)

    def close(self) -> None:
        for ptr in self.device:
            self("cudaFree", ptr)
        for ptr in self.host:
            self("cudaFreeHost", ptr)
        self.device, self.host = [], []


class Engine:
    """One engine: an execution context per optimization profile (all on one stream), its I/O
    tensors and static device buffers sized for the largest shapes any profile allows."""

    def __init__(self, trt, cuda: Cuda, runtime, file: Path, stream, bound: dict | None = None):
        self.name, self.cuda, self.stream = file.stem, cuda, stream
        self.engine = e = runtime.deserialize_cuda_engine(file.read_bytes())
        if e is None:
            raise ConfigError(f"{file}: TensorRT cannot deserialize it (built by another TensorRT "
                              "version or for another GPU?); rebuild on this device")
        names = [e.get_tensor_name(i) for i in range(e.num_io_tensors)]
        self.inputs = [n for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dynamic = [n for n in self.inputs if -1 in tuple(e.get_tensor_shape(n))]
        self.dtype = {n: np.dtype(trt.nptype(e.get_tensor_dtype(n))) for n in names}
        self.ranges = [{n: [tuple(s) for s in e.get_tensor_profile_shape(n, p)] for n in self.dynamic}
                       for p in range(e.num_optimization_profiles)]
        self.contexts = []
        for p in range(e.num_optimization_profiles):
            ctx = e.create_execution_context()
            if not ctx.set_optimization_profile_async(p, int(stream)):
                raise RuntimeError(f"{self.name}: cannot select optimization profile {p}")
            self.contexts.append(ctx)
        self.nbytes = self._largest()
        bound = bound or {}
        self.buf = {n: bound[n] if n in bound else cuda.malloc(self.nbytes[n]) for n in names}

    def _largest(self) -> dict:
        """Bytes of every tensor at the largest shapes: each profile's max input shapes set, the
        output shapes TensorRT derives from them read back."""
        e, size = self.engine, {}
        for p, ctx in enumerate(self.contexts):
            for n in self.dynamic:
                self._shape(ctx, n, self.ranges[p][n][2])
            for n in self.inputs + self.outputs:
                shape = tuple(ctx.get_tensor_shape(n) if n in self.dynamic or n in self.outputs
                              else e.get_tensor_shape(n))
                size[n] = max(size.get(n, 0), int(np.prod(shape)) * self.dtype[n].itemsize)
        return size

    def profile_for(self, shapes: dict) -> int:
        """The first optimization profile whose [min, max] covers every dynamic input's shape."""
        for p, ranges in enumerate(self.ranges):
            if all(all(lo <= d <= hi for lo, d, hi in zip(r[0], shapes[n], r[2])) for n, r in ranges.items()):
                return p
        raise ConfigError(f"{self.name}: shapes {shapes} are outside every optimization profile "
                          f"{self.ranges}; rebuild the engines for these shapes")

    def bind(self, shapes: dict, addresses: dict | None = None) -> int:
        """Set the dynamic inputs' shapes and every tensor's address on the covering profile's
        context (host-side calls only) -> the profile index."""
        p = self.profile_for(shapes)
        ctx = self.contexts[p]
        for n in self.dynamic:
            self._shape(ctx, n, shapes[n])
        for n, ptr in self.buf.items():
            ptr = (addresses or {}).get(n, ptr)
            if not ctx.set_tensor_address(n, int(ptr)):
                raise RuntimeError(f"{self.name}: set_tensor_address({n!r}) refused")
        return p

    def run(self, shapes: dict, addresses: dict | None = None) -> None:
        p = self.bind(shapes, addresses)
        if not self.contexts[p].execute_async_v3(int(self.stream)):
            raise RuntimeError(f"{self.name}: execute_async_v3 failed at shapes {shapes}")

    def _shape(self, ctx, name: str, shape) -> None:
        if not ctx.set_input_shape(name, tuple(int(d) for d in shape)):
            raise RuntimeError(f"{self.name}: set_input_shape({name!r}, {tuple(shape)}) refused")


class GraphRunner:
    """CUDA graphs of one engine's first profile, one per width, all captured at warm-up
    (`capture`, before any cycle); a cycle only replays them (their shapes set back first,
    host-side), so no capture ever counts against a budget. TensorRT does deferred work in the
    first enqueue after a shape change, so each width is captured right after an eager run at
    that width. Widths outside the first profile run eagerly. `eager` turns graphs off."""

    def __init__(self, cuda: Cuda, engine: Engine, eager: bool):
        self.cuda, self.engine, self.eager = cuda, engine, eager
        self.execs = {}

    def run(self, width: int, shapes: dict) -> None:
        e = self.engine
        if width not in self.execs:
            return e.run(shapes)
        e.bind(shapes)                              # the context's shapes back to the captured ones
        self.cuda("cudaGraphLaunch", self.execs[width], e.stream)

    def capture(self, width: int, shapes: dict) -> None:
        """Warm-up only: an eager run at `width`, then its graph captured and replayed once."""
        e, cuda = self.engine, self.cuda
        e.run(shapes)
        if self.eager or e.profile_for(shapes) != 0 or width in self.execs:
            return
        e.bind(shapes)
        mode = cuda.rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        cuda("cudaStreamBeginCapture", e.stream, mode)
        ok = e.contexts[0].execute_async_v3(int(e.stream))
        graph = cuda("cudaStreamEndCapture", e.stream)
        if not ok:
            raise RuntimeError(f"{e.name}: execute_async_v3 failed while capturing width {width}")
        self.execs[width] = cuda("cudaGraphInstantiate", graph, 0)
        cuda("cudaGraphDestroy", graph)
        cuda("cudaGraphLaunch", self.execs[width], e.stream)

    def close(self) -> None:
        for g in self.execs.values():
            self.cuda("cudaGraphExecDestroy", g)
        self.execs = {}


class TensorRTBackend(GraphBackend):
    name = "tensorrt"
    reuses_vision = True

    def __init__(self, folder: Path, meta: dict, manifest: dict, max_len: int | None = None,
                 k_max: int | None = None, eager: bool = False, libraries=None, tokenizer=None):
        trt, rt = libraries or import_libraries()
        self.folder = Path(folder)
        self.init_shapes(folder, meta, max_len)
        self.init_draft_vocab(self.folder, meta, tokenizer)
        if self.host_map:     # the chain feeds its arg-max ids back on the device: they must be target ids
            raise ConfigError(f"{folder}: the draft head's d2t map is applied on the host (export --draft-map "
                              "host); the tensorrt backend chains proposals on the device and needs the map "
                              "inside the draft graphs: re-export with --draft-map graph")
        self.cuda = cuda = Cuda(rt)
        check_manifest(self.folder, meta, manifest, trt.__version__, device_sm(cuda), k_max)
        self.k_max = manifest["shapes"]["k_max"]
        self.stream = cuda("cudaStreamCreateWithFlags", rt.cudaStreamNonBlocking)
        self.action_stream = cuda("cudaStreamCreateWithFlags", rt.cudaStreamNonBlocking)
        self.kv_ready = cuda("cudaEventCreateWithFlags", rt.cudaEventDisableTiming)
        self.action_lock = threading.Lock()
        self._allocate(meta, manifest["shapes"]["max_prompt"])
        self.has_images = False
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engines = {}
        for g, entry in manifest["engines"].items():
            bound = {"cache": self.draft_cache if g.startswith("draft") else self.cache}
            stream = self.action_stream if g in ACTION_GRAPHS else self.stream
            self.engines[g] = Engine(trt, cuda, runtime, self.folder / entry["file"], stream, bound)
        self.verify_graphs = GraphRunner(cuda, self.engines[STEP], eager)
        self._upload_tables()
        self.set_mask(None)
        self._capture_verify_widths()

    def _capture_verify_widths(self) -> None:
        """Every verify width 1..k_max+1 captured now, before any cycle. The warm-up steps feed
        token 0 at rows 0..w-1 of an empty cache; the first prefill overwrites them."""
        for w in range(1, self.k_max + 2):
            self._step(np.zeros(w, np.int64), 0, capture=True)
        self.cuda("cudaStreamSynchronize", self.stream)

    # --- device memory, allocated once ------------------------------------------------------
    def _allocate(self, meta: dict, rows_max: int) -> None:
        t, d, cuda, L = meta["target"], meta["draft_llm"], self.cuda, self.max_len
        self.kv = {"cache": (t["layers"] * 2 * t["kv_heads"], t["head_dim"]),     # (blocks, head_dim)
                   "draft_cache": (d["layers"] * 2 * d["kv_heads"], d["head_dim"])}
        self.cache = cuda.malloc(np.prod(self.kv["cache"]) * L * 4)               # (layers, 2, 1, KVH, L, hd)
        self.draft_cache = cuda.malloc(np.prod(self.kv["draft_cache"]) * L * 4)
        self.feats = cuda.malloc((L + 1) * self.feat_dim * 4)                    # (L + 1, F), index 0 zeros
        cuda("cudaMemsetAsync", self.feats, 0, self.feat_dim * 4, self.stream)
        self.rope = {k: cuda.malloc(L * meta[m]["head_dim"] * 4)                  # (L, hd) per table
                     for k, m in (("cos", "target"), ("sin", "target"), ("dcos", "draft_llm"), ("dsin", "draft_llm"))}
        self.arange = cuda.malloc(L * 8)
        self.proposals = cuda.malloc((L + self.k_max + 1) * 8)
        self.rows_max = rows_max                                                # mask rows a call may read
        self.mask_period, self.mask = 0, None
        # pinned host staging: what crosses per call
        self.ids_host = cuda.pinned((L,), np.int64)
        self.top_host = cuda.pinned((L + self.k_max + 1,), np.int64)
        self.logits_host = cuda.pinned((2 * (self.k_max + 1), self.vocab_size), np.float32)
        a = meta["action"]
        S, W, A = a["samples"], a["n_waypoints"], a["action_dim"]
        self.x_host, self.v_host = cuda.pinned((S, W, A), np.float32), cuda.pinned((S, W, A), np.float32)
        self.t_host, self.v0_host = cuda.pinned((S,), np.float32), cuda.pinned((1,), np.float32)
        self.wp_host = cuda.pinned((1, W, 3), np.float32)
        self.rope_host = cuda.pinned((2, S * W, t["head_dim"]), np.float32)

    def _upload_tables(self) -> None:
        """Once: 0..max_len-1 (the `start` inputs) and the draft's FlatRoPE tables of every row."""
        host = self.cuda.pinned((self.max_len,), np.int64)
        host[:] = np.arange(self.max_len)
        self.cuda.h2d(self.arange, host, self.stream)
        if self.meta["draft_rope"] != "mrope":
            self._upload_rope("d", self.draft_rope(0, self.max_len))
        self.cuda("cudaStreamSynchronize", self.stream)

    def _upload_rope(self, prefix: str, tables) -> None:
        for name, table in zip(("cos", "sin"), tables):
            host = self._staging("rope", table.shape[-2:], np.float32)
            host[:] = table.reshape(host.shape)
            self.cuda.h2d(self.rope[prefix + name], host, self.stream)
            self.cuda("cudaStreamSynchronize", self.stream)

    # --- vision and prefill -------------------------------------------------------------------
    def vision(self, images: np.ndarray) -> None:
        e = self.engines[VISION]
        patches = self.patches(images)
        host = self._staging("patches", patches.shape, np.float32)
        host[:] = patches
        self.cuda.h2d(e.buf["patches"], host, self.stream)
        e.run({})
        self.has_images = True

    def vision_frames(self, images: np.ndarray) -> list:
        """(embeds (n, D), deepstack (S, n, D)) per frame on the host: the vision_frame engine once
        per new frame, else the whole vision engine on the frames padded to its image count."""
        images = np.asarray(images)
        if VISION_FRAME in self.engines:
            return [self._vision_run(VISION_FRAME, f[None]) for f in images]
        return split_frames(images, lambda x: self._vision_run(VISION, x), self.n_images)

    def use_vision(self, frames: list) -> None:
        """One cycle's per-frame features into the vision engine's output buffers (prefill reads them)."""
        v = self.engines[VISION]
        feats = {"image_embeds": np.concatenate([f[0] for f in frames]),
                 "deepstack": np.concatenate([f[1] for f in frames], axis=1)}
        for name, x in feats.items():
            host = self._staging("reuse_" + name, x.shape, v.dtype[name])
            host[:] = x
            self.cuda.h2d(v.buf[name], host, self.stream)
        self.has_images = True

    def _vision_run(self, graph: str, images: np.ndarray) -> tuple:
        """One run of a vision engine on `images` -> (embeds, deepstack), copied to the host."""
        e, s = self.engines[graph], self.stream
        patches = self.patches(images)
        host = self._staging(graph + "_patches", patches.shape, np.float32)
        host[:] = patches
        self.cuda.h2d(e.buf["patches"], host, s)
        e.run({})
        out = []
        for name in ("image_embeds", "deepstack"):
            buf = self._staging(f"{graph}_{name}", output_dims(self.meta["graphs"][graph], name), e.dtype[name])
            self.cuda.d2h(buf, e.buf[name], s)
            out.append(buf)
        self.cuda("cudaStreamSynchronize", s)
        return tuple(np.array(b) for b in out)       # the staging is reused by the next run

    def prefill(self, inputs: PrefillInputs, readout: str) -> np.ndarray:
        ids = np.asarray(inputs.ids, np.int64)
        T, cuda, s = len(ids), self.cuda, self.stream
        self.check_rows(0, T)
        if not self.has_images:
            raise ValueError("tensorrt backend: prefill needs vision(images) first")
        self.delta = int(inputs.rope_delta)
        e, v, dp = self.engines[PREFILL], self.engines[VISION], self.engines[DRAFT_PREFILL]
        self.ids_host[:T] = ids
        cuda.h2d(e.buf["ids"], self.ids_host[:T], s)
        cos, sin = self.target_rope(np.asarray(inputs.positions)[:, None])
        self._h2d_pair(e, cos, sin)
        self._mask_rows(e.buf["allowed"], 1, T)
        hd, F, V = self.meta["target"]["head_dim"], self.feat_dim, self.vocab_size
        images = {"image_embeds": v.buf["image_embeds"], "deepstack": v.buf["deepstack"]}
        out = {"feats": self.feats + F * 4} if self.fused else {}      # rows 0..T-1 at index 1..T
        e.run({"ids": (1, T), "cos": (1, T, hd), "sin": (1, T, hd), "allowed": (T, V)}, {**images, **out})
        self._write_rows("cache", e.buf["kv"], 0, T)
        self._upload_rope("", self.target_rope(np.arange(self.max_len)[None] + self.delta))
        dhd = self.meta["draft_llm"]["head_dim"]
        if self.meta["draft_rope"] == "mrope":
            self._upload_rope("d", self.target_rope(np.arange(self.max_len)[None] + self.delta))
            self._h2d_pair(dp, *self.draft_rope(0, T, np.asarray(inputs.positions)[:, None]))
            drope = {}
        else:
            drope = {"cos": self.rope["dcos"], "sin": self.rope["dsin"]}   # FlatRoPE rows 0..T-1
        feats = {"feats": self.feats} if self.fused else {}               # rows -1..T-2 at index 0..T-1
        shapes = {"ids": (1, T), "cos": (1, T, dhd), "sin": (1, T, dhd), **({"feats": (1, T, F)} if self.fused else {})}
        dp.run(shapes, {"ids": e.buf["ids"], "image_embeds": v.buf["image_embeds"], **drope, **feats})
        self._write_rows("draft_cache", dp.buf["kv"], 0, T)
        cuda("cudaEventRecord", self.kv_ready, s)          # the fallback expert reads rows [0, T)
        return self._read(e, T - 1, 1, readout)

    def set_mask(self, allowed: np.ndarray | None, first: int = 0) -> None:
        """The periodic mask tiled once into device memory: a call of n tokens copies n rows."""
        super().set_mask(allowed, first)
        P, V = self.allowed.shape
        if P != self.mask_period:
            self.mask_period = P
            self.mask = self.cuda.malloc((P + self.rows_max) * V)
            self.mask_host = self.cuda.pinned((P + self.rows_max, V), np.bool_)
        self.mask_host[:] = self.allowed[np.arange(P + self.rows_max) % P]
        self.cuda.h2d(self.mask, self.mask_host, self.stream)
        self.cuda("cudaStreamSynchronize", self.stream)

    # --- draft, verify, action ------------------------------------------------------------------
    def draft(self, tokens, start: int, k: int, sampling=None):
        tokens = np.asarray(tokens, np.int64)
        n0, cuda, s = len(tokens), self.cuda, self.stream
        self.check_rows(start, n0 + k - 1)
        if n0 + k > len(self.top_host):
            raise ValueError(f"tensorrt backend: {n0} fed + {k} proposals exceed {len(self.top_host)}")
        feed = self.engines[DRAFT_FEED]
        self.ids_host[:n0] = tokens
        cuda.h2d(feed.buf["ids"], self.ids_host[:n0], s)
        hidden = [feed.buf["hidden"], self.engines.get(DRAFT_CHAIN, feed).buf["hidden"]]
        slot = self.proposals + (n0 - 1) * 8                 # proposal j lands at slot + 8 j
        n, e, qs = n0, feed, []
        for j in range(k):
            addr = {"argmax": slot + 8 * j - (n - 1) * 8, "hidden": hidden[j % 2]}
            if j == 0:
                if self.fused:
                    addr["feats"] = self.feats + start * self.feat_dim * 4   # target rows start-1..
            else:
                addr["ids"] = slot + 8 * (j - 1)
                if self.fused:
                    addr["feats"] = hidden[(j - 1) % 2] + (n_prev - 1) * self.meta["draft_llm"]["hidden"] * 4
            self._feed(e, start, n, addr)
            if sampling is not None:      # the host samples: one logits row back per proposal
                self.ids_host[0], q = self.draw(self._read(e, n - 1, 1, "logits")[0], sampling, j)
                qs.append(q)
                cuda.h2d(slot + 8 * j, self.ids_host[:1], s)
            n_prev, start, n = n, start + n, 1
            e = self.engines[DRAFT_CHAIN] if self.fused else feed
        cuda.d2h(self.top_host[:k], slot, s)
        cuda("cudaStreamSynchronize", s)
        return self.top_host[:k].copy(), (np.stack(qs) if sampling is not None else None)

    def verify(self, tokens, start: int, readout: str) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        self.check_rows(start, len(tokens))
        self._step(tokens, start)
        return self._read(self.engines[STEP], 0, len(tokens), readout)

    def write(self, tokens, start: int) -> None:
        self._step(np.asarray(tokens, np.int64), start)

    def expert(self, rows: int, v0: float, seed: int, samples: int, steps, combine: str) -> np.ndarray:
        with self.action_lock:
            return self._expert(rows, v0, seed, samples, steps, combine)

    def close(self) -> None:
        if getattr(self, "cuda", None) is None:
            return
        cuda, self.cuda = self.cuda, None
        cuda("cudaStreamSynchronize", self.stream)
        cuda("cudaStreamSynchronize", self.action_stream)
        self.verify_graphs.close()
        cuda("cudaEventDestroy", self.kv_ready)
        cuda("cudaStreamDestroy", self.stream)
        cuda("cudaStreamDestroy", self.action_stream)
        cuda.close()

    # --- internals -------------------------------------------------------------------------------
    def _step(self, tokens: np.ndarray, start: int, capture: bool = False) -> None:
        """Target step over n tokens at `start`: inputs into the static buffers, the engine (a
        CUDA graph per verify width; `capture`: warm-up), the new K/V rows into the cache,
        features into `feats`."""
        n, e, cuda, s = len(tokens), self.engines[STEP], self.cuda, self.stream
        hd = self.meta["target"]["head_dim"]
        self.ids_host[:n] = tokens
        cuda.h2d(e.buf["ids"], self.ids_host[:n], s)
        self._inputs(e, self.rope["cos"], self.rope["sin"], hd, start, n)
        run = self.verify_graphs.capture if capture else self.verify_graphs.run
        run(n, {"ids": (1, n), "cos": (1, n, hd), "sin": (1, n, hd), "allowed": (n, self.vocab_size)})
        self._write_rows("cache", e.buf["new_kv"], start, n)
        if self.fused:                                   # rows start.. at index start + 1..
            cuda.d2d(self.feats + (start + 1) * self.feat_dim * 4, e.buf["feats"], n * self.feat_dim * 4, s)
        cuda("cudaEventRecord", self.kv_ready, s)

    def _feed(self, e: Engine, start: int, n: int, addresses: dict) -> None:
        """One draft call of n tokens at `start` (eager: its addresses move along the chain)."""
        d = self.meta["draft_llm"]
        self._inputs(e, self.rope["dcos"], self.rope["dsin"], d["head_dim"], start, n)
        feats = {"feats": (1, n, self.feat_dim if e.name == DRAFT_FEED else d["hidden"])} if self.fused else {}
        e.run({"ids": (1, n), "cos": (1, n, d["head_dim"]), "sin": (1, n, d["head_dim"]),
               "allowed": (n, self.vocab_size), **feats}, addresses)
        self._write_rows("draft_cache", e.buf["new_kv"], start, n)

    def _inputs(self, e: Engine, cos: int, sin: int, hd: int, start: int, n: int) -> None:
        """Rotary rows start.., `start` and the mask rows: device-to-device copies into e's buffers."""
        cuda, s = self.cuda, self.stream
        cuda.d2d(e.buf["cos"], cos + start * hd * 4, n * hd * 4, s)
        cuda.d2d(e.buf["sin"], sin + start * hd * 4, n * hd * 4, s)
        cuda.d2d(e.buf["start"], self.arange + start * 8, 8, s)
        self._mask_rows(e.buf["allowed"], start + 1, n)

    def _mask_rows(self, dst: int, index0: int, n: int) -> None:
        if n > self.rows_max:
            raise ValueError(f"tensorrt backend: {n} mask rows exceed {self.rows_max}")
        row = (index0 - self.mask_first) % self.mask_period
        self.cuda.d2d(dst, self.mask + row * self.vocab_size, n * self.vocab_size, self.stream)

    def _write_rows(self, cache: str, src: int, start: int, n: int) -> None:
        """(layers, 2, 1, KVH, n, hd) new rows -> cache rows start..start+n-1: layers*2*KVH blocks
        of n*hd floats, each at start*hd of a block of max_len*hd (one cudaMemcpy2DAsync)."""
        blocks, hd = self.kv[cache]
        self.cuda.blocks(getattr(self, cache) + start * hd * 4, self.max_len * hd * 4, src, n * hd * 4,
                         n * hd * 4, blocks, self.stream)

    def _read(self, e: Engine, row: int, n: int, readout: str) -> np.ndarray:
        """Rows row..row+n-1 of e's arg-max (n int64) or masked logits (n, V) back to the host."""
        cuda, s, V = self.cuda, self.stream, self.vocab_size

        def back(host, src):
            cuda.d2h(host, src, s)
            cuda("cudaStreamSynchronize", s)
            return host.copy()

        def logits():
            if n > len(self.logits_host):
                raise ValueError(f"tensorrt backend: {n} logits rows exceed {len(self.logits_host)}")
            return back(self.logits_host[:n], e.buf["logits"] + row * V * 4)
        return self.read(readout, lambda: back(self.top_host[:n], e.buf["argmax"] + row * 8), logits)

    def _h2d_pair(self, e: Engine, cos: np.ndarray, sin: np.ndarray) -> None:
        """A prompt's rotary tables (1, T, hd) into e's cos / sin (staging of max_len rows, once)."""
        T, hd = cos.shape[-2:]
        for name, table in (("cos", cos), ("sin", sin)):
            host = self._staging(name, (self.max_len, hd), np.float32)[:T]
            host[:] = table.reshape(T, hd)
            self.cuda.h2d(e.buf[name], host, self.stream)
        self.cuda("cudaStreamSynchronize", self.stream)

    def _staging(self, key: str, shape, dtype) -> np.ndarray:
        """Pinned host memory per (use, shape): allocated the first time a prompt shape is seen."""
        stage = self.__dict__.setdefault("_stage", {})
        if (key, tuple(shape)) not in stage:
            stage[key, tuple(shape)] = self.cuda.pinned(shape, dtype)
        return stage[key, tuple(shape)]

    def _expert(self, rows: int, v0: float, seed: int, samples: int, steps, combine) -> np.ndarray:
        """The action expert on its own stream, after the last cache write (an event)."""
        cuda, s = self.cuda, self.action_stream
        vel, out = self.engines[ACTION_VELOCITY], self.engines[ACTION_OUTPUT]
        x, cos, sin = self.expert_inputs(rows, seed, samples, combine)
        times = self.euler_times(steps, samples)
        blocks, hd = self.kv["cache"]
        cuda("cudaStreamWaitEvent", s, self.kv_ready, 0)
        cuda.blocks(vel.buf["context"], rows * hd * 4, self.cache, self.max_len * hd * 4, rows * hd * 4, blocks, s)
        self.rope_host[0], self.rope_host[1] = cos.reshape(-1, hd), sin.reshape(-1, hd)
        cuda.h2d(vel.buf["cos"], self.rope_host[0], s)
        cuda.h2d(vel.buf["sin"], self.rope_host[1], s)
        self.x_host[:] = x
        t = self.meta["target"]
        shapes = {"x": x.shape, "t": (samples,), "cos": cos.shape, "sin": sin.shape,
                  "context": (t["layers"], 2, 1, t["kv_heads"], rows, hd)}
        for ti in times:                                  # x <- x + dt v(x, t), t = i / steps
            self.t_host[:] = ti
            cuda.h2d(vel.buf["x"], self.x_host, s)
            cuda.h2d(vel.buf["t"], self.t_host, s)
            vel.run(shapes)
            cuda.d2h(self.v_host, vel.buf["velocity"], s)
            cuda("cudaStreamSynchronize", s)
            self.x_host[:] = self.x_host + self.v_host / np.float32(len(times))
        self.v0_host[0] = v0
        cuda.h2d(out.buf["x"], self.x_host, s)
        cuda.h2d(out.buf["v0"], self.v0_host, s)
        out.run({})
        cuda.d2h(self.wp_host, out.buf["waypoints"], s)
        cuda("cudaStreamSynchronize", s)
        return self.wp_host[0].copy()


def device_sm(cuda: Cuda) -> int:
    props = cuda("cudaGetDeviceProperties", 0)
    return int(props.major) * 10 + int(props.minor)


def version(text: str) -> tuple:
    return tuple(int(p) for p in str(text).split(".")[:3] if p.isdigit())


def check_manifest(folder: Path, meta: dict, manifest: dict, trt_version: str, sm: int,
                   k_max: int | None = None) -> None:
    """Refuse engines that are not what this runtime needs, naming the difference."""
    s, where = manifest["shapes"], f"{folder}/manifest.json"
    wrong = []
    if s["max_len"] != meta["max_len"]:
        wrong.append(f"shapes.max_len={s['max_len']} but the graphs have max_len={meta['max_len']}")
    if k_max is not None and s["k_max"] != k_max:
        wrong.append(f"shapes.k_max={s['k_max']} but the planner asks for k_max={k_max}")
    if list(s["verify_widths"]) != [1, s["k_max"] + 1]:
        wrong.append(f"shapes.verify_widths={s['verify_widths']}, expected [1, {s['k_max'] + 1}]")
    p = meta["prompt"]
    for key in ("cameras", "frames", "image_hw"):
        if list(np.atleast_1d(s[key])) != list(np.atleast_1d(p[key])):
            wrong.append(f"shapes.{key}={s[key]} but the graphs were exported for {p[key]}")
    if manifest["target_sm"] != sm:
        wrong.append(f"built for sm_{manifest['target_sm']}, this GPU is sm_{sm}")
    lo, below = manifest["tensorrt_range"]
    if not version(lo) <= version(trt_version) < version(below):
        wrong.append(f"TensorRT {trt_version} here is outside the profile's range [{lo}, {below})")
    other = sorted(g for g, e in manifest.get("engines", {}).items() if e.get("tensorrt") not in (trt_version, "trtexec"))
    if other:
        built = sorted({manifest["engines"][g].get("tensorrt") for g in other})
        wrong.append(f"TensorRT {trt_version} here, but {other} were built with TensorRT {built}")
    for g, entry in manifest.get("engines", {}).items():
        if file_sha256(folder / entry["file"]) != entry["sha256"]:
            wrong.append(f"{entry['file']}: sha256 does not match the manifest (changed or damaged)")
    for g, entry in meta["graphs"].items():
        if g not in manifest.get("engines", {}):
            wrong.append(f"no engine for graph {g!r}")
        if manifest["graphs"].get(g, {}).get("sha256") != entry["sha256"]:
            wrong.append(f"graph {g!r}: the engine was built from another ONNX file than meta.json lists")
        got, want = entry.get("precision", "fp32"), manifest["precision"].get(g)
        if got == "int4_awq" and not manifest.get("int4_awq") or \
                got != "int4_awq" and QUANTIZED.get(got) != (want if want in ("int8", "fp8") else None):
            wrong.append(f"graph {g!r}: meta.json says {got}, the manifest {want}")
    if manifest.get("onnx_meta_sha256") not in (None, file_sha256(folder / "meta.json")):
        wrong.append("meta.json is not the one the engines were built from")
    if wrong:
        raise ConfigError(f"{where}: these engines do not match this runtime: " + "; ".join(wrong)
                          + f". Rebuild on this device: make engines PROFILE={manifest['profile']}")


def create(spec: BackendSpec) -> TensorRTBackend:
    return TensorRTBackend(spec.engines, spec.meta, spec.manifest, spec.max_len, spec.k_max, spec.eager,
                           tokenizer=spec.tokenizer)
