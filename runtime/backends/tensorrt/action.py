"""The action expert on the TensorRT backend: the action_velocity engine's Euler steps and the
action_output engine, on their own stream after the last cache write. A part of TensorRTBackend
(backend.py), beside its core step."""
from __future__ import annotations

import numpy as np

from core.graphs import ACTION_OUTPUT, ACTION_VELOCITY


class ActionOnStream:
    """The fallback expert of TensorRTBackend: it waits on the backend's `kv_ready` event, copies
    the cache rows it reads into its context buffer, and its Euler update runs on the host (the
    export has no axpy graph; two (S, W, A) copies per Euler step)."""

    def allocate_action(self, cuda, action, head_dim: int) -> None:
        """Pinned host staging of the expert's calls (`action`: meta.json's action section)."""
        S, W, A = action.samples, action.n_waypoints, action.action_dim
        self.x_host, self.v_host = cuda.pinned((S, W, A), np.float32), cuda.pinned((S, W, A), np.float32)
        self.t_host, self.v0_host = cuda.pinned((S,), np.float32), cuda.pinned((1,), np.float32)
        self.wp_host = cuda.pinned((1, W, 3), np.float32)
        self.rope_host = cuda.pinned((2, S * W, head_dim), np.float32)

    def expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        with self.action_lock:
            return self._expert(rows, v0, seed, request)

    def _expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        """The action expert on its own stream, after the last cache write (an event)."""
        cuda, s, c = self.cuda, self.action_stream, self.cache
        vel, out = self.engines[ACTION_VELOCITY], self.engines[ACTION_OUTPUT]
        x, cos, sin = self.expert_inputs(rows, seed, request)
        times, samples = self.euler_times(request), request.samples
        cuda("cudaStreamWaitEvent", s, self.kv_ready, 0)
        width = rows * c.row_bytes
        cuda.blocks(vel.io.context.ptr, width, c.ptr, c.pitch, width, c.blocks, s)
        self.rope_host[0], self.rope_host[1] = cos.reshape(-1, c.head_dim), sin.reshape(-1, c.head_dim)
        cuda.h2d(vel.io.cos.ptr, self.rope_host[0], s)
        cuda.h2d(vel.io.sin.ptr, self.rope_host[1], s)
        self.x_host[:] = x
        t = self.meta.target
        shapes = {"x": x.shape, "t": (samples,), "cos": cos.shape, "sin": sin.shape,
                  "context": (t.layers, 2, 1, t.kv_heads, rows, c.head_dim)}
        for ti in times:                                  # x <- x + dt v(x, t), t = i / steps
            self.t_host[:] = ti
            cuda.h2d(vel.io.x.ptr, self.x_host, s)
            cuda.h2d(vel.io.t.ptr, self.t_host, s)
            vel.run(shapes)
            cuda.d2h(self.v_host, vel.io.velocity.ptr, s)
            cuda("cudaStreamSynchronize", s)
            self.x_host[:] = self.x_host + self.v_host / np.float32(len(times))
        self.v0_host[0] = v0
        cuda.h2d(out.io.x.ptr, self.x_host, s)
        cuda.h2d(out.io.v0.ptr, self.v0_host, s)
        out.run({})
        cuda.d2h(self.wp_host, out.io.waypoints.ptr, s)
        cuda("cudaStreamSynchronize", s)
        return self.wp_host[0].copy()
