"""What one cycle takes in and gives back: input checks and the result record."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from core.config import ConfigError
from prompt.layout import build_prompt
from prompt.positions import mrope_position_ids
from prompt.trajectory import HIST_POSES, TrajectoryRangeError, saturate_history, tokens_to_future
from runtime.backend import PrefillInputs


class InputError(ValueError):
    """Bad cycle input (images, history, prompt length); the message names it and what is allowed."""


FUTURE_TOKENS = 128     # trajectory tokens decoded by the LLM (trajectory: tokens): 64 x (x, y)


def reserve_rows(cfg, tok) -> int:
    """Cache rows kept free after the reasoning: <|cot_end|> and the layout's conditioning
    tail (+ <|traj_future_start|> and the 128 trajectory tokens when decoded as tokens)."""
    if cfg.trajectory == "expert":
        return 1 + len(tok.conditioning.tail(tok))
    return 2 + FUTURE_TOKENS


def check_setup(backend, tokenizer, cfg) -> None:
    """A planner's backend, tokenizer and PlannerConfig must fit together (ConfigError)."""
    if backend.vocab_size != len(tokenizer):
        raise ConfigError(f"backend vocab_size={backend.vocab_size} does not match the "
                          f"tokenizer ({len(tokenizer)} tokens)")
    if cfg.trajectory == "tokens" and not tokenizer.token_trajectory:
        raise ConfigError(f"trajectory='tokens' needs a layout with x/y trajectory tokens; the "
                          f"{tokenizer.layout!r} layout's trajectory comes from the expert")
    if backend.exact_only and (cfg.spec.decoding != "greedy" or cfg.spec.relax_r):
        raise ConfigError(f"backend {backend.name!r} accepts tokens inside its engine: only "
                          "decoding='greedy' with relax_r=0 (exact acceptance) is available")
    fixed = getattr(backend, "action_fixed", None)     # (draws, combine) an export fixed in its graph
    if fixed is not None and cfg.trajectory == "expert" and (cfg.trajectory_samples, cfg.trajectory_combine) != fixed:
        raise ConfigError(f"trajectory_samples={cfg.trajectory_samples}, trajectory_combine="
                          f"{cfg.trajectory_combine!r}: backend {backend.name!r} was exported for {fixed[0]} draws "
                          f"combined by {fixed[1]!r}; set those in the planner profile or re-export with it")
    check_trees(backend, cfg)
    check_room(backend, tokenizer, cfg)


def check_trees(backend, cfg) -> None:
    """spec.tree needs a backend that takes trees, and a tree its widest verify pass holds."""
    if not cfg.spec.tree:
        return
    if not backend.takes_trees:
        raise ConfigError(f"spec.tree={cfg.spec.tree!r}: backend {backend.name!r} cannot verify token "
                          "trees; use a chain (tree: '') or a backend that takes them (torch; onnxruntime or "
                          "tensorrt with a step_tree graph at the step's precision: re-export or rebuild)")
    cfg.spec.tree_shape.check_width(backend.tree_width or backend.max_len)


