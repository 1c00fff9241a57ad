"""The Planner: what a vehicle stack calls once per cycle.

    planner = Planner(backend, tokenizer, PlannerConfig(...))
    result = planner.plan(images, history)      # images (4, 2, H, W, 3) uint8 or {camera: (2, H, W, 3)}
    result = planner.plan(images, history, frames=[[("front_wide", 0.5), ("front_wide", 1.0)], ...])

With PlannerConfig.reuse on, the planner remembers across cycles (runtime/reuse.py): vision
features of frames seen before (keyed by `frames`, the (camera, time_s) of each image, else by
content) and the last cycles' reasoning as a zero-cost draft; both exact.

A cycle: check inputs -> vision -> prefill -> [fallback trajectory from the prefill cache:
in a worker beside the reasoning, inline, or only on failure] -> reasoning (speculative, under
the budget) -> <|cot_end|> -> trajectory (action expert, or 128 trajectory tokens) -> output
checks -> result. Every failure ends in a result with an error or flags and, whenever the ego
speed is known, a trajectory that passed the checks (reasoning's, else the prefill fallback,
else a comfortable stop). Every wait (the last cycle's fallback, a busy expert) is bounded and
timed as a stage of its own (runtime/fallback.py holds the worker, the expert lock and the
waits). The stages of one cycle are runtime/stages.py's Cycle; this object is what lives across
cycles: the learnt costs and acceptance rates, the reuse stores, the fallback worker.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from core.config import ConfigError
from runtime.acceptance import trajectory_range_ids
from runtime.adaptive import AcceptanceRate, TreeTau
from runtime.budget import CostModel, CycleBudget, wall_ms
from runtime.checks import check_history, check_speed, comfortable_stop
from runtime.config import PlannerConfig
from runtime.cycle import CycleResult, InputError, check_images, check_setup
from runtime.fallback import Fallback
from runtime.reuse import Lookup, VisionCache, frame_keys
from runtime.stages import Cycle


MAX_FRAME_TIME_S = 1e9       # |time| of a frame identity at most (~31 years of a clock, in s)


def check_frame_times(frames) -> None:
    """InputError where a frame's time (plan()'s `frames`, runtime/reuse.py frame_keys) is a bool,
    text or any non-number, not finite, or beyond MAX_FRAME_TIME_S (its microsecond key would
    overflow); the layout itself is frame_keys' to check."""
    if frames is None:
        return
    if isinstance(frames, Mapping):
        pairs = [(cam, t) for cam, ts in frames.items() if isinstance(ts, (list, tuple, np.ndarray)) for t in ts]
    elif isinstance(frames, (list, tuple)):
        pairs = [tuple(pair) for row in frames if isinstance(row, (list, tuple)) for pair in row
                 if isinstance(pair, (list, tuple)) and len(pair) == 2]
    else:
        return
    for cam, t in pairs:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)):
            raise InputError(f"frames[{cam!r}]: ({cam!r}, {t!r}) is not a (camera, time_s) pair: a time is a "
                             f"number of seconds, not {type(t).__name__}")
        if not math.isfinite(float(t)) or abs(float(t)) > MAX_FRAME_TIME_S:
            what = "is out of range" if math.isfinite(float(t)) else "is not finite"
            raise InputError(f"frames[{cam!r}]: time {t!r} s {what}; allowed finite, |t| <= {MAX_FRAME_TIME_S:g} s")


