"""The backend interface: one object owns target, draft and action expert on one engine.

The loop (runtime/loop.py) drives every backend through these calls with small host arrays
(token ids, cache indices, a vocabulary mask); logits, hidden states and KV caches stay inside.

Cache contract. Each model has a preallocated KV cache written by index. The loop owns the
lengths: a call that feeds tokens at `start` writes rows start..start+n-1 and attends to rows
[0, start+n). Rolling back after a rejection is passing a smaller `start` next time; rows past
it are stale, never erased, and overwritten later.

    vision(images)                  encode the camera images, keep the embeddings
    vision_frames(images)           encode (n, H, W, 3) frames -> n per-frame features (reuse)
    use_vision(features)            keep one cycle's per-frame features (camera-major) for prefill
    prefill(inputs, readout)        write the prompt into target (and draft) caches; row T-1
    image_blocks(features, ids, positions)   frame_local targets: the image blocks of n frames
                                    on their own, in one call -> n opaque per-frame K/V
    prefill_streamed(inputs, readout, blocks)  prefill with every image block given (rotated to
                                    its rows here): only the rows outside the images are run
    set_mask(allowed, first)        tokens allowed from now on (masked logits -> -inf); a
                                    (P, V) mask is periodic: sequence index i uses row
                                    (i - first) % P (x / y trajectory bins alternate)
    draft(tokens, start, k, sampling)  feed `tokens` to the draft at `start`, then chain k
                                    tokens -> (k,) ids, and the (k, V) probabilities they were
                                    sampled from when `sampling` is given (else None: argmax)
    verify(tokens, start, readout)  one target pass over `tokens` at `start`: one row each
    draft_tree(tokens, start, shape)   feed `tokens` to the draft at `start`, then draft a token
                                    tree (runtime/tree.py, EAGLE-2 style) -> Tree
    verify_tree(tokens, start, readout, offsets, mask)  one target pass over pending tokens and
                                    a tree's nodes at rows start.., positions start + offsets,
                                    (w, w) tree mask: one row each (backends with takes_trees)
    keep_rows(start, rows, draft_start, draft_rows)  move the accepted nodes' cache rows to
                                    start.. (target) and draft_start.. (draft): contiguous again
    action(tokens, start, v0, seed) write `tokens` at `start`, run the action expert on the
                                    target cache [0, start+len(tokens)) -> (64, 3) waypoints

`readout` is "argmax" ((n,) int64 of the masked logits) or "logits" ((n, V) fp32, masked
entries -inf): the few integers or probabilities the acceptance rule needs.

Backends are modules of runtime/backends/ and are loaded by name, so the engine library
(torch, onnxruntime, tensorrt, tensorrt_llm) is imported only when that backend is chosen.
Every module has one `create(spec: BackendSpec)`. The host logic every backend needs (the
cache row check, the tokenizer check, the draft's sampling, the readout) is written once here.
"""
from __future__ import annotations

import abc
import contextlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.artifacts import EnginesMeta, Manifest
from core.config import ConfigError
from runtime.acceptance import process_logits, sample
from runtime.config import ExpertRequest

READOUTS = ("argmax", "logits")
# CLI name -> module of runtime.backends
BACKENDS = {"torch": "torch", "onnxruntime": "onnxruntime", "tensorrt": "tensorrt",
            "tensorrt-llm": "tensorrt_llm"}


@dataclass
class BackendSpec:
    """What a backend is made from: `create(spec)` of every backend module reads the fields it
    needs. An engines folder (its meta.json and, for built engines, manifest.json), or
    checkpoints {kind: folder}, or a preset of random weights (seeded)."""
    tokenizer: object
    max_len: int | None = None          # cache rows (None: what the engines were exported for)
    device: str = "cpu"
    eager: bool = False                 # no CUDA graphs
    engines: Path | None = None
    meta: EnginesMeta | None = None     # engines/meta.json
    manifest: Manifest | None = None    # engines/manifest.json (tensorrt, tensorrt-llm)
    k_max: int | None = None            # the planner's largest draft length (engine shapes)
    threads: int = 0                    # engine CPU threads (onnxruntime; 0: its default)
    checkpoints: dict | None = None     # {kind: folder} (torch)
    preset: str | None = None           # random weights of configs/models/NAME.yaml (torch)
    seed: int | None = None             # of the random weights (None: 0)
    draft: str | None = None            # None (the checkpoint's), "self", "none" or a folder
    draft_noise: float = 0.0            # "self" drafts with noised weights (bench reference)
    static: bool = False                # torch: the static-cache forward
    kv_buckets: bool | None = None      # torch: attention over a kv-length bucket (None: on CUDA)


