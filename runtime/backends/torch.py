"""The PyTorch reference backend: models/ on CPU, or CUDA with static buffers and CUDA graphs.

It owns the target, the draft and the action expert together, so the target's hidden states
reach the draft without a host copy. Buffers (device, preallocated, written by index):
    cache        target KV   (layers, 2, 1, kv_heads, max_len, head_dim)
    draft_cache  draft KV    (draft layers, 2, 1, kv_heads, max_len, head_dim)
    feats        (max_len, 3D) the target's low/mid/top hidden states per row (fused draft)

Drafts: "routine" (models.draft.Draft, FlatRoPE; EAGLE alignment: row j holds token j and the
target feature of row j-1; chained proposals carry the draft's own hidden state, and the
accepted ones are re-fed with the target's features next step), "self" (the target, or a
noised copy, drafting for itself with its own cache: the branch tests' tau = k + 1), "none".
Every call runs the models' own forward (Target.forward, Draft.forward: one cache contract,
rows written by index, attention over the static cache under a mask). On CUDA with eager=False
every verify width, draft feed width (1..k_max+1) and the draft chain's step is captured as a
CUDA graph of that forward when the backend is made (never inside a cycle), with `start` a
device tensor; static=True runs the same on CPU (what the tests compare with
eager). kv_buckets (default: on CUDA): calls over the cache read their kv_bucket(start + width)
rows through the models' inference path, graphs per (width, bucket) (docs/architecture.md).
This module holds only what is backend-specific: buffers, streams and graphs. The
fallback expert runs on its own stream. Beside it: torch_trees.py (token trees), torch_graphs.py
(the static runner and its CUDA graphs), torch_step.py (the greedy step on the device).
"""
from __future__ import annotations

import contextlib
import copy

import numpy as np
import torch

from models import io
from models.action_expert import ActionExpert
from models.config import ModelConfig, load_preset
from models.draft import shift_features
from models.layers import fuse_projections, kv_bucket
from models.rope import apply_rope
from models.target import Target, write_image_blocks
from core.config import ConfigError
from core.graphs import SHAPES
from prompt.pixels import images_to_patches
from runtime.backend import Backend, BackendSpec, PrefillInputs, expert_noise, image_rows
from runtime.backends.torch_graphs import StaticRunner
from runtime.backends.torch_step import DeviceStep, HostLink, raw_costs
from runtime.backends.torch_trees import TorchTrees
from runtime.config import K_MAX_LIMIT

DRAFT_KINDS = ("routine", "self", "none")
DEFAULT_MAX_LEN = SHAPES.max_len


