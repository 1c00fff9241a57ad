"""Test doubles of the TensorRT and cuda-python API subsets runtime/backends/tensorrt/ calls.

No GPU and no TensorRT here: "device memory" is host memory the double owns and tracks, an
"engine" is a small JSON naming the ONNX graph and its optimization profiles, and executing it runs
the same ONNX graph with ONNX Runtime on the arrays behind the fake device pointers. What the doubles
are for is the call contracts: each check raises ContractError and its docstring names the
documented behaviour it mirrors (TensorRT 10.3 Python API / Developer Guide, CUDA Runtime API 12.x).
Work runs at once on the calling thread (streams are in order by construction) except on a stream
being captured, where it is recorded into the graph.

    cuda = FakeCudaRuntime(sm=87);  trt = FakeTensorRT(cuda)
    install(monkeypatch, trt, cuda)        # `import tensorrt`, `from cuda.bindings import runtime`
"""
from __future__ import annotations

import bisect
import ctypes
import enum
import json
import sys
import types
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

ENGINE_FORMAT = "fake-tensorrt-engine"


class ContractError(AssertionError):
    """A call the documented API does not allow (the real library would fail or corrupt memory)."""


# --- cuda-python ------------------------------------------------------------------------------------

class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorStreamCaptureUnsupported = 900


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


class cudaStreamCaptureMode(enum.IntEnum):
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


class Stream:
    def __init__(self, handle: int):
        self.handle, self.capture = handle, None

    def __int__(self):
        return self.handle


