"""Static-shape runs of the PyTorch backend's forwards: as they are (CPU, `static=True`) or as CUDA
graphs captured when the backend is made (runtime/backends/torch.py says when each is used)."""
from __future__ import annotations

import functools

import numpy as np
import torch


class StaticRunner:
    """Static-shape runs of the backend's verify and draft-feed forwards (Target.forward and
    Draft.forward themselves, `start` a (1,) device tensor): as they are (CPU, `static=True`,
    what the tests compare with eager) or as CUDA graphs with static input/output buffers
    (torch.cuda.graph; warm-up on a side stream first), every verify width, draft feed width and
    the draft chain's step captured by `warm` when the backend is made; with the backend's
    kv_buckets, one graph per width and kv bucket (the rows it attends over). A cycle only replays
    them; a width never captured (a long write of the reasoning rows) runs as it is. Rotary
    tables of every text position are precomputed, so a replay only copies inputs. `be`: the
    TorchBackend whose forwards (verify_forward, feed_forward) it runs."""

    def __init__(self, be, capture: bool):
        self.be, self.capture, self.graphs, self.capturing = be, capture, {}, False
        self.start_buf = torch.zeros(1, dtype=torch.long, device=be.device)
        self.expert_in = torch.zeros(2, dtype=torch.long, device=be.device)     # cache rows, rope delta
        self.expert_v0 = torch.zeros(1, dtype=torch.float32, device=be.device)
        rows = torch.arange(be.max_len, device=be.device)[None]
        self.text_cos, self.text_sin = be.target.rope(rows)        # (1, max_len, hd), pos = row
        if be.draft_kind == "routine" and be.cfg.draft.rope == "flat":
            self.draft_cos, self.draft_sin = be.draft_model.rope(rows)
        else:
            self.draft_cos, self.draft_sin = self.text_cos, self.text_sin

    def target(self, ids, start: int):
        w = ids.shape[1]
        p = start + self.be.delta
        args = (ids, self.text_cos[:, p:p + w], self.text_sin[:, p:p + w], self._start(start))
        kv = self.be.kv(start, w)
        return self._run(("target", w, kv), functools.partial(self.be.verify_forward, kv_len=kv), args)

    def draft(self, ids, start: int, feat):
        w = ids.shape[1]
        text = self.be.draft_kind == "self" or self.be.cfg.draft.rope == "mrope"
        p = start + (self.be.delta if text else 0)
        args = (ids, self.draft_cos[:, p:p + w], self.draft_sin[:, p:p + w], self._start(start))
        if feat is not None:
            args += (feat,)
        kv = self.be.kv(start, w)
        return self._run(("draft", w, None if feat is None else feat.shape[-1], kv),
                         functools.partial(self.be.feed_forward, kv_len=kv), args)

    def warm(self, widths: int) -> None:
        """Capture now (CUDA) every verify and draft feed width 1..widths and the chain step, in
        every kv bucket, through the backend's own calls on its empty cache (the first prefill
        overwrites the rows they write). A call of width w in bucket b runs at start b - w - 1
        (its chain step then needs b rows: the same bucket)."""
        if not self.capture:
            return
        self.capturing = True
        try:
            for b in self.be.buckets():
                for w in range(1, widths + 1):
                    start = max(0, b - w - 1)
                    if start + w + 1 > self.be.max_len:
                        continue
                    self.be.verify(np.zeros(w, np.int64), start, "argmax")
                    if self.be.draft_kind != "none":
                        self.be.draft(np.zeros(w, np.int64), start, 2)      # feed of w, then one chain step
        finally:
            self.capturing = False

    def expert(self, rows: int, v0: float, noise: torch.Tensor, request):
        """The expert's sample (every draw and Euler step) over cache rows [0, rows) in the bucket
        of `rows` (every max_len row with kv buckets off), the rows past `rows` masked on the
        device -> (waypoints (1, W, 3), actions). rows, v0 and rope delta go in by kernels."""
        kv = self.be.kv(0, rows) or self.be.max_len
        self.expert_in.fill_(rows)
        self.expert_in[1] = self.be.delta
        self.expert_v0.fill_(v0)
        key = ("expert", kv, request.samples, request.steps, request.combine)
        return self._run(key, self.be.expert_forward(kv, request), (noise, self.expert_v0, self.expert_in))

    def warm_expert(self, request) -> None:
        """Capture now (CUDA) the expert's graph of `request` in every kv bucket (rows of zeros:
        what it reads is overwritten by the first cycle)."""
        if not self.capture:
            return
        ec = self.be.expert_model.cfg
        noise = torch.zeros(request.samples, ec.n_waypoints, ec.action_dim, device=self.be.device)
        self.capturing = True
        try:
            for b in self.be.buckets():
                self.expert(b, 0.0, noise, request)
        finally:
            self.capturing = False

    def _start(self, start: int) -> torch.Tensor:
        """`start` as a (1,) device tensor, filled by a kernel (a host int is its argument: no copy)."""
        self.start_buf.fill_(start)
        return self.start_buf

    def _run(self, key, fn, args):
        if not self.capture or (key not in self.graphs and not self.capturing):
            return fn(*args)
        if key not in self.graphs:
            static = tuple(a.clone() for a in args)
            side = torch.cuda.Stream(self.be.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):      # warm-up: the same inputs, so its writes are the call's
                fn(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the fallback expert may be running in its worker meanwhile
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = fn(*static)
            self.graphs[key] = (graph, static, out)
        graph, static, out = self.graphs[key]
        for buf, a in zip(static, args):
            buf.copy_(a)
        graph.replay()
        return out
