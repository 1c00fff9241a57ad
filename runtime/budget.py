"""The latency budget of one planning cycle, and the cost model that predicts its worst cases.

Stages: vision -> prefill -> reasoning (speculative steps) -> trajectory. With deadline D =
cycle start + budget_ms, W(x) the predicted worst case of x (CostModel) and
R = W(trajectory) + margin, the reasoning may take a step of draft length k only if

    now + W(step k) + R <= D                                          (checked before every step)

and takes the largest k <= the wanted k that fits; when not even a plain step (k = 0) fits,
reasoning is closed (<|cot_end|> forced) and the trajectory runs. Guarantee: if every step
and the trajectory stay within their predicted worst cases, and vision + prefill + R <= budget
(the premise, checked at warm-up and on every cycle), the trajectory is delivered by D - margin.
When either fails the cycle is flagged (`worst_case_exceeded`, `budget_too_small`, `miss`);
it is never silent. The clock is injectable: tests use FakeClock.

Worst cases age: W(x) = factor x peak(x), where the peak is the largest time seen and, once
per cycle, decays toward the running mean (peak <- mean + decay (peak - mean)). A slow
trajectory stage therefore raises the reserve for a few cycles, never for good.
"""
from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager

import numpy as np

from runtime import trace
from runtime.config import BudgetConfig
from runtime.step import Chain, CostKey, Lookup, TreeStep, shorten

MEASURED_STAGES = ("prompt", "vision", "prefill", "trajectory")


def tree_key(shape) -> CostKey:
    """CostModel key of a token tree's whole draft."""
    return CostKey("tree_draft", shape)


def draft_key(k: int) -> CostKey:
    """CostModel key of one draft call that proposes k tokens."""
    return CostKey("draft_call", int(k))


def verify_key(width: int) -> CostKey:
    """CostModel key of a verify pass of `width` tokens."""
    return CostKey("verify", int(width))


def overhead_key(shape=None):
    """CostModel key of what a step costs besides its draft and verify calls (acceptance, cache
    bookkeeping, the loop): "overhead" for a chain step, ("overhead", shape) for a tree's."""
    return "overhead" if shape is None else CostKey("overhead", shape)


def _kind(key) -> str:
    """A key's kind: a sized key's first field, or the plain name."""
    return key[0] if isinstance(key, tuple) else key


def wall_ms() -> float:
    """Monotonic clock in ms (the default)."""
    return time.perf_counter() * 1e3


class FakeClock:
    """A clock that moves only when told: `clock()` reads it, `clock.advance(ms)` moves it."""

    def __init__(self, start_ms: float = 0.0):
        self.t = float(start_ms)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> None:
        with self._lock:
            self.t += float(ms)