def check_room(backend, tok, cfg) -> None:
    """A profile whose prompt + max_reasoning_tokens + the trajectory rows can never fit the
    backend's cache is refused when the planner is made (else every cycle is an input_error)."""
    image_shape = (len(cfg.cameras), cfg.frames, *cfg.image_hw, 3)
    grid, merge = backend.vision_grid(image_shape)
    n_tokens = [int(t * h * w) // merge**2 for t, h, w in grid]
    prompt = build_prompt(tok, n_tokens, saturate_history(np.zeros((HIST_POSES, 3)))[0])
    need = len(prompt.ids) + cfg.max_reasoning_tokens + reserve_rows(cfg, tok)
    if need > backend.max_len:
        most = backend.max_len - len(prompt.ids) - reserve_rows(cfg, tok)
        allowed = (f"max_reasoning_tokens <= {most} (or a larger max_len)" if most >= 1 else
                   f"max_len >= {need - cfg.max_reasoning_tokens + 1}")
        raise ConfigError(f"max_reasoning_tokens={cfg.max_reasoning_tokens}: the prompt ({len(prompt.ids)} rows) + "
                          f"the reasoning + {reserve_rows(cfg, tok)} trajectory rows need {need} cache rows, the "
                          f"backend has max_len={backend.max_len}: no cycle can ever fit; allowed {allowed}")


def cycle_prompt(backend, tok, image_shape, history, res, after_prompt: int) -> PrefillInputs:
    """Prompt ids and M-RoPE positions of a cycle; `after_prompt` cache rows must stay free
    after it (reasoning and trajectory). InputError if the history or the length is bad."""
    grid, merge = backend.vision_grid(image_shape)
    n_tokens = [int(t * h * w) // merge**2 for t, h, w in grid]
    try:
        tokenized, saturated = saturate_history(history)
        prompt = build_prompt(tok, n_tokens, tokenized)
    except ValueError as e:
        raise InputError(f"ego history cannot be tokenized: {e}") from None
    if saturated:
        res.flags.append("history_saturated")
        res.notes.append("the ego history moves faster than its tokens can say (~31 m/s, "
                         "1.2 rad/s): tokenized at that limit; the expert uses the exact speed")
    room = len(prompt.ids) + after_prompt
    if room > backend.max_len:
        raise InputError(f"prompt of {len(prompt.ids)} tokens + {after_prompt} reasoning + trajectory "
                         f"rows needs {room} cache rows; the backend has {backend.max_len}")
    pos, delta = mrope_position_ids(prompt.ids, grid, merge, tok.image_pad, tok.vision_start)
    res.prompt_len = len(prompt.ids)
    return PrefillInputs(prompt.ids, pos, delta, prompt.image_spans)


def future_mask(tok) -> np.ndarray:
    """(2, V) bool: the periodic mask of decoded trajectory tokens (x bin, y bin, x bin, ...)."""
    xy = np.zeros((2, len(tok)), bool)
    xy[0, tok.fut_x_ids.start:tok.fut_x_ids.stop] = True
    xy[1, tok.fut_y_ids.start:tok.fut_y_ids.stop] = True
    return xy


def check_images(images, cfg) -> np.ndarray:
    """Camera images -> (cams, frames, H, W, 3) uint8 in cfg.cameras order.

    Accepts that array or a mapping {camera name: (frames, H, W, 3)}; anything else, a missing
    or unknown camera, a wrong shape or dtype raises InputError saying what was expected."""
    h, w = cfg.image_hw
    want = (cfg.frames, h, w, 3)
    if isinstance(images, Mapping):
        missing = [c for c in cfg.cameras if c not in images]
        unknown = sorted(set(images) - set(cfg.cameras))
        if missing or unknown:
            raise InputError(f"cameras: missing {missing}, unknown {unknown}; the planner needs "
                             f"exactly {list(cfg.cameras)}")
        images = [np.asarray(images[c]) for c in cfg.cameras]
        for cam, img in zip(cfg.cameras, images):
            if img.shape != want:
                raise InputError(f"camera {cam!r}: image shape {img.shape}, expected {want}")
        images = np.stack(images)
    images = np.asarray(images)
    full = (len(cfg.cameras), *want)
    if images.shape != full:
        raise InputError(f"images have shape {images.shape}, expected {full} "
                         f"(cameras {list(cfg.cameras)}, frames, H, W, RGB)")
    if images.dtype != np.uint8:
        raise InputError(f"images have dtype {images.dtype}, expected uint8")
    return images


def future_from_tokens(tok, ids) -> np.ndarray:
    """128 decoded trajectory tokens (x, y alternating) -> (64, 3) waypoints, or ValueError."""
    try:
        return tokens_to_future(tok, np.asarray(ids, np.int64))
    except TrajectoryRangeError as e:
        raise ValueError(f"decoded trajectory tokens are malformed: {e}") from None


@dataclass
class CycleResult:
    cycle: int
    scene: str | None = None
    trajectory: np.ndarray | None = None   # (64, 3) float32 that passed the checks, or None
    source: str = "none"                   # reasoning | cut_reasoning | prefill | stop | none
    flags: list = field(default_factory=list)
    error: str | None = None
    reasoning: str = ""
    reasoning_ids: list = field(default_factory=list)
    stop_reason: str = ""
    prompt_len: int = 0                    # prompt tokens (the reasoning starts at this cache row)
    checks: list = field(default_factory=list)   # problems of the reasoning trajectory, if any
    decode: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    reuse: dict = field(default_factory=dict)    # what came from earlier cycles (PlannerConfig.reuse)

    @property
    def ok(self) -> bool:
        """The trajectory is this cycle's own (reasoning) and nothing was flagged."""
        return self.source == "reasoning" and not self.flags and self.error is None

    def to_json(self) -> dict:
        """A plain dict that is strict JSON: non-finite numbers become null."""
        traj = None if self.trajectory is None else np.round(self.trajectory.astype(float), 4).tolist()
        return finite({"cycle": self.cycle, "scene": self.scene, "ok": self.ok, "source": self.source,
                "flags": list(self.flags), "error": self.error, "reasoning": self.reasoning,
                "reasoning_ids": [int(i) for i in self.reasoning_ids], "stop_reason": self.stop_reason,
                "prompt_len": self.prompt_len,
                "checks": list(self.checks), "decode": self.decode, "timing": self.timing,
                "notes": list(self.notes), "reuse": self.reuse, "trajectory": traj})


def finite(obj):
    """obj with every float that is NaN or +-inf replaced by None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
