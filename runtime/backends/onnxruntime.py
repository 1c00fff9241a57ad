"""The ONNX Runtime backend: the graphs of `specdrive export onnx` driven through InferenceSession
objects, with numpy, onnxruntime and the standard library only (no torch on the vehicle).

An engines folder (meta.json kind "engines", backend "onnxruntime") holds vision, prefill, step,
draft_prefill, draft_feed [, draft_chain], action_velocity and action_output (export/onnx.py
says what each takes). Buffers, allocated once and bound to the sessions with IOBinding (on the
CPU an OrtValue over the numpy array: the same memory, no copy):

    cache        target KV  (layers, 2, 1, kv_heads, max_len, head_dim) float32
    draft_cache  draft KV   (draft layers, 2, 1, kv_heads, max_len, head_dim)
    feats        (max_len, F) the target's low/mid/top hidden states per row (fused drafts)

A step graph returns the K/V of the rows it was fed; they are written here by index (rows
start..start+n-1). Rolling back moves a length in the loop; nothing is erased or concatenated.
Rotary cos/sin are built on the host (prompt.positions.rope_tables): M-RoPE for the target,
FlatRoPE (or M-RoPE) for the draft. The action expert's Euler loop runs here: noise from the
cycle's seed, one action_velocity call per step, then action_output (the draws combined and
integrated). The mask (set_mask) goes into every graph that picks tokens, so a greedy host
reads back the arg-max integers only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from core.artifacts import ONNX_FORMAT, EnginesMeta
from core.config import ConfigError, file_sha256
from core.graphs import (ACTION_OUTPUT, ACTION_VELOCITY, DRAFT_CHAIN, DRAFT_FEED, DRAFT_PREFILL, IMAGE_BLOCKS, PREFILL,
                           STEP, STEP_TREE, VISION, VISION_FRAME)
from runtime.backend import BackendSpec, PrefillInputs, image_rows
from runtime.backends.graphs import GraphBackend, split_frames
from runtime.tree import TreeBuilder

PROVIDERS = {"cpu": ["CPUExecutionProvider"],
             "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
             "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]}


class OrtBackend(GraphBackend):
    name = "onnxruntime"
    reuses_vision = True

    def __init__(self, folder: Path, meta: EnginesMeta, device: str = "cpu", max_len: int | None = None,
                 threads: int = 0, tokenizer=None):
        self.folder = Path(folder)
        # watch_graphs(graph, inputs) sees every session call's inputs (calibration's recorder)
        self.watch_graphs = None
        check_meta(self.folder, meta)
        self.init_shapes(folder, meta, max_len)
        self.init_draft_vocab(self.folder, meta, tokenizer)
        self.sessions = open_sessions(self.folder, meta, device, threads)
        t, d = meta.target, meta.draft_llm
        self.cache = np.zeros((t.layers, 2, 1, t.kv_heads, self.max_len, t.head_dim), np.float32)
        self.draft_cache = np.zeros((d.layers, 2, 1, d.kv_heads, self.max_len, d.head_dim), np.float32)
        self.feats = np.zeros((self.max_len, self.feat_dim), np.float32)
        self.bound = {"cache": ort.OrtValue.ortvalue_from_numpy(self.cache),
                      "draft_cache": ort.OrtValue.ortvalue_from_numpy(self.draft_cache)}
        self.set_mask(None)
        self.images = None

    # --- vision and prefill ------------------------------------------------------------------
    def vision(self, images: np.ndarray) -> None:
        self.images = self._run(VISION, patches=self.patches(images))

    def vision_frames(self, images: np.ndarray) -> list:
        """(embeds (n, D), deepstack (S, n, D)) per frame: the vision_frame graph once per new
        frame; an export without it runs the whole vision graph on the frames padded to its
        image count (exact, as fast as vision())."""
        images = np.asarray(images)
        if VISION_FRAME in self.sessions:
            return [tuple(self._run(VISION_FRAME, patches=self.patches(f[None]))) for f in images]
        return split_frames(images, lambda x: self._run(VISION, patches=self.patches(x)), self.n_images)

    def use_vision(self, frames: list) -> None:
        self.images = (np.concatenate([f[0] for f in frames]), np.concatenate([f[1] for f in frames], axis=1))

    @property
    def takes_trees(self) -> bool:
        """The export has the step_tree graph (exports before token trees do not: re-export), at
        the step graph's precision (calibration quantizes `step` only)."""
        g = self.meta.graphs
        return STEP_TREE in self.sessions and g[STEP_TREE].precision == g[STEP].precision

    @property
    def tree_width(self) -> int:
        return self.meta.k_max + 1          # the verify widths the export was made for

    @property
    def streams_prefill(self) -> bool:
        return IMAGE_BLOCKS in self.sessions

    def image_blocks(self, frames: list, ids: np.ndarray, positions: np.ndarray) -> list:
        n, L = len(frames), len(ids)
        cos, sin = self.target_rope(np.broadcast_to(np.asarray(positions)[:, None], (3, n, L)))
        kv, feats = self._run(IMAGE_BLOCKS, ids=np.broadcast_to(np.asarray(ids, np.int64), (n, L)), cos=cos, sin=sin,
                              image_embeds=np.stack([f[0] for f in frames]),
                              deepstack=np.stack([f[1] for f in frames], axis=1))
        return self.split_blocks(kv, feats)

    def prefill_streamed(self, inputs: PrefillInputs, readout: str, blocks: list) -> np.ndarray:
        ids = np.asarray(inputs.ids, np.int64)[None]
        T = ids.shape[1]
        self.check_rows(0, T)
        first, end = image_rows(inputs)
        pos = np.asarray(inputs.positions)
        self.delta = int(inputs.rope_delta)
        self._step(ids[:, :first], 0, pos[:, :first])
        self.cache[..., first:end, :], feats = self.block_rows(blocks, pos[:, first:end])
        if self.fused:
            self.feats[first:end] = feats
        logits, top = self._step(ids[:, end:], end, pos[:, end:])
        self._draft_prefill(ids, pos, self.images[0], self.feats[None, :T] if self.fused else None)
        return self.read(readout, lambda: top[0, -1:], lambda: logits[0, -1:])

    def prefill(self, inputs: PrefillInputs, readout: str) -> np.ndarray:
        ids = np.asarray(inputs.ids, np.int64)[None]
        T = ids.shape[1]
        self.check_rows(0, T)
        if self.images is None:
            raise ValueError("onnxruntime backend: prefill needs vision(images) first")
        self.delta = int(inputs.rope_delta)
        cos, sin = self.target_rope(np.asarray(inputs.positions)[:, None])
        embeds, deep = self.images
        logits, top, feats, kv = self._run(PREFILL, ids=ids, cos=cos, sin=sin, image_embeds=embeds,
                                           deepstack=deep, allowed=self.allowed_rows(1, T))
        self.cache[..., :T, :] = kv
        if self.fused:
            self.feats[:T] = feats[0]
        self._draft_prefill(ids, np.asarray(inputs.positions), embeds, feats if self.fused else None)
        return self.read(readout, lambda: top[0, -1:], lambda: logits[0, -1:])

    def _draft_prefill(self, ids, positions, embeds, feats) -> None:
        """The draft's prompt rows; a fused draft reads the target's features (1, T, F) shifted."""
        T = ids.shape[1]
        dcos, dsin = self.draft_rope(0, T, positions[:, None])
        extra = {"feats": np.concatenate([np.zeros_like(feats[:, :1]), feats[:, :-1]], 1)} if feats is not None else {}
        (dkv,) = self._run(DRAFT_PREFILL, ids=ids, cos=dcos, sin=dsin, image_embeds=embeds, **extra)
        self.draft_cache[..., :T, :] = dkv

    # --- draft, verify, action ---------------------------------------------------------------
    def draft(self, tokens, start: int, k: int, sampling=None):
        ids = np.asarray(tokens, np.int64)[None]
        self.check_rows(start, ids.shape[1] + k - 1)
        out, qs, graph = [], [], DRAFT_FEED
        feats = self.feed_features(start, ids.shape[1])
        for _ in range(k):
            n = ids.shape[1]
            logits, top, hidden = self._draft_call(graph, ids, start, feats)
            token, q = self.draft_pick(int(top[0, -1]), logits[0, -1], sampling, len(out))
            if sampling is not None:
                qs.append(q)
            out.append(token)
            start, ids = start + n, np.array([[token]], np.int64)
            if self.fused:
                graph, feats = DRAFT_CHAIN, hidden[:, -1:]
        return np.asarray(out, np.int64), (np.stack(qs) if sampling is not None else None)

    def verify(self, tokens, start: int, readout: str) -> np.ndarray:
        ids = np.asarray(tokens, np.int64)[None]
        n = ids.shape[1]
        self.check_rows(start, n)
        logits, top = self._step(ids, start)
        return self.read(readout, lambda: top[0], lambda: logits[0])

    # --- token trees (runtime/tree.py) ----------------------------------------------------------
    def draft_tree(self, tokens, start: int, shape):
        """The draft graphs take no tree mask, so the draft expands its best node per depth (a
        chain of draft_feed / draft_chain calls, each row's context its ancestors exactly) and
        every expanded node proposes its top-K: the tree is that chain with its siblings."""
        ids = np.asarray(tokens, np.int64)[None]
        self.check_rows(start, ids.shape[1] + shape.depth - 1)
        b, graph = TreeBuilder(shape, expand=1), DRAFT_FEED
        feats = self.feed_features(start, ids.shape[1])
        row, node = start, None
        while True:
            n = ids.shape[1]
            logits, _, hidden = self._draft_call(graph, ids, row, feats)
            top_ids, top_lp = self.draft_topk(logits[0, -1], shape.topk)
            if node is None:
                b.root(top_ids, top_lp)
            else:
                b.children([node], [row], top_ids[None], top_lp[None])
            nodes = b.expand()
            if nodes is None:
                return b.tree()
            node, row = nodes[0], row + n
            ids = np.array([[b.tokens[node]]], np.int64)
            if self.fused:
                graph, feats = DRAFT_CHAIN, hidden[:, -1:]

    def verify_tree(self, tokens, start: int, readout: str, offsets, mask) -> np.ndarray:
        ids = np.asarray(tokens, np.int64)[None]
        n = ids.shape[1]
        self.check_rows(start, n)
        offsets = np.asarray(offsets, np.int64)
        cos, sin = self.target_rope((start + offsets + self.delta)[None])
        rows = (start + 1 + offsets - self.mask_first) % len(self.allowed)
        logits, top, feats, kv = self._run(STEP_TREE, ids=ids, cos=cos, sin=sin, cache=self.bound["cache"],
                                           start=np.array([start], np.int64), allowed=self.allowed[rows],
                                           tree=np.asarray(mask, bool))
        self.cache[..., start:start + n, :] = kv
        if self.fused:
            self.feats[start:start + n] = feats[0]
        return self.read(readout, lambda: top[0], lambda: logits[0])

    def keep_rows(self, start: int, rows, draft_start: int, draft_rows) -> None:
        rows, draft_rows = np.asarray(rows, np.int64), np.asarray(draft_rows, np.int64)
        if len(rows):
            self.cache[..., start:start + len(rows), :] = self.cache[..., rows, :]
            if self.fused:
                self.feats[start:start + len(rows)] = self.feats[rows]
        if len(draft_rows):
            self.draft_cache[..., draft_start:draft_start + len(draft_rows), :] = self.draft_cache[..., draft_rows, :]

    def write(self, tokens, start: int) -> None:
        self._step(np.asarray(tokens, np.int64)[None], start)

    def expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        context = np.ascontiguousarray(self.cache[..., :rows, :])
        x, cos, sin = self.expert_inputs(rows, seed, request)
        times = self.euler_times(request)
        for t in times:                              # x <- x + dt v(x, t), t = i / steps
            (v,) = self._run(ACTION_VELOCITY, x=x, t=t, context=context, cos=cos, sin=sin)
            x = x + v / np.float32(len(times))
        (wp,) = self._run(ACTION_OUTPUT, x=x, v0=np.array([v0], np.float32))
        return wp[0].astype(np.float32)

    # --- internals -----------------------------------------------------------------------------
    def _step(self, ids: np.ndarray, start: int, positions=None):
        """Target step over ids (1, n) at `start` (text positions row + delta, or `positions`
        (3, n)): writes the rows' K/V (and features)."""
        n = ids.shape[1]
        cos, sin = self.target_rope(np.arange(start, start + n)[None] + self.delta if positions is None
                                    else np.asarray(positions)[:, None])
        logits, top, feats, kv = self._run(STEP, ids=ids, cos=cos, sin=sin, cache=self.bound["cache"],
                                           start=np.array([start], np.int64), allowed=self.allowed_rows(start + 1, n))
        self.cache[..., start:start + n, :] = kv
        if self.fused:
            self.feats[start:start + n] = feats[0]
        return logits, top

    def _draft_call(self, graph: str, ids: np.ndarray, start: int, feats):
        """One draft_feed / draft_chain call over ids (1, n) at draft row `start`: its K/V rows
        written into the draft cache -> (logits, argmax, hidden)."""
        n = ids.shape[1]
        cos, sin = self.draft_rope(start, n)
        extra = {} if feats is None else {"feats": feats}
        logits, top, hidden, kv = self._run(graph, ids=ids, cos=cos, sin=sin, cache=self.bound["draft_cache"],
                                            start=np.array([start], np.int64),
                                            allowed=self.draft_allowed(start + 1, n), **extra)
        self.draft_cache[..., start:start + n, :] = kv
        return logits, top, hidden

    def _run(self, graph: str, **inputs) -> list[np.ndarray]:
        """One session call with IOBinding: the cache OrtValues are bound as they are (their
        memory is the numpy buffers), small host arrays are bound per call."""
        if self.watch_graphs is not None:
            self.watch_graphs(graph, inputs)
        sess = self.sessions[graph]
        binding = sess.io_binding()
        for name, value in inputs.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for out in sess.get_outputs():
            binding.bind_output(out.name)
        sess.run_with_iobinding(binding)
        self.last_binding = (graph, binding)
        return binding.copy_outputs_to_cpu()


