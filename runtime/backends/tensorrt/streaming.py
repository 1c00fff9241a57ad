"""Streaming on the TensorRT backend: vision features per frame (kept across cycles by the
planner), the image_blocks engine over new frames, and the streamed prefill that writes the kept
blocks' rows into the cache around the step engine's text rows. A part of TensorRTBackend
(backend.py), beside its core step."""
from __future__ import annotations

import numpy as np

from core.graphs import IMAGE_BLOCKS, STEP, VISION, VISION_FRAME
from runtime.backend import PrefillInputs, image_rows
from runtime.backends.graphs import split_frames


class StreamedPrefill:
    """The per-frame vision and streamed-prefill calls of TensorRTBackend: they use its engines,
    buffers and core copies (steps, cache rows, read-back)."""

    @property
    def streams_prefill(self) -> bool:
        return IMAGE_BLOCKS in self.engines

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
        feats = (("image_embeds", v.io.image_embeds, np.concatenate([f[0] for f in frames])),
                 ("deepstack", v.io.deepstack, np.concatenate([f[1] for f in frames], axis=1)))
        for name, dst, x in feats:
            host = self.staging("reuse_" + name, x.shape, dst.dtype)
            host[:] = x
            self.cuda.h2d(dst.ptr, host, self.stream)
        self.has_images = True

    def _vision_run(self, graph: str, images: np.ndarray) -> tuple:
        """One run of a vision engine on `images` -> (embeds, deepstack), copied to the host."""
        e, s = self.engines[graph], self.stream
        patches = self.patches(images)
        host = self.staging(graph + "_patches", patches.shape, np.float32)
        host[:] = patches
        self.cuda.h2d(e.io.patches.ptr, host, s)
        e.run({})
        out = []
        for name, src in (("image_embeds", e.io.image_embeds), ("deepstack", e.io.deepstack)):
            buf = self.staging(f"{graph}_{name}", self.meta.graphs[graph].dims(name, "outputs"), src.dtype)
            self.cuda.d2h(buf, src.ptr, s)
            out.append(buf)
        self.cuda("cudaStreamSynchronize", s)
        return tuple(np.array(b) for b in out)       # the staging is reused by the next run

    def image_blocks(self, frames: list, ids: np.ndarray, positions: np.ndarray) -> list:
        """The image_blocks engine over n new frames; their K/V and features come back to the host
        (a frame's entry lives in the planner's cache, as its vision features do)."""
        e, s, n, L = self.engines[IMAGE_BLOCKS], self.stream, len(frames), len(ids)
        t = self.meta.target
        cos, sin = self.target_rope(np.broadcast_to(np.asarray(positions)[:, None], (3, n, L)))
        inputs = {"ids": (e.io.ids, np.broadcast_to(np.asarray(ids, np.int64), (n, L))),
                  "cos": (e.io.cos, cos), "sin": (e.io.sin, sin),
                  "image_embeds": (e.io.image_embeds, np.stack([f[0] for f in frames])),
                  "deepstack": (e.io.deepstack, np.stack([f[1] for f in frames], axis=1))}
        for name, (dst, x) in inputs.items():
            host = self.staging("blocks_" + name, x.shape, dst.dtype)
            host[:] = x
            self.cuda.h2d(dst.ptr, host, s)
        e.run({name: x.shape for name, (_, x) in inputs.items()})
        kv = self.staging("blocks_out_kv", (t.layers, 2, n, t.kv_heads, L, t.head_dim), e.io.kv.dtype)
        feats = self.staging("blocks_out_feats", (n, L, self.feat_dim), e.io.feats.dtype)
        self.cuda.d2h(kv, e.io.kv.ptr, s)
        self.cuda.d2h(feats, e.io.feats.ptr, s)
        self.cuda("cudaStreamSynchronize", s)
        return self.split_blocks(np.array(kv, np.float32), np.array(feats, np.float32))

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
        self.upload_rope(self.rope, tuple(np.concatenate([p, t[:, T:]], 1) for p, t in zip(prompt, text)))
        self.step_rows(ids[:first], 0)
        kv, feats = self.block_rows(blocks, pos[:, first:end])
        host = self.staging("block_rows", kv.shape, np.float16 if self.cache.dtype.itemsize == 2 else np.float32)
        host[:] = kv
        dev = self._block_buffer(host.nbytes)
        cuda.h2d(dev, host, s)
        self.write_rows(self.cache, dev, first, end - first)
        if self.fused:
            fh = self.staging("block_feats", feats.shape, np.float32)
            fh[:] = feats
            cuda.h2d(self.feats.at((first + 1) * self.feat_dim), fh, s)
        self.step_rows(ids[end:], end)
        self.upload_rope(self.rope, text)
        self.ids_host[:T] = ids                   # the steps above staged their own rows there
        self.draft_prefill(T, pos, None)
        cuda("cudaEventRecord", self.kv_ready, s)
        return self.read_rows(self.engines[STEP], T - end - 1, 1, readout)

    def _block_buffer(self, nbytes: int) -> int:
        """Device rows of the kept image blocks on their way into the cache (grown once)."""
        if getattr(self, "_blocks_dev", (0, 0))[1] < nbytes:
            self._blocks_dev = (self.cuda.malloc(nbytes), nbytes)
        return self._blocks_dev[0]