class CostModel:
    """Per-op costs in ms: a running mean (for speed) and an ageing peak (for worst cases).

    Keys (runtime.step.CostKey for the sized ones): "draft" (one draft step: a call's time over its
    k, the budget's worst case per token), draft_key(k) (a whole draft call of k tokens: the
    adaptive choice's draft_line), verify_key(width), tree_key(shape), "overhead" (a step's cost
    besides its draft and verify calls; overhead_key), "vision", "prefill", "trajectory",
    "lookup" (one lookup search: with `searches`, every step's cost carries the search that
    precedes the next step, so the budget keeps room for it). Unmeasured verify widths are
    extrapolated linearly from the measured ones.

    The adaptive choice prices steps by two lines, draft_line (a draft call of k tokens) and
    verify_line (a verify pass of a width), each fitted to every call measured, each call's weight
    fading by `line_decay` with every later call of its kind (_Sums)."""

    def __init__(self, cfg: BudgetConfig, ema: float = 0.2, searches: bool = False, line_decay: float = 0.98):
        self.cfg, self.ema, self.searches = cfg, ema, bool(searches)
        self.mean: dict = {}
        self.peak: dict = {}
        self._fits: dict = {}      # (table name, width) -> extrapolation; cleared on every change
        self._sums = {"verify": _Sums(line_decay), "draft": _Sums(line_decay)}   # (width or k, ms) of every call

    def observe(self, key, ms: float) -> None:
        ms = float(ms)
        old = self.mean.get(key)
        self.mean[key] = ms if old is None else (1 - self.ema) * old + self.ema * ms
        self.peak[key] = max(self.peak.get(key, ms), ms)
        if _kind(key) in ("verify", "draft_call"):
            self._sums["verify" if _kind(key) == "verify" else "draft"].add(key[1], ms)
        self._fits.clear()

    def age(self) -> None:
        """Once per cycle: every peak moves toward its mean, peak <- mean + decay (peak - mean)."""
        d = self.cfg.peak_decay
        for key, peak in self.peak.items():
            self.peak[key] = self.mean[key] + d * (peak - self.mean[key])
        self._fits.clear()

    def reset(self) -> None:
        """Forget every measurement (after a warm-up cycle): the priors apply again."""
        self.mean.clear(), self.peak.clear(), self._fits.clear()
        self._sums["verify"].clear(), self._sums["draft"].clear()

    def prior(self, key) -> float:
        c = self.cfg
        kind = _kind(key)
        if kind == "verify":
            return c.prior_verify_ms + c.prior_verify_per_token_ms * (key[1] - 1)
        if kind == "tree_draft":        # depth x a draft step
            return key[1].depth * self.worst("draft")
        if kind in ("overhead", "draft_call"):    # until measured: none; a call: k draft steps
            return 0.0 if kind == "overhead" else key[1] * self.worst("draft")
        return {"draft": c.prior_draft_step_ms, "vision": c.prior_vision_ms, "prompt": c.prior_prompt_ms,
                "prefill": c.prior_prefill_ms, "trajectory": c.prior_trajectory_ms, "lookup": c.prior_lookup_ms}[key]

    def expected(self, key) -> float:
        if key in self.mean:
            return self.mean[key]
        if _kind(key) == "verify":
            return self._extrapolate("mean", key[1]) or self.prior(key)
        return self.prior(key)

    def worst(self, key) -> float:
        """Predicted worst case: factor x the ageing peak, or the prior (itself a worst case)."""
        f = self.cfg.worst_case_factor
        if key in self.peak:
            return f * self.peak[key]
        if _kind(key) == "verify":
            guess = self._extrapolate("peak", key[1])
            return max(f * guess, self.prior(key)) if guess else self.prior(key)
        return self.prior(key)

    def step_worst(self, k: int, pending: int = 1, draft: bool = True) -> float:
        """draft=False: a lookup proposal, no draft step (only the verify pass costs); with
        `searches` the next step's lookup search is part of this one's cost."""
        search = self.worst("lookup") if self.searches else 0.0
        return k * self.worst("draft") * draft + self.worst(verify_key(pending + k)) + search + self.worst("overhead")

    def step_expected(self, k: int, pending: int = 1, draft: bool = True) -> float:
        """The expected cost of a step, for choosing one (the adaptive policy): the verify pass from
        verify_line, not from that width's own running mean."""
        search = self.expected("lookup") if self.searches else 0.0
        return (self.draft_line(k) if draft else 0.0) + self.verify_line(pending + k) + search \
            + self.expected("overhead")

    def steps_expected(self, k_max: int, pending: int = 1, draft: bool = True) -> list:
        """step_expected of k = 1..k_max (the adaptive choice prices every k before every step):
        the lines are fitted once, at the first k, and the step's fixed terms looked up once."""
        fixed = (self.expected("lookup") if self.searches else 0.0) + self.expected("overhead")
        return [(self.draft_line(k) if draft else 0.0) + self.verify_line(pending + k) + fixed
                for k in range(1, k_max + 1)]

    def draft_line(self, k: int) -> float:
        """A draft call of k tokens from the line through every measured call (_Sums.line: slope
        >= 0, intercept >= 0); with one call length measured, k x the mean per token. A call has a
        fixed part (feeding the tokens it missed, the call itself) besides its k steps: priced per
        token, that part makes every longer k look dearer than it is, the choice then drafts
        shorter, and short calls keep the per-token mean high."""
        if not k:
            return 0.0
        if "draft_line" not in self._fits:
            self._fits["draft_line"] = self._sums["draft"].line()
        line = self._fits["draft_line"]
        return k * self.expected("draft") if line is None else line[0] + line[1] * k

    def verify_line(self, width: int) -> float:
        """A verify pass of `width` from the line through every measured pass (_Sums.line: slope
        >= 0); with one width measured, that width's mean for every width (optimistic: the next
        choice measures another), with none, the prior.

        Why every pass, each fading as later ones come, and not a line through each width's
        running mean: the choice stops taking a width that looks dear, so that width's mean is
        never measured again and whatever made it look dear stays. On a shared CPU a pass's time
        has a standard deviation of a fifth of its mean or more, and a few passes take twice the
        mean; a width's mean that caught one keeps the choice off that width for good (and a
        lucky pass makes a width look cheap and chosen every step). In the sums, that pass's
        weight fades with every pass after it, whichever width it had. Where a backend's cost steps with width (GPU tiles) the line smooths the steps away;
        the budget's worst cases keep each width's own peak."""
        if "line" not in self._fits:     # (intercept, slope), fitted once per change
            self._fits["line"] = self._sums["verify"].line(flat=True)
        line = self._fits["line"]
        return self.expected(verify_key(width)) if line is None else line[0] + line[1] * width

    def tree_worst(self, shape, pending: int = 1) -> float:
        """A token tree's step (runtime/tree.py): its whole draft (measured per shape; before that
        depth x a draft step) and the verify pass of pending + nodes tokens (and, with `searches`,
        the next step's lookup search)."""
        search = self.worst("lookup") if self.searches else 0.0
        return self.worst(tree_key(shape)) + self.worst(verify_key(pending + shape.nodes)) + search \
            + self.worst(overhead_key(shape))

    def tree_expected(self, shape, pending: int = 1) -> float:
        search = self.expected("lookup") if self.searches else 0.0
        return self.expected(tree_key(shape)) + self.verify_line(pending + shape.nodes) + search \
            + self.expected(overhead_key(shape))

    def premise(self, cfg: BudgetConfig) -> dict:
        """W(prompt) + W(vision) + W(prefill) + W(trajectory) + margin against the budget (ms)."""
        need = sum(self.worst(s) for s in MEASURED_STAGES) + cfg.margin_ms
        return {"need_ms": round(need, 3), "budget_ms": cfg.budget_ms,
                "ok": (not cfg.enabled) or need <= cfg.budget_ms,
                **{f"{s}_worst_ms": round(self.worst(s), 3) for s in MEASURED_STAGES}}

    def _extrapolate(self, name: str, width: int) -> float | None:
        """The verify cost of `width` from the measured widths of table `name` (memoized: the
        adaptive policy asks for every k before every step)."""
        if (name, width) not in self._fits:
            self._fits[(name, width)] = self._fit(getattr(self, name), width)
        return self._fits[(name, width)]

    def _fit(self, table: dict, width: int) -> float | None:
        widths = sorted(k[1] for k in table if _kind(k) == "verify")
        if not widths:
            return None
        if len(widths) == 1:
            w0 = widths[0]
            slope = self.cfg.prior_verify_per_token_ms
        else:
            xs = np.array(widths, float)
            ys = np.array([table[verify_key(w)] for w in widths])
            slope = max(float(np.polyfit(xs, ys, 1)[0]), 0.0)
            w0 = min(widths, key=lambda w: abs(w - width))
        return table[verify_key(w0)] + slope * (width - w0)