def check_meta(folder: Path, meta: EnginesMeta) -> None:
    """Refuse a folder that is not what its meta.json says (read and checked whole by
    core.artifacts), naming the difference: its backend, precisions, graph files."""
    if meta.backend != "onnxruntime":
        raise ConfigError(f"{folder}/meta.json: backend {meta.backend!r}; expected {ONNX_FORMAT!r} graphs for "
                          "'onnxruntime'")
    check_precision(folder, meta)
    for name, g in meta.graphs.items():
        file = folder / g.file
        if not file.is_file():
            raise ConfigError(f"{file}: missing (meta.json lists graph {name!r}); re-export the folder")
        digest = file_sha256(file)
        if digest != g.sha256:
            raise ConfigError(f"{file}: sha256 {digest[:12]}... does not match meta.json "
                              f"({g.sha256[:12]}...): the graph was changed or damaged")


def check_precision(folder: Path, meta: EnginesMeta) -> None:
    """meta.json's "precision" table and each graph's own entry agree, and a graph said to be
    quantized carries the record calibration wrote (an fp32 graph called int8 is refused)."""
    table = meta.precision
    for name, g in meta.graphs.items():
        said, own, record = table.get(name, table.get("*")), g.precision, g.quantization is not None
        if said != own or (own != "fp32") != record:
            raise ConfigError(f"{folder}/meta.json: precision of graph {name!r} is {said!r}, but its graph "
                              f"entry is {own} {'with' if record else 'without'} a quantization "
                              "record; only calibration (specdrive calibrate) makes quantized graphs")


