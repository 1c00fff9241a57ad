"""One TensorRT engine: deserialized, an execution context per optimization profile, its I/O
tensors (names, dtypes, shape ranges) and static device buffers; and the check that a manifest's
engines are the ones this runtime and this GPU can run.

Documentation followed (TensorRT 10.3 Python API and Developer Guide):
  IExecutionContext.set_optimization_profile_async / set_input_shape / set_tensor_address /
  execute_async_v3; ICudaEngine.get_tensor_profile_shape / num_io_tensors / get_tensor_name /
  get_tensor_mode / get_tensor_dtype (Developer Guide, "Working with Dynamic Shapes",
  "Optimization Profiles").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core.artifacts import EnginesMeta, Manifest
from core.config import ConfigError, file_sha256
from runtime.backends.tensorrt.buffers import io_set
from runtime.backends.tensorrt.cuda import Cuda

# fp32 graphs build at the profile's fp32 / fp16 / bf16
QUANTIZED = {"int8": "int8", "int8_sq": "int8", "fp8": "fp8"}


class Engine:
    """One engine: an execution context per optimization profile (all on one stream), its I/O
    tensors with the dtypes TensorRT reports, and (`allocate`) static device buffers sized for the
    largest shapes any profile allows: `buf` by tensor name (what TensorRT binds), `io` the same
    buffers as the graph's typed set (what the backend addresses)."""

    def __init__(self, trt, cuda: Cuda, runtime, file: Path, stream):
        self.name, self.cuda, self.stream = file.stem, cuda, stream
        self.engine = e = runtime.deserialize_cuda_engine(file.read_bytes())
        if e is None:
            raise ConfigError(f"{file}: TensorRT cannot deserialize it (built by another TensorRT "
                              "version or for another GPU?); rebuild on this device")
        names = [e.get_tensor_name(i) for i in range(e.num_io_tensors)]
        self.inputs = [n for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dynamic = [n for n in self.inputs if -1 in tuple(e.get_tensor_shape(n))]
        self.dtype = {n: np.dtype(trt.nptype(e.get_tensor_dtype(n))) for n in names}
        self.ranges = [{n: [tuple(s) for s in e.get_tensor_profile_shape(n, p)] for n in self.dynamic}
                       for p in range(e.num_optimization_profiles)]
        self.contexts = []
        for p in range(e.num_optimization_profiles):
            ctx = e.create_execution_context()
            if not ctx.set_optimization_profile_async(p, int(stream)):
                raise RuntimeError(f"{self.name}: cannot select optimization profile {p}")
            self.contexts.append(ctx)
        self.nbytes = self._largest()
        self.buf, self.io = {}, None

    def allocate(self, bound: dict, graph: str) -> None:
        """A device buffer per tensor, except those `bound` gives ({name: address}: the caches the
        backend owns, sized from this engine's dtypes before they were allocated); `graph`: the
        graph it was built from, whose role types `io`."""
        self.buf = {n: bound[n] if n in bound else self.cuda.malloc(self.nbytes[n])
                    for n in self.inputs + self.outputs}
        self.io = io_set(graph, self.buf, self.dtype)

    def largest(self, name: str) -> list[tuple]:
        """Input `name`'s largest shape under each optimization profile."""
        return [r[name][2] for r in self.ranges]

    def _largest(self) -> dict:
        """Bytes of every tensor at the largest shapes: each profile's max input shapes set, the
        output shapes TensorRT derives from them read back."""
        e, size = self.engine, {}
        for p, ctx in enumerate(self.contexts):
            for n in self.dynamic:
                self._shape(ctx, n, self.ranges[p][n][2])
            for n in self.inputs + self.outputs:
                shape = tuple(ctx.get_tensor_shape(n) if n in self.dynamic or n in self.outputs
                              else e.get_tensor_shape(n))
                size[n] = max(size.get(n, 0), int(np.prod(shape)) * self.dtype[n].itemsize)
        return size

    def profile_for(self, shapes: dict) -> int:
        """The first optimization profile whose [min, max] covers every dynamic input's shape."""
        for p, ranges in enumerate(self.ranges):
            if all(all(lo <= d <= hi for lo, d, hi in zip(r[0], shapes[n], r[2])) for n, r in ranges.items()):
                return p
        raise ConfigError(f"{self.name}: shapes {shapes} are outside every optimization profile "
                          f"{self.ranges}; rebuild the engines for these shapes")

    def bind(self, shapes: dict, addresses: dict | None = None) -> int:
        """Set the dynamic inputs' shapes and every tensor's address on the covering profile's
        context (host-side calls only) -> the profile index."""
        p = self.profile_for(shapes)
        ctx = self.contexts[p]
        for n in self.dynamic:
            self._shape(ctx, n, shapes[n])
        for n, ptr in self.buf.items():
            ptr = (addresses or {}).get(n, ptr)
            if not ctx.set_tensor_address(n, int(ptr)):
                raise RuntimeError(f"{self.name}: set_tensor_address({n!r}) refused")
        return p

    def run(self, shapes: dict, addresses: dict | None = None) -> None:
        p = self.bind(shapes, addresses)
        if not self.contexts[p].execute_async_v3(int(self.stream)):
            raise RuntimeError(f"{self.name}: execute_async_v3 failed at shapes {shapes}")

    def _shape(self, ctx, name: str, shape) -> None:
        if not ctx.set_input_shape(name, tuple(int(d) for d in shape)):
            raise RuntimeError(f"{self.name}: set_input_shape({name!r}, {tuple(shape)}) refused")


def device_sm(cuda: Cuda) -> int:
    props = cuda("cudaGetDeviceProperties", 0)
    return int(props.major) * 10 + int(props.minor)


def version(text: str) -> tuple:
    return tuple(int(p) for p in str(text).split(".")[:3] if p.isdigit())


def check_manifest(folder: Path, meta: EnginesMeta, manifest: Manifest, trt_version: str, sm: int,
                   k_max: int | None = None) -> None:
    """Refuse engines that are not what this runtime needs, naming the difference."""
    s, where = manifest.shapes, f"{folder}/manifest.json"
    wrong = []
    if s.max_len != meta.max_len:
        wrong.append(f"shapes.max_len={s.max_len} but the graphs have max_len={meta.max_len}")
    if k_max is not None and s.k_max != k_max:
        wrong.append(f"shapes.k_max={s.k_max} but the planner asks for k_max={k_max}")
    if list(s.verify_widths) != [1, s.k_max + 1]:
        wrong.append(f"shapes.verify_widths={list(s.verify_widths)}, expected [1, {s.k_max + 1}]")
    for key in ("cameras", "frames", "image_hw"):
        built, exported = getattr(s, key), getattr(meta.prompt, key)
        if list(np.atleast_1d(built)) != list(np.atleast_1d(exported)):
            wrong.append(f"shapes.{key}={_json(built)} but the graphs were exported for {_json(exported)}")
    if manifest.target_sm != sm:
        wrong.append(f"built for sm_{manifest.target_sm}, this GPU is sm_{sm}")
    lo, below = manifest.tensorrt_range
    if not version(lo) <= version(trt_version) < version(below):
        wrong.append(f"TensorRT {trt_version} here is outside the profile's range [{lo}, {below})")
    other = sorted(g for g, e in manifest.engines.items() if e.tensorrt not in (trt_version, "trtexec"))
    if other:
        built = sorted({manifest.engines[g].tensorrt for g in other})
        wrong.append(f"TensorRT {trt_version} here, but {other} were built with TensorRT {built}")
    for g, entry in manifest.engines.items():
        if file_sha256(folder / entry.file) != entry.sha256:
            wrong.append(f"{entry.file}: sha256 does not match the manifest (changed or damaged)")
    for g, entry in meta.graphs.items():
        if g not in manifest.engines:
            wrong.append(f"no engine for graph {g!r}")
        built_from = manifest.graphs.get(g)
        if built_from is None or built_from.sha256 != entry.sha256:
            wrong.append(f"graph {g!r}: the engine was built from another ONNX file than meta.json lists")
        got, want = entry.precision, manifest.precision.get(g)
        if got == "int4_awq" and not manifest.int4_awq or \
                got != "int4_awq" and QUANTIZED.get(got) != (want if want in ("int8", "fp8") else None):
            wrong.append(f"graph {g!r}: meta.json says {got}, the manifest {want}")
    if manifest.onnx_meta_sha256 not in (None, file_sha256(folder / "meta.json")):
        wrong.append("meta.json is not the one the engines were built from")
    if wrong:
        raise ConfigError(f"{where}: these engines do not match this runtime: " + "; ".join(wrong)
                          + f". Rebuild on this device: make engines PROFILE={manifest.profile}")


def _json(value) -> str:
    """A shape as its JSON list reads (tuples from the typed cards print as lists)."""
    return str(list(value)) if isinstance(value, (list, tuple)) else str(value)