@dataclass(frozen=True)
class DraftSampling:
    """How the draft samples its k proposals: q_j = process_logits(masked logits_j, temperature,
    top_p), proposal j = sample(q_j, u[j]), u (k,) uniforms the acceptance rule drew first."""
    temperature: float
    top_p: float
    u: np.ndarray


def check_tokenizer(meta: EnginesMeta, tokenizer, folder) -> None:
    """An engines folder's meta.json names the tokenizer its graphs were made with."""
    if meta.tokenizer_sha256 not in (None, tokenizer.fingerprint):
        raise ConfigError(f"{folder}/tokenizer.json (sha256 {tokenizer.fingerprint[:12]}...) is not "
                          f"the tokenizer these engines were made with "
                          f"(sha256 {str(meta.tokenizer_sha256)[:12]}...)")


@dataclass(frozen=True)
class GreedyOutcome:
    """What a device-resident greedy step brings back to the host, in one copy: the k proposals,
    how many were accepted, the target's token after them; and its calls' times (ms: CUDA events
    read after that copy, or the host clock where the device is the host)."""
    draft: np.ndarray
    accepted: int
    bonus: int
    draft_ms: float
    verify_ms: float


@dataclass
class PrefillInputs:
    ids: np.ndarray                 # (T,) int64 prompt ids, ending with <|cot_start|>
    positions: np.ndarray           # (3, T) int64 target M-RoPE ids (t, h, w rows)
    rope_delta: int                 # decode token at cache row i has M-RoPE position i + delta
    image_spans: list = field(default_factory=list)   # [(start, n_tokens)] in prompt order


