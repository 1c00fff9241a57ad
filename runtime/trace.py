"""Named time ranges over a planning cycle: NVTX for Nsight, or a recorder of our own.

    with span("verify"):               # a no-op unless tracing was switched on
        rows = backend.verify(...)

The loop, the planner and the budget open the ranges (every stage of a cycle, every engine
call); backends open none, so every backend gets the same names. Tracing is off by default and
then `span` returns one shared null context (a function call, nothing else). It is switched on
by `enable(recorder=..., nvtx=...)`, or for a process run under Nsight Systems by the
environment variable SPECDRIVE_NVTX=1 (`specdrive profile` sets it for the child it runs under
nsys). The optional `nvtx` package is imported only then; `import runtime` never loads it.

Range names: "cycle" (CycleBudget's life), the budget's stages ("vision", "prefill",
"reasoning", "trajectory", "fallback", "fallback_wait", "expert_wait"), the engine calls of a
step ("draft", "verify", "accept") and of the expert ("action"), and "checks" (output checks).
"measure" marks the cycles a profile records (the nsys capture range skips the warm-up).
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

DOMAIN = "specdrive"
CAPTURE = "measure"            # nsys --nvtx-capture=measure@specdrive
_NULL = nullcontext()
_sinks: tuple = ()             # active sinks; empty = tracing off


@dataclass
class Range:
    name: str
    thread: int                # threading.get_ident() of the thread that ran it
    start_ns: int              # time.perf_counter_ns()
    end_ns: int

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass
class Recorder:
    """Keeps every closed range (appends are atomic in CPython: threads may share one)."""
    ranges: list = field(default_factory=list)
    threads: dict = field(default_factory=dict)     # ident -> thread name

    def begin(self, name: str):
        return (name, threading.get_ident(), time.perf_counter_ns())

    def end(self, token) -> None:
        name, ident, t0 = token
        self.ranges.append(Range(name, ident, t0, time.perf_counter_ns()))
        if ident not in self.threads:
            self.threads[ident] = threading.current_thread().name


class NvtxSink:
    """Process ranges (start/end: they may end on another thread) in the "specdrive" domain."""

    def __init__(self):
        import nvtx     # optional (pip install specdrive[gpu]); only imported here

        self.domain = nvtx.get_domain(DOMAIN)
        self.attrs: dict = {}

    def begin(self, name: str):
        attr = self.attrs.get(name)
        if attr is None:
            attr = self.attrs[name] = self.domain.get_event_attributes(message=name)
        return self.domain.start_range(attr)

    def end(self, token) -> None:
        self.domain.end_range(token)


class _Span:
    __slots__ = ("name", "tokens")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.tokens = [(s, s.begin(self.name)) for s in _sinks]
        return self

    def __exit__(self, *exc):
        for sink, token in reversed(self.tokens):
            sink.end(token)
        return False


def span(name: str):
    """A context manager timing `name` in every active sink; the shared null context when off."""
    return _Span(name) if _sinks else _NULL


def begin(name: str):
    """Open a range that `end` closes (for a range that is not one block: a whole cycle)."""
    return [(s, s.begin(name)) for s in _sinks] if _sinks else None


def end(tokens) -> None:
    for sink, token in reversed(tokens or ()):
        sink.end(token)


def enable(recorder: Recorder | None = None, nvtx: bool = False) -> None:
    """Switch tracing on: into `recorder`, and NVTX when `nvtx` (ImportError without the
    package). enable() with neither switches it off."""
    global _sinks
    sinks = [recorder] if recorder is not None else []
    if nvtx:
        sinks.append(NvtxSink())
    _sinks = tuple(sinks)


def disable() -> None:
    enable()


def enabled() -> bool:
    return bool(_sinks)


def nvtx_available() -> bool:
    try:
        import nvtx  # noqa: F401
    except ImportError:
        return False
    return True


if os.environ.get("SPECDRIVE_NVTX") == "1":     # a process started under nsys
    enable(nvtx=nvtx_available())
