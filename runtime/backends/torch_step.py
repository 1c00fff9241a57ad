"""The torch backend's device-resident greedy step, and its one door to the host.

A greedy chain step on the host path (runtime/loop.py `_chain`) reads the device k + 1 times: each
drafted token's arg-max comes back before the next draft step can be fed, and the verify pass's
arg-max rows come back for the acceptance. On a GPU each read is a host sync, and the host's
launches of the next call wait behind it. Here the step stays on the device:

    the draft      each chain step's masked arg-max is written into `drafted`, and the next step is
                   fed from that buffer (no read); the feed and the k chain steps queue back to back
    the verify     its input is the pending tokens and `drafted`, put together on the device
    acceptance     the target's masked arg-max, the matches with `drafted`, the accepted length n
                   (the run of leading matches) and the bonus token rows[n], all on the device
    the one sync   a copy of (n, bonus, drafted) to the host: `HostLink.down`

Host ids going the other way (the pending tokens, the tokens the draft missed, a lookup proposal)
go through `HostLink.up`: a pinned staging buffer and a non-blocking copy on CUDA, so they never
wait for the device. Cache rows (`start`) are host ints, known without a read: they come from the
accepted length the last step brought back; a rejection is a smaller `start`, no read either.

Every device-to-host read of the torch backend goes through `HostLink.down` (tests count the
reads of a greedy step through torch's function hooks: it makes one).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from core.config import ConfigError
from runtime.backend import GreedyOutcome

STAGING = 4        # host arrays one step sends up: pending, the draft's feed, a lookup proposal


class HostLink:
    """The backend's transfers between host and device. `down` is the one device-to-host read;
    `up` stages host ids in pinned memory (CUDA) and copies them without blocking."""

    def __init__(self, device: torch.device, width: int):
        self.device, self.width = device, int(width)
        pinned = device.type == "cuda"
        self.staging = torch.zeros(STAGING, self.width, dtype=torch.long, pin_memory=pinned)
        self.slot = 0
        self.reads = 0          # device-to-host reads so far (the bench reports syncs per step)

    def up(self, ids) -> torch.Tensor:
        """Host int ids (n,) -> a device tensor (n,). Slots rotate: a step's copies never share one."""
        ids = np.asarray(ids, np.int64)
        if self.device.type != "cuda":
            return torch.from_numpy(ids.copy())
        if len(ids) > self.width:
            return torch.from_numpy(ids.copy()).to(self.device)      # wider than staged: a blocking copy
        row = self.staging[self.slot, :len(ids)]
        self.slot = (self.slot + 1) % STAGING
        row.numpy()[:] = ids
        return row.to(self.device, non_blocking=True)

    def down(self, x: torch.Tensor) -> np.ndarray:
        """The one door from the device to the host: a blocking copy (on CUDA the host waits for
        everything queued before it)."""
        self.reads += 1
        return x.detach().cpu().numpy()


class StepTimer:
    """Times of a step's draft and verify: CUDA events read after the step's one sync (no sync of
    their own), or the host clock where the device is the host."""

    def __init__(self, device: torch.device, clock):
        self.cuda = device.type == "cuda"
        self.clock = clock
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(self.clock())

    def spans(self) -> list:
        """ms between consecutive marks (call after the step's sync)."""
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