class TorchBackend(TorchTrees, Backend):
    name = "torch"
    reuses_vision = True
    streams_prefill = True
    approximates_prefill = True
    takes_trees = True
    device_greedy = True

    def __init__(self, cfg: ModelConfig, target: Target, expert: ActionExpert, draft=None,
                 draft_kind: str = "routine", device: str = "cpu", max_len: int = DEFAULT_MAX_LEN,
                 eager: bool = True, static: bool = False, k_max: int | None = None,
                 kv_buckets: bool | None = None):
        if draft_kind not in DRAFT_KINDS:
            raise ConfigError(f"draft kind {draft_kind!r} is not known; choose one of {list(DRAFT_KINDS)}")
        self.cfg, self.device = cfg, torch.device(device)
        self.target, self.expert_model, self.draft_model, self.draft_kind = target, expert, draft, draft_kind
        for m in (target, expert, draft):
            if m is not None:
                m.to(self.device).eval()
        llm = cfg.target.llm
        self.vocab_size, self.max_len = llm.vocab_size, int(max_len)
        self.image_attention = llm.image_attention
        self.kv_buckets = self.device.type == "cuda" if kv_buckets is None else bool(kv_buckets)
        if self.kv_buckets:
            for m in (target, draft):
                if m is not None:
                    fuse_projections(m)
        self.fused = draft_kind == "routine" and cfg.draft.features == "fused"
        self.feature_layers = tuple(cfg.draft.feature_layers) if self.fused else ()
        # routine fused drafts re-feed accepted proposals with the target's features
        self.draft_keeps_proposals = not self.fused
        self.cache = target.new_cache(1, self.max_len)
        self.draft_cache = None if draft is None else draft.new_cache(1, self.max_len)
        self.feats = torch.zeros(self.max_len, 3 * llm.hidden if self.fused else 1, device=self.device)
        self.link = HostLink(self.device, 128)       # every device-to-host read goes through it
        self.set_mask(None)
        self.delta, self.images = 0, None
        self.device_step = DeviceStep(self, k_max or K_MAX_LIMIT)
        self.graphs = None
        if static or (self.device.type == "cuda" and not eager):
            self.graphs = StaticRunner(self, capture=self.device.type == "cuda" and not eager)
            self.graphs.warm((k_max or K_MAX_LIMIT) + 1)
        self.side_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.concurrent_action = self.side_stream is not None    # the fallback on its own stream

    # --- vision and prefill ------------------------------------------------------------------
    def vision_grid(self, image_shape: tuple) -> tuple[np.ndarray, int]:
        v = self.cfg.target.vision
        cams, frames, h, w, _ = image_shape
        side = v.patch * v.merge
        if h % side or w % side:
            raise ConfigError(f"image size {h}x{w} must be a multiple of patch*merge={side}")
        return np.tile(np.array([[1, h // v.patch, w // v.patch]], np.int64), (cams * frames, 1)), v.merge

    @torch.no_grad()
    def vision(self, images: np.ndarray) -> None:
        v = self.cfg.target.vision
        imgs = np.asarray(images).reshape(-1, *images.shape[-3:])   # camera-major, as training
        patches, grid = images_to_patches(imgs, v.patch, v.temporal_patch, v.merge)
        self.images = self.target.encode_images(torch.from_numpy(patches).to(self.device), grid)

    @torch.no_grad()
    def vision_frames(self, images: np.ndarray) -> list:
        """(embeds (n, D), [deepstack (n, D)]) per frame: one batch, cut per image (copies, so a
        cached frame holds only its own rows)."""
        if not len(images):
            return []
        v = self.cfg.target.vision
        patches, grid = images_to_patches(np.asarray(images), v.patch, v.temporal_patch, v.merge)
        embeds, deep = self.target.encode_images(torch.from_numpy(patches).to(self.device), grid)
        n = embeds.shape[0] // len(images)
        return [(embeds[i * n:(i + 1) * n].clone(), [d[i * n:(i + 1) * n].clone() for d in deep])
                for i in range(len(images))]

    def use_vision(self, frames: list) -> None:
        deep = [torch.cat([f[1][j] for f in frames]) for j in range(len(frames[0][1]))]
        self.images = (torch.cat([f[0] for f in frames]), deep)

    @torch.no_grad()
    def prefill(self, inputs: PrefillInputs, readout: str) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(inputs.ids), device=self.device)[None]
        self.check_rows(0, ids.shape[1])
        self.delta = int(inputs.rope_delta)
        if inputs.image_spans and self.images is None:
            raise ValueError("torch backend: a prompt with images needs vision(images) first")
        embeds, deep = self.images if inputs.image_spans else (None, None)
        if embeds is not None:   # counted on the host: the forward reads nothing back
            check_image_tokens(inputs.ids, self.cfg.target.image_token_id, embeds.shape[0])
        pos = torch.as_tensor(np.asarray(inputs.positions), device=self.device)[:, None]   # (3, 1, T)
        cos, sin = self.target.rope(pos)
        logits, hid = self.target(ids, cos, sin, self.cache, 0, embeds, deep, self.feature_layers,
                                  kv_len=self.kv(0, ids.shape[1]))
        if self.fused:
            self.feats[:ids.shape[1]] = torch.cat(hid, -1)[0]
        self._draft_prefill(ids, pos, embeds, deep)
        return self._read(logits[0, -1:], readout, ids.shape[1])

    def _draft_prefill(self, ids, pos, embeds, deep) -> None:
        """The draft's prompt rows (after the target's: a fused draft reads its features)."""
        kv = self.kv(0, ids.shape[1])
        if self.draft_kind == "self":
            self.draft_model(ids, *self.target.rope(pos), self.draft_cache, 0, embeds, deep, kv_len=kv)
        elif self.draft_kind == "routine":
            f = shift_features(self.feats[None, :ids.shape[1]]) if self.fused else None
            self.draft_model(ids, *self._draft_rope(0, ids.shape[1], pos), self.draft_cache, 0, f, embeds, kv_len=kv)

    @torch.no_grad()
    def image_blocks(self, frames: list, ids: np.ndarray, positions: np.ndarray) -> list:
        """Per frame: ([(k before rope, v) (1, KVH, L, D) per layer], fused features (L, F) or None)."""
        n, L = len(frames), len(ids)
        embeds = torch.cat([f[0] for f in frames])
        deep = [torch.cat([f[1][j] for f in frames]) for j in range(len(frames[0][1]))]
        block_ids = torch.as_tensor(np.asarray(ids), device=self.device)[None].expand(n, L)
        pos = torch.as_tensor(np.asarray(positions), device=self.device)[:, None].expand(3, n, L)
        kv, hid = self.target.image_block_kv(block_ids, *self.target.rope(pos), embeds, deep,
                                              self.feature_layers)
        feats = torch.cat(hid, -1) if self.fused else None
        return [([(k[i:i + 1].clone(), v[i:i + 1].clone()) for k, v in kv],
                 None if feats is None else feats[i].clone()) for i in range(n)]

    @torch.no_grad()
    def prefill_streamed(self, inputs: PrefillInputs, readout: str, blocks: list) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(inputs.ids), device=self.device)[None]
        T = ids.shape[1]
        self.check_rows(0, T)
        first, end = image_rows(inputs)
        self.delta = int(inputs.rope_delta)
        pos = torch.as_tensor(np.asarray(inputs.positions), device=self.device)[:, None]   # (3, 1, T)
        cos, sin = self.target.rope(pos)
        layers = self.feature_layers
        _, hid = self.target(ids[:, :first], cos[:, :first], sin[:, :first], self.cache, 0, hidden_layers=layers,
                             kv_len=self.kv(0, first))
        kv = [(torch.cat([b[0][j][0] for b in blocks]), torch.cat([b[0][j][1] for b in blocks]))
              for j in range(len(self.cache))]
        rows = torch.arange(first, end, device=self.device)
        write_image_blocks(self.cache, kv, rows, cos[:, first:end], sin[:, first:end])
        logits, tail = self.target(ids[:, end:], cos[:, end:], sin[:, end:], self.cache, end, hidden_layers=layers,
                                   kv_len=self.kv(0, T))
        if self.fused:
            self.feats[:first] = torch.cat(hid, -1)[0]
            self.feats[first:end] = torch.cat([b[1] for b in blocks])
            self.feats[end:T] = torch.cat(tail, -1)[0]
        self._draft_prefill(ids, pos, *self.images)
        return self._read(logits[0, -1:], readout, T)

    @torch.no_grad()
    def prefill_approximate(self, inputs: PrefillInputs, readout: str, blocks: list):
        """APPROXIMATE (reuse.approximate_prefill, a causal target): blocks[i] None -> image i computed
        in place (attending to every row before it), else its kept K/V rotated to its rows. -> (the
        readout of row T-1, per image the block K/V computed now (K un-rotated) or None)."""
        ids = torch.as_tensor(np.asarray(inputs.ids), device=self.device)[None]
        T = ids.shape[1]
        self.check_rows(0, T)
        first, end = image_rows(inputs)
        self.delta = int(inputs.rope_delta)
        pos = torch.as_tensor(np.asarray(inputs.positions), device=self.device)[:, None]
        cos, sin = self.target.rope(pos)
        embeds, deep = self.images
        layers, F = self.feature_layers, self.feats
        _, hid = self.target(ids[:, :first], cos[:, :first], sin[:, :first], self.cache, 0, hidden_layers=layers,
                             kv_len=self.kv(0, first))
        if self.fused:
            F[:first] = torch.cat(hid, -1)[0]
        new, P = [], embeds.shape[0] // len(blocks)
        for i, (s, n) in enumerate(inputs.image_spans):
            a, b = s - 1, s + n + 1
            rows = torch.arange(a, b, device=self.device)
            if blocks[i] is not None:
                write_image_blocks(self.cache, blocks[i][0], rows, cos[:, a:b], sin[:, a:b])
                if self.fused:
                    F[a:b] = blocks[i][1]
                new.append(None)
                continue
            _, hid = self.target(ids[:, a:b], cos[:, a:b], sin[:, a:b], self.cache, a,
                                 embeds[i * P:(i + 1) * P], [d[i * P:(i + 1) * P] for d in deep], layers,
                                 kv_len=self.kv(0, b))
            kv = [(apply_rope(layer[0][:, :, a:b], cos[:, a:b], -sin[:, a:b]).clone(), layer[1][:, :, a:b].clone())
                  for layer in self.cache]
            f = torch.cat(hid, -1)[0].clone() if self.fused else None
            if self.fused:
                F[a:b] = f
            new.append((kv, f))
        logits, tail = self.target(ids[:, end:], cos[:, end:], sin[:, end:], self.cache, end, hidden_layers=layers,
                                   kv_len=self.kv(0, T))
        if self.fused:
            F[end:T] = torch.cat(tail, -1)[0]
        self._draft_prefill(ids, pos, embeds, deep)
        return self._read(logits[0, -1:], readout, T), new

    def set_mask(self, allowed: np.ndarray | None, first: int = 0) -> None:
        """(P, V) on the device once per phase; rows picked per token by sequence index."""
        super().set_mask(allowed, first)
        self.allowed_dev = torch.from_numpy(self.allowed).to(self.device)

    # --- draft, verify, action ---------------------------------------------------------------
    @torch.no_grad()
    def draft(self, tokens, start: int, k: int, sampling=None):
        if self.draft_kind == "none":
            raise ConfigError("this backend has no draft (--draft none): use k = 0")
        ids = torch.as_tensor(np.asarray(tokens, np.int64), device=self.device)[None]
        self.check_rows(start, ids.shape[1] + k - 1)
        out, qs, feat = [], [], self.feed_features(start, ids.shape[1])
        for i in range(k):
            logits, hidden = self.draft_step(ids, start, feat)
            masked = self._masked(logits[0, -1:], start + ids.shape[1])[0]
            if sampling is None:
                token = int(self.link.down(masked.argmax()))
            else:
                token, q = self.draw(self.link.down(masked), sampling, i)
                qs.append(q)
            out.append(token)
            start, feat = start + ids.shape[1], hidden[:, -1:] if self.fused else None
            ids = torch.full((1, 1), token, device=self.device, dtype=torch.long)
        return np.asarray(out, np.int64), (np.stack(qs) if sampling is not None else None)

    @torch.no_grad()
    def verify(self, tokens, start: int, readout: str) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(tokens, np.int64), device=self.device)[None]
        self.check_rows(start, ids.shape[1])
        logits, feats = self.target_pass(ids, start)
        if self.fused:
            self.feats[start:start + ids.shape[1]] = feats
        return self._read(logits[0], readout, start + 1)

    def target_pass(self, ids, start: int):
        """The verify forward of device ids (1, w) at `start`: the captured graph of width w, or
        as it is -> logits (1, w, V), fused features (w, 3D) or None."""
        if self.graphs is not None:
            return self.graphs.target(ids, start)
        w = ids.shape[1]
        return self.verify_forward(ids, *self._text_rope(start, w), start, self.kv(start, w))

    def raw_costs(self, widths, ks) -> dict:
        return raw_costs(self, widths, ks)

    @property
    def host_reads(self) -> int:
        return self.link.reads

    def greedy_step(self, tokens, start: int, draft_tokens, draft_start: int, k: int, proposal, clock):
        """runtime/torch_step.py: the greedy step on the device, one read back."""
        return self.device_step.step(tokens, start, draft_tokens, draft_start, k, proposal, clock)

    def warm_expert(self, request) -> None:
        if self.graphs is not None:
            self.graphs.warm_expert(request)

    @contextlib.contextmanager
    def action_scope(self):
        """No autograd; on CUDA the fallback's own stream, after the cache writes queued so far."""
        with torch.no_grad():
            if self.side_stream is None:
                yield
                return
            with torch.cuda.stream(self.side_stream):
                self.side_stream.wait_stream(torch.cuda.current_stream(self.device))
                yield

    def write(self, tokens, start: int) -> None:
        ids = torch.as_tensor(np.asarray(tokens, np.int64), device=self.device)[None]
        w = ids.shape[1]
        self.target(ids, *self._text_rope(start, w), self.cache, start, kv_len=self.kv(start, w))

    def expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        ec, r = self.expert_model.cfg, request      # the noise of every backend: numpy, on the host
        noise = torch.from_numpy(expert_noise(seed, r.samples, ec.n_waypoints, ec.action_dim)).to(self.device)
        if self.graphs is not None or self.kv_buckets:      # every draw and Euler step in one static call
            if not 1 <= rows <= self.max_len:
                raise ValueError(f"torch backend: expert over {rows} cache rows; allowed 1..max_len={self.max_len}")
            if self.graphs is not None:
                return self.link.down(self.graphs.expert(rows, v0, noise, r)[0][0].float())
            lens = torch.tensor([rows, self.delta], device=self.device)   # eagerly: the graphs' rounding
            wp, _ = self.expert_forward(self.kv(0, rows), r)(noise, torch.tensor([v0], device=self.device), lens)
            return self.link.down(wp[0].float())
        wp, _ = self.expert_model.sample(self.cache, rows, torch.tensor([v0], device=self.device), r.steps,
                                         rope_delta=self.delta, noise=noise, samples=r.samples, combine=r.combine)
        return self.link.down(wp[0].float())

    # --- the forwards StaticRunner captures (torch_graphs.py; start: an int or a (1,) device tensor)
    def verify_forward(self, ids, cos, sin, start, kv_len=None):
        """Target.forward over the cache (kv_len: its first rows only, `kv`) -> logits (1, w, V),
        fused features (w, 3D) or None."""
        logits, hid = self.target(ids, cos, sin, self.cache, start, hidden_layers=self.feature_layers, kv_len=kv_len)
        return logits, (torch.cat(hid, -1)[0] if self.fused else None)

    def feed_forward(self, ids, cos, sin, start, feat=None, tree=None, kv_len=None):
        """Draft.forward (or the target's, for a self draft) -> logits, hidden (None: self);
        `tree` (T, max_len): a token tree's mask instead of the causal one; kv_len as verify_forward's."""
        if self.draft_kind == "self":
            return self.draft_model(ids, cos, sin, self.draft_cache, start, tree=tree, kv_len=kv_len)[0], None
        return self.draft_model(ids, cos, sin, self.draft_cache, start, feat, tree=tree, kv_len=kv_len)

    def expert_forward(self, kv: int, request):
        """sample_bucketed over `kv` cache rows: (noise, v0 (1,), lens (2,): rows, rope delta) -> waypoints, actions."""
        model = self.expert_model
        steps = request.steps or model.cfg.euler_steps

        def run(noise, v0, lens):
            return model.sample_bucketed(self.cache, kv, lens[:1], v0, steps, rope_delta=lens[1:], noise=noise,
                                         samples=request.samples, combine=request.combine)
        return run

    # --- internals -----------------------------------------------------------------------------
    def kv(self, start: int, width: int) -> int | None:
        """The cache rows a call of `width` rows at `start` attends over: its kv bucket, or None
        (all max_len rows, the reference forward) with kv_buckets off."""
        return kv_bucket(start + width, self.max_len) if self.kv_buckets else None

    def buckets(self) -> list[int]:
        """The kv lengths a call may attend over: every kv bucket (kv_buckets on), or [max_len]."""
        L = self.max_len
        return sorted({kv_bucket(n, L) for n in range(1, L + 1)}) if self.kv_buckets else [L]

    def _text_rope(self, start: int, n: int):
        """cos, sin of text rows start..start+n-1: M-RoPE position row + delta on all axes."""
        pos = torch.arange(start, start + n, device=self.device)[None] + self.delta
        return self.target.rope(pos)

    def _draft_rope(self, start: int, n: int, prompt_pos=None):
        if self.draft_kind == "self" or self.cfg.draft.rope == "mrope":
            return self.target.rope(prompt_pos) if prompt_pos is not None else self._text_rope(start, n)
        return self.draft_model.rope(torch.arange(start, start + n, device=self.device)[None])

    def draft_step(self, ids, start: int, feat):
        if self.graphs is not None:
            return self.graphs.draft(ids, start, feat)
        w = ids.shape[1]
        return self.feed_forward(ids, *self._draft_rope(start, w), start, feat, kv_len=self.kv(start, w))

    def _masked(self, logits: torch.Tensor, index0: int) -> torch.Tensor:
        """logits (n, V) choosing the tokens at sequence indices index0.. -> masked fp32."""
        rows = torch.from_numpy(self.mask_index(index0, logits.shape[0])).to(self.device)
        return logits.float().masked_fill(~self.allowed_dev[rows], float("-inf"))

    def _read(self, logits: torch.Tensor, readout: str, index0: int) -> np.ndarray:
        masked = self._masked(logits, index0)
        return self.read(readout, lambda: self.link.down(masked.argmax(-1)), lambda: self.link.down(masked))


def check_image_tokens(ids, image_token_id: int, n_embeds: int) -> None:
    """The prompt's image-pad count (host ids) must equal the vision tower's embeddings."""
    n = int(np.count_nonzero(np.asarray(ids) == image_token_id))
    if n != n_embeds:
        raise ValueError(f"torch backend: {n} image tokens in the prompt but {n_embeds} image "
                         "embeddings from vision(images); they must be equal")


def noised_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """A deep copy with every weight w -> w + noise * std(w) * N(0, 1) (seeded)."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            scale = float(p.std()) if p.numel() > 1 else 1.0
            p.add_(noise * scale * torch.randn(p.shape, generator=g).to(p.device, p.dtype))
    return other


def create(spec: BackendSpec) -> TorchBackend:
    """Random-weight models from a preset (seeded), or checkpoints {kind: folder}; `draft`:
    None (the draft that comes with them), "self", "none", or a draft checkpoint folder."""
    tokenizer, preset, seed, checkpoints = spec.tokenizer, spec.preset, spec.seed or 0, spec.checkpoints
    draft, draft_noise, device = spec.draft, spec.draft_noise, spec.device
    if (preset is None) == (checkpoints is None):
        raise ConfigError("torch backend: give exactly one of preset (random weights) or checkpoints")
    check_device(device)
    if preset is not None:
        cfg = io.with_tokenizer(load_preset(preset), tokenizer)
        target, expert, routine = io.new_models(cfg, seed)
    else:
        cfg, target, expert, routine = io.load_models(checkpoints, tokenizer)
    kind, model = "routine", routine
    if draft == "self":
        kind, model = "self", noised_copy(target, draft_noise, seed + 1) if draft_noise else target
    elif draft == "none":
        kind, model = "none", None
    elif draft is not None:
        sha = io.target_sha256(checkpoints) if checkpoints is not None else None
        cfg, model, _ = io.load_draft(draft, cfg, target, tokenizer, sha)
    if kind == "routine" and model is None:
        raise ConfigError("the checkpoint has no draft (meta.json kind 'draft'); pass --draft DIR, "
                          "--draft self or --draft none")
    return TorchBackend(cfg, target, expert, model, kind, device, spec.max_len or DEFAULT_MAX_LEN,
                        spec.eager, spec.static, spec.k_max, spec.kv_buckets)


def check_device(device: str) -> None:
    """A torch device this machine has, or a ConfigError saying what is allowed."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: the torch backend runs on cpu or cuda[:N]")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device!r}: torch {torch.__version__} sees no CUDA GPU here "
                          f"(CUDA build: {torch.version.cuda or 'none'}); use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
