"""The TensorRT backend: `create(spec)` and the Backend over the engines of `specdrive engines
build`, driven with numpy, TensorRT's Python API and cuda-python only (the package docstring,
runtime/backends/tensorrt/__init__.py, says what lives in device memory and what crosses per call).
This module holds the core: device memory, prefill, the target step and the draft chain; token
trees (trees.py), the per-frame vision and streamed prefill (streaming.py) and the action expert
(action.py) sit beside it as the classes it is made of.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from core.artifacts import EnginesMeta, Manifest
from core.config import ConfigError
from core.graphs import ACTION_GRAPHS, DRAFT_CHAIN, DRAFT_FEED, DRAFT_PREFILL, PREFILL, STEP, STEP_TREE, VISION
from runtime.backend import BackendSpec, PrefillInputs
from runtime.backends.graphs import GraphBackend
from runtime.backends.tensorrt.action import ActionOnStream
from runtime.backends.tensorrt.buffers import Buffer, KVCache, RopeRows, device_array, kv_cache
from runtime.backends.tensorrt.cuda import Cuda
from runtime.backends.tensorrt.cuda_graphs import GraphRunner
from runtime.backends.tensorrt.engine import Engine, check_manifest, device_sm
from runtime.backends.tensorrt.streaming import StreamedPrefill
from runtime.backends.tensorrt.trees import TreePasses

INSTALL = ("on Jetson Orin (JetPack 6.1+): `sudo apt install python3-libnvinfer` (TensorRT 10.3); on "
           "DRIVE OS 6 TensorRT 8.6 comes with the DRIVE OS SDK; on x86 GPUs: `pip install tensorrt`; "
           "and cuda-python for device memory and streams: `pip install 'cuda-python>=12'` (pycuda is "
           "not needed)")
F32, I64 = np.dtype(np.float32), np.dtype(np.int64)    # features and rotary rows; ids and positions


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


KV_TENSORS = ("cache", "kv", "new_kv", "context")     # the engines' inputs and outputs of KV rows


class TensorRTBackend(TreePasses, StreamedPrefill, ActionOnStream, GraphBackend):
    name = "tensorrt"
    reuses_vision = True

    def __init__(self, folder: Path, meta: EnginesMeta, manifest: Manifest, max_len: int | None = None,
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
        self.k_max = manifest.shapes.k_max
        self.stream = cuda("cudaStreamCreateWithFlags", rt.cudaStreamNonBlocking)
        self.action_stream = cuda("cudaStreamCreateWithFlags", rt.cudaStreamNonBlocking)
        self.kv_ready = cuda("cudaEventCreateWithFlags", rt.cudaEventDisableTiming)
        self.action_lock = threading.Lock()
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engines = {g: Engine(trt, cuda, runtime, self.folder / entry.file,
                                  self.action_stream if g in ACTION_GRAPHS else self.stream)
                        for g, entry in manifest.engines.items()}
        self._allocate(meta, manifest.shapes.max_prompt)
        for g, e in self.engines.items():
            e.allocate({"cache": (self.draft_cache if g.startswith("draft") else self.cache).ptr}, g)
        self.has_images = False
        self.verify_graphs = GraphRunner(cuda, self.engines[STEP], eager)
        tree = self.engines.get(STEP_TREE)      # a profile per tree width (engines/build.py dim_ranges)
        self.tree_widths = [shape[1] for shape in tree.largest("ids")] if tree else []
        self.tree_graphs = GraphRunner(cuda, tree, eager) if tree else None
        self._upload_tables()
        self.set_mask(None)
        self._capture_widths()

    def _capture_widths(self) -> None:
        """Every verify width 1..k_max+1, and every tree width, captured now, before any cycle. The
        warm-up steps feed token 0 at rows 0..w-1 of an empty cache (a tree: a chain); the first
        prefill overwrites them."""
        for w in range(1, self.k_max + 2):
            self.step_rows(np.zeros(w, np.int64), 0, capture=True)
        self.capture_trees()
        self.cuda("cudaStreamSynchronize", self.stream)

    # --- device memory, allocated once ------------------------------------------------------
    def _allocate(self, meta: EnginesMeta, rows_max: int) -> None:
        t, d, cuda, L = meta.target, meta.draft_llm, self.cuda, self.max_len
        # the caches at the element the engines bind them at
        self.cache: KVCache = kv_cache(cuda, t.layers * 2 * t.kv_heads, t.head_dim, L, self._kv_dtype("target"))
        self.draft_cache: KVCache = kv_cache(cuda, d.layers * 2 * d.kv_heads, d.head_dim, L, self._kv_dtype("draft"))
        self.feats = device_array(cuda, (L + 1) * self.feat_dim, F32)           # (L + 1, F), index 0 zeros
        cuda("cudaMemsetAsync", self.feats.ptr, 0, self.feats.bytes(self.feat_dim), self.stream)
        self.rope = RopeRows(device_array(cuda, L * t.head_dim, F32), device_array(cuda, L * t.head_dim, F32))
        self.draft_rope_rows = RopeRows(device_array(cuda, L * d.head_dim, F32),
                                        device_array(cuda, L * d.head_dim, F32))
        self.arange = device_array(cuda, L, I64)
        self.proposals = device_array(cuda, L + self.k_max + 1, I64)
        self.rows_max = rows_max                                                # mask rows a call may read
        self.mask_period, self.mask = 0, None
        # pinned host staging: what crosses per call
        self.ids_host = cuda.pinned((L,), np.int64)
        self.top_host = cuda.pinned((L + self.k_max + 1,), np.int64)
        self.logits_host = cuda.pinned((2 * (self.k_max + 1), self.vocab_size), np.float32)
        self.allocate_action(cuda, meta.action, t.head_dim)

    def _kv_dtype(self, model: str) -> np.dtype:
        """The element of the target's or the draft's cache: the dtype TensorRT reports for every
        KV tensor of the engines that read or write that cache (one dtype, else refused)."""
        dtypes = {f"{g}.{n}": e.dtype[n] for g, e in self.engines.items()
                  if g.startswith("draft") == (model == "draft") for n in KV_TENSORS if n in e.dtype}
        if len(set(dtypes.values())) != 1:
            found = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
            raise ConfigError(f"{self.folder}: the {model} KV cache is bound as {found}; its engines must "
                              "agree on one dtype (rebuild them)")
        return next(iter(dtypes.values()))

    def _upload_tables(self) -> None:
        """Once: 0..max_len-1 (the `start` inputs) and the draft's FlatRoPE tables of every row."""
        host = self.cuda.pinned((self.max_len,), np.int64)
        host[:] = np.arange(self.max_len)
        self.cuda.h2d(self.arange.ptr, host, self.stream)
        if self.meta.draft_rope != "mrope":
            self.upload_rope(self.draft_rope_rows, self.draft_rope(0, self.max_len))
        self.cuda("cudaStreamSynchronize", self.stream)

    def upload_rope(self, rows: RopeRows, tables) -> None:
        """(cos, sin) tables of every cache row into `rows`."""
        for dst, table in zip((rows.cos, rows.sin), tables):
            host = self.staging("rope", table.shape[-2:], np.float32)
            host[:] = table.reshape(host.shape)
            self.cuda.h2d(dst.ptr, host, self.stream)
            self.cuda("cudaStreamSynchronize", self.stream)

    # --- vision and prefill -------------------------------------------------------------------
    def vision(self, images: np.ndarray) -> None:
        e = self.engines[VISION]
        patches = self.patches(images)
        host = self.staging("patches", patches.shape, np.float32)
        host[:] = patches
        self.cuda.h2d(e.io.patches.ptr, host, self.stream)
        e.run({})
        self.has_images = True

    def prefill(self, inputs: PrefillInputs, readout: str) -> np.ndarray:
        ids = np.asarray(inputs.ids, np.int64)
        T, cuda, s = len(ids), self.cuda, self.stream
        self.check_rows(0, T)
        if not self.has_images:
            raise ValueError("tensorrt backend: prefill needs vision(images) first")
        self.delta = int(inputs.rope_delta)
        e, v = self.engines[PREFILL], self.engines[VISION]
        self.ids_host[:T] = ids
        cuda.h2d(e.io.ids.ptr, self.ids_host[:T], s)
        cos, sin = self.target_rope(np.asarray(inputs.positions)[:, None])
        self._h2d_pair(e, cos, sin)
        self._mask_rows(e.io.allowed, 1, T)
        hd, F, V = self.meta.target.head_dim, self.feat_dim, self.vocab_size
        images = {"image_embeds": v.io.image_embeds.ptr, "deepstack": v.io.deepstack.ptr}
        out = {"feats": self.feats.at(F)} if self.fused else {}      # rows 0..T-1 at index 1..T
        e.run({"ids": (1, T), "cos": (1, T, hd), "sin": (1, T, hd), "allowed": (T, V)}, {**images, **out})
        self.write_rows(self.cache, e.io.kv.ptr, 0, T)
        self.upload_rope(self.rope, self.target_rope(np.arange(self.max_len)[None] + self.delta))
        self.draft_prefill(T, np.asarray(inputs.positions), e.io.ids.ptr)
        cuda("cudaEventRecord", self.kv_ready, s)          # the fallback expert reads rows [0, T)
        return self.read_rows(e, T - 1, 1, readout)

    def draft_prefill(self, T: int, positions: np.ndarray, ids: int | None) -> None:
        """The draft's prompt rows from the prompt ids (a device address, or None: ids_host[:T]
        copied here), the images and, for a fused draft, the target's features of rows 0..T-2."""
        cuda, s, F = self.cuda, self.stream, self.feat_dim
        dp, v = self.engines[DRAFT_PREFILL], self.engines[VISION]
        if ids is None:
            cuda.h2d(dp.io.ids.ptr, self.ids_host[:T], s)
        bound = {} if ids is None else {"ids": ids}
        dhd = self.meta.draft_llm.head_dim
        if self.meta.draft_rope == "mrope":
            self.upload_rope(self.draft_rope_rows, self.target_rope(np.arange(self.max_len)[None] + self.delta))
            self._h2d_pair(dp, *self.draft_rope(0, T, positions[:, None]))
            drope = {}
        else:                                                             # FlatRoPE rows 0..T-1
            drope = {"cos": self.draft_rope_rows.cos.ptr, "sin": self.draft_rope_rows.sin.ptr}
        feats = {"feats": self.feats.ptr} if self.fused else {}           # rows -1..T-2 at index 0..T-1
        shapes = {"ids": (1, T), "cos": (1, T, dhd), "sin": (1, T, dhd), **({"feats": (1, T, F)} if self.fused else {})}
        dp.run(shapes, {**bound, "image_embeds": v.io.image_embeds.ptr, **drope, **feats})
        self.write_rows(self.draft_cache, dp.io.kv.ptr, 0, T)

    def set_mask(self, allowed: np.ndarray | None, first: int = 0) -> None:
        """The periodic mask tiled once into device memory: a call of n tokens copies n rows."""
        super().set_mask(allowed, first)
        P, V = self.allowed.shape
        if P != self.mask_period:
            self.mask_period = P
            self.mask = device_array(self.cuda, (P + self.rows_max) * V, np.bool_)
            self.mask_host = self.cuda.pinned((P + self.rows_max, V), np.bool_)
        self.mask_host[:] = self.allowed[np.arange(P + self.rows_max) % P]
        self.cuda.h2d(self.mask.ptr, self.mask_host, self.stream)
        self.cuda("cudaStreamSynchronize", self.stream)

    # --- draft, verify, action ------------------------------------------------------------------
    def draft(self, tokens, start: int, k: int, sampling=None):
        qs = []

        def draw(j: int, logits: np.ndarray) -> int:      # the host samples: a logits row per proposal
            token, q = self.draw(logits, sampling, j)
            qs.append(q)
            return token
        slot = self.draft_calls(tokens, start, k, None if sampling is None else draw)
        self.cuda.d2h(self.top_host[:k], slot, self.stream)
        self.cuda("cudaStreamSynchronize", self.stream)
        return self.top_host[:k].copy(), (np.stack(qs) if sampling is not None else None)

    def draft_calls(self, tokens, start: int, k: int, pick=None) -> int:
        """At most k draft calls: `tokens` fed at `start`, then one token per call. Call j writes
        its token to proposal slot j, which call j + 1 reads: its arg-max, on the device, or,
        given `pick`, the token pick(j, its masked logits row) chose on the host (None: stop).
        -> the address of slot 0."""
        tokens = np.asarray(tokens, np.int64)
        n0, cuda, s = len(tokens), self.cuda, self.stream
        self.check_rows(start, n0 + k - 1)
        if n0 + k > len(self.top_host):
            raise ValueError(f"tensorrt backend: {n0} fed + {k} proposals exceed {len(self.top_host)}")
        feed = self.engines[DRAFT_FEED]
        self.ids_host[:n0] = tokens
        cuda.h2d(feed.io.ids.ptr, self.ids_host[:n0], s)
        hidden = [feed.io.hidden, self.engines.get(DRAFT_CHAIN, feed).io.hidden]
        slot, P = n0 - 1, self.proposals                     # proposal j lands at proposals[slot + j]
        n, e = n0, feed
        for j in range(k):
            addr = {"argmax": P.at(slot + j - (n - 1)), "hidden": hidden[j % 2].ptr}
            if j == 0:
                feats = self.feats.at(start * self.feat_dim)                   # target rows start-1..
            else:
                addr.update(ids=P.at(slot + j - 1))
                feats = hidden[(j - 1) % 2].at((n_prev - 1) * self.meta.draft_llm.hidden)
            if self.fused:
                addr.update(feats=feats)
            self._feed(e, start, n, addr)
            if pick is not None:
                token = pick(j, self.read_rows(e, n - 1, 1, "logits")[0])
                if token is None:
                    break
                self.ids_host[0] = token
                cuda.h2d(P.at(slot + j), self.ids_host[:1], s)
            n_prev, start, n = n, start + n, 1
            e = self.engines[DRAFT_CHAIN] if self.fused else feed
        return P.at(slot)

    def verify(self, tokens, start: int, readout: str) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        self.check_rows(start, len(tokens))
        self.step_rows(tokens, start)
        return self.read_rows(self.engines[STEP], 0, len(tokens), readout)

    def write(self, tokens, start: int) -> None:
        self.step_rows(np.asarray(tokens, np.int64), start)

    def close(self) -> None:
        if getattr(self, "cuda", None) is None:
            return
        cuda, self.cuda = self.cuda, None
        cuda("cudaStreamSynchronize", self.stream)
        cuda("cudaStreamSynchronize", self.action_stream)
        self.verify_graphs.close()
        if self.tree_graphs is not None:
            self.tree_graphs.close()
        cuda("cudaEventDestroy", self.kv_ready)
        cuda("cudaStreamDestroy", self.stream)
        cuda("cudaStreamDestroy", self.action_stream)
        cuda.close()

    # --- the core step and its copies --------------------------------------------------------------
    def step_rows(self, tokens: np.ndarray, start: int, capture: bool = False) -> None:
        """Target step over n tokens at `start`: inputs into the static buffers, the engine (a
        CUDA graph per verify width; `capture`: warm-up), the new K/V rows into the cache,
        features into `feats`."""
        n, e, cuda, s = len(tokens), self.engines[STEP], self.cuda, self.stream
        hd = self.meta.target.head_dim
        self.ids_host[:n] = tokens
        cuda.h2d(e.io.ids.ptr, self.ids_host[:n], s)
        self._inputs(e, self.rope, hd, start, n)
        run = self.verify_graphs.capture if capture else self.verify_graphs.run
        run(n, {"ids": (1, n), "cos": (1, n, hd), "sin": (1, n, hd), "allowed": (n, self.vocab_size)})
        self.write_rows(self.cache, e.io.new_kv.ptr, start, n)
        if self.fused:                                   # rows start.. at index start + 1..
            self.copy_feats(e, start, n)
        cuda("cudaEventRecord", self.kv_ready, s)

    def copy_feats(self, e: Engine, start: int, n: int) -> None:
        """e's features of n rows into `feats` at index start + 1.. (row r at index r + 1)."""
        F = self.feat_dim
        self.cuda.d2d(self.feats.at((start + 1) * F), e.io.feats.ptr, self.feats.bytes(n * F), self.stream)

    def _feed(self, e: Engine, start: int, n: int, addresses: dict) -> None:
        """One draft call of n tokens at `start` (eager: its addresses move along the chain)."""
        d = self.meta.draft_llm
        self._inputs(e, self.draft_rope_rows, d.head_dim, start, n)
        feats = {"feats": (1, n, self.feat_dim if e.name == DRAFT_FEED else d.hidden)} if self.fused else {}
        e.run({"ids": (1, n), "cos": (1, n, d.head_dim), "sin": (1, n, d.head_dim),
               "allowed": (n, self.vocab_size), **feats}, addresses)
        self.write_rows(self.draft_cache, e.io.new_kv.ptr, start, n)

    def _inputs(self, e: Engine, rope: RopeRows, hd: int, start: int, n: int) -> None:
        """Rotary rows start.., `start` and the mask rows: device-to-device copies into e's buffers."""
        cuda, s = self.cuda, self.stream
        cuda.d2d(e.io.cos.ptr, rope.cos.at(start * hd), rope.cos.bytes(n * hd), s)
        cuda.d2d(e.io.sin.ptr, rope.sin.at(start * hd), rope.sin.bytes(n * hd), s)
        self.copy_start(e, start)
        self._mask_rows(e.io.allowed, start + 1, n)

    def copy_start(self, e: Engine, start: int) -> None:
        """e's `start` input: element `start` of the arange table."""
        self.cuda.d2d(e.io.start.ptr, self.arange.at(start), self.arange.bytes(1), self.stream)

    def _mask_rows(self, dst: Buffer, index0: int, n: int) -> None:
        if n > self.rows_max:
            raise ValueError(f"tensorrt backend: {n} mask rows exceed {self.rows_max}")
        row, V = (index0 - self.mask_first) % self.mask_period, self.vocab_size
        self.cuda.d2d(dst.ptr, self.mask.at(row * V), self.mask.bytes(n * V), self.stream)

    def write_rows(self, cache: KVCache, src: int, start: int, n: int) -> None:
        """(layers, 2, 1, KVH, n, hd) new rows -> cache rows start..start+n-1: layers*2*KVH blocks
        of n*hd elements, each at start*hd of a block of max_len*hd (one cudaMemcpy2DAsync)."""
        width = n * cache.row_bytes
        self.cuda.blocks(cache.row(start), cache.pitch, src, width, width, cache.blocks, self.stream)

    def read_rows(self, e: Engine, row: int, n: int, readout: str) -> np.ndarray:
        """Rows row..row+n-1 of e's arg-max (n int64) or masked logits (n, V) back to the host."""
        cuda, s, V = self.cuda, self.stream, self.vocab_size

        def back(host, src):
            cuda.d2h(host, src, s)
            cuda("cudaStreamSynchronize", s)
            return host.copy()

        def logits():
            if n > len(self.logits_host):
                raise ValueError(f"tensorrt backend: {n} logits rows exceed {len(self.logits_host)}")
            return back(self.logits_host[:n], e.io.logits.at(row * V))
        return self.read(readout, lambda: back(self.top_host[:n], e.io.argmax.at(row)), logits)

    def _h2d_pair(self, e: Engine, cos: np.ndarray, sin: np.ndarray) -> None:
        """A prompt's rotary tables (1, T, hd) into e's cos / sin (staging of max_len rows, once)."""
        T, hd = cos.shape[-2:]
        for name, dst, table in (("cos", e.io.cos, cos), ("sin", e.io.sin, sin)):
            host = self.staging(name, (self.max_len, hd), np.float32)[:T]
            host[:] = table.reshape(T, hd)
            self.cuda.h2d(dst.ptr, host, self.stream)
        self.cuda("cudaStreamSynchronize", self.stream)

    def staging(self, key: str, shape, dtype) -> np.ndarray:
        """Pinned host memory per (use, shape): allocated the first time a prompt shape is seen."""
        stage = self.__dict__.setdefault("_stage", {})
        if (key, tuple(shape)) not in stage:
            stage[key, tuple(shape)] = self.cuda.pinned(shape, dtype)
        return stage[key, tuple(shape)]


def create(spec: BackendSpec) -> TensorRTBackend:
    return TensorRTBackend(spec.engines, spec.meta, spec.manifest, spec.max_len, spec.k_max, spec.eager,
                           tokenizer=spec.tokenizer)
