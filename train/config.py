"""Checked configs of the three training stages; `configs/train/*.yaml` load into these.

    VisionStageConfig  vision pretraining: the target's tower learns the cameras' facts first
    SFTConfig          target SFT: CoC + future-token next-token loss, action expert flow matching
    DistillConfig      routine-reasoner distillation from the target's own greedy reasoning
    AARLConfig         action-aware RL of the distilled flat draft (group-relative, KL anchor)
    ShipConfig         assembling checkpoints/tiny from the run folders
    EvalConfig         the MODEL_CARD numbers of a trained planner folder

Every stage shares `RunConfig` (steps, batch, optimiser, checkpoint cadence, threads, seed).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from models.config import IMAGE_ATTENTION
from core.config import ConfigError, check_choice, check_range, load_yaml

STAGES = ("vision", "sft", "distill", "aarl")
DEVICES = ("cpu", "cuda")
DISTILLED = ("flat", "mrope", "flat-standalone", "mrope-standalone", "eagle3")   # what `train distill` makes
DRAFTS = DISTILLED + ("flat-aarl",)


def ship_vocab(name: str) -> int | None:
    """The reduced head's N of a draft name to ship: 0 for a DRAFTS name, N for a distilled
    variant with a reduced head ("flat-v256" -> 256, train/ckpt.variant_name); None if unknown."""
    if name in DRAFTS:
        return 0
    m = re.fullmatch(r"(.+)-v([1-9][0-9]*)", name)
    return int(m.group(2)) if m and m.group(1) in DISTILLED else None


@dataclass
class RunConfig:
    """Optimiser and bookkeeping shared by all stages."""
    out: str = "runs/sft-tiny"     # run folder: checkpoints, state, log.jsonl
    steps: int = 1000
    batch_size: int = 8            # per process; torchrun splits nothing, each rank reads its shard
    lr: float = 3e-4
    min_lr_ratio: float = 0.1      # cosine decay to lr * min_lr_ratio
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 0               # torch.set_num_threads in this run; 0 = leave torch's default
    ckpt_every_s: float = 180.0    # wall-clock seconds between resumable checkpoints
    log_every: int = 10
    device: str = "cpu"            # "cuda": the models and batches on the first visible GPU (train.loop.device)

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            check_range(f"run.{name}", getattr(self, name), lo=1)
        for name in ("warmup", "threads", "log_every", "seed"):
            check_range(f"run.{name}", getattr(self, name), lo=0)
        check_range("run.lr", self.lr, lo=0.0)
        check_range("run.min_lr_ratio", self.min_lr_ratio, lo=0.0, hi=1.0)
        check_range("run.weight_decay", self.weight_decay, lo=0.0)
        check_range("run.grad_clip", self.grad_clip, lo=0.0)
        check_range("run.ckpt_every_s", self.ckpt_every_s, lo=0.0)
        if not self.out:
            raise ConfigError("run.out must name a run folder, got ''")
        check_choice("run.device", self.device, DEVICES)


@dataclass
class DataConfig:
    """Which scenes a stage reads: a `specdrive scenes generate` folder and split."""
    dir: str = "data/scenes"
    split: str = "train"
    max_scenes: int = 0            # 0 = all scenes of the split
    balance: float = 0.0           # vision and sft: draw scenes with p ~ count(fact)^-balance; 0 = plain epochs

    def __post_init__(self):
        check_choice("data.split", self.split, ("train", "val", "test", "heldout", "unseen"))
        check_range("data.max_scenes", self.max_scenes, lo=0)
        check_range("data.balance", self.balance, lo=0.0, hi=1.0)


@dataclass
class VisionStageConfig:
    preset: str = "tiny"           # the preset whose vision tower is pretrained
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(out="runs/vision-tiny", lr=1e-3))
    slot: int = 16                 # dims each merged token keeps in the probe head
    decision_weight: float = 1.0   # CE of the decision next to the cause-word BCE
    val_scenes: int = 200          # validation scenes scored at the end (RUN/val.json); 0 = none

    def __post_init__(self):
        check_range("slot", self.slot, lo=1, hi=128)
        check_range("decision_weight", self.decision_weight, lo=0.0)
        check_range("val_scenes", self.val_scenes, lo=0)


@dataclass
class SFTConfig:
    preset: str = "tiny"           # configs/models/NAME.yaml or a path
    image_attention: str = ""      # '' = the preset's llm.image_attention; "causal" | "frame_local"
    init_vision: str = ""          # RUN/vision.safetensors of `train vision`; '' = random tower
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=RunConfig)
    coc_weight: float = 1.0        # next-token loss on the CoC words and <|cot_end|>
    commitment_weight: float = 1.0  # inside the CoC loss: weight of commitment words (routine: 1)
    future_weight: float = 0.5     # next-token loss on the 128 future tokens (token-output mode)
    expert_weight: float = 1.0     # flow-matching loss of the action expert
    expert_cuts: int = 1           # extra expert losses per scene on a cache cut inside the CoC
    expert_grad_to_target: bool = False  # False: the expert reads a detached cache (knowledge insulation)

    def __post_init__(self):
        for name in ("coc_weight", "commitment_weight", "future_weight", "expert_weight"):
            check_range(name, getattr(self, name), lo=0.0)
        check_range("expert_cuts", self.expert_cuts, lo=0, hi=8)
        if self.image_attention:
            check_choice("image_attention", self.image_attention, IMAGE_ATTENTION)


@dataclass
class DistillConfig:
    target: str = "checkpoints/tiny/target"   # SFT checkpoint folder (models.io)
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(out="runs/distill-tiny"))
    drafts: tuple[str, ...] = ("flat", "mrope", "flat-standalone")
    seeds: tuple[int, ...] = (0,)
    max_new_tokens: int = 96       # greedy reasoning budget when caching the target's CoC
    gen_batch: int = 16            # scenes per batched greedy generation
    kl_weight: float = 1.0         # KL(target || draft) over the next-token distribution
    feature_weight: float = 0.1    # EAGLE-style smooth-L1 to the target's top hidden (fused drafts)
    temperature: float = 1.0
    draft_vocab: int = 0           # 0: the draft shares the target's LM head; N: its own head over the
                                   # N tokens the target writes most (prompt/draft_vocab.py), variant "<v>-v<N>"
    position_gap: int = 0          # the dose-response: copies of the prompt's image region added to the
                                   # draft's positions before the reasoning (train.teachers.draft_inputs)
    reasoning_cache: str = ""      # the target's greedy reasoning file; '' = RUN/reasoning.safetensors

    def __post_init__(self):
        check_range("draft_vocab", self.draft_vocab, lo=0)
        check_range("position_gap", self.position_gap, lo=0, hi=64)
        if not self.drafts:
            raise ConfigError(f"drafts must name at least one of {list(DISTILLED)}")
        for d in self.drafts:
            check_choice("drafts[]", d, DISTILLED)
        if not self.seeds:
            raise ConfigError("seeds must hold at least one seed")
        check_range("max_new_tokens", self.max_new_tokens, lo=1, hi=256)
        check_range("gen_batch", self.gen_batch, lo=1)
        for name in ("kl_weight", "feature_weight"):
            check_range(name, getattr(self, name), lo=0.0)
        check_range("temperature", self.temperature, lo=1e-3)
        uniform_only("distill", self.data)


@dataclass
class AARLConfig:
    target: str = "checkpoints/tiny/target"
    draft: str = "checkpoints/tiny/draft-flat"   # the distilled flat draft (also the frozen reference)
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(out="runs/aarl-tiny", lr=2e-5))
    group: int = 4                 # rollouts per scene (group-relative advantages)
    max_new_tokens: int = 96
    temperature: float = 1.0       # rollout sampling temperature of the draft
    action_weight: float = 1.0     # reward: -(ADE / ade_scale) - collision penalty
    accept_weight: float = 1.0     # reward: fraction of rollout tokens the target would choose
    ade_scale: float = 2.0         # metres that cost one unit of reward
    collision_penalty: float = 1.0
    kl_coef: float = 0.05          # beta of the KL to the frozen distilled draft (on-policy: no clip)
    trajectory_samples: int = 1    # expert draws averaged per scored trajectory (as the runtime)
    action_on: str = "rollout"     # the text the action reward scores: the rollout, or what one
                                   # verify pass of it lets through (one_pass: a budget cut)
    accept_on: str = "agree"       # r_accept: the share of rollout tokens equal to the target's greedy
                                   # choice (agree), or the share in the leading run of them (leading:
                                   # what one verify pass accepts)

    def __post_init__(self):
        check_range("group", self.group, lo=2)
        check_choice("action_on", self.action_on, ("rollout", "one_pass"))
        check_choice("accept_on", self.accept_on, ("agree", "leading"))
        check_range("trajectory_samples", self.trajectory_samples, lo=1, hi=64)
        check_range("max_new_tokens", self.max_new_tokens, lo=1, hi=256)
        check_range("temperature", self.temperature, lo=1e-3)
        for name in ("action_weight", "accept_weight", "ade_scale", "collision_penalty", "kl_coef"):
            check_range(name, getattr(self, name), lo=0.0)
        uniform_only("aarl", self.data)


def uniform_only(stage: str, data_cfg: DataConfig) -> None:
    """Distillation and AARL learn the target's own behaviour on the data as it comes."""
    if data_cfg.balance:
        raise ConfigError(f"data.balance={data_cfg.balance!r}: the {stage} stage draws scenes uniformly; "
                          "balance applies to the vision and sft stages only (set it to 0 here)")


