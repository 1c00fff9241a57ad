"""The stages of one planning cycle (runtime.planner.Planner.plan runs one `Cycle` per call).

    prompt -> vision (reused frames: runtime/reuse.py) -> prefill -> fallback start (runtime/fallback.py)
    -> reasoning (runtime/loop.py decode under the budget) -> trajectory -> checks -> delivery

Each stage is timed by the cycle's CycleBudget; every failure ends in `_deliver`, which always
leaves a checked trajectory (reasoning's, else the prefill fallback, else a comfortable stop).
"""
from __future__ import annotations

import numpy as np

from runtime.adaptive import StepPolicy
from runtime.backend import PrefillInputs
from runtime.budget import CycleBudget
from runtime.checks import check_trajectory, comfortable_stop
from runtime.cycle import (FUTURE_TOKENS, CycleResult, InputError, cycle_prompt, future_from_tokens,
                           future_mask, reserve_rows)
from runtime.loop import DecodeState, DecodeStats, decode, make_rule
from runtime.reuse import CycleLookup, stream_blocks
from runtime.trace import span


class Cycle:
    """The stages of one cycle of `planner` (a runtime.planner.Planner: its backend, tokenizer,
    config, costs, acceptance rates, reuse stores and fallback)."""

    def __init__(self, planner, res: CycleResult, budget: CycleBudget, v0: float, seed: int):
        self.p, self.res, self.budget, self.v0, self.seed = planner, res, budget, v0, seed
        self.cfg, self.tok, self.be = planner.cfg, planner.tok, planner.backend
        self.fallback = planner.fallback
        self.prefilled = False        # rows [0, prompt_len) of the target cache are this cycle's

    def run(self, images, history, keys=None) -> None:
        try:
            with self.budget.stage("prompt"):     # host work: ~37 ms a cycle counted by no stage before
                inputs = self._prompt(images, history)
            with self.budget.stage("vision"):
                self._vision(images, keys)
            state = self._prefill(inputs)
            self.prefilled = True
        except InputError as e:
            self._deliver(None, error=str(e), flag="input_error")
            return
        except Exception as e:        # a backend fault before any trajectory exists
            self._deliver(None, error=f"backend failed before reasoning: {e!r}", flag="backend_error")
            return
        self.fallback.start(self._fallback_args(), self.budget, self.res)
        try:
            self._reason(state)
            if self._no_time_left():
                self._deliver(None, flag="budget_exhausted")
                return
            traj = self._final_trajectory(state)
        except TimeoutError as e:     # the expert stayed busy with the fallback
            self._deliver(None, error=str(e), flag="expert_busy")
            return
        except Exception as e:
            self._deliver(None, error=f"reasoning or trajectory failed: {e!r}", flag="reasoning_failed")
            return
        self._deliver(traj)

    def _vision(self, images, keys) -> None:
        cache = self.p.vision_cache
        if cache is None:
            self.be.vision(images)
            return
        self.res.reuse["vision"] = got = cache.encode(self.be, images, keys)
        if got["changed"]:
            self.res.flags.append("frame_changed")
            self.res.notes.append(f"{got['changed']} frame(s) came again under a known (camera, time) "
                                  "with other pixels: encoded afresh, the old features dropped")

    def _final_trajectory(self, state: DecodeState) -> np.ndarray:
        """The trajectory stage, after the expert is free of a running fallback (bounded)."""
        if self.cfg.trajectory == "expert":
            self.fallback.wait_expert_idle(self.budget)
        with self.budget.stage("trajectory"):
            return self._trajectory(state)

    def _no_time_left(self) -> bool:
        """The final trajectory would end after the deadline but the prefill one is ready."""
        ready = self.fallback.available()
        return self.cfg.budget.enabled and ready and self.budget.left_ms() < self.budget.reserve_ms()

    def _prompt(self, images, history) -> PrefillInputs:
        inputs = cycle_prompt(self.be, self.tok, images.shape, history, self.res,
                              self.cfg.max_reasoning_tokens + reserve_rows(self.cfg, self.tok))
        self.prompt_len = len(inputs.ids)
        return inputs

    def _prefill(self, inputs: PrefillInputs) -> DecodeState:
        rule = self._rule("reasoning")
        self.be.set_mask(self.tok.text_mask())       # trajectory tokens are masked while reasoning
        with self.budget.stage("prefill"):
            if self.cfg.reuse.prefill:
                blocks, self.res.reuse["prefill"] = stream_blocks(self.be, self.p.vision_cache.frames, inputs)
                row = self.be.prefill_streamed(inputs, rule.readout, blocks)
            elif self.cfg.reuse.approximate_prefill:
                row = self._approximate_prefill(inputs, rule.readout)
            else:
                row = self.be.prefill(inputs, rule.readout)
        return DecodeState.after_prefill(inputs.ids, rule.first(row))

    def _approximate_prefill(self, inputs: PrefillInputs, readout: str):
        """reuse.approximate_prefill (runtime/config.py): kept frames' K/V shifted, new frames computed
        in place; flagged on every cycle that kept one."""
        frames = self.p.vision_cache.frames
        row, new = self.be.prefill_approximate(inputs, readout, [f.blocks for f in frames])
        kept = sum(f.blocks is not None for f in frames)
        for f, b in zip(frames, new):
            f.blocks = f.blocks if b is None else b
        self.res.reuse["prefill"] = {"reused": kept, "computed": len(frames) - kept}
        if kept:
            self.res.flags.append("approximate_prefill")
            self.res.notes.append(f"approximate prefill: {kept} frame(s) kept with K/V computed in an earlier "
                                  "cycle's context (a causal target); the reasoning may differ from a full prefill")
        return row

    def _fallback_args(self) -> tuple:
        """The expert on the cache right after prefill: rows [0, prompt_len), no tokens written."""
        return (np.zeros(0, np.int64), self.prompt_len, self.v0, self.seed)

    def _rule(self, phase: str):
        return make_rule(self.cfg.spec, phase, self.p.rng, self.p.range_ids)

    def _policy(self, phase: str) -> StepPolicy:
        """Reasoning steps are fitted by the budget (decode's `budget`); trajectory tokens (token mode) are not,
        their whole decode is the trajectory stage. Each phase keeps its acceptance rate."""
        spec = self.cfg.spec
        return StepPolicy(self.p.costs, spec.k, spec.adaptive and spec.k > 0, spec.k_max,
                          rate=self.p.rates[phase], free_rate=self.p.rates["lookup"], tree=spec.tree_shape,
                          tree_tau=self.p.tree_tau)

    def _reason(self, state: DecodeState) -> None:
        stats, tok, store = DecodeStats(), self.tok, self.p.lookup
        lookup = None if store is None else CycleLookup(store, self.prompt_len - 1)   # from <|cot_start|>
        with self.budget.stage("reasoning"):
            reason = decode(self.be, state, self._rule("reasoning"), self._policy("reasoning"),
                            stop_ids=(tok.cot_end,), limit=self.prompt_len + self.cfg.max_reasoning_tokens,
                            reserve=reserve_rows(self.cfg, self.tok), clock=self.budget.clock, stats=stats,
                            observer=self.p.observer, lookup=lookup, budget=self.budget)
        self.budget.end_reasoning()
        if store is not None:     # what the target accepted (a forced <|cot_end|> is not)
            store.remember(state.seq[self.prompt_len - 1:])
            self.res.reuse["lookup"] = {"proposed": stats.looked_up, "accepted": stats.looked_up_accepted}
        if reason != "stop":      # close the reasoning: <|cot_end|> forced
            self.res.flags.append("budget_cut" if reason == "budget" else "reasoning_truncated")
            state.force([tok.cot_end])
        self.res.reasoning_ids = state.seq[self.prompt_len:-1]
        self.res.reasoning = tok.decode(self.res.reasoning_ids)
        self.res.stop_reason = reason
        self.res.decode = stats.to_json()

    def _trajectory(self, state: DecodeState) -> np.ndarray:
        """Expert on the cache through <|cot_end|> and the layout's conditioning tail (upstream
        Alpamayo-R1: one row more, <|traj_future_start|>), or <|traj_future_start|> + 128 decoded
        trajectory tokens (relaxed acceptance if asked).

        The expert's cache rows of the reasoning are rewritten in one pass from the final text:
        rows written by verify passes of different widths differ from plain decoding's in the
        last fp32 bits, and the expert amplifies such differences (1e-6 in the cache moved a
        trajectory by ~0.3 m). Rewritten, the trajectory is a function of the prompt and the
        reasoning text alone, so speculative and plain decoding deliver the same waypoints."""
        if self.cfg.trajectory == "expert":
            tail = self.tok.conditioning.tail(self.tok)
            coc = np.asarray(list(state.seq[self.prompt_len:]) + tail, np.int64)
            return self.fallback.run_expert(coc, self.prompt_len, self.v0, self.seed)
        state.force([self.tok.traj_future_start])
        self.be.set_mask(future_mask(self.tok), first=len(state.seq))
        stats = DecodeStats()
        decode(self.be, state, self._rule("trajectory"), self._policy("trajectory"), stop_ids=(),
               limit=len(state.seq) + FUTURE_TOKENS, clock=self.budget.clock, stats=stats,
               observer=self.p.observer)
        self.res.decode["trajectory"] = stats.to_json()
        return future_from_tokens(self.tok, state.seq[-FUTURE_TOKENS:])

    def _deliver(self, traj, error: str | None = None, flag: str | None = None) -> None:
        """Check the trajectory; replace a failing or missing one: prefill fallback, else stop."""
        res, checks = self.res, self.cfg.checks
        if flag:
            res.flags.append(flag)
        if error:
            res.error = error
        if traj is not None:
            with span("checks"):
                res.checks = check_trajectory(traj, self.v0, checks)
            if not res.checks:   # the reasoning closed by itself, or was cut (budget, length)
                res.trajectory = np.asarray(traj, np.float32)
                res.source = "reasoning" if res.stop_reason == "stop" else "cut_reasoning"
                return
            res.flags.append("check_failed")
        res.flags.append("fallback")
        if self.prefilled:
            self.fallback.start_on_failure(self._fallback_args(), self.budget, res)
        fb = self.fallback.result(self.budget, res)
        if fb is not None and not check_trajectory(fb, self.v0, checks):
            res.trajectory, res.source = np.asarray(fb, np.float32), "prefill"
            return
        res.trajectory, res.source = comfortable_stop(self.v0, checks), "stop"