class _Sums:
    """Weighted sums (w, wx, wy, wxx, wxy) of (x, y) points, every point's weight multiplied by
    `decay` when a later point is added: the least-squares line of the recent points, in O(1) a
    point."""

    FADED = 1e-9     # the x spread, relative to the mean x^2, below which the points are one x

    def __init__(self, decay: float):
        self.decay = decay
        self.clear()

    def clear(self) -> None:
        self.s = [0.0] * 5

    def add(self, x: float, y: float) -> None:
        d, x, y = self.decay, float(x), float(y)
        self.s = [d * a + b for a, b in zip(self.s, (1.0, x, y, x * x, x * y))]

    def line(self, flat: bool = False) -> tuple[float, float] | None:
        """_line_of_sums of the points. Where they hold one x, or the other x values' weight has
        faded to nothing (their slope would be round-off): (their mean, 0) if `flat`, else None;
        with no points, None."""
        w, sx, sy, sxx, _ = self.s
        if w <= 0:
            return None
        if w * sxx - sx * sx <= self.FADED * w * sxx:
            return (sy / w, 0.0) if flat else None
        return _line_of_sums(*self.s)


def _line_of_sums(sw: float, sx: float, sy: float, sxx: float, sxy: float) -> tuple[float, float]:
    """(intercept, slope) of the weighted least-squares line from its sums, with slope >= 0 and
    intercept >= 0: a negative slope gives the weighted mean (flat), a negative intercept the
    weighted line through the origin. In closed form: the adaptive choice refits before every
    step, and np.polyfit there cost a tenth of a small model's step on a CPU."""
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det if det > 0 else 0.0
    if slope <= 0:
        return sy / sw, 0.0
    icpt = (sy - slope * sx) / sw
    if icpt < 0:
        return 0.0, sxy / sxx
    return icpt, slope


