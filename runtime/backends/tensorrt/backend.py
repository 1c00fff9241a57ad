"""The TensorRT backend: `create(spec)` and the Backend over the engines of `specdrive engines
build`, driven with numpy, TensorRT's Python API and cuda-python only (the package docstring,
runtime/backends/tensorrt/__init__.py, says what lives in device memory and what crosses per call).
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from core.artifacts import EnginesMeta, Manifest
from core.config import ConfigError
from core.graphs import (ACTION_GRAPHS, ACTION_OUTPUT, ACTION_VELOCITY, DRAFT_CHAIN, DRAFT_FEED, DRAFT_PREFILL,
                           IMAGE_BLOCKS, PREFILL, STEP, STEP_TREE, VISION, VISION_FRAME)
from runtime.backend import BackendSpec, PrefillInputs, image_rows
from runtime.backends.graphs import GraphBackend, split_frames
from runtime.backends.tensorrt.cuda import Cuda
from runtime.backends.tensorrt.cuda_graphs import GraphRunner
from runtime.backends.tensorrt.engine import Engine, check_manifest, device_sm
from runtime.tree import TreeBuilder

INSTALL = ("on Jetson Orin (JetPack 6.1+): `sudo apt install python3-libnvinfer` (TensorRT 10.3); on "
           "DRIVE OS 6 TensorRT 8.6 comes with the DRIVE OS SDK; on x86 GPUs: `pip install tensorrt`; "
           "and cuda-python for device memory and streams: `pip install 'cuda-python>=12'` (pycuda is "
           "not needed)")


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


class TensorRTBackend(GraphBackend):
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
            e.allocate({"cache": self.draft_cache if g.startswith("draft") else self.cache})
        self.has_images = False
        self.verify_graphs = GraphRunner(cuda, self.engines[STEP], eager)
        tree = self.engines.get(STEP_TREE)      # a profile per tree width (engines/build.py dim_ranges)
        self.tree_widths = [r["ids"][2][1] for r in tree.ranges] if tree else []
        self.tree_graphs = GraphRunner(cuda, tree, eager) if tree else None
        self._upload_tables()
        self.set_mask(None)
        self._capture_widths()

    def _capture_widths(self) -> None:
        """Every verify width 1..k_max+1, and every tree width, captured now, before any cycle. The
        warm-up steps feed token 0 at rows 0..w-1 of an empty cache (a tree: a chain); the first
        prefill overwrites them."""
        for w in range(1, self.k_max + 2):
            self._step(np.zeros(w, np.int64), 0, capture=True)
        for w in self.tree_widths if self.takes_trees else ():
            self._step_tree(np.zeros(w, np.int64), 0, np.arange(w), np.tri(w, dtype=bool), capture=True)
        self.cuda("cudaStreamSynchronize", self.stream)

    @property
    def takes_trees(self) -> bool:
        """The build has a step_tree engine at the step's precision (builds before token trees
        have none: rebuild)."""
        g = self.meta.graphs
        return STEP_TREE in self.engines and g[STEP_TREE].precision == g[STEP].precision

    @property
    def tree_width(self) -> int | None:
        return self.tree_widths[-1] if self.tree_widths else None

    # --- device memory, allocated once ------------------------------------------------------
    def _allocate(self, meta: EnginesMeta, rows_max: int) -> None:
        t, d, cuda, L = meta.target, meta.draft_llm, self.cuda, self.max_len
        # (blocks, head_dim, bytes per element): the element as the engines bind the cache
        self.kv = {"cache": (t.layers * 2 * t.kv_heads, t.head_dim, self._kv_itemsize("target")),
                   "draft_cache": (d.layers * 2 * d.kv_heads, d.head_dim, self._kv_itemsize("draft"))}
        self.cache = cuda.malloc(np.prod(self.kv["cache"]) * L)                   # (layers, 2, 1, KVH, L, hd)
        self.draft_cache = cuda.malloc(np.prod(self.kv["draft_cache"]) * L)
        self.feats = cuda.malloc((L + 1) * self.feat_dim * 4)                    # (L + 1, F), index 0 zeros
        cuda("cudaMemsetAsync", self.feats, 0, self.feat_dim * 4, self.stream)
        self.rope = {k: cuda.malloc(L * m.head_dim * 4)                           # (L, hd) per table
                     for k, m in (("cos", t), ("sin", t), ("dcos", d), ("dsin", d))}
        self.arange = cuda.malloc(L * 8)
        self.proposals = cuda.malloc((L + self.k_max + 1) * 8)
        self.rows_max = rows_max                                                # mask rows a call may read
        self.mask_period, self.mask = 0, None
        # pinned host staging: what crosses per call
        self.ids_host = cuda.pinned((L,), np.int64)
        self.top_host = cuda.pinned((L + self.k_max + 1,), np.int64)
        self.logits_host = cuda.pinned((2 * (self.k_max + 1), self.vocab_size), np.float32)
        a = meta.action
        S, W, A = a.samples, a.n_waypoints, a.action_dim
        self.x_host, self.v_host = cuda.pinned((S, W, A), np.float32), cuda.pinned((S, W, A), np.float32)
        self.t_host, self.v0_host = cuda.pinned((S,), np.float32), cuda.pinned((1,), np.float32)
        self.wp_host = cuda.pinned((1, W, 3), np.float32)
        self.rope_host = cuda.pinned((2, S * W, t.head_dim), np.float32)

    def _kv_itemsize(self, model: str) -> int:
        """Bytes of one KV element of the target's or the draft's cache: the dtype TensorRT reports
        for every KV tensor of the engines that read or write that cache (one dtype, else refused)."""
        dtypes = {f"{g}.{n}": e.dtype[n] for g, e in self.engines.items()
                  if g.startswith("draft") == (model == "draft") for n in KV_TENSORS if n in e.dtype}
        if len(set(dtypes.values())) != 1:
            found = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
            raise ConfigError(f"{self.folder}: the {model} KV cache is bound as {found}; its engines must "
                              "agree on one dtype (rebuild them)")
        return next(iter(dtypes.values())).itemsize

    def _upload_tables(self) -> None:
        """Once: 0..max_len-1 (the `start` inputs) and the draft's FlatRoPE tables of every row."""
        host = self.cuda.pinned((self.max_len,), np.int64)
        host[:] = np.arange(self.max_len)
        self.cuda.h2d(self.arange, host, self.stream)
        if self.meta.draft_rope != "mrope":
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
            buf = self._staging(f"{graph}_{name}", self.meta.graphs[graph].dims(name, "outputs"), e.dtype[name])
            self.cuda.d2h(buf, e.buf[name], s)
            out.append(buf)
        self.cuda("cudaStreamSynchronize", s)
        return tuple(np.array(b) for b in out)       # the staging is reused by the next run

    @property
    def streams_prefill(self) -> bool:
        return IMAGE_BLOCKS in self.engines

    def image_blocks(self, frames: list, ids: np.ndarray, positions: np.ndarray) -> list:
        """The image_blocks engine over n new frames; their K/V and features come back to the host
        (a frame's entry lives in the planner's cache, as its vision features do)."""
        e, s, n, L = self.engines[IMAGE_BLOCKS], self.stream, len(frames), len(ids)
        hd = self.meta.target.head_dim
        cos, sin = self.target_rope(np.broadcast_to(np.asarray(positions)[:, None], (3, n, L)))
        inputs = {"ids": np.broadcast_to(np.asarray(ids, np.int64), (n, L)), "cos": cos, "sin": sin,
                  "image_embeds": np.stack([f[0] for f in frames]),
                  "deepstack": np.stack([f[1] for f in frames], axis=1)}
        for name, x in inputs.items():
            host = self._staging("blocks_" + name, x.shape, e.dtype[name])
            host[:] = x
            self.cuda.h2d(e.buf[name], host, s)
        e.run({name: x.shape for name, x in inputs.items()})
        t = self.meta.target
        out = {"kv": (t.layers, 2, n, t.kv_heads, L, hd), "feats": (n, L, self.feat_dim)}
        back = {}
        for name, shape in out.items():
            host = self._staging("blocks_out_" + name, shape, e.dtype[name])
            self.cuda.d2h(host, e.buf[name], s)
            back[name] = host
        self.cuda("cudaStreamSynchronize", s)
        return self.split_blocks(np.array(back["kv"], np.float32), np.array(back["feats"], np.float32))

    def prefill_streamed(self, inputs: PrefillInputs, readout: str, blocks: list) -> np.ndarray:
        """The rows before the images and after them through the step engine (its prompt-sized
        profile), the kept blocks' rows rotated on the host and copied into the cache."""
        ids = np.asarray(inputs.ids, np.int64)
        T, cuda, s = len(ids), self.cuda, self.stream
        self.check_rows(0, T)
        if not self.has_images:
            raise ValueError("tensorrt backend: prefill needs vision(images) first")
        first, end = image_rows(inputs)
        pos = np.asarray(inputs.positions)
        self.delta = int(inputs.rope_delta)
        text = self.target_rope(np.arange(self.max_len)[None] + self.delta)
        prompt = self.target_rope(pos[:, None])
        self._upload_rope("", tuple(np.concatenate([p, t[:, T:]], 1) for p, t in zip(prompt, text)))
        self._step(ids[:first], 0)
        kv, feats = self.block_rows(blocks, pos[:, first:end])
        blocks_n, hd, size = self.kv["cache"]
        host = self._staging("block_rows", kv.shape, np.float16 if size == 2 else np.float32)
        host[:] = kv
        dev = self._block_buffer(host.nbytes)
        cuda.h2d(dev, host, s)
        self._write_rows("cache", dev, first, end - first)
        if self.fused:
            fh = self._staging("block_feats", feats.shape, np.float32)
            fh[:] = feats
            cuda.h2d(self.feats + (first + 1) * self.feat_dim * 4, fh, s)
        self._step(ids[end:], end)
        self._upload_rope("", text)
        self.ids_host[:T] = ids                   # the steps above staged their own rows there
        self._draft_prefill(T, pos, {"ids": None})
        cuda("cudaEventRecord", self.kv_ready, s)
        return self._read(self.engines[STEP], T - end - 1, 1, readout)

    def _block_buffer(self, nbytes: int) -> int:
        """Device rows of the kept image blocks on their way into the cache (grown once)."""
        if getattr(self, "_blocks_dev", (0, 0))[1] < nbytes:
            self._blocks_dev = (self.cuda.malloc(nbytes), nbytes)
        return self._blocks_dev[0]

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
        hd, F, V = self.meta.target.head_dim, self.feat_dim, self.vocab_size
        images = {"image_embeds": v.buf["image_embeds"], "deepstack": v.buf["deepstack"]}
        out = {"feats": self.feats + F * 4} if self.fused else {}      # rows 0..T-1 at index 1..T
        e.run({"ids": (1, T), "cos": (1, T, hd), "sin": (1, T, hd), "allowed": (T, V)}, {**images, **out})
        self._write_rows("cache", e.buf["kv"], 0, T)
        self._upload_rope("", self.target_rope(np.arange(self.max_len)[None] + self.delta))
        self._draft_prefill(T, np.asarray(inputs.positions), {"ids": e.buf["ids"]})
        cuda("cudaEventRecord", self.kv_ready, s)          # the fallback expert reads rows [0, T)
        return self._read(e, T - 1, 1, readout)

    def _draft_prefill(self, T: int, positions: np.ndarray, ids: dict) -> None:
        """The draft's prompt rows from the prompt ids (a device buffer, or None: ids_host[:T]
        copied here), the images and, for a fused draft, the target's features of rows 0..T-2."""
        cuda, s, F = self.cuda, self.stream, self.feat_dim
        dp, v = self.engines[DRAFT_PREFILL], self.engines[VISION]
        if ids["ids"] is None:
            cuda.h2d(dp.buf["ids"], self.ids_host[:T], s)
            ids = {}
        dhd = self.meta.draft_llm.head_dim
        if self.meta.draft_rope == "mrope":
            self._upload_rope("d", self.target_rope(np.arange(self.max_len)[None] + self.delta))
            self._h2d_pair(dp, *self.draft_rope(0, T, positions[:, None]))
            drope = {}
        else:
            drope = {"cos": self.rope["dcos"], "sin": self.rope["dsin"]}   # FlatRoPE rows 0..T-1
        feats = {"feats": self.feats} if self.fused else {}               # rows -1..T-2 at index 0..T-1
        shapes = {"ids": (1, T), "cos": (1, T, dhd), "sin": (1, T, dhd), **({"feats": (1, T, F)} if self.fused else {})}
        dp.run(shapes, {**ids, "image_embeds": v.buf["image_embeds"], **drope, **feats})
        self._write_rows("draft_cache", dp.buf["kv"], 0, T)

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
        qs = []

        def draw(j: int, logits: np.ndarray) -> int:      # the host samples: a logits row per proposal
            token, q = self.draw(logits, sampling, j)
            qs.append(q)
            return token
        slot = self._draft_calls(tokens, start, k, None if sampling is None else draw)
        self.cuda.d2h(self.top_host[:k], slot, self.stream)
        self.cuda("cudaStreamSynchronize", self.stream)
        return self.top_host[:k].copy(), (np.stack(qs) if sampling is not None else None)

    def _draft_calls(self, tokens, start: int, k: int, pick=None) -> int:
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
        cuda.h2d(feed.buf["ids"], self.ids_host[:n0], s)
        hidden = [feed.buf["hidden"], self.engines.get(DRAFT_CHAIN, feed).buf["hidden"]]
        slot = self.proposals + (n0 - 1) * 8                 # proposal j lands at slot + 8 j
        n, e = n0, feed
        for j in range(k):
            addr = {"argmax": slot + 8 * j - (n - 1) * 8, "hidden": hidden[j % 2]}
            if j == 0:
                if self.fused:
                    addr["feats"] = self.feats + start * self.feat_dim * 4   # target rows start-1..
            else:
                addr["ids"] = slot + 8 * (j - 1)
                if self.fused:
                    addr["feats"] = hidden[(j - 1) % 2] + (n_prev - 1) * self.meta.draft_llm.hidden * 4
            self._feed(e, start, n, addr)
            if pick is not None:
                token = pick(j, self._read(e, n - 1, 1, "logits")[0])
                if token is None:
                    break
                self.ids_host[0] = token
                cuda.h2d(slot + 8 * j, self.ids_host[:1], s)
            n_prev, start, n = n, start + n, 1
            e = self.engines[DRAFT_CHAIN] if self.fused else feed
        return slot

    def verify(self, tokens, start: int, readout: str) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        self.check_rows(start, len(tokens))
        self._step(tokens, start)
        return self._read(self.engines[STEP], 0, len(tokens), readout)

    # --- token trees (runtime/tree.py) ----------------------------------------------------------
    def draft_tree(self, tokens, start: int, shape):
        """The draft engines take no tree mask, so the best node of each depth is fed (a chain of
        draft calls, as on onnxruntime) and each call's masked logits row comes back for its
        node's top-K: the tree is that chain with its siblings."""
        b, n0, node = TreeBuilder(shape, expand=1), len(tokens), None

        def expand(j: int, logits: np.ndarray):
            nonlocal node
            ids, logp = self.draft_topk(logits, shape.topk)
            if node is None:
                b.root(ids, logp)
            else:
                b.children([node], [start + n0 + j - 1], ids[None], logp[None])
            nodes = b.expand()
            node = None if nodes is None else nodes[0]
            return None if node is None else b.tokens[node]
        self._draft_calls(tokens, start, shape.depth, expand)
        return b.tree()

    def verify_tree(self, tokens, start: int, readout: str, offsets, mask) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        self.check_rows(start, len(tokens))
        self._step_tree(tokens, start, np.asarray(offsets, np.int64), np.asarray(mask, bool))
        return self._read(self.engines[STEP_TREE], 0, len(tokens), readout)

    def keep_rows(self, start: int, rows, draft_start: int, draft_rows) -> None:
        """Row by row, in path order: a path's rows increase and each lies at or after the row it
        moves to, so none is overwritten before it is read."""
        F, s = self.feat_dim * 4, self.stream
        for cache, src, dst in (("cache", rows, start), ("draft_cache", draft_rows, draft_start)):
            blocks, hd, size = self.kv[cache]
            base, pitch = getattr(self, cache), self.max_len * hd * size
            for j, r in enumerate(np.asarray(src, np.int64).tolist()):
                if r != dst + j:
                    self.cuda.blocks(base + (dst + j) * hd * size, pitch, base + r * hd * size, pitch,
                                     hd * size, blocks, s)
                    if cache == "cache" and self.fused:      # row r's features at index r + 1
                        self.cuda.d2d(self.feats + (dst + j + 1) * F, self.feats + (r + 1) * F, F, s)
        self.cuda("cudaEventRecord", self.kv_ready, s)

    def write(self, tokens, start: int) -> None:
        self._step(np.asarray(tokens, np.int64), start)

    def expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        with self.action_lock:
            return self._expert(rows, v0, seed, request)

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

    # --- internals -------------------------------------------------------------------------------
    def _step(self, tokens: np.ndarray, start: int, capture: bool = False) -> None:
        """Target step over n tokens at `start`: inputs into the static buffers, the engine (a
        CUDA graph per verify width; `capture`: warm-up), the new K/V rows into the cache,
        features into `feats`."""
        n, e, cuda, s = len(tokens), self.engines[STEP], self.cuda, self.stream
        hd = self.meta.target.head_dim
        self.ids_host[:n] = tokens
        cuda.h2d(e.buf["ids"], self.ids_host[:n], s)
        self._inputs(e, self.rope["cos"], self.rope["sin"], hd, start, n)
        run = self.verify_graphs.capture if capture else self.verify_graphs.run
        run(n, {"ids": (1, n), "cos": (1, n, hd), "sin": (1, n, hd), "allowed": (n, self.vocab_size)})
        self._write_rows("cache", e.buf["new_kv"], start, n)
        if self.fused:                                   # rows start.. at index start + 1..
            cuda.d2d(self.feats + (start + 1) * self.feat_dim * 4, e.buf["feats"], n * self.feat_dim * 4, s)
        cuda("cudaEventRecord", self.kv_ready, s)

    def _step_tree(self, tokens: np.ndarray, start: int, offsets: np.ndarray, mask: np.ndarray,
                   capture: bool = False) -> None:
        """Target pass over a tree's n rows at `start` (positions start + offsets, the (n, n) tree
        mask), padded to the smallest tree width w >= n whose rows fit the cache, so it replays
        that width's CUDA graph (no such width: n rows, eagerly). A pad row is token 0 at the first
        pending row's position that sees the prefix and itself, and no row sees it; its K/V lands
        past the tree, in rows written again before anything reads them. Host to device: the w ids, cos/sin rows
        and the (w, w) mask; the allowed rows are copied on the device."""
        n, e, cuda, s = len(tokens), self.engines[STEP_TREE], self.cuda, self.stream
        w = next((b for b in self.tree_widths if b >= n and start + b <= self.max_len), n)
        hd, V = self.meta.target.head_dim, self.vocab_size
        offsets = np.concatenate([offsets, np.zeros(w - n, np.int64)])
        self.ids_host[:w] = np.concatenate([tokens, np.zeros(w - n, np.int64)])
        cuda.h2d(e.buf["ids"], self.ids_host[:w], s)
        tree = self._staging("tree", (w, w), np.bool_)
        tree[:] = np.eye(w, dtype=bool)
        tree[:n, :n] = mask
        cuda.h2d(e.buf["tree"], tree, s)
        for name, table in zip(("cos", "sin"), self.target_rope((start + offsets + self.delta)[None])):
            host = self._staging("tree_" + name, (w, hd), np.float32)
            host[:] = table.reshape(w, hd)
            cuda.h2d(e.buf[name], host, s)
        cuda.d2d(e.buf["start"], self.arange + start * 8, 8, s)
        self._tree_mask_rows(e.buf["allowed"], start + 1, offsets)
        run = self.tree_graphs.capture if capture else self.tree_graphs.run
        run(w, {"ids": (1, w), "cos": (1, w, hd), "sin": (1, w, hd), "allowed": (w, V), "tree": (w, w)})
        self._write_rows("cache", e.buf["new_kv"], start, w)
        if self.fused:
            cuda.d2d(self.feats + (start + 1) * self.feat_dim * 4, e.buf["feats"], w * self.feat_dim * 4, s)
        cuda("cudaEventRecord", self.kv_ready, s)

    def _tree_mask_rows(self, dst: int, index0: int, offsets: np.ndarray) -> None:
        """Mask rows index0 + offsets[i] into row i of dst. The tiled table repeats with the
        period P, so row i may read table row i + ((index0 + offsets[i] - first - i) mod P): runs
        of consecutive table rows go in one copy each (a period-1 mask: one copy in all)."""
        i, V = np.arange(len(offsets)), self.vocab_size
        rows = i + (index0 + offsets - self.mask_first - i) % self.mask_period
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        for a, b in zip([0, *cuts], [*cuts, len(rows)]):
            self.cuda.d2d(dst + int(a) * V, self.mask + int(rows[a]) * V, int(b - a) * V, self.stream)

    def _feed(self, e: Engine, start: int, n: int, addresses: dict) -> None:
        """One draft call of n tokens at `start` (eager: its addresses move along the chain)."""
        d = self.meta.draft_llm
        self._inputs(e, self.rope["dcos"], self.rope["dsin"], d.head_dim, start, n)
        feats = {"feats": (1, n, self.feat_dim if e.name == DRAFT_FEED else d.hidden)} if self.fused else {}
        e.run({"ids": (1, n), "cos": (1, n, d.head_dim), "sin": (1, n, d.head_dim),
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
        of n*hd elements, each at start*hd of a block of max_len*hd (one cudaMemcpy2DAsync)."""
        blocks, hd, size = self.kv[cache]
        self.cuda.blocks(getattr(self, cache) + start * hd * size, self.max_len * hd * size, src, n * hd * size,
                         n * hd * size, blocks, self.stream)

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

    def _expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        """The action expert on its own stream, after the last cache write (an event)."""
        cuda, s = self.cuda, self.action_stream
        vel, out = self.engines[ACTION_VELOCITY], self.engines[ACTION_OUTPUT]
        x, cos, sin = self.expert_inputs(rows, seed, request)
        times, samples = self.euler_times(request), request.samples
        blocks, hd, size = self.kv["cache"]
        cuda("cudaStreamWaitEvent", s, self.kv_ready, 0)
        cuda.blocks(vel.buf["context"], rows * hd * size, self.cache, self.max_len * hd * size, rows * hd * size,
                    blocks, s)
        self.rope_host[0], self.rope_host[1] = cos.reshape(-1, hd), sin.reshape(-1, hd)
        cuda.h2d(vel.buf["cos"], self.rope_host[0], s)
        cuda.h2d(vel.buf["sin"], self.rope_host[1], s)
        self.x_host[:] = x
        t = self.meta.target
        shapes = {"x": x.shape, "t": (samples,), "cos": cos.shape, "sin": sin.shape,
                  "context": (t.layers, 2, 1, t.kv_heads, rows, hd)}
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



def create(spec: BackendSpec) -> TensorRTBackend:
    return TensorRTBackend(spec.engines, spec.meta, spec.manifest, spec.max_len, spec.k_max, spec.eager,
                           tokenizer=spec.tokenizer)
