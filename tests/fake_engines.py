"""TensorRT engines "built" by the double (tests/trt_doubles.py): what `specdrive engines build`
does on a device, for the TensorRT and TensorRT-LLM backend tests."""
import dataclasses
import shutil
from pathlib import Path

from engines import build as eb
from engines.profile import Shapes, load_profile
from core.artifacts import read_meta
from core.config import file_sha256
from tests.trt_doubles import FakeCudaRuntime, FakeTensorRT, build_engine, install

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny"
TRT = "10.3.0"


def engine_profile():
    """orin-fp16 with the shapes of the tiny export (cpu planner: max_len 512)."""
    return dataclasses.replace(load_profile("orin-fp16"), name="orin-fp16",
                               shapes=Shapes(max_prompt=448, max_len=512, k_max=8))


KV = ("cache", "kv", "new_kv", "context")       # the graphs' KV inputs and outputs


def build_fake_engines(folder: Path, version: str = TRT, kv_dtype: str | None = None) -> dict:
    """What `specdrive engines build` does on a device, with the double's engine format: one engine
    per graph with the optimization profiles engines/build.py asks TensorRT for, then the manifest
    (engines/build.py's own writer). `kv_dtype`: the engines bind their KV tensors at that dtype
    (as an engine built with fp16 KV I/O reports them)."""
    meta = read_meta(folder)
    prof = engine_profile()
    (folder / "trt").mkdir(exist_ok=True)
    engines = {}
    for graph, g in meta.graphs.items():
        profiles = []
        for axes in eb.dim_ranges(prof, graph):
            profiles.append({s.name: [eb._shape(s, axes, i) for i in range(3)] for s in g.inputs
                             if any(isinstance(d, str) for d in s.shape)})
        io = g.to_dict()                       # the double's engine holds the graph's entry
        if kv_dtype:
            io = {**io, **{side: [{**t, "dtype": kv_dtype} if t["name"] in KV else t for t in io[side]]
                           for side in ("inputs", "outputs")}}
        dst = folder / "trt" / f"{graph}.engine"
        dst.write_bytes(build_engine(folder / g.file, io, profiles, version))
        engines[graph] = {"file": f"trt/{graph}.engine", "sha256": file_sha256(dst), "tensorrt": version}
    return eb.write_manifest(prof, SHIPPED, folder, meta, {"export": "done", "build": "done"},
                             {"status": "not needed", "graphs": {}}, built=True, engines=engines)


def engines_on_the_double(onnx: Path, out: Path, monkeypatch) -> Path:
    """A copy of the ONNX export `onnx` at `out` with engines "built" by the double, and the double
    (TensorRT TRT on an sm 87 device, as on Orin) installed for the test -> out."""
    shutil.copytree(onnx, out)
    build_fake_engines(out)
    cuda = FakeCudaRuntime(sm=87)
    install(monkeypatch, FakeTensorRT(cuda, TRT), cuda)
    return out