class DeviceStep:
    """Buffers and calls of the device-resident greedy step of a TorchBackend `be`."""

    def __init__(self, be, k_max: int):
        dev = be.device
        self.be, self.k_max = be, int(k_max)
        self.drafted = torch.zeros(self.k_max, dtype=torch.long, device=dev)
        self.out = torch.zeros(self.k_max + 2, dtype=torch.long, device=dev)
        self.rows = torch.arange(be.max_len, device=dev)

    @torch.no_grad()
    def step(self, tokens, start: int, draft_tokens, draft_start: int, k: int, proposal, clock) -> GreedyOutcome:
        be, link = self.be, self.be.link
        if k > self.k_max:
            raise ValueError(f"torch backend: a greedy step of k={k} is longer than k_max={self.k_max}")
        timer = StepTimer(be.device, clock)
        timer.mark()
        if proposal is not None:
            self.drafted[:k].copy_(link.up(proposal))
        elif k:
            self.chain(draft_tokens, draft_start, k)
        timer.mark()
        n, bonus = self.verify(link.up(tokens), start, k)
        timer.mark()
        out = self.out[:k + 2]
        out[0], out[1] = n, bonus
        out[2:].copy_(self.drafted[:k])
        host = link.down(out)                     # the step's one sync
        draft_ms, verify_ms = timer.spans()
        return GreedyOutcome(host[2:].copy(), int(host[0]), int(host[1]), draft_ms, verify_ms)

    def chain(self, tokens, start: int, k: int) -> None:
        """Feed `tokens` (host ids, or a device tensor) at draft row `start`, then k chain steps,
        each step's masked arg-max written into drafted[i] and fed from there."""
        be = self.be
        if be.draft_kind == "none":
            raise ConfigError("this backend has no draft (--draft none): use k = 0")
        ids = (tokens if isinstance(tokens, torch.Tensor) else be.link.up(tokens))[None]
        be.check_rows(start, ids.shape[1] + k - 1)
        feat = be.feed_features(start, ids.shape[1])
        for i in range(k):
            logits, hidden = be.draft_step(ids, start, feat)
            chosen = self.masked(logits[0, -1:], start + ids.shape[1]).argmax(-1)
            self.drafted[i:i + 1].copy_(chosen)
            start, feat = start + ids.shape[1], hidden[:, -1:] if be.fused else None
            ids = self.drafted[i:i + 1].view(1, 1)

    def verify(self, pending: torch.Tensor, start: int, k: int):
        """The target over pending + drafted[:k] at `start`; acceptance on the device -> (n, bonus)
        as device scalars: n the run of leading draft tokens equal to the target's arg-max."""
        be = self.be
        P = pending.shape[0]
        ids = torch.cat([pending, self.drafted[:k]])[None]
        be.check_rows(start, P + k)
        logits, feats = be.target_pass(ids, start)
        if be.fused:
            be.feats[start:start + P + k] = feats
        rows = self.masked(logits[0, P - 1:], start + P).argmax(-1)      # (k + 1,)
        n = (self.drafted[:k] == rows[:k]).long().cumprod(0).sum()
        return n, rows.gather(0, n.view(1))[0]

    def masked(self, logits: torch.Tensor, index0: int) -> torch.Tensor:
        """logits (n, V) choosing the tokens at sequence indices index0.. -> masked fp32; the mask
        rows computed on the device from host ints (no index array goes up)."""
        be = self.be
        n = logits.shape[0]
        rows = (self.rows[:n] + (index0 - be.mask_first)) % len(be.allowed)
        return logits.float().masked_fill(~be.allowed_dev[rows], float("-inf"))


@torch.no_grad()
def raw_costs(be, widths, ks, repeats: int = 20) -> dict:
    """The floor of each call kind on this backend: `repeats` calls back to back, one wait at the
    end, no loop around them -> {"verify": {w: ms}, "draft": {k: ms}} (a draft call: a feed of one
    token and k chain steps). The bench sets them beside the same calls' times inside the loop:
    the difference is what the loop's host work costs. Writes cache rows from 0 (call it between
    cycles: the next prefill rewrites them)."""
    ids = {w: torch.zeros(1, w, dtype=torch.long, device=be.device) for w in widths}
    one = torch.zeros(1, dtype=torch.long, device=be.device)
    out = {"verify": {}, "draft": {}}
    for w in widths:
        out["verify"][w] = _timed(be, lambda w=w: be.target_pass(ids[w], 0), repeats)
    if be.draft_kind != "none":
        for k in ks:
            out["draft"][k] = _timed(be, lambda k=k: be.device_step.chain(one, 1, k), repeats)
    return out


def _timed(be, call, repeats: int) -> float:
    call()                                   # a first call (a graph captured at warm-up is replayed)
    if be.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - t0) * 1e3 / repeats
