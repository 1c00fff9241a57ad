"""What a planner keeps across cycles, exactly: vision features of frames seen before, and the
last cycles' reasoning as a zero-cost draft (PlannerConfig.reuse; both off by default).

Vision. The vision tower encodes every image on its own (attention stays inside a frame), so
a frame's features do not depend on the other images of the cycle: the features of a frame
seen in an earlier cycle are the ones this cycle would compute. `VisionCache` keys a frame by
its identity (camera, timestamp in microseconds) when plan() is given `frames`, else by its
content digest (blake2b-128 of the pixels), and keeps the digest beside the features either
way: a known identity with other pixels is encoded afresh (counted as `changed`, flagged),
never served stale. Bound: `max_frames` entries (least recently used go first); with
identities, frames older than this cycle's oldest (or newer than its newest: another drive)
leave at once. A drive cycle sees each camera at t - 0.5 s and t, so half its frames were the
t frames of the cycle 5 steps before: 4 cameras x 6 live times = 24 entries cover a drive.

Prefill (streaming). A frame_local target's image block (<|vision_start|> .. <|vision_end|>)
attends to itself alone (models/layers.py frame_local_mask), so its per-layer K before rope and
its V are a function of the frame's pixels alone, wherever the block sits. `stream_blocks` keeps
them in the frame's VisionCache entry (same key, digest check, bound and eviction as its vision
features, so a changed frame loses both), computes the blocks of this cycle's new frames in one
backend call, and the backend's prefill rotates the kept keys to this cycle's rows and prefills
only the rows outside the images. The reasoning equals a full prefill's; the cache rows agree
to float rounding (the same sums in another order).

Lookup. `Lookup` remembers the last cycles' reasoning (from <|cot_start|> through
<|cot_end|>) and, when the tail of the tokens accepted so far (the pending one included)
matches a stretch of it (the longest tail of at least `lookup_ngram` tokens, the most recent
cycle first), proposes what followed (prompt-lookup decoding). The target verifies the
proposal like any draft, so greedy output is plain decoding's; for sampling it is a point-mass
draft q = onehot(x): accept with prob min(1, p(x)/q(x)) = p(x), residual norm(max(p - q, 0))
= p without x (runtime/acceptance.py accept_sampling, unchanged).
"""
from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runtime.cycle import InputError

MAX_NGRAM = 8


def digest(image: np.ndarray) -> bytes:
    """blake2b-128 of one frame's shape and every pixel (~1 GB/s: a 64x96 frame in ~20 us)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(image.shape).encode())
    h.update(np.ascontiguousarray(image).data)
    return h.digest()


def frame_keys(frames, cfg) -> list | None:
    """plan()'s `frames` -> [(camera, time_us)] camera-major, or None (key by content).

    Accepts (cameras, frames) nested sequences of (camera, time_s) pairs, or a mapping
    {camera: (frames,) times in s}; InputError names what is wrong and what is allowed."""
    if frames is None:
        return None
    if isinstance(frames, Mapping):
        missing = [c for c in cfg.cameras if c not in frames]
        if missing or set(frames) - set(cfg.cameras):
            raise InputError(f"frames: cameras {sorted(frames)}; the planner needs exactly {list(cfg.cameras)}")
        frames = [[(c, t) for t in _seq(frames[c], c)] for c in cfg.cameras]
    rows = _seq(frames, "frames")
    if len(rows) != len(cfg.cameras):
        raise InputError(f"frames: {len(rows)} cameras, expected {len(cfg.cameras)} ({list(cfg.cameras)}) "
                         f"x {cfg.frames} (camera, time_s) pairs")
    keys = []
    for cam, row in zip(cfg.cameras, rows):
        row = _seq(row, cam)
        if len(row) != cfg.frames:
            raise InputError(f"frames[{cam!r}]: {len(row)} entries, expected {cfg.frames} (camera, time_s) pairs")
        for pair in row:
            keys.append(_key(cam, pair))
    return keys


def _seq(x, what) -> list:
    if isinstance(x, (str, bytes)) or not hasattr(x, "__len__"):
        raise InputError(f"frames: {what!r} must be a sequence, got {type(x).__name__}")
    return list(x)


def _key(cam: str, pair) -> tuple:
    try:
        name, t = pair
        t = float(t)
    except (TypeError, ValueError):
        raise InputError(f"frames[{cam!r}]: {pair!r} is not a (camera, time_s) pair") from None
    if name != cam:
        raise InputError(f"frames: camera {name!r} where {cam!r} is (cameras in the order {cam!r} ... of the config)")
    if not math.isfinite(t):
        raise InputError(f"frames[{cam!r}]: time {t!r} s is not finite")
    return (cam, round(t * 1e6))


@dataclass
class Frame:
    """One cached frame: its content digest, the backend's vision features, and (streaming
    prefill) the backend's image-block K/V once computed."""
    digest: bytes
    features: object
    blocks: object = None


