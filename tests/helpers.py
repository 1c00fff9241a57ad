"""Helpers that several test modules share (tests never import each other): the greedy rule that
records top-2 gaps and the tie-aware equality check of speculative against plain decoding; the
short drives and planner profiles of the reuse and streaming tests."""
import dataclasses

import numpy as np

from runtime.config import PlannerConfig, ReuseConfig, load_planner_config, with_overrides
from runtime.loop import GreedyRule
from scenes.config import DT, FRAME_OFFSETS

TIE = 1e-5            # a top-2 gap under this may flip with the float rounding of another verify width
CYCLES = 7            # the t - 0.5 s frames of cycles 5.. are the t frames of cycles 0..


class GapRule(GreedyRule):
    """Greedy, reading logits to record the top-2 gap of every chosen token (the plain reference)."""
    readout = "logits"
    exact_greedy = False        # accepts on the host, where it records the gaps

    def __init__(self):
        self.gaps = []

    def _pick(self, rows):
        top2 = np.sort(rows, axis=-1)[:, -2:]
        self.gaps += list(top2[:, 1] - top2[:, 0])
        return rows.argmax(-1)

    def first(self, row):
        return int(self._pick(row)[0])

    def accept(self, draft, q, rows):
        return 0, int(self._pick(rows)[0])


def check_equal(out, plain, gaps, where, ties):
    """A mismatch is a bug unless the target's top-2 gap at the divergence is < TIE (a near-tie
    that float rounding of another verify width may flip); such a tie is appended to `ties`."""
    if out == plain:
        return
    j = next((i for i, (a, b) in enumerate(zip(out, plain)) if a != b), min(len(out), len(plain)))
    assert j < len(gaps) and gaps[j] < TIE, f"{where}: diverges at token {j} (gap {gaps[j] if j < len(gaps) else None})"
    ties.append(where)


def frames_of(cycle, cams):
    """The frame identities of a drive cycle: (camera, capture time) per camera and frame offset."""
    return [[(cam, cycle.time - k * DT) for k in FRAME_OFFSETS] for cam in cams]


def reuse_profile(max_reasoning_tokens: int, **reuse) -> PlannerConfig:
    """The cpu profile with the budget off, a reasoning cap, and reuse set to ReuseConfig(**reuse)
    (every reuse field not named at its default, whatever the profile sets)."""
    changes = {"budget": {"budget_ms": 0.0}, "max_reasoning_tokens": max_reasoning_tokens,
               "reuse": dataclasses.asdict(ReuseConfig(**reuse))}
    return with_overrides(load_planner_config("cpu"), changes, "test profile")
