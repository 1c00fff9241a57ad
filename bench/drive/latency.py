"""The latency of a closed-loop drive: this machine's wall clock, or a device's, priced call by call.

    --latency measured              the planner runs on the wall clock (runtime.budget.wall_ms)
    --latency DEVICE:PRESET         every engine call the cycle makes is priced by the roofline
                                    model (bench/common/costs.py) of PRESET's shapes on DEVICE
                                    (configs/devices.yaml), int8, and a virtual clock advances by it

A simulated cycle runs the shipped models for its decisions (tokens, acceptance, the trajectory)
and a virtual clock for its time: `PricedBackend` wraps the backend and, after each call, moves
the clock by that call's projected cost at the shape it had (the verify width, the draft's fed
tokens and k steps, the cache rows it reads). The planner's clock is that virtual clock, so the
budget cuts, the step caps and the cycle's total are in the device's time, and the same drive,
mode and spec give the same times (no wall clock is read). Host work (the prompt build, the
checks) costs nothing in simulated time. The priced prompt is PRESET's own (its camera setup from
configs/devices.yaml), and a cache row r of the tiny planner is priced as row
r - tiny prompt + preset prompt (the reasoning grows the context as it does there).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core.config import ConfigError
from runtime.budget import FakeClock, wall_ms
from runtime.config import ExpertRequest

MEASURED = "measured"
PRECISION = "int8"


def presets() -> list[str]:
    from models.config import PRESET_DIR
    return sorted(p.stem for p in Path(PRESET_DIR).glob("*.yaml"))


@dataclass
class Latency:
    """One --latency spec: `label` names it in outputs; `pricer` is None on the wall clock."""
    spec: str
    pricer: object = None

    @property
    def simulated(self) -> bool:
        return self.pricer is not None

    @property
    def label(self) -> str:
        return self.spec.replace(":", "_")

    def clock(self):
        return FakeClock() if self.simulated else wall_ms

    def wrap(self, backend, clock, with_draft: bool):
        return PricedBackend(backend, self.pricer, clock, with_draft) if self.simulated else backend


def parse_latency(spec: str, planner_cfg) -> Latency:
    """'measured' or 'DEVICE:PRESET' -> Latency (ConfigError naming the allowed devices / presets)."""
    from bench.common.devices import load_devices
    from models.config import load_preset

    spec = spec.strip()
    if spec == MEASURED:
        return Latency(spec)
    table = load_devices()
    device, _, preset = spec.partition(":")
    if device not in table.devices or not preset:
        raise ConfigError(f"--latency {spec!r}: give 'measured' or DEVICE:PRESET with DEVICE one of "
                          f"{sorted(table.devices)} and PRESET one of {presets()}")
    if preset not in presets():
        raise ConfigError(f"--latency {spec!r}: preset {preset!r} is not known; presets: {presets()}")
    return Latency(spec, Pricer(load_preset(preset), table.devices[device], table.workloads.get(preset, {}),
                                planner_cfg))


class Pricer:
    """Projected ms of each engine call of one preset on one device (memoized by shape)."""

    def __init__(self, cfg, device, workload: dict, planner_cfg):
        from bench.common.costs import Shapes, prompt_tokens

        p = planner_cfg
        self.cfg, self.dev = cfg, device
        self.images = int(workload.get("images", len(p.cameras) * p.frames))
        self.cycle_images = len(p.cameras) * p.frames      # the images of one of our cycles
        self.image_hw = tuple(workload.get("image_hw", p.image_hw))
        self.max_len = int(workload.get("max_len", p.max_len))
        self.shapes = Shapes(cfg, PRECISION, device.impl)
        self.prompt_len = prompt_tokens(cfg, self.images, self.image_hw)
        self.ms = lru_cache(maxsize=None)(self._ms)

    def _cost(self, cost) -> float:
        return cost.ms(self.dev, PRECISION)

    def _ms(self, call: str, a: int = 0, b: int = 0, c: int = 0) -> float:
        from bench.common.costs import Workload, image_block_rows, image_blocks_cost, streamed_rest

        s, L, ref = self.shapes, self.max_len, self.dev.impl == "reference"
        T = self.prompt_len
        if call == "vision":
            return self._cost(s.vision(self.images, self.image_hw))
        if call == "vision_frames":    # a of a cycle's images encoded (reuse): that share of the preset's
            n = round(self.images * a / self.cycle_images)
            return self._cost(s.vision(n, self.image_hw)) if n else 0.0
        if call == "prefill":          # a: with the draft's prefill
            ms = self._cost(s.target(T, T, L, T if ref else 1))
            return ms + (self._cost(s.draft(T, T, L, T if ref else 1)) if a else 0.0)
        if call == "image_blocks":     # a of a cycle's images' blocks (streaming prefill): that share of the preset's
            n = round(self.images * a / self.cycle_images)
            return self._cost(image_blocks_cost(s, self.cfg, n, self.image_hw))
        if call == "prefill_streamed":  # a: with the draft's prefill; b of a cycle's images computed this cycle
            n = round(self.images * b / self.cycle_images)
            w = Workload(images=self.images, image_hw=self.image_hw, max_len=L, precision=PRECISION, streamed_images=n)
            return self._cost(streamed_rest(s, self.cfg, w, T, draft=bool(a)))
        if call == "prefill_approximate":   # a: with the draft; b of a cycle's images computed in place
            n = round(self.images * b / self.cycle_images)          # one call per new block, over the prompt
            w = Workload(images=self.images, image_hw=self.image_hw, max_len=L, precision=PRECISION, streamed_images=n)
            block = image_block_rows(self.cfg, self.image_hw)
            return n * self._cost(s.target(block, T, L, 0)) + self._cost(streamed_rest(s, self.cfg, w, T, draft=bool(a)))
        if call == "draft":            # a fed tokens, then b - 1 more steps, at context c
            return self._cost(s.draft(a, c, L, 1)) + max(b - 1, 0) * self._cost(s.draft(1, c, L, 1))
        if call == "verify":           # width a at context c
            return self._cost(s.target(a, c, L, a))
        if call == "action":           # a tokens rewritten, b Euler steps, c draws; context T + a
            ms = self._cost(s.target(a, T + a, L, a if ref else 0)) if a else 0.0
            return ms + b * self._cost(s.expert(c, T + a))
        raise ValueError(f"unknown call {call!r}")


class PricedBackend:
    """The backend, with a virtual clock moved by each call's projected cost after the call.
    Everything but the engine calls (vision, or vision_frames under reuse, prefill, draft, verify,
    action) passes through unchanged. Steps take the loop's host path (draft and verify calls, each
    priced); a device-resident greedy step would run both unpriced."""

    device_greedy = False

    def __init__(self, backend, pricer: Pricer, clock: FakeClock, with_draft: bool):
        self._be, self.pricer, self.clock, self.with_draft = backend, pricer, clock, with_draft
        self.tiny_prompt = 0          # rows of this cycle's real prompt (row offsets map onto the preset's)
        self.new_blocks = 0           # image blocks computed this cycle (streaming prefill)
        self.calls: list[tuple[str, float]] = []

    def __getattr__(self, name):
        return getattr(self._be, name)

    def _charge(self, name: str, ms: float) -> None:
        self.calls.append((name, ms))
        self.clock.advance(ms)

    def _ctx(self, start: int) -> int:
        return self.pricer.prompt_len + max(start - self.tiny_prompt, 0)

    def vision(self, images):
        out = self._be.vision(images)
        self._charge("vision", self.pricer.ms("vision"))
        return out

    def vision_frames(self, images):
        out = self._be.vision_frames(images)
        self._charge("vision", self.pricer.ms("vision_frames", len(images)))
        return out

    def prefill(self, inputs, readout):
        out = self._be.prefill(inputs, readout)
        self.tiny_prompt = len(inputs.ids)
        self._charge("prefill", self.pricer.ms("prefill", int(self.with_draft)))
        return out

    def image_blocks(self, frames, ids, positions):
        out = self._be.image_blocks(frames, ids, positions)
        self.new_blocks = len(frames)
        self._charge("prefill", self.pricer.ms("image_blocks", len(frames)))
        return out

    def prefill_streamed(self, inputs, readout, blocks):
        out = self._be.prefill_streamed(inputs, readout, blocks)
        self.tiny_prompt = len(inputs.ids)
        self._charge("prefill", self.pricer.ms("prefill_streamed", int(self.with_draft), self.new_blocks))
        self.new_blocks = 0
        return out

    def prefill_approximate(self, inputs, readout, blocks):
        out = self._be.prefill_approximate(inputs, readout, blocks)
        self.tiny_prompt = len(inputs.ids)
        new = sum(b is None for b in blocks)
        self._charge("prefill", self.pricer.ms("prefill_approximate", int(self.with_draft), new))
        return out

    def draft(self, tokens, start, k, sampling=None):
        out = self._be.draft(tokens, start, k, sampling)
        self._charge("draft", self.pricer.ms("draft", len(tokens), k, self._ctx(start)))
        return out

    def verify(self, tokens, start, readout):
        out = self._be.verify(tokens, start, readout)
        self._charge(f"verify_{len(tokens)}", self.pricer.ms("verify", len(tokens), self._ctx(start)))
        return out

    def action(self, tokens, start, v0, seed, request=ExpertRequest()):
        out = self._be.action(tokens, start, v0, seed, request)
        rows = self._ctx(start) + len(tokens) - self.pricer.prompt_len
        euler = request.steps or self.pricer.cfg.expert.euler_steps
        self._charge("action", self.pricer.ms("action", rows, euler, request.samples))
        return out
