"""CUDA graphs over one TensorRT engine, one per width (shape bucket), captured at warm-up.

Documentation followed: TensorRT Developer Guide, "CUDA Graphs" (enqueue once after a shape change
before capturing; a graph holds the shapes and addresses of its capture); CUDA Runtime API 12.x,
"Graph Management" and "Stream Management" (cudaStreamBeginCapture / cudaStreamEndCapture /
cudaGraphInstantiate / cudaGraphLaunch).
"""
from __future__ import annotations

from runtime.backends.tensorrt.cuda import Cuda
from runtime.backends.tensorrt.engine import Engine


class GraphRunner:
    """CUDA graphs of one engine, one per width, all captured at warm-up (`capture`, before any
    cycle), each on the context of the optimization profile that covers it; a cycle only replays
    them (their shapes set back first, host-side), so no capture ever counts against a budget.
    TensorRT does deferred work in the first enqueue after a shape change, so each width is
    captured right after an eager run at that width. A width never captured runs eagerly. `eager`
    turns graphs off."""

    def __init__(self, cuda: Cuda, engine: Engine, eager: bool):
        self.cuda, self.engine, self.eager = cuda, engine, eager
        self.execs = {}

    def run(self, width: int, shapes: dict) -> None:
        e = self.engine
        if width not in self.execs:
            return e.run(shapes)
        e.bind(shapes)                              # the context's shapes back to the captured ones
        self.cuda("cudaGraphLaunch", self.execs[width], e.stream)

    def capture(self, width: int, shapes: dict) -> None:
        """Warm-up only: an eager run at `width`, then its graph captured and replayed once."""
        e, cuda = self.engine, self.cuda
        e.run(shapes)
        if self.eager or width in self.execs:
            return
        p = e.bind(shapes)
        mode = cuda.rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        cuda("cudaStreamBeginCapture", e.stream, mode)
        ok = e.contexts[p].execute_async_v3(int(e.stream))
        graph = cuda("cudaStreamEndCapture", e.stream)
        if not ok:
            raise RuntimeError(f"{e.name}: execute_async_v3 failed while capturing width {width}")
        self.execs[width] = cuda("cudaGraphInstantiate", graph, 0)
        cuda("cudaGraphDestroy", graph)
        cuda("cudaGraphLaunch", self.execs[width], e.stream)

    def close(self) -> None:
        for g in self.execs.values():
            self.cuda("cudaGraphExecDestroy", g)
        self.execs = {}