class Backend(abc.ABC):
    """Target + draft + action expert on one engine. See the module docstring for the calls."""

    name = "abstract"
    # exact_only: acceptance happens inside the engine (TensorRT-LLM external-draft mode);
    # `verify` then knows only the target's choices up to the first mismatch, so only the
    # greedy exact rule can be driven. The loop refuses other rules with a ConfigError.
    exact_only = False
    # draft_keeps_proposals: the draft's cache rows of its own accepted proposals stay valid.
    # False for EAGLE-style drafts, whose accepted rows are re-fed with the target's features
    # (the loop then rolls the draft back to the rows it was fed from the accepted sequence).
    draft_keeps_proposals = True
    # concurrent_action: two action() calls (the fallback beside the final trajectory) may run
    # at once without slowing each other much (a GPU side stream). False on a CPU: the planner
    # then never runs two expert batches at once.
    concurrent_action = False
    fused = False                   # the draft reads the target's features (EAGLE-style)
    # reuses_vision: vision_frames / use_vision exist (PlannerConfig.reuse.vision, runtime/reuse.py)
    reuses_vision = False
    # image_attention: the target's image layout (models LLMConfig.image_attention); streams_prefill:
    # image_blocks / prefill_streamed exist (PlannerConfig.reuse.prefill, a frame_local target)
    image_attention = "causal"
    streams_prefill = False
    stream_mismatch = None          # why streaming here would not be a full prefill's (str), or None
    approximates_prefill = False    # prefill_approximate exists (reuse.approximate_prefill, a causal target)
    readouts = READOUTS             # what `read` can give (an exact-only engine: ids alone)
    # takes_trees: draft_tree / verify_tree / keep_rows exist (token trees, runtime/tree.py);
    # tree_width: the widest verify pass a tree may use (None: the cache's rows)
    takes_trees = False
    tree_width: int | None = None
    # device_greedy: greedy_step exists: a greedy chain or lookup step runs on the device (drafted
    # tokens, the target's arg-max and the accepted length never leave it; one copy back a step)
    device_greedy = False
    vocab_size: int
    max_len: int                    # cache capacity in tokens

    @abc.abstractmethod
    def vision_grid(self, image_shape: tuple) -> tuple[np.ndarray, int]:
        """(cams, frames, H, W, 3) -> (grid_thw (n_images, 3) in prompt order, spatial merge)."""

    @abc.abstractmethod
    def vision(self, images: np.ndarray) -> None:
        """Encode uint8 images (cams, frames, H, W, 3); keep the embeddings for prefill."""

    @abc.abstractmethod
    def prefill(self, inputs: PrefillInputs, readout: str) -> np.ndarray:
        """Write the prompt into the caches; return the readout of the last row, shape (1,...)."""

    @abc.abstractmethod
    def draft(self, tokens: np.ndarray, start: int, k: int,
              sampling: DraftSampling | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Feed `tokens` (>= 1) at draft row `start`, then chain k tokens -> ((k,) int64, q):
        q (k, V) fp32 the probabilities each was sampled from (`sampling`), None for the masked
        argmax (greedy: chosen on the device, only the ids come back)."""

    @abc.abstractmethod
    def verify(self, tokens: np.ndarray, start: int, readout: str) -> np.ndarray:
        """One target pass over `tokens` at target row `start` -> readout per token."""

    @abc.abstractmethod
    def write(self, tokens: np.ndarray, start: int) -> None:
        """One target pass over `tokens` (>= 1, rows already checked) at `start` that only writes
        their cache rows (and features): the rows the action expert then reads."""

    @abc.abstractmethod
    def expert(self, rows: int, v0: float, seed: int, request: ExpertRequest) -> np.ndarray:
        """The action expert on target cache rows [0, rows) -> (64, 3) float32 (see `action`)."""

    def close(self) -> None:
        """Release engine resources (streams, graphs, sessions)."""

    def warm_expert(self, request: ExpertRequest) -> None:
        """Get ready for `expert` calls of `request` (a planner calls it once, when it is made): a
        backend that captures the expert's graphs captures them now, never inside a cycle."""

    def raw_costs(self, widths, ks) -> dict | None:
        """Each call kind's floor: {"verify": {width: ms}, "draft": {k: ms}} of calls back to back
        with no loop around them (the bench's in-loop times are set beside it); None: not measured
        on this backend."""
        return None

    @property
    def host_reads(self) -> int | None:
        """Device-to-host reads so far (each a host sync on a GPU), where the backend counts them."""
        return None

    def greedy_step(self, tokens, start: int, draft_tokens, draft_start: int, k: int, proposal, clock):
        """One exact greedy step on the device (backends with device_greedy): feed `draft_tokens`
        at `draft_start` and chain k proposals (or take `proposal`, (k,) host ids), verify `tokens`
        (pending) + the proposals at `start`, accept on the device -> GreedyOutcome. The loop's
        host path (draft, verify, runtime.acceptance.accept_greedy) gives the same tokens."""
        raise ConfigError(f"backend {self.name!r} has no device-resident greedy step")

    def vision_frames(self, images: np.ndarray) -> list:
        """Encode uint8 frames (n, H, W, 3), each on its own -> n opaque per-frame features, the
        rows vision() would give those frames (images are encoded independently)."""
        raise ConfigError(f"backend {self.name!r} cannot encode frames one by one: turn reuse.vision off")

    def use_vision(self, frames: list) -> None:
        """Keep the features of one cycle's images (vision_frames' values, camera-major) for prefill,
        as vision(images) would."""
        raise ConfigError(f"backend {self.name!r} cannot take reused vision features: turn reuse.vision off")

    def image_blocks(self, frames: list, ids: np.ndarray, positions: np.ndarray) -> list:
        """The image blocks of n frames (their vision_frames features) computed on their own, in
        one call: ids (L,) one block's tokens, positions (3, L) its M-RoPE ids from its
        <|vision_start|> -> n opaque per-frame K (before rope), V [and fused-draft features]."""
        raise ConfigError(f"backend {self.name!r} cannot stream the prefill: turn reuse.prefill off")

    def prefill_streamed(self, inputs: PrefillInputs, readout: str, blocks: list) -> np.ndarray:
        """prefill() of a frame_local target with every image block's K/V given (image_blocks'
        values, prompt order): the kept keys are rotated to this prompt's rows, and only the
        rows before the first and after the last image are run. Same readout as prefill."""
        raise ConfigError(f"backend {self.name!r} cannot stream the prefill: turn reuse.prefill off")

    def draft_tree(self, tokens: np.ndarray, start: int, shape):
        """Feed `tokens` at draft row `start`, then draft a tree of `shape` (runtime.tree.TreeShape)
        -> runtime.tree.Tree (greedy: the draft's top-K by cumulative log-probability)."""
        raise ConfigError(f"backend {self.name!r} cannot draft token trees: use a chain (no spec.tree)")

    def verify_tree(self, tokens: np.ndarray, start: int, readout: str, offsets: np.ndarray,
                    mask: np.ndarray) -> np.ndarray:
        """One target pass over `tokens` (pending tokens, then a tree's nodes) at rows start..,
        token i at position start + offsets[i] (+ the rope delta), seeing the prefix and the rows j
        of this call with mask[i, j] (runtime.tree.layout) -> the readout of every row."""
        raise ConfigError(f"backend {self.name!r} cannot verify token trees: use a chain (no spec.tree)")

    def keep_rows(self, start: int, rows: np.ndarray, draft_start: int, draft_rows: np.ndarray) -> None:
        """Move target cache rows `rows` (and their features) to start, start+1, .. and draft cache
        rows `draft_rows` to draft_start, ..: the accepted path of a tree, contiguous again."""
        raise ConfigError(f"backend {self.name!r} cannot verify token trees: use a chain (no spec.tree)")

    # --- host logic shared by every backend --------------------------------------------------
    def action(self, tokens: np.ndarray, start: int, v0: float, seed: int,
               request: ExpertRequest = ExpertRequest()) -> np.ndarray:
        """Write `tokens` at `start`, run the expert on rows [0, start+len) -> (64, 3) float32, as
        `request` asks (draws, how they are combined, Euler steps: runtime.config.ExpertRequest).
        Thread-safe against draft/verify calls that write rows >= start+len (the fallback
        trajectory runs in a worker beside the reasoning; `action_scope` puts it on its own
        stream where the engine has one)."""
        tokens = np.asarray(tokens, np.int64)
        self.check_rows(start, len(tokens))
        with self.action_scope():
            if len(tokens):
                self.write(tokens, start)
            return self.expert(start + len(tokens), float(v0), int(seed), request)

    def action_scope(self):
        """The context an action() call runs in (a side stream; none by default)."""
        return contextlib.nullcontext()

    def set_mask(self, allowed: np.ndarray | None, first: int = 0) -> None:
        """(V,) or (P, V) bool of the tokens that may be chosen (None = all), kept as `allowed`
        (P, V): the token at sequence index i uses row (i - first) % P (see `allowed_rows`)."""
        self.allowed, self.mask_first = periodic_mask(allowed, self.vocab_size), int(first)

    def mask_index(self, index0: int, n: int) -> np.ndarray:
        """(n,) rows of `allowed` for the tokens chosen at sequence indices index0 .. index0+n-1."""
        return mask_rows(self.mask_first, index0, n, len(self.allowed))

    def allowed_rows(self, index0: int, n: int) -> np.ndarray:
        """(n, V) bool mask rows of the tokens chosen at sequence indices index0 .. index0+n-1."""
        return self.allowed[self.mask_index(index0, n)]

    def read(self, readout: str, ids, logits) -> np.ndarray:
        """The readout switch: "argmax" -> ids() (n,) int64, "logits" -> logits() (n, V) fp32
        (masked entries -inf). Callables, so only what the rule asks for leaves the engine."""
        self.check_readout(readout)
        return np.asarray(ids(), np.int64) if readout == "argmax" else np.asarray(logits(), np.float32)

    def check_readout(self, readout: str) -> None:
        if readout not in self.readouts:
            ids_only = f" (the {self.name} backend returns token ids only)" if self.readouts == ("argmax",) else ""
            raise ConfigError(f"readout={readout!r} is not allowed; choose one of {list(self.readouts)}{ids_only}")

    def check_rows(self, start: int, n: int) -> None:
        """Rows [start, start+n) must lie in the cache [0, max_len)."""
        if start < 0 or start + n > self.max_len:
            raise ValueError(f"{self.name} backend: rows [{start}, {start + n}) outside the cache "
                             f"[0, {self.max_len})")

    def feed_features(self, start: int, n: int):
        """(1, n, F) target features of rows start-1 .. start+n-2 for n tokens fed to a fused draft
        at `start` (draft row j reads target row j-1; row -1 is zeros), from `self.feats`
        (max_len, F) (a numpy array or a torch tensor); None when the draft is not fused."""
        if not self.fused:
            return None
        if start > 0:                       # the usual case: a view, no copy
            return self.feats[start - 1:start + n - 1][None]
        f = self.feats[[0] + list(range(n - 1))]     # a copy: row -1 (zeros) then rows 0..n-2
        f[0] = 0
        return f[None]

    @staticmethod
    def draw(logits: np.ndarray, sampling: DraftSampling, j: int) -> tuple[int, np.ndarray]:
        """Proposal j of a sampled draft from its masked fp32 logits (V,) -> (id, q (V,))."""
        q = process_logits(logits, sampling.temperature, sampling.top_p)
        return sample(q, float(sampling.u[j])), q


def image_rows(inputs: PrefillInputs) -> tuple[int, int]:
    """[first, end) prompt rows of the image blocks, which must follow one another with nothing
    between them (prefill_streamed runs the rows before `first` and from `end` on)."""
    spans = list(inputs.image_spans)
    if not spans:
        raise ValueError("streaming prefill: the prompt has no images")
    for (s, n), (s2, _) in zip(spans, spans[1:]):
        if s2 != s + n + 2:
            raise ValueError(f"streaming prefill needs the image blocks back to back; spans {spans}")
    return spans[0][0] - 1, spans[-1][0] + spans[-1][1] + 1


def load_backend(name: str, spec: BackendSpec | None = None, **fields) -> Backend:
    """Import runtime.backends.<module> only now, and build its backend from `spec` (or from
    BackendSpec(**fields))."""
    spec = spec if spec is not None else BackendSpec(**fields)
    if name not in BACKENDS:
        raise ConfigError(f"backend {name!r} is not known; choose one of {sorted(BACKENDS)}")
    module_name = f"runtime.backends.{BACKENDS[name]}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise ConfigError(f"backend {name!r} is not implemented in this build "
                              f"(no module {module_name})") from None
        raise ConfigError(f"backend {name!r} needs the package {e.name!r}, which is not "
                          "installed") from None
    if spec.meta is not None and spec.tokenizer is not None:
        check_tokenizer(spec.meta, spec.tokenizer, spec.engines)
    return module.create(spec)


