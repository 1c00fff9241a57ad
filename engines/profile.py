"""Engine profiles: what to build for one device (configs/engines/NAME.yaml -> EngineProfile).

A profile names the target GPU (SM), the TensorRT versions it builds with, the precision of each
graph of `specdrive export onnx`, the shapes the engines are built for (TensorRT optimization
profiles: prompt rows for prefill, verify widths 1..k_max+1 for the step graphs) and the planner
profile it serves. What a device cannot run is refused here, at configuration time:

    FP8 needs sm_89+ (Ada, Hopper, Blackwell) and TensorRT >= 9: Orin (Ampere, sm_87) has none.
    INT4 weight-only (AWQ) needs TensorRT >= 10 (JetPack 6.1+; DRIVE OS 6 ships 8.6).

A name that is not a file but reads DEVICE-PRECISION ("orin-fp8") is the device's first profile
with every LLM graph at that precision, so such a request meets the same checks (and is refused
with the reason) instead of a bare "unknown profile".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from core.config import ConfigError, check_choice, check_range, check_types, load_named
from core.graphs import LLM_GRAPHS, SHAPES

PROFILE_DIR = Path(__file__).resolve().parent.parent / "configs" / "engines"
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
CALIBRATION_METHODS = ("max", "entropy")
FP8_MIN_SM = 89          # Ada (8.9), Hopper (9.0), Blackwell (10.x, 11.0, 12.x)
ARCH = {87: "Ampere (Orin)", 89: "Ada", 90: "Hopper", 100: "Blackwell", 110: "Blackwell (Thor)"}


@dataclass
class GraphPrecision:
    """The precision each exported graph is built in: one field per graph of core/graphs.py GRAPHS."""
    vision: str = "fp16"
    vision_frame: str = "fp16"       # the one-image vision graph (reuse.vision)
    prefill: str = "fp16"
    step: str = "fp16"
    step_tree: str = "fp16"          # the step over a token tree (runtime/tree.py); the onnxruntime
                                     # backend verifies trees only where it matches `step`
    image_blocks: str = "fp16"       # a frame_local target's image blocks on their own (reuse.prefill)
    draft_prefill: str = "fp16"
    draft_feed: str = "fp16"
    draft_chain: str = "fp16"
    action_velocity: str = "fp16"
    action_output: str = "fp32"

    def __post_init__(self):
        check_types(self)
        for name, value in self.items():
            check_choice(f"precision.{name}", value, PRECISIONS)

    def items(self):
        return dataclasses.asdict(self).items()

    def graphs(self, precision: str) -> list[str]:
        return [g for g, p in self.items() if p == precision]


@dataclass
class Shapes:
    """What the engines are built for. max_prompt: prefill rows; k_max + 1: widest verify;
    tree_widths: the token-tree verify widths (step_tree: a profile and a CUDA graph per width)."""
    max_prompt: int = SHAPES.max_prompt
    max_len: int = SHAPES.max_len
    k_max: int = SHAPES.k_max
    cameras: int = SHAPES.cameras
    frames: int = SHAPES.frames
    image_hw: tuple[int, ...] = SHAPES.image_hw
    tree_widths: tuple[int, ...] = SHAPES.tree_widths

    def __post_init__(self):
        check_types(self)
        check_range("shapes.max_len", self.max_len, lo=64, hi=1 << 20)
        check_range("shapes.max_prompt", self.max_prompt, lo=1, hi=self.max_len - 1)
        check_range("shapes.k_max", self.k_max, lo=1, hi=16)
        check_range("shapes.cameras", self.cameras, lo=1)
        check_range("shapes.frames", self.frames, lo=1)
        if len(self.image_hw) != 2 or min(self.image_hw) < 1:
            raise ConfigError(f"shapes.image_hw={list(self.image_hw)!r} must be [height, width], both >= 1")
        widths = list(self.tree_widths)
        if widths != sorted(set(widths)) or not all(2 <= w <= self.max_prompt for w in widths):
            raise ConfigError(f"shapes.tree_widths={widths!r}: allowed strictly increasing widths in "
                              f"2..max_prompt ({self.max_prompt}), e.g. [9, 17, 33]")

    @property
    def verify_widths(self) -> tuple[int, int]:
        return 1, self.k_max + 1


@dataclass
class CalibrationConfig:
    """The calibration set: `prompts` train-split scenes (never test / held-out / unseen); the
    activation-range method of the int8 graphs (fp8 uses max, INT4 AWQ its clip search);
    SmoothQuant before INT8; the accuracy report's number of held-out scenes."""
    prompts: int = 128
    method: str = "max"
    seed: int = 0
    smoothquant: bool = False
    report_scenes: int = 16

    def __post_init__(self):
        check_types(self)
        check_range("calibration.prompts", self.prompts, lo=1, hi=100_000)
        check_choice("calibration.method", self.method, CALIBRATION_METHODS)
        check_range("calibration.report_scenes", self.report_scenes, lo=1, hi=100_000)

    def method_for(self, precision: str) -> str | None:
        """The calibration method of one precision (None: that precision's default)."""
        return self.method if precision in ("int8", "int8_sq") else None


