"""Roofline projection of one planning cycle from a model preset's shapes and a device's peaks.

Every engine call is a list of operations, each with its FLOPs and the DRAM bytes it moves
(weights, activations in and out, K/V rows read and written). An operation takes

    t = max(FLOPs / (peak(precision) x compute_efficiency), bytes / (bandwidth x memory_efficiency))

and a call is the sum of its operations (no launch gaps: engines with CUDA graphs are assumed;
the CPU validation shows what that leaves out). Batch 1, one cycle:

    vision      the ViT over every encoded image (attention inside each image), patch embed, mergers
    prefill     the target over the prompt, then the draft over it (its cache is written too)
    draft call  one per speculative step: a feed step (one row of the target's features through
                the draft's fc fusion, then its layers and head) and k - 1 chain steps (the
                draft's own hidden: no fc); "draft_step" is the call / k, the cost per proposal
                (the c of tools.measure_c)
    verify(w)   one target forward of w = k + 1 tokens (w = 1: a plain decode step)
    reasoning   plain: N verify(1); speculative: ceil(N / tau) steps of k draft steps + verify(k+1);
                on drives a share of the steps is proposed by lookup (the last cycles' reasoning):
                those cost no draft step (lookup_share)
    trajectory  the target rewrites the N reasoning rows, then `euler_steps` expert forwards over
                samples x 64 action tokens reading the target's cache (shared by the draws)
    tree step   a token tree (runtime/tree.py) of N nodes, depth d, top-K, drafted EAGLE-2 style
                as the torch backend drafts it (whose tau `specdrive bench --trees` measures): a
                feed of the root, then d - 1 calls of the K best candidates of a depth (K rows
                under a tree mask, top-K on the device); one verify of w = 1 + N (the tree mask
                costs what a causal one does: a dense kernel computes every score); then the
                accepted path's K/V rows moved where a chain has them (tau - 1 rows of every
                layer, read and written): `tree_step_costs`. The graph backends' draft graphs take
                no tree mask: they feed one node per depth (the same d calls, of one row each, and
                a logits row back to the host per call), so their trees are narrower

How a backend runs them (`Impl`): the torch reference attends over all max_len cache rows and
computes logits for every row; an engine attends over the valid rows and reads the logits of the
last prompt row only. Shapes come from the preset (models.sizes counts the parameters of the same
modules); nothing here is fitted to a measured run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from models.config import LLMConfig, ModelConfig
from models.sizes import param_counts
from core.config import ConfigError, check_choice, check_range
from core.graphs import DRAFT_CHAIN, DRAFT_FEED, SHAPES

# precision -> (bytes per weight, which peak does the arithmetic). bf16 runs at the fp16 tensor
# peak (the same on Ampere, Hopper, Blackwell data sheets). int4 is weight-only (AWQ):
# the matmuls run in fp16 on dequantized weights; fp4 is NVFP4 (Blackwell tensor cores).
PRECISIONS = {"fp32": (4.0, "fp32"), "fp16": (2.0, "fp16"), "bf16": (2.0, "fp16"), "int8": (1.0, "int8"),
              "fp8": (1.0, "fp8"), "int4": (0.5, "fp16"), "fp4": (0.5, "fp4")}
IMPLS = ("reference", "engine")


def kv_bytes(precision: str) -> float:
    """K/V cache bytes per value: fp32 runs keep fp32, FP8/FP4 profiles an FP8 cache, else fp16."""
    return 4.0 if precision == "fp32" else 1.0 if precision in ("fp8", "fp4") else 2.0


def act_bytes(precision: str) -> float:
    return 4.0 if precision == "fp32" else 2.0


@dataclass
class Device:
    """Peaks of one device (dense, no sparsity; TFLOP/s or TOP/s; 0 = not supported) and the
    fractions of them an engine reaches (assumptions, stated with the table)."""
    title: str
    dram_gbps: float
    memory_gb: float
    fp32_tflops: float
    fp16_tflops: float
    int8_tops: float = 0.0
    fp8_tflops: float = 0.0
    fp4_tflops: float = 0.0
    compute_efficiency: float = 0.5
    memory_efficiency: float = 0.7
    impl: str = "engine"
    note: str = ""

    def __post_init__(self):
        for name in ("dram_gbps", "memory_gb", "fp32_tflops", "fp16_tflops"):
            check_range(f"{self.title}.{name}", getattr(self, name), lo=1e-9)
        for name in ("int8_tops", "fp8_tflops", "fp4_tflops"):
            check_range(f"{self.title}.{name}", getattr(self, name), lo=0.0)
        for name in ("compute_efficiency", "memory_efficiency"):
            check_range(f"{self.title}.{name}", getattr(self, name), lo=1e-3, hi=1.0)
        check_choice(f"{self.title}.impl", self.impl, IMPLS)

    def peak_flops(self, precision: str) -> float:
        """FLOP/s (or OP/s) the arithmetic of `precision` gets; ConfigError where unsupported."""
        check_choice("precision", precision, PRECISIONS)
        unit = PRECISIONS[precision][1]
        peak = {"fp32": self.fp32_tflops, "fp16": self.fp16_tflops, "int8": self.int8_tops,
                "fp8": self.fp8_tflops, "fp4": self.fp4_tflops}[unit]
        if not peak:
            why = " (Orin is Ampere, sm_87: no FP8/FP4 tensor cores)" if "Orin" in self.title else ""
            raise ConfigError(f"{self.title} has no {unit} arithmetic{why}; use one of "
                              f"{[p for p in PRECISIONS if self._has(PRECISIONS[p][1])]}")
        return peak * 1e12

    def _has(self, unit: str) -> bool:
        return bool({"fp32": self.fp32_tflops, "fp16": self.fp16_tflops, "int8": self.int8_tops,
                     "fp8": self.fp8_tflops, "fp4": self.fp4_tflops}[unit])


@dataclass
class Workload:
    """What one cycle processes (batch 1)."""
    images: int = SHAPES.cameras * SHAPES.frames   # camera images in the prompt
    encoded_images: int | None = None  # images the ViT encodes per cycle (None: all; fewer when
                                       # the older frames' features are reused)
    image_hw: tuple = SHAPES.image_hw
    prompt_len: int = 0                # tokens of the prompt (0: computed from the images)
    reasoning_tokens: int = 40         # CoC tokens decoded
    max_len: int = SHAPES.max_len      # cache rows (the reference attends over all of them)
    k: int = 4                         # draft length per speculative step
    tau: float = 3.0                   # tokens emitted per verify pass
    samples: int = 8                   # expert draws per trajectory
    euler_steps: int = 10
    precision: str = "fp16"
    budget_ms: float = 100.0
    margin_ms: float = 5.0
    lookup_share: float = 0.0          # share of speculative steps proposed by lookup (drives): no draft step
    streamed_images: int | None = None  # streaming prefill (a frame_local target): image blocks computed
                                        # per cycle, the others' K/V kept (None: the whole prompt prefilled)

    def __post_init__(self):
        check_choice("precision", self.precision, PRECISIONS)
        check_range("images", self.images, lo=1)
        check_range("reasoning_tokens", self.reasoning_tokens, lo=0)
        check_range("k", self.k, lo=0, hi=16)
        check_range("tau", self.tau, lo=1.0, hi=self.k + 1.0)
        check_range("samples", self.samples, lo=1)
        check_range("euler_steps", self.euler_steps, lo=1)
        if self.encoded_images is not None:
            check_range("encoded_images", self.encoded_images, lo=0, hi=self.images)
        check_range("lookup_share", self.lookup_share, lo=0.0, hi=1.0)
        if self.streamed_images is not None:
            check_range("streamed_images", self.streamed_images, lo=0, hi=self.images)


@dataclass
class Op:
    name: str
    flops: float
    bytes: float


@dataclass
class Cost:
    ops: list = field(default_factory=list)

    def add(self, name: str, flops: float, nbytes: float) -> None:
        self.ops.append(Op(name, float(flops), float(nbytes)))

    def extend(self, other: "Cost", times: float = 1.0) -> None:
        self.ops += [Op(o.name, o.flops * times, o.bytes * times) for o in other.ops]

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops)

    @property
    def bytes(self) -> float:
        return sum(o.bytes for o in self.ops)

    def ms(self, dev: Device, precision: str) -> float:
        peak = dev.peak_flops(precision) * dev.compute_efficiency
        bw = dev.dram_gbps * 1e9 * dev.memory_efficiency
        return 1e3 * sum(max(o.flops / peak, o.bytes / bw) for o in self.ops)


class Shapes:
    """The cost of every engine call of one preset at one precision, under one Impl."""

    def __init__(self, cfg: ModelConfig, precision: str, impl: str = "engine"):
        check_choice("impl", impl, IMPLS)
        self.cfg, self.impl = cfg, impl
        self.w, self.a, self.kv = PRECISIONS[precision][0], act_bytes(precision), kv_bytes(precision)

    def matmul(self, c: Cost, name: str, T: float, n_in: int, n_out: int) -> None:
        """x (T, n_in) @ W (n_in, n_out): weights read once, activations in and out."""
        c.add(name, 2 * T * n_in * n_out, n_in * n_out * self.w + T * (n_in + n_out) * self.a)

    def attention(self, c: Cost, llm: LLMConfig, T: float, S: float, heads: int | None = None) -> None:
        """T queries over S keys (GQA: kv_heads K/V rows read once); the reference writes the
        (T, S) scores to memory, an engine keeps them on chip (flash attention)."""
        h = heads or llm.heads
        nbytes = 2 * S * llm.kv_heads * llm.head_dim * self.kv + 2 * T * h * llm.head_dim * self.a
        if self.impl == "reference":
            nbytes += 2 * T * S * h * 4
        c.add("attention", 4 * T * S * h * llm.head_dim, nbytes)

    def decoder(self, c: Cost, llm: LLMConfig, T: float, S: float, layers: int) -> None:
        D, hd = llm.hidden, llm.head_dim
        one = Cost()
        self.matmul(one, "qkv", T, D, (llm.heads + 2 * llm.kv_heads) * hd)
        self.matmul(one, "o", T, llm.heads * hd, D)
        self.matmul(one, "mlp_in", T, D, 2 * llm.intermediate)
        self.matmul(one, "mlp_out", T, llm.intermediate, D)
        self.attention(one, llm, T, S)
        one.add("kv_write", 0, 2 * T * llm.kv_heads * hd * self.kv)
        c.extend(one, layers)

    def _ctx(self, valid: float, max_len: int) -> float:
        return max_len if self.impl == "reference" else valid

    def target(self, T: float, valid: float, max_len: int, logits_rows: float) -> Cost:
        llm, c = self.cfg.target.llm, Cost()
        self.decoder(c, llm, T, self._ctx(valid, max_len), llm.layers)
        if logits_rows:
            self.matmul(c, "lm_head", logits_rows, llm.hidden, llm.vocab_size)
        return c

    def draft(self, T: float, valid: float, max_len: int, logits_rows: float, fc: bool = True) -> Cost:
        """T rows of the draft; fc=False: a chain step, which feeds the draft's own hidden (D
        wide) and skips the fusion fc (3D -> D); in_proj runs either way."""
        cfg, c = self.cfg, Cost()
        llm, D = cfg.draft_llm(), cfg.target.llm.hidden
        if cfg.draft.features == "fused":
            if fc:
                self.matmul(c, "fuse", T, len(cfg.draft.feature_layers) * D, D)
            self.matmul(c, "in_proj", T, 2 * D, D)
        self.decoder(c, llm, T, self._ctx(valid, max_len), llm.layers)
        if logits_rows:   # a reduced head (draft.vocab = N): N rows, then its logits scattered to V (fp32)
            self.matmul(c, "lm_head", logits_rows, D, cfg.draft.vocab or llm.vocab_size)
            if cfg.draft.vocab:
                c.add("d2t_scatter", 0, logits_rows * llm.vocab_size * 4)
        return c

    def vision(self, images: int, image_hw) -> Cost:
        v, D, c = self.cfg.target.vision, self.cfg.target.llm.hidden, Cost()
        if images == 0:
            return c
        P = (image_hw[0] // v.patch) * (image_hw[1] // v.patch)      # patches per image
        T, H = images * P, v.hidden
        self.matmul(c, "patch_embed", T, v.patch_dim, H)
        for _ in range(v.depth):
            self.matmul(c, "qkv", T, H, 3 * H)
            self.matmul(c, "proj", T, H, H)
            self.matmul(c, "mlp_in", T, H, v.intermediate * (1 if v.style == "qwen3" else 2))
            self.matmul(c, "mlp_out", T, v.intermediate, H)
            extra = 2 * P * P * v.heads * 4 * images if self.impl == "reference" else 0
            c.add("attention", 4 * P * P * H * images, 4 * T * H * self.a + extra)
        big = H * v.merge ** 2
        for _ in range(1 + len(v.deepstack_layers)):
            self.matmul(c, "merger", T / v.merge ** 2, big, big)
            self.matmul(c, "merger", T / v.merge ** 2, big, D)
        return c

    def expert(self, samples: int, ctx: float) -> Cost:
        """One Euler step: samples x W action tokens through the expert's layers, each reading
        the target's K/V of `ctx` rows (once: the draws share the prompt's cache)."""
        e, llm, c = self.cfg.expert, self.cfg.target.llm, Cost()
        T = samples * e.n_waypoints
        self.matmul(c, "in_proj", T, e.fourier_feats * (e.action_dim + 1), e.in_proj_hidden)
        for _ in range(e.in_proj_layers - 1):
            self.matmul(c, "in_proj", T, e.in_proj_hidden, e.in_proj_hidden)
        self.matmul(c, "in_proj", T, e.in_proj_hidden, e.hidden)
        for _ in range(llm.layers):
            self.matmul(c, "qkv", T, e.hidden, (e.heads + 2 * llm.kv_heads) * llm.head_dim)
            self.matmul(c, "o", T, e.heads * llm.head_dim, e.hidden)
            self.matmul(c, "mlp_in", T, e.hidden, 2 * e.intermediate)
            self.matmul(c, "mlp_out", T, e.intermediate, e.hidden)
            keys = ctx + e.n_waypoints
            nbytes = 2 * ctx * llm.kv_heads * llm.head_dim * self.kv
            if self.impl == "reference":    # scores, and the cache rows copied beside each draw's own
                nbytes += 2 * T * keys * e.heads * 4 + samples * 4 * ctx * llm.kv_heads * llm.head_dim * self.kv
            c.add("attention", 4 * T * keys * e.heads * llm.head_dim, nbytes)
        self.matmul(c, "out_proj", T, e.hidden, e.action_dim)
        return c


def prompt_tokens(cfg: ModelConfig, images: int, image_hw) -> int:
    """Prompt length of `images` camera images (the layout of prompt/layout.py, built for real)."""
    import numpy as np

    from prompt.layout import build_prompt
    from bench.common.sources import default_tokenizer

    v = cfg.target.vision
    per_image = (image_hw[0] // v.patch) * (image_hw[1] // v.patch) // v.merge ** 2
    return len(build_prompt(default_tokenizer(), [per_image] * images, np.zeros((16, 3), np.float32)).ids)


def image_block_rows(cfg: ModelConfig, image_hw) -> int:
    """Rows of one image block: <|vision_start|>, the image's LLM tokens, <|vision_end|>."""
    v = cfg.target.vision
    return (image_hw[0] // v.patch) * (image_hw[1] // v.patch) // v.merge ** 2 + 2


def streamed_prefill(s: "Shapes", cfg: ModelConfig, w: Workload, T: int) -> Cost:
    """Streaming prefill (runtime/reuse.py): the new frames' image blocks in one call, each block
    attending to itself alone (L keys); the kept blocks' keys rotated to their rows (read and
    written once); the rows outside the images in one call over the whole prompt (the text
    before the images, a few rows, priced with them); the draft's prompt rows as before."""
    c = image_blocks_cost(s, cfg, w.streamed_images, w.image_hw)
    c.extend(streamed_rest(s, cfg, w, T))
    return c


def image_blocks_cost(s: "Shapes", cfg: ModelConfig, blocks: int, image_hw) -> Cost:
    """`blocks` image blocks in one call, each attending to its own L rows alone."""
    L = image_block_rows(cfg, image_hw)
    return s.target(blocks * L, L, L, 0) if blocks else Cost()


def streamed_rest(s: "Shapes", cfg: ModelConfig, w: Workload, T: int, draft: bool = True) -> Cost:
    """A streamed prefill after its new blocks: the kept blocks' keys rotated into the cache, the
    rows outside the images over the whole prompt, [the draft's prompt rows]."""
    L, llm = image_block_rows(cfg, w.image_hw), cfg.target.llm
    c, ref = Cost(), s.impl == "reference"
    kept = (w.images - (w.streamed_images or 0)) * L
    row_bytes = llm.layers * 2 * llm.kv_heads * llm.head_dim * s.kv
    c.add("rotate_kept_keys", 6 * kept * llm.layers * llm.kv_heads * llm.head_dim, 2 * kept * row_bytes)
    rest = T - w.images * L
    c.extend(s.target(rest, T, w.max_len, rest if ref else 1))
    if draft:
        c.extend(s.draft(T, T, w.max_len, T if ref else 1))
    return c


def stage_costs(cfg: ModelConfig, w: Workload, impl: str) -> dict:
    """{call: Cost} of every engine call of one cycle (the draft's feed and chain steps and their
    mean per proposal, one verify per width)."""
    s = Shapes(cfg, w.precision, impl)
    T = w.prompt_len or prompt_tokens(cfg, w.images, w.image_hw)
    N, ref = w.reasoning_tokens, impl == "reference"
    ctx = T + N / 2                                     # mean valid rows while reasoning
    if w.streamed_images is None:
        prefill = s.target(T, T, w.max_len, T if ref else 1)
        prefill.extend(s.draft(T, T, w.max_len, T if ref else 1))
    else:
        prefill = streamed_prefill(s, cfg, w, T)
    traj = s.target(N + 1, T + N + 1, w.max_len, N + 1 if ref else 0)   # rewrite of the reasoning rows
    traj.extend(s.expert(w.samples, T + N + 1), w.euler_steps)
    enc = w.images if w.encoded_images is None else w.encoded_images
    feed, chain, step = s.draft(1, ctx, w.max_len, 1), s.draft(1, ctx, w.max_len, 1, fc=False), Cost()
    k = max(w.k, 1)
    step.extend(feed, 1 / k)                            # one feed + (k - 1) chain steps per call
    step.extend(chain, (k - 1) / k)
    return {"prompt_len": T, "vision": s.vision(enc, w.image_hw), "prefill": prefill,
            DRAFT_FEED: feed, DRAFT_CHAIN: chain, "draft_step": step,
            "verify": {width: s.target(width, ctx, w.max_len, width) for width in {1, w.k + 1}},
            "trajectory": traj}


def tree_step_costs(cfg: ModelConfig, w: Workload, impl: str, shape, tau: float) -> dict:
    """{draft, verify, moves} Cost of one token-tree step of `shape` (runtime.tree.TreeShape) that
    emits `tau` tokens (module docstring); the valid rows are the reasoning's mean, as a chain's."""
    s = Shapes(cfg, w.precision, impl)
    T = w.prompt_len or prompt_tokens(cfg, w.images, w.image_hw)
    ctx, llm, K = T + w.reasoning_tokens / 2, cfg.target.llm, shape.topk
    draft = s.draft(1, ctx, w.max_len, 1)
    draft.extend(s.draft(K, ctx, w.max_len, K, fc=False), shape.depth - 1)
    moves = Cost()
    moves.add("row_moves", 0, 2 * (tau - 1) * llm.layers * 2 * llm.kv_heads * llm.head_dim * s.kv)
    width = 1 + shape.nodes
    return {"draft": draft, "verify": s.target(width, ctx, w.max_len, width), "moves": moves}


def project_trees(cfg: ModelConfig, dev: Device, w: Workload, trees, goal: float = 0.15,
                  prices: dict | None = None) -> dict:
    """Token trees against the chain of `w` (k, tau): [(TreeShape, tau or None)] -> the verify ms
    of every width, and per tree its step's ms; with its tau, its reasoning stage (ceil(N / tau)
    steps) and how far below the chain's it is; always the tau it would need to be `goal` below
    (`tau_needed`: N over the most whole steps that fit, as the reasoning stage counts them; None
    when not even one step fits). `prices` (a measured floor, bench/roofline/measured.py
    measured_prices): every verify from its measured width curve, the chain's draft steps and a
    tree's first (feed) call from the measured draft steps; the rest as priced here."""
    N, widths = w.reasoning_tokens, sorted({1, w.k + 1, *(1 + t.nodes for t, _ in trees)})
    s = Shapes(cfg, w.precision, dev.impl)
    ctx = (w.prompt_len or prompt_tokens(cfg, w.images, w.image_hw)) + N / 2
    if prices is None:
        chain = project(cfg, dev, w)["speculative"]["reasoning_ms"]
        verify = {wd: s.target(wd, ctx, w.max_len, wd).ms(dev, w.precision) for wd in widths}
    else:
        verify = {wd: prices["verify"](wd) for wd in widths}
        steps = math.ceil(N / w.tau) if w.k else N
        chain = steps * ((1 - w.lookup_share) * w.k * prices["draft_step"] + verify[w.k + 1]) if w.k \
            else N * verify[1]
    rows = []
    for shape, tau in trees:
        if tau is not None:
            check_range(f"tree {shape} tau", tau, lo=1.0, hi=shape.depth + 1.0)
        ms = {k: c.ms(dev, w.precision) for k, c in tree_step_costs(cfg, w, dev.impl, shape, tau or 1.0).items()}
        if prices is not None:
            ms["verify"] = verify[1 + shape.nodes]
            wide = s.draft(shape.topk, ctx, w.max_len, shape.topk, fc=False).ms(dev, w.precision)
            one = s.draft(1, ctx, w.max_len, 1, fc=False).ms(dev, w.precision)
            ms["draft"] = prices[DRAFT_FEED] + (shape.depth - 1) * prices[DRAFT_CHAIN] * wide / one
        step = sum(ms.values())
        row = {"tree": str(shape), "width": 1 + shape.nodes, **{f"{k}_ms": v for k, v in ms.items()},
               "step_ms": step, "tau": tau, "reasoning_ms": None, "below_chain": None,
               "tau_needed": tau_for(N, step, (1 - goal) * chain)}
        if tau is not None:
            row["reasoning_ms"] = math.ceil(N / tau) * step
            row["below_chain"] = 1 - row["reasoning_ms"] / chain if chain else None
        rows.append(row)
    priced = [r for r in rows if r["reasoning_ms"] is not None]
    best = min(priced, key=lambda r: r["reasoning_ms"]) if priced else None
    return {"verify_ms": verify, "chain": {"k": w.k, "tau": w.tau, "reasoning_ms": chain}, "trees": rows,
            "best": best and best["tree"], "goal": goal,
            "met": None if best is None else bool(best["below_chain"] is not None and best["below_chain"] >= goal)}


def tau_for(tokens: float, step_ms: float, within_ms: float) -> float | None:
    """The smallest tau whose ceil(tokens / tau) steps of step_ms fit within_ms (None: not one)."""
    steps = math.floor(within_ms / step_ms) if step_ms > 0 else 0
    return tokens / steps if steps >= 1 else None


def project(cfg: ModelConfig, dev: Device, w: Workload) -> dict:
    """Per-stage ms for plain and speculative decoding, and whether the cycle fits the budget."""
    costs = stage_costs(cfg, w, dev.impl)
    ms = {name: costs[name].ms(dev, w.precision)
          for name in ("vision", "prefill", DRAFT_FEED, DRAFT_CHAIN, "draft_step", "trajectory")}
    verify = {width: c.ms(dev, w.precision) for width, c in costs["verify"].items()}
    N = w.reasoning_tokens
    steps = math.ceil(N / w.tau) if w.k else N
    plain_reason = N * verify[1]
    spec_reason = steps * ((1 - w.lookup_share) * w.k * ms["draft_step"] + verify[w.k + 1]) if w.k else plain_reason
    fixed = ms["vision"] + ms["prefill"] + ms["trajectory"]
    out = {"prompt_len": costs["prompt_len"], "stages_ms": {**ms, "verify_1": verify[1],
                                                            f"verify_{w.k + 1}": verify[w.k + 1]},
           "plain": _cycle(fixed, plain_reason, w), "speculative": _cycle(fixed, spec_reason, w),
           "premise_ok": fixed + w.margin_ms <= w.budget_ms}
    left = w.budget_ms - w.margin_ms - fixed          # time the reasoning may take
    per_token = {"plain": verify[1], "speculative": spec_reason / N if N else 0.0}
    out["tokens_in_budget"] = {m: (max(int(left // t), 0) if t > 0 else N) for m, t in per_token.items()}
    return out


def drive_cycle(cfg: ModelConfig, dev: Device, w: Workload, new_images: int, lookup_share: float,
                streaming: bool = False) -> dict:
    """The cycle on a drive: the ViT encodes only the `new_images` frames not seen before (the
    others' features are reused: every frame time on the 10 Hz grid leaves one new frame per
    camera), and `lookup_share` of the speculative steps cost no draft step; `streaming`: the
    prefill computes the new frames' image blocks only (a frame_local target)."""
    import dataclasses

    new = min(new_images, w.images)
    return project(cfg, dev, dataclasses.replace(w, encoded_images=new, lookup_share=lookup_share,
                                                 streamed_images=new if streaming else None))


def _cycle(fixed: float, reasoning: float, w: Workload) -> dict:
    total = fixed + reasoning
    return {"reasoning_ms": reasoning, "cycle_ms": total, "fits": total + w.margin_ms <= w.budget_ms}


REMEDIES = (   # (label, changes to the Workload), tried one by one, kept when they help
    ("4-bit weights (INT4 AWQ; NVFP4 where the device has FP4)", {"precision": "4bit"}),
    ("vision features of older frames reused", {"encoded_images": "per_camera"}),
    ("2 Euler steps", {"euler_steps": 2}),
    ("1 expert draw", {"samples": 1}),
    ("1 frame per camera (shorter prompt)", {"images": "per_camera", "encoded_images": "per_camera"}),
)


def remedies(cfg: ModelConfig, dev: Device, w: Workload, cameras: int, smaller: tuple | None = None):
    """Each remedy alone, and accumulated (a remedy joins the set only when it shortens the
    speculative cycle): ms and whether it fits -> (rows, the workload with the kept remedies). `smaller` = (name, ModelConfig) of a smaller
    preset, tried first on the same workload."""
    import dataclasses

    out, acc = [], {}
    best = project(cfg, dev, w)["speculative"]["cycle_ms"]
    if smaller is not None:
        r = project(smaller[1], dev, w)
        out.append({"remedy": f"smaller preset {smaller[0]}", "alone_ms": r["speculative"]["cycle_ms"],
                    "alone_fits": r["speculative"]["fits"], "kept": False})
    for label, change in REMEDIES:
        fp4 = bool(dev.fp4_tflops)
        change = {k: (cameras if v == "per_camera" else ("fp4" if fp4 else "int4") if v == "4bit" else v)
                  for k, v in change.items()}
        if change.get("precision") == w.precision:
            continue
        alone = project(cfg, dev, dataclasses.replace(w, **change))["speculative"]
        trial = project(cfg, dev, dataclasses.replace(w, **{**acc, **change}))
        kept = trial["speculative"]["cycle_ms"] < best
        if kept:
            acc.update(change)
            best = trial["speculative"]["cycle_ms"]
        out.append({"remedy": label, "alone_ms": alone["cycle_ms"], "alone_fits": alone["fits"], "kept": kept,
                    "cumulative_ms": best, "cumulative_fits": best + w.margin_ms <= w.budget_ms})
    return out, dataclasses.replace(w, **acc)


def weights_bytes(cfg: ModelConfig, precision: str) -> dict:
    """Bytes of the weights per component (the draft shares the target's embedding and head)."""
    b = PRECISIONS[precision][0]
    return {k: v * b for k, v in param_counts(cfg).items()}


def memory_report(cfg: ModelConfig, precision: str, prompt_lens, max_len: int, widths, samples: int) -> dict:
    """Weights, K/V caches and activation estimates (bytes) of one preset at one precision.

    activations of a forward of T tokens: the residual, q/k/v, the MLP's gate and up (the
    largest live set of one layer, reused layer after layer) and the logits (T x V, fp32); a
    CUDA graph per verify width keeps such a pool each (upper bound: no sharing between graphs)."""
    llm, a, kv = cfg.target.llm, act_bytes(precision), kv_bytes(precision)
    per_row = lambda L: L.layers * 2 * L.kv_heads * L.head_dim * kv     # noqa: E731
    draft = cfg.draft_llm()

    def act(T: int) -> float:
        live = T * (2 * llm.hidden + (llm.heads + 2 * llm.kv_heads) * llm.head_dim + 2 * llm.intermediate)
        return live * a + T * llm.vocab_size * 4

    e = cfg.expert
    expert_act = samples * e.n_waypoints * (2 * e.hidden + 2 * e.intermediate) * a
    return {"precision": precision, "weights": weights_bytes(cfg, precision),
            "kv_per_token": {"target": per_row(llm), "draft": per_row(draft)},
            "kv_cache": {str(L): {"target": per_row(llm) * L, "draft": per_row(draft) * L}
                         for L in [*prompt_lens, max_len]},
            "activations": {str(wd): act(wd) for wd in widths},
            "graph_pools": sum(act(wd) for wd in widths),
            "prefill_activations": {str(L): act(L) for L in prompt_lens},
            "expert_activations": expert_act}