class CycleBudget:
    """Deadline bookkeeping of one cycle: stage timings, the step cap, flags."""

    def __init__(self, cfg: BudgetConfig, costs: CostModel, clock=wall_ms):
        self.cfg, self.costs, self.clock = cfg, costs, clock
        self._range = trace.begin("cycle")      # closed by finish (runtime/trace.py)
        self.start = clock()
        self.deadline = self.start + cfg.budget_ms if cfg.enabled else math.inf
        self.stages: dict[str, float] = {}
        self.flags: list[str] = []
        self.cut = False
        self._step = None      # (time the last allowed step began, its predicted worst case)
        if not costs.premise(cfg)["ok"]:
            self.flag("budget_too_small")

    @contextmanager
    def stage(self, name: str, measure: str | None = None):
        """Time a stage; its duration feeds the cost model under `measure` (default: the stage's
        own name when it is one of MEASURED_STAGES), the worst cases of later cycles."""
        t0 = self.clock()
        try:
            with trace.span(name):
                yield
        finally:
            ms = self.clock() - t0
            self.stages[name] = self.stages.get(name, 0.0) + ms
            key = measure or (name if name in MEASURED_STAGES else None)
            if key is not None:
                predicted = self.costs.worst(key)
                self.costs.observe(key, ms)
                if key == "trajectory" and self.cfg.enabled and ms > predicted:
                    self.flag("worst_case_exceeded")

    def reserve_ms(self) -> float:
        """R = W(trajectory) + margin: what must stay free for the final trajectory."""
        return self.costs.worst("trajectory") + self.cfg.margin_ms

    def left_ms(self) -> float:
        return self.deadline - self.clock()

    def trajectory_fits(self) -> bool:
        return self.left_ms() >= self.reserve_ms()

    def wait_s(self, cap_ms: float) -> float:
        """How long (s) a wait may block: until R before the deadline, at most cap_ms."""
        left = self.left_ms() - self.reserve_ms() if self.cfg.enabled else cap_ms
        return max(min(left, cap_ms), 0.0) / 1e3

    def fit(self, step, pending: int = 1):
        """The planned step (runtime.step) as the time left allows: a tree as it is, or the chain
        it stands for; a chain or lookup shortened (`cap`); None: close the reasoning."""
        if isinstance(step, TreeStep):
            if self.cap_tree(step.shape, pending) is not None:
                return step
            step = Chain(step.chain)
        k = self.cap(step.k, pending, free=isinstance(step, Lookup))
        return None if k is None else shorten(step, k)

    def cap(self, k: int, pending: int = 1, free: bool = False) -> int | None:
        """Largest k' <= k with now + W(step k') + R <= D, or None: close the reasoning. free: the
        k' proposals cost no draft step (lookup)."""
        self._check_last_step()
        if not self.cfg.enabled:
            return k
        left = self.left_ms() - self.reserve_ms()
        for kk in range(k, -1, -1):
            worst = self.costs.step_worst(kk, pending, draft=not free)
            if worst <= left:
                self._step = (self.clock(), worst)
                return kk
        self.cut = True
        return None

    def cap_tree(self, shape, pending: int = 1):
        """The tree `shape` if now + W(tree step) + R <= D, else None (the caller falls back to a
        chain, which `cap` shortens or closes)."""
        self._check_last_step()
        if not self.cfg.enabled:
            return shape
        worst = self.costs.tree_worst(shape, pending)
        if worst <= self.left_ms() - self.reserve_ms():
            self._step = (self.clock(), worst)
            return shape
        return None

    def end_reasoning(self) -> None:
        self._check_last_step()

    def _check_last_step(self) -> None:
        if self._step is not None:
            began, worst = self._step
            if self.clock() - began > worst:
                self.flag("worst_case_exceeded")
            self._step = None

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def finish(self) -> dict:
        """Close the cycle: total, slack, miss flag; age the worst cases. Returns the timing record."""
        now = self.clock()
        total = now - self.start
        slack = self.deadline - now if self.cfg.enabled else None
        if self.cfg.enabled and now > self.deadline:
            self.flag("miss")
        self.costs.age()
        trace.end(self._range)
        self._range = None
        return {"total_ms": round(total, 3), "budget_ms": self.cfg.budget_ms or None,
                "slack_ms": None if slack is None else round(slack, 3),
                "stages_ms": {k: round(v, 3) for k, v in self.stages.items()},
                "unaccounted_ms": round(total - sum(self.stages.values()), 3),
                "cut": self.cut}
