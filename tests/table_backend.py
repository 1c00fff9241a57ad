"""A deterministic numpy test double of a backend (tests only, not a CLI backend): table "models" with a real KV-cache contract.

Target: row i of a block fed at `start` writes cache[start+i] = E[x_i] (+ the image feature for
vision tokens) and reads the causal mean of cache[0 : start+i+1], so its output depends on
every earlier row exactly like attention does: a wrong `start` or a stale row changes the
output, which is what the loop tests need to catch.

    h_i      = tanh(E[x_i] + mean(cache[:start+i+1]) + P[pos_i mod 64])     (D,)
    logits_i = h_i @ W + stop_slope * (start + i - T) * onehot(stop_id)     (V,)

pos_i = start + i + rope_delta (the M-RoPE text position). The draft is the same function with
W + draft_noise * N(0, 1) and its own cache: noise 0 makes it the target (tau = k + 1).
The action "expert" maps the mean of the target cache to accelerations and curvatures and
integrates them from v0. Simulated costs (ms) move an injected FakeClock on the main thread
only (a worker thread runs beside the loop, so its time does not add to the cycle's).
"""
from __future__ import annotations

import threading

import numpy as np

from core.config import ConfigError
from prompt.trajectory import DT, FUT_WAYPOINTS
from runtime.backend import Backend, PrefillInputs

N_POS = 64