ORT_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "int64": "tensor(int64)",
             "int32": "tensor(int32)", "int8": "tensor(int8)", "uint8": "tensor(uint8)", "bool": "tensor(bool)"}


def io_of(values) -> list:
    """[(name, shape, type)] of a session's inputs or outputs (dynamic axes by name)."""
    return [(v.name, list(v.shape), v.type) for v in values]


def declared(specs) -> list:
    return [(t.name, list(t.shape), ORT_TYPES.get(t.dtype, t.dtype)) for t in specs]


def open_sessions(folder: Path, meta: EnginesMeta, device: str, threads: int = 0) -> dict:
    """An InferenceSession per graph (`threads` intra-op threads; 0: onnxruntime's default), its
    inputs and outputs checked against meta.json."""
    kind = device.split(":")[0]
    if kind not in PROVIDERS:
        raise ConfigError(f"--device {device!r}: the onnxruntime backend runs on {sorted(PROVIDERS)}")
    providers = [p for p in PROVIDERS[kind] if p in ort.get_available_providers()]
    if providers[:1] != PROVIDERS[kind][:1]:
        raise ConfigError(f"--device {device!r}: onnxruntime {ort.__version__} here has the providers "
                          f"{ort.get_available_providers()}; {PROVIDERS[kind][0]} is missing")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = int(threads)
    sessions = {}
    for name, g in meta.graphs.items():
        try:
            sess = ort.InferenceSession(str(folder / g.file), opts, providers=providers)
        except Exception as e:     # a corrupt graph that still matched its hash is a bad export
            raise ConfigError(f"{folder / g.file}: onnxruntime cannot load it: {e}") from None
        got = ([i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()])
        want = ([i.name for i in g.inputs], [o.name for o in g.outputs])
        if got != want:
            raise ConfigError(f"{folder / g.file}: inputs/outputs {got} but meta.json says {want}")
        for have, says in ((io_of(sess.get_inputs()), declared(g.inputs)),
                           (io_of(sess.get_outputs()), declared(g.outputs))):
            for h, w in zip(have, says):
                if h != w:
                    raise ConfigError(f"{folder / g.file}: {h[0]!r} is {h[2]} {h[1]} in the graph but "
                                      f"meta.json graph {name!r} declares {w[2]} {w[1]}")
        check_rope(folder / g.file, sess, meta)
        sessions[name] = sess
    return sessions


