"""Planner configuration: checked dataclasses, one per concern (spec, budget, checks, planner).

YAML presets live in configs/planner/NAME.yaml (one per engine profile: the budget priors
differ per engine) and are read by `load_planner_config`, which goes through core.config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from core.config import ConfigError, check_choice, check_range, check_types, from_dict, load_named
from core.artifacts import check_fingerprint_text
from core.graphs import SHAPES

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "planner"
CAMERAS = ("front_wide", "front_tele", "cross_left", "cross_right")
DECODING = ("greedy", "sample")
TRAJECTORY_SOURCES = ("expert", "tokens")
# worker: the prefill trajectory in a worker beside the reasoning (own CUDA stream);
# inline: computed after the prefill, before the reasoning; on_failure: computed only when the
# reasoning's trajectory is missing or fails its checks and its worst case fits the time left
FALLBACKS = ("worker", "inline", "on_failure")
COMBINES = ("mean", "medoid")
K_MAX_LIMIT = 16
TREE_NODES_LIMIT = 64


def tree_shape(text: str, what: str = "tree"):
    """A token tree "N,d,K" (nodes, depth, top-K) -> runtime.tree.TreeShape, refused naming what
    is allowed (ConfigError): a malformed text, a depth or top-K of 0, more than TREE_NODES_LIMIT
    nodes, a depth past K_MAX_LIMIT (a tree falls back to the chain of its depth, and the backends
    draft chains of at most k_max), a top-K past the nodes (children that could never be kept)."""
    from runtime.tree import TreeShape
    shape = TreeShape.parse(text)
    if shape.nodes > TREE_NODES_LIMIT:
        raise ConfigError(f"{what}={text!r}: nodes={shape.nodes} is not allowed; allowed 1..{TREE_NODES_LIMIT}")
    if shape.depth > K_MAX_LIMIT:
        raise ConfigError(f"{what}={text!r}: depth={shape.depth} is not allowed; allowed 1..{K_MAX_LIMIT} "
                          "(a tree falls back to the chain of its depth; chains are at most k_max long)")
    if shape.topk > shape.nodes:
        raise ConfigError(f"{what}={text!r}: top-K={shape.topk} is not allowed; allowed 1..nodes={shape.nodes} "
                          "(no more children can be kept than the tree has nodes)")
    return shape


@dataclass
class SpecConfig:
    """Speculative decoding. k = 0 is plain target decoding (no draft calls)."""
    decoding: str = "greedy"        # greedy: exact argmax; sample: speculative sampling
    k: int = 4                      # draft length when not adaptive (and the first guess when it is)
    adaptive: bool = True           # choose k per step to maximise tokens per second
    k_max: int = SHAPES.k_max
    temperature: float = 0.6        # Alpamayo-R1's sampling settings (temperature, then top-p)
    top_p: float = 0.98
    relax_r: int = 0                # Spec-VLA relaxed acceptance radius for trajectory tokens (bins)
    seed: int = 0                   # sampling RNG seed (per planner; each cycle draws from it)
    # token trees (runtime/tree.py, EAGLE-2 style): "N,d,K" = at most N drafted nodes, depth <= d,
    # top-K children per expanded node, verified in one target pass; "" = chains only. Greedy
    # only: sampling keeps chains (no exact recursive rejection over siblings is implemented),
    # and relaxed trajectory tokens too. With adaptive, each step chooses the tree or the best
    # chain by measured tokens per ms; without, every step is this tree.
    tree: str = ""

    def __post_init__(self):
        check_types(self)
        check_choice("spec.decoding", self.decoding, DECODING)
        check_range("spec.k_max", self.k_max, lo=1, hi=K_MAX_LIMIT)
        check_range("spec.k", self.k, lo=0, hi=self.k_max)
        check_range("spec.temperature", self.temperature, lo=1e-3, hi=10.0)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"spec.top_p={self.top_p!r} is out of range; allowed (0, 1]")
        check_range("spec.relax_r", self.relax_r, lo=0)
        self._tree_shape = tree_shape(self.tree, "spec.tree") if self.tree else None
        if self.tree:
            if self.decoding != "greedy":
                raise ConfigError(f"spec.tree={self.tree!r} needs decoding='greedy': sampling keeps "
                                  "chains (set tree: '' with decoding='sample')")
        if self.relax_r and self.decoding != "greedy":
            raise ConfigError(f"spec.relax_r={self.relax_r} needs decoding='greedy' (relaxed "
                              "acceptance compares argmax bins); use relax_r=0 with 'sample'")


    @property
    def tree_shape(self):
        """spec.tree as a runtime.tree.TreeShape (parsed once, here), or None: chains only."""
        return self._tree_shape


@dataclass
class BudgetConfig:
    """Latency budget per cycle. budget_ms = 0 turns it off. Priors are worst-case costs (ms)
    used until a stage has been measured; afterwards worst case = factor x a peak that is the
    largest time seen and, every cycle, decays toward the running mean by peak_decay (a one-off
    slow stage ages out in a few cycles instead of locking the reasoning out)."""
    budget_ms: float = 0.0
    margin_ms: float = 5.0
    prior_prompt_ms: float = 0.0            # the prompt build (tokens, positions) on the host
    worst_case_factor: float = 1.5
    prior_vision_ms: float = 20.0
    prior_prefill_ms: float = 40.0
    prior_draft_step_ms: float = 2.0
    prior_verify_ms: float = 6.0            # verify of width 1 ...
    prior_verify_per_token_ms: float = 0.5  # ... plus this per extra token
    prior_trajectory_ms: float = 30.0
    prior_lookup_ms: float = 1.0            # one lookup search (reuse.lookup; bounded under 1 ms per step)
    peak_decay: float = 0.8                 # per cycle: peak <- mean + decay (peak - mean)

    def __post_init__(self):
        check_types(self)
        for name in ("budget_ms", "margin_ms", "prior_prompt_ms", "prior_vision_ms", "prior_prefill_ms",
                     "prior_draft_step_ms", "prior_verify_ms", "prior_verify_per_token_ms",
                     "prior_trajectory_ms", "prior_lookup_ms"):
            check_range(f"budget.{name}", getattr(self, name), lo=0.0)
        check_range("budget.worst_case_factor", self.worst_case_factor, lo=1.0)
        check_range("budget.peak_decay", self.peak_decay, lo=0.0, hi=1.0)
        floor = self.prior_prompt_ms + self.prior_vision_ms + self.prior_prefill_ms + self.margin_ms
        if self.enabled and self.budget_ms < floor:
            raise ConfigError(f"budget.budget_ms={self.budget_ms} is below prompt + vision + prefill + margin "
                              f"by the profile's priors ({floor:g} ms): every cycle would miss; raise "
                              "the budget (or lower the priors to measured worst cases)")

    @property
    def enabled(self) -> bool:
        return self.budget_ms > 0


@dataclass
class CheckConfig:
    """Kinematic limits a trajectory must meet before it leaves (10 Hz waypoints)."""
    max_speed: float = 45.0          # m/s
    max_accel: float = 8.0           # m/s^2, |longitudinal| (braking included)
    max_jerk: float = 40.0           # m/s^3, finite differences at 10 Hz are noisy: a loose bound
    max_curvature: float = 0.3       # 1/m (turning radius >= 3.3 m)
    curvature_min_speed: float = 1.0  # m/s; below this curvature is not checked (heading is noise)
    stop_decel: float = 2.0          # m/s^2, the comfortable stop's deceleration
    max_history_speed: float = 45.0  # m/s; an ego history faster than this is absurd (<= max_speed:
                                     # the comfortable stop from that speed must pass the checks)

    def __post_init__(self):
        check_types(self)
        for name in ("max_speed", "max_accel", "max_jerk", "max_curvature", "stop_decel",
                     "max_history_speed"):
            check_range(f"checks.{name}", getattr(self, name), lo=1e-6)
        check_range("checks.curvature_min_speed", self.curvature_min_speed, lo=0.0)
        if self.max_history_speed > self.max_speed:
            raise ConfigError(f"checks.max_history_speed={self.max_history_speed} must not exceed "
                              f"checks.max_speed={self.max_speed} (a stop from that speed must pass the checks)")
        if self.stop_decel > self.max_accel:
            raise ConfigError(f"checks.stop_decel={self.stop_decel} must not exceed "
                              f"checks.max_accel={self.max_accel} (the stop must pass the checks)")


@dataclass
class ReuseConfig:
    """What a planner keeps across cycles (runtime/reuse.py); off by default: exact either way.
    vision: a frame's vision features are kept, keyed by its identity (camera, timestamp) when
    plan() is given frames, else by a content hash, and checked against a full content digest
    (other pixels under a known identity are encoded afresh). lookup: the last cycles'
    reasoning proposes the continuation of the tokens just accepted (prompt-lookup drafting,
    no draft model call), the model draft where nothing matches. prefill (streaming prefill, a
    frame_local target only, with vision on): each frame's per-layer K (before rope) and V are
    kept beside its vision features, and a cycle computes the image blocks of new frames only,
    rotates the kept ones to their rows and prefills the rows after the images."""
    vision: bool = False
    lookup: bool = False
    prefill: bool = False
    # APPROXIMATE, off by default, flagged approximate_prefill on every cycle it touches: on a causal
    # target, a kept frame's K/V from the cycle that computed it (in that cycle's context) is rotated
    # to its new rows, and only new frames are computed, in place (FlashDrive-style cache shifting)
    approximate_prefill: bool = False
    max_frames: int = 32         # cached frames at most (a drive cycle: 4 cameras x 2 frames, the
                                 # older one seen 5 cycles before: 4 x 6 distinct times live)
    lookup_cycles: int = 4       # reasoning texts of that many last cycles are searched
    lookup_ngram: int = 2        # the shortest tail of the accepted tokens that must match (1..8)

    def __post_init__(self):
        check_types(self)
        check_range("reuse.max_frames", self.max_frames, lo=1, hi=4096)
        check_range("reuse.lookup_cycles", self.lookup_cycles, lo=1, hi=64)
        check_range("reuse.lookup_ngram", self.lookup_ngram, lo=1, hi=8)
        for name in ("prefill", "approximate_prefill"):
            if getattr(self, name) and not self.vision:
                raise ConfigError(f"reuse.{name} keeps each frame's KV beside its vision features: "
                                  f"turn reuse.vision on too (or reuse.{name} off)")
        if self.prefill and self.approximate_prefill:
            raise ConfigError("reuse.prefill (exact, a frame_local target) and reuse.approximate_prefill "
                              "(a causal target) exclude each other; choose one")


@dataclass(frozen=True)
class ExpertRequest:
    """What the action expert is asked for, from the planner profile to every backend's `expert`:
    `samples` draws integrated as one batch, combined by `combine` ("mean": in action space;
    "medoid": the draw nearest the others), `steps` Euler steps (None: the checkpoint's own)."""
    samples: int = 1
    steps: int | None = None
    combine: str = "mean"

    def __post_init__(self):
        check_expert(self.samples, self.steps, self.combine)


def check_expert(samples, steps, combine, names=("samples", "steps", "combine")) -> None:
    """The expert's settings' limits, written once (an ExpertRequest's and the profile's fields)."""
    check_range(names[0], samples, lo=1, hi=64)
    if steps is not None:
        check_range(names[1], steps, lo=1, hi=100)
    check_choice(names[2], combine, COMBINES)


@dataclass
class PlannerConfig:
    spec: SpecConfig = field(default_factory=SpecConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    checks: CheckConfig = field(default_factory=CheckConfig)
    max_reasoning_tokens: int = 96   # CoC tokens after <|cot_start|> (Alpamayo-R1 allows 256)
    trajectory: str = "expert"       # expert: action expert on the KV cache; tokens: 128 tokens
    fallback: str = "worker"         # the prefill trajectory: worker | inline | on_failure (FALLBACKS)
    trajectory_samples: int = 1      # expert draws per trajectory, combined by trajectory_combine
    trajectory_combine: str = "mean"  # mean: of the draws in action space; medoid: the draw nearest
                                      # the others (always a path the expert drew)
    euler_steps: int | None = None   # the expert's Euler steps (None: the checkpoint's own)
    max_len: int = SHAPES.max_len    # cache rows the backend allocates (prompt + reasoning + tail)
    cameras: tuple[str, ...] = CAMERAS
    image_hw: tuple[int, ...] = SHAPES.image_hw
    frames: int = SHAPES.frames
    reuse: ReuseConfig = field(default_factory=ReuseConfig)
    fingerprint: str | None = None   # the model folder this profile runs, pinned (core/artifacts.py
                                     # folder_fingerprint): another folder is refused (exit 2)
    require_pin: bool = False        # true: a run whose model folder no pin covers (this fingerprint or
                                     # --expect-fingerprint) is refused (exit 2), not only said unverified

    def __post_init__(self):
        check_types(self)
        check_fingerprint_text(self.fingerprint, "fingerprint")
        check_range("max_reasoning_tokens", self.max_reasoning_tokens, lo=1, hi=4096)
        check_choice("trajectory", self.trajectory, TRAJECTORY_SOURCES)
        check_choice("fallback", self.fallback, FALLBACKS)
        check_expert(self.trajectory_samples, self.euler_steps, self.trajectory_combine,
                     ("trajectory_samples", "euler_steps", "trajectory_combine"))
        check_range("max_len", self.max_len, lo=64, hi=1 << 20)
        if not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ConfigError(f"cameras={list(self.cameras)!r} must be a non-empty list of distinct names")
        if len(self.image_hw) != 2 or min(self.image_hw) < 1:
            raise ConfigError(f"image_hw={list(self.image_hw)!r} must be [height, width], both >= 1")
        check_range("frames", self.frames, lo=1)
        if self.reuse.vision and self.reuse.max_frames < len(self.cameras) * self.frames:
            raise ConfigError(f"reuse.max_frames={self.reuse.max_frames} holds less than one cycle's "
                              f"{len(self.cameras)} cameras x {self.frames} frames; allowed >= "
                              f"{len(self.cameras) * self.frames}")
        if self.spec.relax_r and self.trajectory != "tokens":
            raise ConfigError(f"spec.relax_r={self.spec.relax_r} only applies to trajectory='tokens' "
                              "(trajectory tokens are masked while reasoning)")

    def expert_request(self) -> ExpertRequest:
        """The expert's settings of this profile, as every trajectory asks for them."""
        return ExpertRequest(self.trajectory_samples, self.euler_steps, self.trajectory_combine)


def load_planner_config(name_or_path: str | Path) -> PlannerConfig:
    """A profile name (configs/planner/NAME.yaml) or a YAML path -> PlannerConfig."""
    return load_named(PlannerConfig, name_or_path, PRESET_DIR, "planner profile", "profiles", empty_ok=False)


def with_overrides(cfg: PlannerConfig, overrides: dict, where: str = "overrides") -> PlannerConfig:
    """`cfg` with a nested dict of changes merged in, re-built and re-validated by the dataclasses:
    with_overrides(cfg, {"spec": {"k": 8, "adaptive": False}, "budget": {"budget_ms": 0.0}}) keeps
    every other field of spec and budget. An unknown key is a ConfigError naming it (and `where`)."""
    return from_dict(PlannerConfig, _merged(dataclasses.asdict(cfg), overrides), where)


def _merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merged(base[key], value) if nested else value
    return out