@dataclass
class TrtllmConfig:
    """TensorRT-LLM checkpoints of the target and the standalone draft beside the engines
    (engines/trtllm.py). FP8 follows the precision of the step (target) and draft_chain (draft)
    graphs; `dtype` is that of everything not in FP8."""
    enabled: bool = False
    dtype: str = "bfloat16"

    def __post_init__(self):
        check_types(self)
        check_choice("trtllm.dtype", self.dtype, ("float32", "float16", "bfloat16"))


@dataclass
class EngineProfile:
    device: str
    target_sm: int
    tensorrt_min: str
    tensorrt_below: str
    planner: str
    platform: str = ""
    precision: GraphPrecision = field(default_factory=GraphPrecision)
    shapes: Shapes = field(default_factory=Shapes)
    int4_awq: bool = False          # INT4 weight-only (AWQ) for the target LLM's weights
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    trtllm: TrtllmConfig = field(default_factory=TrtllmConfig)
    name: str = ""                  # set by load_profile from the file name

    def __post_init__(self):
        check_types(self)
        check_range("target_sm", self.target_sm, lo=50, hi=200)
        lo, below = version(self.tensorrt_min, "tensorrt_min"), version(self.tensorrt_below, "tensorrt_below")
        if lo >= below:
            raise ConfigError(f"tensorrt_min={self.tensorrt_min!r} must be below tensorrt_below={self.tensorrt_below!r}")
        fp8 = self.precision.graphs("fp8")
        arch = ARCH.get(self.target_sm, f"sm_{self.target_sm}")
        if fp8 and self.target_sm < FP8_MIN_SM:
            raise ConfigError(f"engine profile {self.name or self.device!r}: precision fp8 for {fp8}, but "
                              f"{self.device} is sm_{self.target_sm} ({arch}), which has no FP8 (FP8 needs "
                              f"sm_{FP8_MIN_SM}+: Ada, Hopper, Blackwell such as Thor); use int8 or fp16")
        if fp8 and lo < (9,):
            raise ConfigError(f"precision fp8 for {fp8} needs TensorRT >= 9; tensorrt_min is {self.tensorrt_min!r}")
        if self.trtllm.enabled and self.target_sm < FP8_MIN_SM:
            raise ConfigError(f"trtllm.enabled on sm_{self.target_sm} ({arch}): TensorRT-LLM's last Orin "
                              "release (v0.12.0-jetson) predates M-RoPE; the TensorRT-LLM path is for "
                              "Thor, Hopper and Ada (sm_89+). Set trtllm.enabled: false")
        if self.int4_awq and lo < (10,):
            raise ConfigError(f"int4_awq needs TensorRT >= 10 (JetPack 6.1+; DRIVE OS 6 ships 8.6); "
                              f"tensorrt_min is {self.tensorrt_min!r}: raise it to \"10.0\" or set int4_awq: false")

    @property
    def quantized(self) -> list[str]:
        """Graphs that need calibration (Q/DQ scales) before the build."""
        return [g for g, p in self.precision.items() if p in ("int8", "fp8")]

    def tensorrt_ok(self, found: str) -> bool:
        return version(self.tensorrt_min, "tensorrt_min") <= version(found, "tensorrt") \
            < version(self.tensorrt_below, "tensorrt_below")


def version(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split(".")[:3])
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a version like \"10.3\"") from None


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> EngineProfile:
    """configs/engines/NAME.yaml (or a YAML path) -> the checked EngineProfile; DEVICE-PRECISION
    names without a file derive from the device's profile (see the module doc)."""
    path = Path(name_or_path)
    if not path.suffix and not (PROFILE_DIR / f"{name_or_path}.yaml").is_file():
        return _derived(str(name_or_path))
    prof = load_named(EngineProfile, name_or_path, PROFILE_DIR, "engine profile", "engine profiles")
    return dataclasses.replace(prof, name=prof.name or path.stem)


def _derived(name: str) -> EngineProfile:
    device, _, precision = name.rpartition("-")
    bases = [p for p in known_profiles() if p.rpartition("-")[0] == device]
    if not bases or precision not in PRECISIONS:
        raise ConfigError(f"engine profile {name!r} not found; known engine profiles: {known_profiles()}")
    base = load_profile(bases[0])
    prec = dataclasses.replace(base.precision, **{g: precision for g in LLM_GRAPHS})
    # dataclasses.replace runs __post_init__: an impossible precision is refused right here
    return dataclasses.replace(base, precision=prec, name=name)