class VisionCache:
    """Per-frame vision features of the last frames (module docstring): `encode` is the vision
    stage of a cycle with reuse.vision on; `frames` is that cycle's entries, camera-major."""

    def __init__(self, max_frames: int):
        self.max_frames = int(max_frames)
        self.entries: OrderedDict = OrderedDict()     # key -> Frame
        self.frames: list = []

    def clear(self) -> None:
        self.entries.clear()
        self.frames = []

    def encode(self, backend, images: np.ndarray, keys: list | None) -> dict:
        """Give the backend this cycle's features (camera-major), encoding only the frames not
        held -> {"reused", "encoded", "changed"} counts of the cycle."""
        flat = np.asarray(images).reshape(-1, *images.shape[-3:])
        digests = [digest(f) for f in flat]
        keys = keys if keys is not None else digests
        frames, todo, changed = [None] * len(flat), [], 0
        for i, (key, d) in enumerate(zip(keys, digests)):
            hit = self.entries.get(key)
            if hit is not None and hit.digest == d:
                frames[i] = hit
                self.entries.move_to_end(key)
            else:
                changed += hit is not None      # a known identity with other pixels: encoded afresh
                todo.append(i)
        try:
            if todo:
                for i, f in zip(todo, backend.vision_frames(flat[todo])):
                    frames[i] = Frame(digests[i], f)
                    self.entries[keys[i]] = frames[i]
                    self.entries.move_to_end(keys[i])
            self.frames = frames
            backend.use_vision([f.features for f in frames])
        finally:                 # a failed call leaves the cache within max_frames too
            self._evict(keys if keys is not digests else None)
        return {"reused": len(flat) - len(todo), "encoded": len(todo), "changed": changed}

    def _evict(self, keys: list | None) -> None:
        if keys is not None:     # identities: what is outside this cycle's time span is gone
            lo, hi = min(t for _, t in keys), max(t for _, t in keys)
            for key in [k for k in self.entries if not isinstance(k, tuple) or not lo <= k[1] <= hi]:
                del self.entries[key]
        while len(self.entries) > self.max_frames:
            self.entries.popitem(last=False)


def stream_blocks(backend, frames: list, inputs) -> tuple[list, dict]:
    """This cycle's image-block K/V (one per frame, prompt order), computing the new frames'
    blocks in one backend call and keeping them in their Frame -> (blocks, counts)."""
    todo = [i for i, f in enumerate(frames) if f.blocks is None]
    if todo:
        ids, positions = block_layout(inputs)
        for i, b in zip(todo, backend.image_blocks([frames[i].features for i in todo], ids, positions)):
            frames[i].blocks = b
    return [f.blocks for f in frames], {"reused": len(frames) - len(todo), "computed": len(todo)}


def block_layout(inputs) -> tuple[np.ndarray, np.ndarray]:
    """The one image block of a prompt whose images are all of one size: its ids (L,) and its
    M-RoPE positions (3, L) counted from its <|vision_start|> (0 on every axis)."""
    spans = list(inputs.image_spans)
    if not spans or len({n for _, n in spans}) != 1:
        raise ValueError(f"streaming prefill needs images of one size; image spans {spans}")
    s, n = spans[0]
    pos = np.asarray(inputs.positions)[:, s - 1:s + n + 1]
    return np.asarray(inputs.ids[s - 1:s + n + 1], np.int64), pos - pos[:, :1]


class Lookup:
    """The last `cycles` reasoning texts and the prompt-lookup proposal (module docstring).

    Each text is indexed when remembered: for every length n in ngram..MAX_NGRAM, {n tokens:
    the first place they start with a token after them}. A search is then at most
    (MAX_NGRAM - ngram + 1) x cycles dictionary reads, whatever the texts hold: at the largest
    settings (64 texts of 4,096 tokens) tens of microseconds per step, where scanning the texts
    took up to ~200 ms. The decode loop measures each search and the budget prices it
    (runtime/budget.py CostModel "lookup")."""

    def __init__(self, cycles: int, ngram: int):
        self.texts: deque = deque(maxlen=int(cycles))
        self.index: deque = deque(maxlen=int(cycles))    # per text: {n: {n-gram: first start}}
        self.ngram = int(ngram)

    def clear(self) -> None:
        self.texts.clear()
        self.index.clear()

    def remember(self, tokens) -> None:
        """One cycle's accepted reasoning, <|cot_start|> first."""
        text = [int(t) for t in tokens]
        index = {}
        for n in range(self.ngram, MAX_NGRAM + 1):
            starts = len(text) - n                # a token must follow the match
            grams = list(zip(*(text[j:j + starts] for j in range(n)))) if starts > 0 else []
            index[n] = dict(zip(reversed(grams), range(starts - 1, -1, -1)))   # the first start wins
        self.texts.append(text)
        self.index.append(index)

    def propose(self, context, k: int) -> np.ndarray:
        """Up to k tokens that followed the longest matching tail of `context` (the accepted
        tokens from <|cot_start|> on), most recent text first; empty when nothing matches."""
        context = list(context)
        for n in range(min(MAX_NGRAM, len(context)), self.ngram - 1, -1):
            tail = tuple(context[-n:])
            for text, index in zip(reversed(self.texts), reversed(self.index)):
                i = index[n].get(tail)
                if i is not None:
                    return np.asarray(text[i + n:i + n + k], np.int64)
        return np.zeros(0, np.int64)


class CycleLookup:
    """One cycle's view of a Lookup: the context is the sequence from row `start` on."""

    def __init__(self, lookup: Lookup, start: int):
        self.lookup, self.start = lookup, int(start)

    def propose(self, seq: list, k: int) -> np.ndarray:
        return self.lookup.propose(seq[self.start:], k) if k > 0 else np.zeros(0, np.int64)