def periodic_mask(allowed, vocab_size: int) -> np.ndarray:
    """None, (V,) or (P, V) bool -> (P, V) bool."""
    if allowed is None:
        return np.ones((1, vocab_size), bool)
    allowed = np.asarray(allowed, bool)
    allowed = allowed[None] if allowed.ndim == 1 else allowed
    if allowed.ndim != 2 or allowed.shape[1] != vocab_size or not allowed.any(axis=1).all():
        raise ConfigError(f"mask shape {allowed.shape}: expected (V,) or (P, V) with V={vocab_size} "
                          "and at least one allowed token per row")
    return allowed


def mask_rows(first: int, index0: int, n: int, period: int) -> np.ndarray:
    """(n,) mask rows of the tokens at sequence indices index0 .. index0+n-1."""
    return (index0 + np.arange(n) - first) % period


def expert_noise(seed: int, samples: int, n_waypoints: int, action_dim: int) -> np.ndarray:
    """(samples, W, A) float32: the action expert's starting noise of a cycle, drawn on the host
    from its seed by numpy, the same for every backend (torch, onnxruntime, tensorrt), so the
    same seed gives the same waypoints on each (within float tolerance)."""
    rng = np.random.default_rng(int(seed))
    return rng.standard_normal((samples, n_waypoints, action_dim)).astype(np.float32)
