"""The Planner: what a vehicle stack calls once per cycle.

    planner = Planner(backend, tokenizer, PlannerConfig(...))
    result = planner.plan(images, history)      # images (4, 2, H, W, 3) uint8 or {camera: (2, H, W, 3)}

A cycle: check inputs -> vision -> prefill -> [fallback trajectory from the prefill cache:
in a worker beside the reasoning, inline, or only on failure] -> reasoning (speculative, under
the budget) -> <|cot_end|> -> trajectory (action expert, or 128 trajectory tokens) -> output
checks -> result. Every failure ends in a result with an error or flags and, whenever the ego
speed is known, a trajectory that passed the checks (reasoning's, else the prefill fallback,
else a comfortable stop). Every wait (the last cycle's fallback, a busy expert) is bounded and
timed as a stage of its own. On a backend whose expert calls cannot overlap (CPU:
`concurrent_action` False) one lock keeps two expert batches from running at once.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from prompt.config import ConfigError
from prompt.layout import build_prompt
from prompt.positions import mrope_position_ids
from prompt.trajectory import saturate_history
from runtime.acceptance import trajectory_range_ids
from runtime.adaptive import AcceptanceRate, StepPolicy
from runtime.backend import PrefillInputs
from runtime.budget import CostModel, CycleBudget, wall_ms
from runtime.checks import check_history, check_trajectory, comfortable_stop
from runtime.config import PlannerConfig
from runtime.cycle import CycleResult, InputError, check_images, future_from_tokens
from runtime.loop import DecodeState, DecodeStats, GreedyRule, RelaxedRule, SamplingRule, decode
from runtime.trace import span

FUTURE_TOKENS = 128
WAIT_FLOOR_MS = 50.0
HUNG_WORKER_MS = 10_000.0


class Planner:
    def __init__(self, backend, tokenizer, config: PlannerConfig | None = None, clock=wall_ms):
        self.backend, self.tok = backend, tokenizer
        self.cfg = config or PlannerConfig()
        self.clock = clock
        if backend.vocab_size != len(tokenizer):
            raise ConfigError(f"backend vocab_size={backend.vocab_size} does not match the "
                              f"tokenizer ({len(tokenizer)} tokens)")
        spec = self.cfg.spec
        if self.cfg.trajectory == "tokens" and not tokenizer.token_trajectory:
            raise ConfigError(f"trajectory='tokens' needs a layout with x/y trajectory tokens; the "
                              f"{tokenizer.layout!r} layout's trajectory comes from the expert")
        if backend.exact_only and (spec.decoding != "greedy" or spec.relax_r):
            raise ConfigError(f"backend {backend.name!r} accepts tokens inside its engine: only "
                              "decoding='greedy' with relax_r=0 (exact acceptance) is available")
        self.costs = CostModel(self.cfg.budget)     # learnt across cycles: the worst cases
        self.rates = {"reasoning": AcceptanceRate(), "trajectory": AcceptanceRate()}
        self.rng = np.random.default_rng(spec.seed)
        self.range_ids = trajectory_range_ids(tokenizer)
        self.executor = ThreadPoolExecutor(1, "fallback") if self.cfg.fallback == "worker" else None
        self.expert_lock = None if backend.concurrent_action else threading.Lock()
        self.cycles = 0
        self.last_v0: float | None = None
        self.pending = None           # the last cycle's fallback (it reads the target cache)
        self.premise: dict | None = None

    def run_expert(self, *args, lock_timeout: float = -1):
        """backend.action under the expert lock (when the backend cannot overlap two); a lock
        not acquired within lock_timeout s raises TimeoutError."""
        lock = self.expert_lock
        if lock is None:
            with span("action"):
                return self.backend.action(*args, **self.action_options())
        if not lock.acquire(timeout=lock_timeout):
            raise TimeoutError(f"the expert is busy (the fallback trajectory) after {lock_timeout:.3f} s")
        try:
            with span("action"):
                return self.backend.action(*args, **self.action_options())
        finally:
            lock.release()

    def wait_cap_ms(self) -> float:
        """The longest any wait on the expert may block (ms), budget or not: a few trajectories'
        worst case, at least WAIT_FLOOR_MS (thread wake-ups on a loaded machine). With a budget
        the deadline bounds it further (CycleBudget.wait_s). With the budget off there is no
        deadline to protect, and the worst case may still be the profile's prior (an Orin prior
        on a CPU): the cap then only keeps a hung worker from blocking forever (HUNG_WORKER_MS)."""
        if self.cfg.budget.budget_ms <= 0:
            return HUNG_WORKER_MS
        return max(4 * self.costs.worst("trajectory"), WAIT_FLOOR_MS)

    def action_options(self) -> dict:
        c = self.cfg
        return {"samples": c.trajectory_samples, "steps": c.euler_steps, "combine": c.trajectory_combine}

    def _drain_fallback(self, budget: CycleBudget, res: CycleResult) -> None:
        """The next prefill overwrites the cache the last fallback reads: wait for it, at most
        wait_cap_ms (timed as the stage "fallback_wait"). A worker still busy then is
        abandoned and replaced (flag fallback_stuck); one that failed unseen is flagged."""
        job, self.pending = self.pending, None
        if job is None or job.done() and job.exception() is None:
            return
        with budget.stage("fallback_wait"):
            try:
                err = job.exception(timeout=budget.wait_s(self.wait_cap_ms()))
            except TimeoutError:
                res.flags.append("fallback_stuck")
                res.notes.append("the last cycle's fallback trajectory did not finish; its worker "
                                 "was replaced")
                self.executor.shutdown(wait=False, cancel_futures=True)
                self.executor = ThreadPoolExecutor(1, "fallback")
                self.expert_lock = None if self.expert_lock is None else threading.Lock()
                return
        if err is not None:
            res.flags.append("fallback_failed")
            res.notes.append(f"the last cycle's fallback trajectory failed: {err!r}")

    def warmup(self, images, history, cycles: int = 1) -> dict:
        """Run cycles whose timings are then forgotten (first calls: allocation, lazy init, CUDA
        graph capture), then one measured cycle, and check the budget's premise
        W(vision) + W(prefill) + W(trajectory) + margin <= budget on its timings (returned, and
        kept in `self.premise`; a cycle that starts with it broken is flagged budget_too_small)."""
        for _ in range(cycles):
            self.plan(images, history, scene="warmup")
        self._settle()
        self.costs.reset()
        self.plan(images, history, scene="warmup")
        self._settle()
        self.premise = self.costs.premise(self.cfg.budget)
        self.cycles = 0
        return self.premise

    def _settle(self) -> None:
        if self.pending is not None:
            self.pending.exception()
        self.pending = None

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)
        self.backend.close()

    def plan(self, images, history, scene: str | None = None) -> CycleResult:
        """One planning cycle; never raises (bad input, a backend fault, even a fault of the
        planner itself end in an error and, when the speed is known, a stop)."""
        self.cycles += 1
        budget = CycleBudget(self.cfg.budget, self.costs, self.clock)
        res = CycleResult(cycle=self.cycles, scene=scene)
        try:
            self._drain_fallback(budget, res)
            images, v0 = self._check_inputs(images, history, res)
        except InputError as e:
            return self._fail_inputs(res, budget, str(e), "input_error")
        except Exception as e:
            return self._fail_inputs(res, budget, f"planner fault: {e!r}", "planner_error")
        cycle = _Cycle(self, res, budget, v0, int(self.rng.integers(2**31)))
        try:
            cycle.run(images, history)
        except Exception as e:
            return self._fail_inputs(res, budget, f"planner fault: {e!r}", "planner_error")
        finally:     # a running fallback the cycle never read: the next cycle waits for it
            unread = not cycle.fallback_seen and hasattr(cycle.fallback, "done")
            self.pending = cycle.fallback if unread else None
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
        self.last_v0 = v0
        return check_images(images, self.cfg), v0

    def _fail_inputs(self, res: CycleResult, budget: CycleBudget, error: str, flag: str) -> CycleResult:
        res.error, res.flags = error, res.flags + [flag]
        if self.last_v0 is not None:   # the ego speed is known (now or from the last cycle)
            res.trajectory, res.source = comfortable_stop(self.last_v0, self.cfg.checks), "stop"
        return self._finish(res, budget)


class _Cycle:
    """The stages of one cycle (kept apart from Planner so each stays a short function)."""

    def __init__(self, planner: Planner, res: CycleResult, budget: CycleBudget, v0: float, seed: int):
        self.p, self.res, self.budget, self.v0, self.seed = planner, res, budget, v0, seed
        self.cfg, self.tok, self.be = planner.cfg, planner.tok, planner.backend
        self.fallback = None          # Future or ready (64, 3) array of the prefill trajectory
        self.fallback_seen = False    # its result (or failure) was read by this cycle
        self.prefilled = False        # rows [0, prompt_len) of the target cache are this cycle's

    def run(self, images, history) -> None:
        try:
            inputs = self._prompt(images, history)
            with self.budget.stage("vision"):
                self.be.vision(images)
            state = self._prefill(inputs)
            self.prefilled = True
        except InputError as e:
            self._deliver(None, error=str(e), flag="input_error")
            return
        except Exception as e:        # a backend fault before any trajectory exists
            self._deliver(None, error=f"backend failed before reasoning: {e!r}", flag="backend_error")
            return
        self._start_fallback()
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

    def _final_trajectory(self, state: DecodeState) -> np.ndarray:
        """The trajectory stage; on a backend whose expert calls cannot overlap, first wait (timed
        as "expert_wait", bounded by the time left before the reserve) for a running fallback."""
        if self.cfg.trajectory == "expert" and self.p.expert_lock is not None:
            lock = self.p.expert_lock
            with self.budget.stage("expert_wait"):
                got = lock.acquire(timeout=self.budget.wait_s(self.p.wait_cap_ms()))
            if not got:
                raise TimeoutError("the expert stayed busy with the fallback trajectory")
            lock.release()
        with self.budget.stage("trajectory"):
            return self._trajectory(state)

    def _no_time_left(self) -> bool:
        """The final trajectory would end after the deadline but the prefill one is ready."""
        ready = isinstance(self.fallback, np.ndarray) or (self.fallback is not None and self.fallback.done())
        return self.cfg.budget.enabled and ready and self.budget.left_ms() < self.budget.reserve_ms()

    def _prompt(self, images, history) -> PrefillInputs:
        """Prompt ids and M-RoPE positions; InputError if the history or the length is bad."""
        grid, merge = self.be.vision_grid(images.shape)
        n_tokens = [int(t * h * w) // merge**2 for t, h, w in grid]
        try:
            tokenized, saturated = saturate_history(history)
            prompt = build_prompt(self.tok, n_tokens, tokenized)
        except ValueError as e:
            raise InputError(f"ego history cannot be tokenized: {e}") from None
        if saturated:
            self.res.flags.append("history_saturated")
            self.res.notes.append("the ego history moves faster than its tokens can say (~31 m/s, "
                                  "1.2 rad/s): tokenized at that limit; the expert uses the exact speed")
        room = len(prompt.ids) + self.cfg.max_reasoning_tokens + self._reserve()
        if room > self.be.max_len:
            raise InputError(f"prompt of {len(prompt.ids)} tokens + {self.cfg.max_reasoning_tokens} "
                             f"reasoning + trajectory tokens needs {room} cache rows; the backend "
                             f"has {self.be.max_len}")
        pos, delta = mrope_position_ids(prompt.ids, grid, merge, self.tok.image_pad, self.tok.vision_start)
        self.prompt_len = self.res.prompt_len = len(prompt.ids)
        return PrefillInputs(prompt.ids, pos, delta, prompt.image_spans)

    def _prefill(self, inputs: PrefillInputs) -> DecodeState:
        rule = self._rule("reasoning")
        self.be.set_mask(self.tok.text_mask())       # trajectory tokens are masked while reasoning
        with self.budget.stage("prefill"):
            row = self.be.prefill(inputs, rule.readout)
        return DecodeState.after_prefill(inputs.ids, rule.first(row))

    def _start_fallback(self, now: bool = False) -> None:
        """Expert on the cache right after prefill (rows [0, T)): submitted to the worker, or run
        here (inline, or `now` when on_failure needs it; timed as a trajectory stage)."""
        if self.cfg.fallback == "on_failure" and not now:
            return
        args = (np.zeros(0, np.int64), self.prompt_len, self.v0, self.seed)
        try:
            if self.p.executor is not None and not now:
                self.fallback = self.p.executor.submit(self.p.run_expert, *args)
            else:
                with self.budget.stage("fallback", measure="trajectory"):
                    self.fallback = self.p.run_expert(*args, lock_timeout=self.budget.wait_s(self.p.wait_cap_ms()))
        except Exception as e:
            self.res.flags.append("fallback_failed")
            self.res.notes.append(f"fallback: {e!r}")

    def _rule(self, phase: str):
        spec = self.cfg.spec
        if spec.decoding == "sample":
            return SamplingRule(spec.temperature, spec.top_p, self.p.rng)
        if phase == "trajectory" and spec.relax_r:
            return RelaxedRule(self.p.range_ids, spec.relax_r)
        return GreedyRule()

    def _policy(self, phase: str) -> StepPolicy:
        """Reasoning steps are capped by the budget; trajectory tokens (token mode) are not,
        their whole decode is the trajectory stage. Each phase keeps its acceptance rate."""
        spec, reasoning = self.cfg.spec, phase == "reasoning"
        return StepPolicy(self.p.costs, spec.k, spec.adaptive and spec.k > 0, spec.k_max,
                          cap=self.budget.cap if reasoning else None, rate=self.p.rates[phase])

    def _reserve(self) -> int:
        """Cache rows kept free after the reasoning: <|cot_end|> and the layout's conditioning
        tail (+ <|traj_future_start|> and the 128 trajectory tokens when decoded as tokens)."""
        if self.cfg.trajectory == "expert":
            return 1 + len(self.tok.conditioning.tail(self.tok))
        return 2 + FUTURE_TOKENS

    def _reason(self, state: DecodeState) -> None:
        stats, tok = DecodeStats(), self.tok
        with self.budget.stage("reasoning"):
            reason = decode(self.be, state, self._rule("reasoning"), self._policy("reasoning"),
                            stop_ids=(tok.cot_end,), limit=self.prompt_len + self.cfg.max_reasoning_tokens,
                            reserve=self._reserve(), clock=self.budget.clock, stats=stats)
        self.budget.end_reasoning()
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
            return self.p.run_expert(coc, self.prompt_len, self.v0, self.seed)
        state.force([self.tok.traj_future_start])
        xy = np.zeros((2, len(self.tok)), bool)                        # x bin, y bin, x bin, ...
        xy[0, self.tok.fut_x_ids.start:self.tok.fut_x_ids.stop] = True
        xy[1, self.tok.fut_y_ids.start:self.tok.fut_y_ids.stop] = True
        self.be.set_mask(xy, first=len(state.seq))
        stats = DecodeStats()
        decode(self.be, state, self._rule("trajectory"), self._policy("trajectory"), stop_ids=(),
               limit=len(state.seq) + FUTURE_TOKENS, clock=self.budget.clock, stats=stats)
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
        if self.fallback is None and self.prefilled and self.cfg.fallback == "on_failure":
            self._fallback_on_failure()
        fb = self._fallback_result()
        if fb is not None and not check_trajectory(fb, self.v0, checks):
            res.trajectory, res.source = np.asarray(fb, np.float32), "prefill"
            return
        res.trajectory, res.source = comfortable_stop(self.v0, checks), "stop"

    def _fallback_on_failure(self) -> None:
        """The prefill trajectory now, if its worst case fits before the deadline - margin."""
        budget = self.budget
        if budget.cfg.enabled and budget.left_ms() < budget.reserve_ms():
            self.res.flags.append("no_time_for_fallback")
            return
        self._start_fallback(now=True)

    def _fallback_result(self):
        self.fallback_seen = True
        if self.fallback is None or isinstance(self.fallback, np.ndarray):
            return self.fallback
        # bounded even without a budget: a stuck worker must not hold the cycle
        cap = self.p.wait_cap_ms()
        timeout = max(self.budget.left_ms() - self.cfg.budget.margin_ms, 0.0) if self.cfg.budget.enabled else cap
        try:
            with self.budget.stage("fallback_wait"):
                return self.fallback.result(timeout=timeout / 1e3)
        except Exception as e:        # timed out or failed: the comfortable stop follows
            self.res.notes.append(f"fallback: {e!r}")
            return None
