"""Host logic shared by the backends that run the graphs of `specdrive export onnx` (ONNX Runtime,
TensorRT): what is decided on the host, written once. The engine-specific part (running one graph
and moving its tensors) stays in each backend module.

    shapes       meta.json's target / draft dimensions, max_len, fused features (meta.json is
                 read and checked whole by core/artifacts.py: EnginesMeta)
    rotary       prompt.positions.rope_tables: M-RoPE (target), FlatRoPE or M-RoPE (draft)
    draft map    a reduced draft head's d2t (meta.json draft_vocab), applied in the graph or here
    action       the checks of a trajectory request, the seeded noise, the expert's rotary tables

Numpy and the standard library only: this module is imported by every graph backend.
"""
from __future__ import annotations

import numpy as np

from core.artifacts import EnginesMeta
from core.config import ConfigError
from prompt.draft_vocab import check_d2t, d2t_sha256
from core.graphs import IMAGE_BLOCKS, PREFILL
from prompt.pixels import images_to_patches
from prompt.positions import rope_tables
from runtime.backend import Backend, expert_noise
from runtime.config import ExpertRequest

def split_frames(images: np.ndarray, run, n_images: int) -> list:
    """Per-frame (embeds (t, D), deepstack (S, t, D)) of `images` (n, H, W, 3) through `run`, a
    vision graph of a fixed n_images: the frames in chunks, the last padded by repeating a frame
    (images are encoded independently, so the padding changes no other frame's rows)."""
    out = []
    for i in range(0, len(images), n_images):
        chunk = images[i:i + n_images]
        pad = np.concatenate([chunk, np.repeat(chunk[-1:], n_images - len(chunk), 0)])
        embeds, deep = run(pad)
        t = embeds.shape[0] // n_images
        out += [(embeds[j * t:(j + 1) * t].copy(), deep[:, j * t:(j + 1) * t].copy()) for j in range(len(chunk))]
    return out