@dataclass
class ShipConfig:
    sft: str = "runs/sft-tiny/ckpt"
    drafts: dict = field(default_factory=lambda: {
        "flat": "runs/distill-tiny/flat-s0/ckpt/draft-flat",
        "mrope": "runs/distill-tiny/mrope-s0/ckpt/draft-mrope",
        "flat-standalone": "runs/distill-tiny/flat-standalone-s0/ckpt/draft-flat-standalone",
        "flat-aarl": "runs/aarl-tiny/ckpt/draft-flat-aarl",
        "flat-v256": "runs/distill-tiny/flat-v256-s0/ckpt/draft-flat-v256",
        "eagle3-v256": "runs/distill-tiny/eagle3-v256-s0/ckpt/draft-eagle3-v256"})
    out: str = "checkpoints/tiny"

    def __post_init__(self):
        bad = sorted(v for v in self.drafts if ship_vocab(str(v)) is None)
        if bad:
            raise ConfigError(f"drafts: unknown variant(s) {bad}; allowed {sorted(DRAFTS)}, or one of "
                              f"{list(DISTILLED)} with a reduced head of N >= 1 rows as '<variant>-v<N>'")


@dataclass
class EvalConfig:
    planner: str = "checkpoints/tiny"
    # draft folders: names inside `planner`, or paths (other seeds' drafts); missing ones are skipped
    drafts: tuple[str, ...] = ("draft-flat", "draft-mrope", "draft-flat-standalone", "draft-flat-aarl")
    data: DataConfig = field(default_factory=lambda: DataConfig(split="test", max_scenes=100))
    splits: tuple[str, ...] = ("test", "heldout", "unseen")
    k: int = 8
    max_new_tokens: int = 96
    batch: int = 16
    threads: int = 0
    device: str = "cpu"            # "cuda": the models on the first visible GPU
    out: str = "runs/eval-tiny/metrics.json"
    runtime_scenes: int = 0        # test scenes also run through runtime.Planner (torch backend)
    aarl_scenes: int = 0           # heldout scenes on which draft-flat and draft-flat-aarl are scored
                                   # with the AARL reward of `aarl_config` (same seeded rollouts)
    aarl_config: str = "configs/train/aarl.yaml"
    trajectory_samples: int = 1    # expert draws averaged per trajectory (runtime's trajectory_samples)
    budget_action: bool = False    # ADE and commitment of the text a budget of a few passes lets through
    claims: str = ""               # markdown of the claims tables and pictures (train.claims_report; "" = none)
    notes: tuple[str, ...] = ()    # facts about the runs the numbers cannot show (written into the card)
    card: str = ""                 # MODEL_CARD.md to write from the metrics and the run logs ("" = none)
    commands: tuple[str, ...] = ()  # the card's "Commands" (default: the shipped checkpoint's, train.card.COMMANDS)
    compare: tuple[str, ...] = ()   # metrics files of planners on the same scenes, side by side in the card
    vision_run: str = "runs/vision-tiny"
    sft_run: str = "runs/sft-tiny"
    distill_run: str = "runs/distill-tiny"
    aarl_run: str = "runs/aarl-tiny"

    def __post_init__(self):
        check_range("k", self.k, lo=1, hi=16)
        check_range("max_new_tokens", self.max_new_tokens, lo=1, hi=256)
        check_range("batch", self.batch, lo=1)
        check_range("trajectory_samples", self.trajectory_samples, lo=1, hi=64)
        check_range("aarl_scenes", self.aarl_scenes, lo=0)
        check_choice("device", self.device, DEVICES)
        for s in self.splits:
            DataConfig(split=s)


CONFIGS = {"vision": VisionStageConfig, "sft": SFTConfig, "distill": DistillConfig, "aarl": AARLConfig,
           "ship": ShipConfig, "eval": EvalConfig, "card": EvalConfig}


def load(stage: str, path, overrides=()):
    """Read `path` (YAML) as the config of `stage` (one of CONFIGS), "key=value" overrides applied."""
    check_choice("stage", stage, CONFIGS)
    return load_yaml(CONFIGS[stage], path, overrides=tuple(overrides))