def check_rope(file: Path, sess, meta: EnginesMeta) -> None:
    """The rotary facts a graph was exported with (its metadata "specdrive.rope", export/onnx.py)
    against meta.json's, from which the host builds cos/sin: an edited rope_theta fails here even
    with its facts hash recomputed. Every graph of this format version carries it: one without
    (stripped, with the hashes redone) is refused."""
    import json

    raw = sess.get_modelmeta().custom_metadata_map.get("specdrive.rope")
    if raw is None:
        raise ConfigError(f"{file}: no 'specdrive.rope' metadata, which every graph of an ONNX export of format "
                          f"version {meta.raw.get('format_version')} carries (the rotary facts it was exported for): it was "
                          "stripped or the graph comes from elsewhere; allowed: the graphs `specdrive export onnx` "
                          "wrote; re-export the folder")
    try:
        said = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{file}: its 'specdrive.rope' metadata is not JSON; re-export the folder") from None
    for part, dims in (("target", meta.target), ("draft_llm", meta.draft_llm)):
        want = said.get(part, {}) if isinstance(said, dict) else {}
        have = {"head_dim": dims.head_dim, "rope_theta": float(dims.rope_theta),
                "mrope_section": list(dims.mrope_section), "interleaved": bool(dims.interleaved),
                **({"image_attention": dims.image_attention} if part == "target" else {})}
        for key, value in have.items():
            if key in want and want[key] != value:
                raise ConfigError(f"{file.parent}/meta.json: field '{part}.{key}' = {value!r}, but graph {file.name} "
                                  f"was exported for {want[key]!r}: the rotary tables built from meta.json would not "
                                  "be the model's (meta.json was edited); re-export the folder")


def create(spec: BackendSpec) -> OrtBackend:
    return OrtBackend(spec.engines, spec.meta, spec.device, spec.max_len, spec.threads, spec.tokenizer)