class GraphBackend(Backend):
    """Shapes, rotary tables, masks and the expert's host side over one exported meta.json."""

    def init_shapes(self, folder, meta: EnginesMeta, max_len: int | None) -> None:
        if max_len is not None and max_len != meta.max_len:
            raise ConfigError(f"{folder}: graphs were exported for max_len={meta.max_len}, the "
                              f"planner asks for {max_len}; re-export or set max_len to match")
        t = meta.target
        self.meta, self.vocab_size, self.max_len = meta, t.vocab_size, meta.max_len
        self.fused = meta.draft_features == "fused"
        self.draft_keeps_proposals = not self.fused
        self.feat_dim = 3 * t.hidden if self.fused else 1
        self.delta = 0
        self.action_fixed = (meta.action.samples, meta.action.combine)   # in action_output
        self.image_attention = t.image_attention

    @property
    def stream_mismatch(self) -> str | None:
        """Streaming is exact only where the image_blocks graph computes what the prefill graph
        computes: the same precision (a quantized image_blocks would also need the prefill's own
        scales, which calibration does not share yet)."""
        g = self.meta.graphs
        if IMAGE_BLOCKS not in g or PREFILL not in g or g[IMAGE_BLOCKS].precision == g[PREFILL].precision:
            return None
        return (f"the image_blocks graph is {g[IMAGE_BLOCKS].precision} and the prefill graph "
                f"{g[PREFILL].precision}, so streamed image blocks would not be the full prefill's. Streaming "
                "a quantized prefill is not built yet; use an export whose prefill is not quantized, or turn "
                "reuse.prefill off")

    def block_rows(self, blocks: list, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Kept image blocks (per frame (kv (layers, 2, 1, KVH, L, hd) with K before rope, feats
        (L, F))) -> their target cache rows (layers, 2, 1, KVH, n*L, hd), keys rotated to
        `positions` (3, n*L), and their features (n*L, F)."""
        kv = np.concatenate([b[0] for b in blocks], axis=4)
        cos, sin = self.target_rope(np.asarray(positions)[:, None])          # (1, n*L, hd)
        k = kv[:, 0]
        half = k.shape[-1] // 2
        rotated = np.concatenate([-k[..., half:], k[..., :half]], -1)
        kv = np.stack([k * cos + rotated * sin, kv[:, 1]], 1).astype(np.float32)
        return kv, np.concatenate([b[1] for b in blocks])

    def split_blocks(self, kv: np.ndarray, feats: np.ndarray) -> list:
        """image_blocks' outputs kv (layers, 2, n, KVH, L, hd), feats (n, L, F) -> per frame."""
        return [(np.ascontiguousarray(kv[:, :, i:i + 1]), feats[i].copy()) for i in range(kv.shape[2])]

    def init_draft_vocab(self, folder, meta: EnginesMeta, tokenizer) -> None:
        """meta.json's draft_vocab (None for a full head): a reduced head's d2t checked against its
        hash and the tokenizer; `host_map` when the backend applies it (export --draft-map host)."""
        dv = meta.draft_vocab
        self.d2t, self.host_map = None, False
        if dv is None:
            return
        d2t = np.asarray(dv.d2t, np.int64)
        where = f"{folder}/meta.json draft_vocab"
        if tokenizer is not None:
            check_d2t(d2t, tokenizer, where, dv.d2t_sha256)
        elif d2t_sha256(d2t) != dv.d2t_sha256:
            raise ConfigError(f"{where}: d2t does not match its d2t_sha256")
        self.d2t, self.host_map = d2t, dv.map == "host"

    def draft_allowed(self, index0: int, n: int) -> np.ndarray:
        """The draft graphs' mask rows: over the target vocabulary, or the head's rows (host map)."""
        rows = self.allowed_rows(index0, n)
        return rows[:, self.d2t] if self.host_map else rows

    def draft_pick(self, top: int, logits: np.ndarray, sampling, j: int):
        """A draft graph's last-row result -> (target id, q (V,) or None): with a host map the
        head id goes through d2t and the head's logits are scattered (-inf outside the head)."""
        if self.host_map:
            full = np.full(self.vocab_size, -np.inf, np.float32)
            full[self.d2t] = logits
            top, logits = int(self.d2t[top]), full
        if sampling is None:
            return int(top), None
        return self.draw(logits, sampling, j)

    def draft_topk(self, logits: np.ndarray, k: int):
        """A draft graph's masked last-row logits (its head's, with a host map) -> the top-k target
        ids and their log-probabilities (a tree's candidates, runtime/tree.py)."""
        if self.host_map:
            full = np.full(self.vocab_size, -np.inf, np.float32)
            full[self.d2t] = logits
            logits = full
        z = logits.astype(np.float64)
        z = z - z.max()
        lp = z - np.log(np.exp(z).sum())
        top = np.argsort(-lp, kind="stable")[:k]
        return top.astype(np.int64), lp[top]

    # --- vision ---------------------------------------------------------------------------------
    def vision_grid(self, image_shape: tuple) -> tuple[np.ndarray, int]:
        p = self.meta.prompt
        want = (p.cameras, p.frames, *p.image_hw, 3)
        if tuple(image_shape) != want:
            raise ConfigError(f"images {tuple(image_shape)}: these graphs were exported for {want} "
                              "(cameras, frames, H, W, RGB)")
        return np.asarray(p.grid_thw, np.int64), self.meta.vision.merge

    @property
    def n_images(self) -> int:
        """Images per cycle the vision graph was exported for."""
        return len(self.meta.prompt.grid_thw)

    def patches(self, images: np.ndarray) -> np.ndarray:
        v = self.meta.vision
        imgs = np.asarray(images).reshape(-1, *images.shape[-3:])        # camera-major
        patches, _ = images_to_patches(imgs, v.patch, v.temporal_patch, v.merge)
        return patches.astype(np.float32)

    # --- rotary tables --------------------------------------------------------------------------
    def target_rope(self, positions):
        t = self.meta.target
        if t.mrope_section and np.asarray(positions).ndim == 2:
            positions = np.broadcast_to(positions, (3, *np.shape(positions)))
        return rope_tables(positions, t.head_dim, t.rope_theta, t.mrope_section, t.interleaved)

    def draft_rope(self, start: int, n: int, prompt_positions=None):
        if self.meta.draft_rope == "mrope":
            return self.target_rope(prompt_positions if prompt_positions is not None
                                     else np.arange(start, start + n)[None] + self.delta)
        d = self.meta.draft_llm
        return rope_tables(np.arange(start, start + n)[None], d.head_dim, d.rope_theta)

    # --- the action expert's host side ----------------------------------------------------------
    def expert_inputs(self, rows: int, seed: int, request: ExpertRequest):
        """Checked request -> (noise x (S, W, A) fp32, cos, sin (S, W, hd)): the draws start from
        the cycle's seed, the expert's queries sit at positions rows + delta + 0..W-1."""
        samples, combine = request.samples, request.combine
        a, t = self.meta.action, self.meta.target
        if (samples, combine) != (a.samples, a.combine):
            raise ConfigError(f"{self.folder}: action_output was exported for {a.samples} draws "
                              f"combined by {a.combine!r}, the planner asks for {samples} by "
                              f"{combine!r}; re-export with that planner profile")
        W, A, S = a.n_waypoints, a.action_dim, samples
        x = expert_noise(seed, S, W, A)
        pos = rows + self.delta + np.arange(W)
        cos, sin = rope_tables(np.broadcast_to(pos, (3, S, W)) if t.mrope_section else
                               np.broadcast_to(pos, (S, W)), t.head_dim, t.rope_theta,
                               t.mrope_section, t.interleaved)
        return x, cos, sin

    def euler_times(self, request: ExpertRequest) -> np.ndarray:
        """(steps, S) fp32: t = i / steps of Euler step i (x <- x + v(x, t) / steps)."""
        samples, steps = request.samples, request.steps or self.meta.action.euler_steps
        return np.repeat((np.arange(steps) / steps).astype(np.float32)[:, None], samples, 1)