class TableBackend(Backend):
    name = "table"
    reuses_vision = True

    def __init__(self, vocab_size: int, max_len: int = 512, dim: int = 16, seed: int = 0,
                 draft_noise: float = 0.0, stop_id: int | None = None, stop_slope: float = 0.0,
                 patch: int = 8, merge: int = 2, clock=None, costs: dict | None = None,
                 draft_head=None):
        if vocab_size < 2 or max_len < 2:
            raise ConfigError(f"table backend: vocab_size={vocab_size} and max_len={max_len} must be >= 2")
        rng = np.random.default_rng(seed)
        self.vocab_size, self.max_len, self.dim = vocab_size, max_len, dim
        self.E = rng.normal(0, 1, (vocab_size, dim)).astype(np.float32)
        self.P = rng.normal(0, 0.5, (N_POS, dim)).astype(np.float32)
        self.W = rng.normal(0, 1, (dim, vocab_size)).astype(np.float32)
        self.W_draft = (self.W + draft_noise * rng.normal(0, 1, self.W.shape)).astype(np.float32)
        # a reduced draft head (d2t target ids): the draft's logits are -inf outside it, as
        # models.draft.Draft.to_target scatters them, so its q is zero there
        self.draft_head = None if draft_head is None else np.isin(np.arange(vocab_size), draft_head)
        self.img_proj = rng.normal(0, 1, (3, dim)).astype(np.float32)
        self.act_proj = rng.normal(0, 0.3, (dim, 2 * FUT_WAYPOINTS)).astype(np.float32)
        self.stop_id, self.stop_slope = stop_id, float(stop_slope)
        self.patch, self.merge = patch, merge
        self.cache = np.zeros((max_len, dim), np.float32)         # (max_len, D) target rows
        self.draft_cache = np.zeros((max_len, dim), np.float32)   # (max_len, D) draft rows
        self.set_mask(None)                                        # allowed (P, V) bool
        self.image_feats = None
        self.prompt_len, self.rope_delta = 0, 0
        self.clock, self.costs = clock, dict(costs or {})
        self.calls = {"vision": 0, "vision_frames": 0, "prefill": 0, "draft": 0, "verify": 0, "action": 0}

    # --- the Backend calls ---------------------------------------------------------------
    def vision_grid(self, image_shape: tuple) -> tuple[np.ndarray, int]:
        cams, frames, h, w, _ = image_shape
        side = self.patch * self.merge
        if h % side or w % side:
            raise ConfigError(f"image size {h}x{w} must be a multiple of patch*merge={side}")
        grid = np.array([[1, h // self.patch, w // self.patch]] * (cams * frames), dtype=np.int64)
        return grid, self.merge

    def vision(self, images: np.ndarray) -> None:
        self._tick("vision")
        flat = images.reshape(-1, images.shape[-3] * images.shape[-2], 3).astype(np.float32)
        self.image_feats = (flat.mean(axis=1) / 255.0) @ self.img_proj          # (n_images, D)

    def vision_frames(self, images: np.ndarray) -> list:
        """Per frame its (D,) feature row, as vision() computes it (costs: per frame)."""
        self._tick("vision_frames", len(images))
        flat = np.asarray(images).reshape(len(images), -1, 3).astype(np.float32)
        return list((flat.mean(axis=1) / 255.0) @ self.img_proj)

    def use_vision(self, frames: list) -> None:
        self.image_feats = np.stack(frames)

    def prefill(self, inputs: PrefillInputs, readout: str) -> np.ndarray:
        self._tick("prefill")
        ids = np.asarray(inputs.ids, dtype=np.int64)
        self.check_rows(0, len(ids))
        self.prompt_len, self.rope_delta = len(ids), int(inputs.rope_delta)
        extra = np.zeros((len(ids), self.dim), np.float32)
        for j, (s, n) in enumerate(inputs.image_spans):
            if self.image_feats is None:
                raise RuntimeError("table backend: prefill with images before vision()")
            extra[s:s + n] = self.image_feats[j]
        pos = np.asarray(inputs.positions)[0]
        logits = self._forward(self.cache, self.W, ids, 0, pos, extra)
        self._forward(self.draft_cache, self.W_draft, ids, 0, pos, extra)
        return self._read(logits[-1:], readout, len(ids))

    def draft(self, tokens, start: int, k: int, sampling=None):
        self._tick("draft", k)
        tokens = np.asarray(tokens, dtype=np.int64)
        out, qs = np.zeros(k, np.int64), []
        for i in range(k):
            self.check_rows(start, len(tokens))
            row = self._forward(self.draft_cache, self.W_draft, tokens, start, None)[-1:]
            if self.draft_head is not None:
                row = np.where(self.draft_head, row, -np.inf)
            row = self._masked(row, start + len(tokens))[0]
            if sampling is None:
                out[i] = int(np.argmax(row))
            else:
                out[i], q = self.draw(row, sampling, i)
                qs.append(q)
            start, tokens = start + len(tokens), out[i:i + 1]
        return out, (np.stack(qs) if sampling is not None else None)

    def verify(self, tokens, start: int, readout: str) -> np.ndarray:
        self._tick("verify", len(tokens))
        tokens = np.asarray(tokens, dtype=np.int64)
        self.check_rows(start, len(tokens))
        return self._read(self._forward(self.cache, self.W, tokens, start, None), readout, start + 1)

    def write(self, tokens, start: int) -> None:
        self._forward(self.cache, self.W, np.asarray(tokens, np.int64), start, None)

    def expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        self._tick("action")
        ctx = self.cache[:rows].mean(axis=0)
        noise = np.random.default_rng(seed).normal(0, 0.02, (request.samples, 2 * FUT_WAYPOINTS))
        draws = np.tanh(ctx @ self.act_proj + noise)                       # (samples, 128)
        u = (draws.mean(0) if request.combine == "mean" else medoid(draws)).reshape(FUT_WAYPOINTS, 2)
        return integrate_actions(u[:, 0] * 1.5, u[:, 1] * 0.02, v0)

    # --- internals -------------------------------------------------------------------------
    def _forward(self, cache, W, tokens, start, pos, extra=None) -> np.ndarray:
        """Write rows start.. and return logits (n, V) reading the causal mean of the cache."""
        n = len(tokens)
        cache[start:start + n] = self.E[tokens] + (0 if extra is None else extra)
        csum = np.cumsum(cache[:start + n], axis=0, dtype=np.float64)[start:]
        ctx = (csum / np.arange(start + 1, start + n + 1)[:, None]).astype(np.float32)
        if pos is None:
            pos = np.arange(start, start + n) + self.rope_delta
        h = np.tanh(self.E[tokens] + ctx + self.P[np.asarray(pos) % N_POS])
        logits = h @ W
        if self.stop_id is not None:
            logits[:, self.stop_id] += self.stop_slope * (np.arange(start, start + n) - self.prompt_len)
        return logits.astype(np.float32)

    def _masked(self, logits: np.ndarray, index0: int) -> np.ndarray:
        """Rows choosing the tokens at sequence indices index0.. with their masks applied."""
        return np.where(self.allowed_rows(index0, len(logits)), logits, -np.inf).astype(np.float32)

    def _read(self, logits: np.ndarray, readout: str, index0: int) -> np.ndarray:
        masked = self._masked(logits, index0)
        return self.read(readout, lambda: masked.argmax(axis=-1), lambda: masked)

    def _tick(self, op: str, width: int = 1) -> None:
        """Count the call; move the fake clock by its simulated cost (main thread only)."""
        self.calls[op] += 1
        cost = self.costs.get(op)
        if self.clock is None or cost is None or threading.current_thread() is not threading.main_thread():
            return
        self.clock.advance(cost(width) if callable(cost) else cost * (width if op == "draft" else 1))


def medoid(draws: np.ndarray) -> np.ndarray:
    """(S, D) draws -> the draw with the least summed distance to the others."""
    dist = np.linalg.norm(draws[:, None] - draws[None], axis=-1).sum(1)
    return draws[int(np.argmin(dist))]


def integrate_actions(accel: np.ndarray, curvature: np.ndarray, v0: float) -> np.ndarray:
    """(64,) accelerations and curvatures from speed v0 at the origin -> (64, 3) waypoints."""
    v = np.maximum(v0 + np.cumsum(accel) * DT, 0.0)
    heading = np.cumsum(v * curvature * DT)
    x = np.cumsum(v * np.cos(heading) * DT)
    y = np.cumsum(v * np.sin(heading) * DT)
    return np.stack([x, y, heading], axis=1).astype(np.float32)


def prompts(n: int, seed: int = 0, vocab: int = 48) -> list:
    """n synthetic token prompts: 6..19 ids each, drawn from 4..vocab-1."""
    rng = np.random.default_rng(seed)
    return [rng.integers(4, vocab, rng.integers(6, 20)) for _ in range(n)]