class FakeCudaRuntime:
    """The subset of `cuda.bindings.runtime` the backend calls; every call returns (error, value...)
    as cuda-python does. `log` counts copies (kind, bytes) and allocations, so a test sees a copy per
    token or a leak."""
    cudaError_t, cudaMemcpyKind, cudaStreamCaptureMode = cudaError_t, cudaMemcpyKind, cudaStreamCaptureMode
    cudaStreamNonBlocking, cudaEventDisableTiming = 1, 2

    def __init__(self, sm: int = 87):
        self.sm = sm
        self.memory: dict[int, tuple[np.ndarray, str]] = {}      # ptr -> (bytes, "device" | "host")
        self.starts: list[int] = []
        self.streams: dict[int, Stream] = {}
        self.events: set[int] = set()
        self.graphs: dict[int, list] = {}
        self.execs: dict[int, list] = {}
        self.log = Counter()
        self.bytes = Counter()
        self._next = 1

    # -- memory ---------------------------------------------------------------------------------
    def _alloc(self, nbytes: int, where: str):
        buf = np.zeros(int(nbytes) + 1, np.uint8)          # +1: no two allocations share an address
        ptr = buf.ctypes.data
        self.memory[ptr] = (buf, where)
        bisect.insort(self.starts, ptr)
        self.log[f"malloc_{where}"] += 1
        return cudaError_t.cudaSuccess, ptr

    def cudaMalloc(self, nbytes):
        return self._alloc(nbytes, "device")

    def cudaMallocHost(self, nbytes):
        return self._alloc(nbytes, "host")

    def _free(self, ptr, where):
        if ptr not in self.memory or self.memory[ptr][1] != where:
            raise ContractError(f"cudaFree{'Host' if where == 'host' else ''}({ptr:#x}): not an allocation "
                                "of that kind (CUDA Runtime API, Memory Management)")
        del self.memory[ptr]
        self.starts.remove(ptr)
        self.log[f"free_{where}"] += 1
        return (cudaError_t.cudaSuccess,)

    def cudaFree(self, ptr):
        return self._free(int(ptr), "device")

    def cudaFreeHost(self, ptr):
        return self._free(int(ptr), "host")

    def region(self, ptr: int, nbytes: int, where: str | None = "device") -> np.ndarray:
        """The nbytes at ptr inside one live allocation of kind `where` (None: host memory the
        double does not own, e.g. a numpy array). Out of bounds: the kernel or copy would write
        past the buffer (CUDA Runtime API: a copy's ranges must lie in allocated memory)."""
        ptr, nbytes = int(ptr), int(nbytes)
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            base = self.starts[i]
            buf, kind = self.memory[base]
            if ptr < base + len(buf) - 1:
                if kind != (where or "host"):
                    raise ContractError(f"{ptr:#x} is {kind} memory, expected {where or 'host'} memory")
                if ptr + nbytes > base + len(buf) - 1:
                    raise ContractError(f"{nbytes} bytes at {ptr:#x} run past its allocation of "
                                        f"{len(buf) - 1} bytes (offset {ptr - base})")
                return buf[ptr - base:ptr - base + nbytes]
        if where == "device":
            raise ContractError(f"{ptr:#x} is not device memory from cudaMalloc")
        return np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr))[:nbytes]

    def live(self, where: str = "device") -> int:
        return sum(1 for _, kind in self.memory.values() if kind == where)

    # -- copies -----------------------------------------------------------------------------------
    def _ends(self, kind):
        src = "device" if kind in (cudaMemcpyKind.cudaMemcpyDeviceToHost, cudaMemcpyKind.cudaMemcpyDeviceToDevice) else None
        dst = "device" if kind in (cudaMemcpyKind.cudaMemcpyHostToDevice, cudaMemcpyKind.cudaMemcpyDeviceToDevice) else None
        return dst, src

    def _enqueue(self, stream, op):
        s = self._stream(stream)
        if s.capture is not None:
            s.capture.append(op)
        else:
            op()
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        """Both ranges must be of the kind `kind` says (CUDA Runtime API, cudaMemcpyAsync)."""
        dst_kind, src_kind = self._ends(kind)
        d, s = self.region(dst, count, dst_kind), self.region(src, count, src_kind)
        self.log[kind.name] += 1
        self.bytes[kind.name] += int(count)

        def op():
            d[:] = s
        return self._enqueue(stream, op)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        """width <= both pitches, every row inside its allocation (CUDA Runtime API, cudaMemcpy2DAsync)."""
        if width > dpitch or width > spitch:
            raise ContractError(f"cudaMemcpy2DAsync: width {width} exceeds a pitch ({dpitch}, {spitch})")
        dst_kind, src_kind = self._ends(kind)
        span = lambda pitch: (height - 1) * pitch + width
        d, s = self.region(dst, span(dpitch), dst_kind), self.region(src, span(spitch), src_kind)
        self.log[kind.name + "_2D"] += 1
        self.bytes[kind.name] += int(width * height)

        def op():
            for r in range(height):
                d[r * dpitch:r * dpitch + width] = s[r * spitch:r * spitch + width]
        return self._enqueue(stream, op)

    def cudaMemsetAsync(self, ptr, value, count, stream):
        d = self.region(ptr, count)

        def op():
            d[:] = value
        return self._enqueue(stream, op)

    # -- streams, events, graphs --------------------------------------------------------------------
    def cudaStreamCreateWithFlags(self, flags):
        s = Stream(len(self.streams) + 100)
        self.streams[s.handle] = s
        return cudaError_t.cudaSuccess, s

    def _stream(self, stream) -> Stream:
        if int(stream) not in self.streams:
            raise ContractError(f"stream {int(stream)} was not created by cudaStreamCreate* (or was destroyed)")
        return self.streams[int(stream)]

    def cudaStreamDestroy(self, stream):
        del self.streams[int(self._stream(stream))]
        return (cudaError_t.cudaSuccess,)

    def cudaStreamSynchronize(self, stream):
        """Not allowed on a stream being captured (CUDA Programming Guide, "Prohibited and
        Unhandled Operations" of stream capture)."""
        if self._stream(stream).capture is not None:
            return (cudaError_t.cudaErrorStreamCaptureUnsupported,)
        self.log["sync"] += 1
        return (cudaError_t.cudaSuccess,)

    def cudaEventCreateWithFlags(self, flags):
        self._next += 1
        self.events.add(self._next)
        return cudaError_t.cudaSuccess, self._next

    def cudaEventRecord(self, event, stream):
        assert event in self.events
        self._stream(stream)
        return (cudaError_t.cudaSuccess,)

    def cudaStreamWaitEvent(self, stream, event, flags):
        assert event in self.events
        self._stream(stream)
        self.log["wait_event"] += 1
        return (cudaError_t.cudaSuccess,)

    def cudaEventDestroy(self, event):
        self.events.remove(event)
        return (cudaError_t.cudaSuccess,)

    def cudaStreamBeginCapture(self, stream, mode):
        """Capture needs a non-default stream not already capturing (CUDA Runtime API,
        cudaStreamBeginCapture)."""
        s = self._stream(stream)
        if s.capture is not None:
            raise ContractError("cudaStreamBeginCapture on a stream already capturing")
        s.capture = []
        return (cudaError_t.cudaSuccess,)

    def cudaStreamEndCapture(self, stream):
        s = self._stream(stream)
        if s.capture is None:
            raise ContractError("cudaStreamEndCapture without cudaStreamBeginCapture")
        self._next += 1
        self.graphs[self._next], s.capture = s.capture, None
        return cudaError_t.cudaSuccess, self._next

    def cudaGraphInstantiate(self, graph, flags):
        self._next += 1
        self.execs[self._next] = list(self.graphs[graph])
        self.log["graph_instantiate"] += 1
        return cudaError_t.cudaSuccess, self._next

    def cudaGraphDestroy(self, graph):
        del self.graphs[graph]
        return (cudaError_t.cudaSuccess,)

    def cudaGraphLaunch(self, exec_, stream):
        """A graph replays the work it recorded, with the recorded arguments (CUDA Runtime API,
        cudaGraphLaunch)."""
        self.log["graph_launch"] += 1
        for op in self.execs[exec_]:
            self._enqueue(stream, op)
        return (cudaError_t.cudaSuccess,)

    def cudaGraphExecDestroy(self, exec_):
        del self.execs[exec_]
        return (cudaError_t.cudaSuccess,)

    def cudaGetDeviceProperties(self, device):
        return cudaError_t.cudaSuccess, types.SimpleNamespace(major=self.sm // 10, minor=self.sm % 10)


# --- TensorRT ---------------------------------------------------------------------------------------

class TensorIOMode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


class DataType(enum.Enum):
    FLOAT = "float32"
    INT64 = "int64"
    BOOL = "bool"
    INT32 = "int32"
    HALF = "float16"


ORT_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def build_engine(onnx_file: Path, graph: dict, profiles: list[dict], version: str) -> bytes:
    """The double's "serialized engine": the ONNX graph it runs, its I/O (meta.json's entry) and
    its optimization profiles {input: (min, opt, max)}."""
    return json.dumps({"format": ENGINE_FORMAT, "onnx": str(Path(onnx_file).resolve()), "tensorrt": version,
                       "inputs": graph["inputs"], "outputs": graph["outputs"], "profiles": profiles}).encode()


class FakeTensorRT(types.ModuleType):
    """The subset of the `tensorrt` module the backend calls."""
    TensorIOMode, DataType = TensorIOMode, DataType

    class Logger:
        WARNING = 2

        def __init__(self, severity=2):
            self.severity = severity

    def __init__(self, cuda: FakeCudaRuntime, version: str = "10.3.0"):
        super().__init__("tensorrt")
        self.cuda, self.__version__ = cuda, version
        self.executions = Counter()

    @staticmethod
    def nptype(dtype: DataType):
        return np.dtype(dtype.value).type

    def Runtime(self, logger):
        return types.SimpleNamespace(deserialize_cuda_engine=lambda data: FakeEngine(self, data))


class FakeEngine:
    """ICudaEngine: tensors by name, optimization profiles, execution contexts."""

    def __init__(self, trt: FakeTensorRT, data: bytes):
        spec = json.loads(bytes(data))
        if spec.get("format") != ENGINE_FORMAT or spec["tensorrt"] != trt.__version__:
            raise ContractError("deserialize_cuda_engine: an engine runs only on the TensorRT version "
                                "that built it (Developer Guide, 'Version Compatibility')")
        self.trt, self.spec = trt, spec
        self.io = {t["name"]: t for t in spec["inputs"] + spec["outputs"]}
        self.names = [t["name"] for t in spec["inputs"] + spec["outputs"]]
        self.input_names = [t["name"] for t in spec["inputs"]]
        self.profiles = spec["profiles"]
        self.contexts: list[FakeContext] = []
        self._session = None

    @property
    def num_io_tensors(self):
        return len(self.names)

    @property
    def num_optimization_profiles(self):
        return len(self.profiles)

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_mode(self, name):
        return TensorIOMode.INPUT if name in self.input_names else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        return DataType(self.io[name]["dtype"])

    def get_tensor_shape(self, name):
        """Dynamic dimensions read -1 (ICudaEngine.get_tensor_shape)."""
        return tuple(d if isinstance(d, int) else -1 for d in self.io[name]["shape"])

    def get_tensor_profile_shape(self, name, profile):
        """(min, opt, max) of an input under a profile (ICudaEngine.get_tensor_profile_shape)."""
        if name not in self.input_names:
            raise ContractError(f"get_tensor_profile_shape({name!r}): only inputs have profile shapes")
        return [tuple(s) for s in self.profiles[profile][name]]

    def create_execution_context(self):
        ctx = FakeContext(self)
        self.contexts.append(ctx)
        return ctx

    def session(self):
        if self._session is None:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            self._session = ort.InferenceSession(self.spec["onnx"], opts, providers=["CPUExecutionProvider"])
        return self._session


class FakeContext:
    """IExecutionContext with its documented preconditions checked."""

    def __init__(self, engine: FakeEngine):
        self.engine, self.trt, self.cuda = engine, engine.trt, engine.trt.cuda
        self.profile = None
        self.shapes: dict[str, tuple] = {}
        self.addresses: dict[str, int] = {}
        self.stream = None
        self.changed = True              # shapes changed since the last eager execution

    def set_optimization_profile_async(self, profile, stream):
        """Contexts of one engine may not share a profile (Developer Guide, "Optimization
        Profiles"); selecting one invalidates the input shapes set before."""
        if any(c is not self and c.profile == profile for c in self.engine.contexts):
            return False
        self._use_stream(stream)
        self.profile, self.shapes, self.changed = profile, {}, True
        return True

    def set_input_shape(self, name, shape):
        """False for a non-input, a wrong rank, a fixed dimension changed, or a shape outside the
        active profile's [min, max] (IExecutionContext.set_input_shape)."""
        spec = self.engine.io.get(name)
        if spec is None or name not in self.engine.input_names or len(shape) != len(spec["shape"]):
            return False
        if any(isinstance(d, int) and d != s for d, s in zip(spec["shape"], shape)):
            return False
        if self.profile is None:
            return False
        lo, _, hi = self.engine.profiles[self.profile].get(name, (spec["shape"],) * 3)
        if not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return False
        if self.shapes.get(name) != tuple(shape):
            self.changed = True
        self.shapes[name] = tuple(int(s) for s in shape)
        return True

    def _dims(self) -> dict:
        dims = {}
        for name in self.engine.input_names:
            for d, s in zip(self.engine.io[name]["shape"], self.shapes.get(name, ())):
                if isinstance(d, str):
                    dims[d] = s
        return dims

    def get_tensor_shape(self, name):
        """Inputs: the shape set; outputs: derived from the inputs' shapes (-1 where unknown)."""
        if name in self.engine.input_names and name in self.shapes:
            return self.shapes[name]
        dims = self._dims()
        return tuple(d if isinstance(d, int) else dims.get(d, -1) for d in self.engine.io[name]["shape"])

    def set_tensor_address(self, name, ptr):
        if name not in self.engine.io:
            return False
        self.addresses[name] = int(ptr)
        return True

    def _use_stream(self, stream):
        """One context, one stream: TensorRT's enqueue work of a context is ordered on the stream
        it runs on; running a context on two streams at once races on its activation memory
        (Developer Guide, "Streams" / IExecutionContext is not thread-safe)."""
        if self.stream is not None and self.stream != int(stream):
            raise ContractError(f"context used on stream {int(stream)} after stream {self.stream}")
        self.stream = int(stream)

    def execute_async_v3(self, stream):
        """Preconditions of IExecutionContext.execute_async_v3: a profile selected, every dynamic
        input's shape set (set_input_shape), an address for every I/O tensor (set_tensor_address),
        each buffer large enough for its tensor's shape; captured into a CUDA graph only after an
        eager run at the same shapes (Developer Guide, "CUDA Graphs": enqueue once before capture
        so deferred shape-dependent work is not captured)."""
        e = self.engine
        self._use_stream(stream)
        if self.profile is None:
            raise ContractError(f"{Path(e.spec['onnx']).stem}: no optimization profile selected")
        missing = [n for n in e.input_names if -1 in e.get_tensor_shape(n) and n not in self.shapes]
        if missing:
            raise ContractError(f"{Path(e.spec['onnx']).stem}: set_input_shape was not called for {missing}")
        unbound = [n for n in e.names if n not in self.addresses]
        if unbound:
            raise ContractError(f"{Path(e.spec['onnx']).stem}: no tensor address for {unbound}")
        shapes = {n: self.get_tensor_shape(n) for n in e.names}
        views = {n: self.cuda.region(self.addresses[n], int(np.prod(shapes[n])) * np.dtype(e.io[n]["dtype"]).itemsize)
                 for n in e.names}
        s = self.cuda._stream(stream)
        if s.capture is not None:
            if self.changed:
                raise ContractError(f"{Path(e.spec['onnx']).stem}: captured right after a shape change; "
                                    "enqueue once eagerly at these shapes first")
            captured = {n: self.shapes.get(n) for n in e.input_names}
            s.capture.append(lambda: self._replay(captured, shapes, views))
            return True
        self.changed = False
        self._run(shapes, views)
        return True

    def _replay(self, captured, shapes, views):
        """A graph holds the shapes of its capture; replaying it while the context is set to other
        shapes computes the captured ones (Developer Guide, "CUDA Graphs")."""
        now = {n: self.shapes.get(n) for n in self.engine.input_names}
        if now != captured:
            raise ContractError(f"CUDA graph captured at {captured} replayed with the context at {now}")
        self._run(shapes, views)

    def _run(self, shapes, views):
        e = self.engine
        graph = {i.name: ORT_NUMPY[i.type] for i in e.session().get_inputs()}   # an engine built at other
        feed = {n: np.frombuffer(views[n].tobytes(), np.dtype(e.io[n]["dtype"])).reshape(shapes[n])  # I/O types
                .astype(graph[n], copy=False) for n in e.input_names}           # converts at its bindings
        outs = e.session().run([t["name"] for t in e.spec["outputs"]], feed)
        for t, out in zip(e.spec["outputs"], outs):
            if tuple(out.shape) != tuple(shapes[t["name"]]):
                raise ContractError(f"{t['name']}: the graph gave {out.shape}, TensorRT said {shapes[t['name']]}")
            views[t["name"]][:] = np.ascontiguousarray(out, np.dtype(t["dtype"])).view(np.uint8).reshape(-1)
        self.trt.executions[Path(e.spec["onnx"]).stem] += 1


def install(monkeypatch, trt: FakeTensorRT, cuda: FakeCudaRuntime) -> None:
    """`import tensorrt` and `from cuda.bindings import runtime` find the doubles."""
    pkg, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    pkg.bindings, bindings.runtime = bindings, cuda
    for name, mod in (("tensorrt", trt), ("cuda", pkg), ("cuda.bindings", bindings), ("cuda.bindings.runtime", cuda)):
        monkeypatch.setitem(sys.modules, name, mod)
