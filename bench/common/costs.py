"""The cost of one engine call from a model preset's shapes and a device's peaks (the roofline
model): what the roofline projection (bench/roofline/projection.py) sums into a cycle and what
the closed loop's priced latency (bench/drive/latency.py) moves its virtual clock by.

Every engine call is a list of operations, each with its FLOPs and the DRAM bytes it moves
(weights, activations in and out, K/V rows read and written). An operation takes

    t = max(FLOPs / (peak(precision) x compute_efficiency), bytes / (bandwidth x memory_efficiency))

and a call is the sum of its operations (no launch gaps: engines with CUDA graphs are assumed;
the CPU validation shows what that leaves out). `Shapes` prices the calls: vision (the ViT over
the encoded images), target(w) and draft(w) forwards of w rows, the expert; image blocks and the
rest of a streamed prefill (runtime/reuse.py).

How a backend runs them (`Impl`): the torch reference attends over all max_len cache rows and
computes logits for every row; an engine attends over the valid rows and reads the logits of the
last prompt row only. Shapes come from the preset (models.sizes counts the parameters of the same
modules); nothing here is fitted to a measured run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from models.config import LLMConfig, ModelConfig
from core.config import ConfigError, check_choice, check_range
from core.graphs import SHAPES

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