class Planner:
    def __init__(self, backend, tokenizer, config: PlannerConfig | None = None, clock=wall_ms,
                 observer=None):
        self.backend, self.tok = backend, tokenizer
        self.observer = observer      # observer(runtime.step.StepRecord) sees every decode step
        self.cfg = config or PlannerConfig()
        self.clock = clock
        check_setup(backend, tokenizer, self.cfg)
        backend.warm_expert(self.cfg.expert_request())
        self.costs = CostModel(self.cfg.budget, searches=self.cfg.reuse.lookup)   # learnt across cycles
        self.rates = {"reasoning": AcceptanceRate(), "trajectory": AcceptanceRate(), "lookup": AcceptanceRate()}
        self.tree_tau = TreeTau()       # tokens per tree step (spec.tree; runtime/tree.py)
        reuse = self.cfg.reuse
        if reuse.vision and not backend.reuses_vision:
            raise ConfigError(f"reuse.vision: backend {backend.name!r} cannot encode frames one by one; "
                              "turn reuse.vision off for it")
        if reuse.prefill:
            check_streaming(backend)
        if reuse.approximate_prefill:
            check_approximate(backend)
        self.vision_cache = VisionCache(reuse.max_frames) if reuse.vision else None
        self.lookup = Lookup(reuse.lookup_cycles, reuse.lookup_ngram) if reuse.lookup else None
        self.rng = np.random.default_rng(self.cfg.spec.seed)
        self.range_ids = trajectory_range_ids(tokenizer)
        self.fallback = Fallback(backend, self.cfg, self.costs)
        self.cycles = 0
        self.last_v0: float | None = None
        self.premise: dict | None = None

    def warmup(self, images, history, cycles: int = 1) -> dict:
        """Run cycles whose timings are then forgotten (first calls: allocation, lazy init, CUDA
        graph capture), then one measured cycle, and check the budget's premise
        W(prompt) + W(vision) + W(prefill) + W(trajectory) + margin <= budget on its timings (returned, and
        kept in `self.premise`; a cycle that starts with it broken is flagged budget_too_small)."""
        for _ in range(cycles):
            self.plan(images, history, scene="warmup")
        self.fallback.settle()
        self.costs.reset()
        self.plan(images, history, scene="warmup")
        self.fallback.settle()
        self.premise = self.costs.premise(self.cfg.budget)
        self.cycles = 0
        self.forget()
        return self.premise

    def forget(self) -> None:
        """Drop what earlier cycles left for reuse (a new drive, after warm-up)."""
        if self.vision_cache is not None:
            self.vision_cache.clear()
        if self.lookup is not None:
            self.lookup.clear()

    def close(self) -> None:
        self.fallback.close()
        self.backend.close()

    def plan(self, images, history, scene: str | None = None, frames=None) -> CycleResult:
        """One planning cycle; never raises (bad input, a backend fault, even a fault of the
        planner itself end in an error and, when the speed is known, a stop). `frames`: the
        identity of each image, (cameras, frames) (camera, time_s) pairs or {camera: [time_s]}
        (runtime/reuse.py frame_keys), for reuse.vision; without it frames are keyed by content."""
        self.cycles += 1
        budget = CycleBudget(self.cfg.budget, self.costs, self.clock)
        res = CycleResult(cycle=self.cycles, scene=scene)
        try:
            self.fallback.drain(budget, res)
            images, v0 = self._check_inputs(images, history, res)
            check_frame_times(frames)
            keys = frame_keys(frames, self.cfg)
        except InputError as e:
            return self._fail_inputs(res, budget, str(e), "input_error")
        except Exception as e:
            return self._fail_inputs(res, budget, f"planner fault: {e!r}", "planner_error")
        cycle = Cycle(self, res, budget, v0, int(self.rng.integers(2**31)))
        self.fallback.begin_cycle()
        try:
            cycle.run(images, history, keys)
        except Exception as e:
            return self._fail_inputs(res, budget, f"planner fault: {e!r}", "planner_error")
        finally:     # a running fallback the cycle never read: the next cycle waits for it
            self.fallback.end_cycle()
        return self._finish(res, budget)

    def _finish(self, res: CycleResult, budget: CycleBudget) -> CycleResult:
        res.timing = budget.finish()
        res.flags += [f for f in budget.flags if f not in res.flags]
        return res

    def _check_inputs(self, images, history, res: CycleResult):
        problems = check_history(history, self.cfg.checks)
        if problems:
            raise InputError(problems[0])
        v0 = self.tok.conditioning.speed(history)     # the layout's v0 estimator
        problems = check_speed(v0, self.cfg.checks)
        if problems:
            raise InputError(problems[0])
        self.last_v0 = v0
        return check_images(images, self.cfg), v0

    def _fail_inputs(self, res: CycleResult, budget: CycleBudget, error: str, flag: str) -> CycleResult:
        res.error, res.flags = error, res.flags + [flag]
        if self.last_v0 is not None:   # the ego speed is known (now or from the last cycle)
            res.trajectory, res.source = comfortable_stop(self.last_v0, self.cfg.checks), "stop"
        return self._finish(res, budget)


def check_streaming(backend) -> None:
    """reuse.prefill needs a frame_local target on a backend that streams; else exit 2 with why."""
    if backend.image_attention != "frame_local":
        raise ConfigError(f"reuse.prefill (streaming prefill) needs a target trained with the frame_local image "
                          f"layout; this target's llm.image_attention is {backend.image_attention!r}, where every "
                          "image attends to the images before it, so no frame's KV can be kept exactly. Use a "
                          "frame_local checkpoint (checkpoints/tiny; configs/train/sft.yaml) or turn reuse.prefill off")
    if not backend.streams_prefill:
        raise ConfigError(f"reuse.prefill: backend {backend.name!r} cannot stream the prefill; turn reuse.prefill off")
    if backend.stream_mismatch:
        raise ConfigError(f"reuse.prefill: {backend.stream_mismatch}")


def check_approximate(backend) -> None:
    """reuse.approximate_prefill is for causal targets on a backend that can run it; else exit 2."""
    if backend.image_attention != "causal":
        raise ConfigError("reuse.approximate_prefill is for causal targets (checkpoints/tiny-causal); this one is "
                          "frame_local, whose streaming is exact: use reuse.prefill instead")
    if not backend.approximates_prefill:
        raise ConfigError(f"reuse.approximate_prefill: backend {backend.name!r} does not run it (torch only); "
                          "turn it off")
