"""The fallback trajectory's concurrency, in one object: the worker, the expert lock, the pending
job of the last cycle and every bounded wait on them.

The fallback is the action expert on the target cache right after prefill (rows [0, T)), in case
the reasoning is cut or fails. `fallback` (the planner profile) says where it runs:

    worker       submitted to a one-thread worker beside the reasoning (a job)
    inline       run at once, before the reasoning (a ready trajectory)
    on_failure   run only when the cycle needs it and its worst case fits before the deadline

On a backend whose expert calls cannot overlap (`concurrent_action` False: a CPU) one lock keeps
two expert batches from running at once. The next prefill overwrites the rows a running job
reads, so a cycle first drains the last cycle's unread job. Every wait is bounded (wait_cap_ms)
and timed as a stage of its own ("fallback_wait", "expert_wait").
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout   # the builtin TimeoutError only from 3.11

import numpy as np

from runtime.trace import span

WAIT_FLOOR_MS = 50.0
HUNG_WORKER_MS = 10_000.0


class Fallback:
    def __init__(self, backend, cfg, costs):
        self.backend, self.cfg, self.costs = backend, cfg, costs     # PlannerConfig, CostModel
        self.request = cfg.expert_request()                           # every trajectory's expert settings
        self.executor = ThreadPoolExecutor(1, "fallback") if cfg.fallback == "worker" else None
        self.lock = None if backend.concurrent_action else threading.Lock()
        self.pending: Future | None = None     # the last cycle's job nobody read (it reads the cache)
        self.abandoned: list[Future] = []      # replaced jobs still running (fallback_stuck)
        self.begin_cycle()

    # --- the expert, under the lock --------------------------------------------------------------
    def run_expert(self, *args, lock_timeout: float = -1):
        """backend.action under the expert lock (when the backend cannot overlap two); a lock
        not acquired within lock_timeout s raises TimeoutError."""
        lock = self.lock      # its own: a hung call releases the lock it took, never a replacement
        if lock is None:
            with span("action"):
                return self.backend.action(*args, request=self.request)
        if not lock.acquire(timeout=lock_timeout):
            raise TimeoutError(f"the expert is busy (the fallback trajectory) after {lock_timeout:.3f} s")
        try:
            with span("action"):
                return self.backend.action(*args, request=self.request)
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

    # --- across cycles ---------------------------------------------------------------------------
    def drain(self, budget, res) -> None:
        """The next prefill overwrites the cache the last job reads: wait for it, at most
        wait_cap_ms (timed as the stage "fallback_wait"). A worker still busy then is
        abandoned and replaced (flag fallback_stuck); one that failed unseen is flagged."""
        self.abandoned = [j for j in self.abandoned if not j.done()]
        if self.abandoned and self.lock is not None:
            res.flags.append("expert_overlap")
            res.notes.append(f"{len(self.abandoned)} abandoned expert call(s) still running beside this cycle's: "
                             "this backend cannot overlap two expert calls, so their timings (and, on an "
                             "engine with shared buffers, their results) are not to be trusted")
        job, self.pending = self.pending, None
        if job is None or job.done() and job.exception() is None:
            return
        with budget.stage("fallback_wait"):
            try:
                err = job.exception(timeout=budget.wait_s(self.wait_cap_ms()))
            except FutureTimeout:
                res.flags.append("fallback_stuck")
                res.notes.append("the last cycle's fallback trajectory did not finish; its worker "
                                 "was replaced")
                self.abandoned.append(job)
                self.executor.shutdown(wait=False, cancel_futures=True)
                self.executor = ThreadPoolExecutor(1, "fallback")
                self.lock = None if self.lock is None else threading.Lock()
                return
        if err is not None:
            res.flags.append("fallback_failed")
            res.notes.append(f"the last cycle's fallback trajectory failed: {err!r}")

    def settle(self) -> None:
        """Wait for the pending job, however long (warm-up: its timings are forgotten)."""
        if self.pending is not None:
            self.pending.exception()
        self.pending = None

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    # --- one cycle -------------------------------------------------------------------------------
    def begin_cycle(self) -> None:
        self.job: Future | None = None          # the worker's run of this cycle
        self.ready: np.ndarray | None = None    # (64, 3) an inline run's trajectory
        self.seen = False                       # this cycle read the job's result (or failure)

    def end_cycle(self) -> None:
        """A job the cycle never read, or read but still running (it timed out, and may hold
        the expert lock): the next cycle drains it before its prefill, and replaces its worker
        and lock when it stays busy. Without this a hung job that held the lock kept every
        later cycle in a stop (expert_busy), never flagged, never replaced. A drained job's
        result is never read."""
        running = self.job is not None and not self.job.done()
        self.pending = self.job if (not self.seen or running) else None

    def available(self) -> bool:
        """A trajectory is there without waiting."""
        return self.ready is not None or (self.job is not None and self.job.done())

    def start(self, args: tuple, budget, res, now: bool = False) -> None:
        """The expert on the prefill cache: submitted to the worker, or run here (inline, or `now`
        when on_failure needs it; timed as a trajectory stage)."""
        if self.cfg.fallback == "on_failure" and not now:
            return
        try:
            if self.executor is not None and not now:
                self.job = self.executor.submit(self.run_expert, *args)
            else:
                with budget.stage("fallback", measure="trajectory"):
                    self.ready = self.run_expert(*args, lock_timeout=budget.wait_s(self.wait_cap_ms()))
        except Exception as e:
            res.flags.append("fallback_failed")
            res.notes.append(f"fallback: {e!r}")

    def start_on_failure(self, args: tuple, budget, res) -> None:
        """fallback on_failure, none started: the prefill trajectory now, if its worst case fits
        before the deadline - margin."""
        if self.cfg.fallback != "on_failure" or self.job is not None or self.ready is not None:
            return
        if budget.cfg.enabled and budget.left_ms() < budget.reserve_ms():
            res.flags.append("no_time_for_fallback")
            return
        self.start(args, budget, res, now=True)

    def wait_expert_idle(self, budget) -> None:
        """On a backend whose expert calls cannot overlap, wait (timed as "expert_wait", bounded
        by the time left before the reserve) for a running job; TimeoutError if it stays busy."""
        if self.lock is None:
            return
        with budget.stage("expert_wait"):
            got = self.lock.acquire(timeout=budget.wait_s(self.wait_cap_ms()))
        if not got:
            raise TimeoutError("the expert stayed busy with the fallback trajectory")
        self.lock.release()

    def result(self, budget, res) -> np.ndarray | None:
        """This cycle's fallback trajectory, waiting for the job at most until the deadline less
        the margin (bounded even without a budget: a stuck worker must not hold the cycle)."""
        self.seen = True
        if self.job is None:
            return self.ready
        cap = self.wait_cap_ms()
        timeout = max(budget.left_ms() - self.cfg.budget.margin_ms, 0.0) if self.cfg.budget.enabled else cap
        try:
            with budget.stage("fallback_wait"):
                return self.job.result(timeout=timeout / 1e3)
        except Exception as e:        # timed out or failed: the comfortable stop follows
            res.notes.append(f"fallback: {e!r}")
            return None
