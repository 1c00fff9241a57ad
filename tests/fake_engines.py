"""TensorRT engines "built" by the double (tests/trt_doubles.py): what `specdrive engines build`
does on a device, for the TensorRT and TensorRT-LLM backend tests."""
import dataclasses
import json
from pathlib import Path

from engines import build as eb
from engines.profile import Shapes, load_profile
from prompt.config import file_sha256
from tests.trt_doubles import build_engine

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny"
TRT = "10.3.0"


def engine_profile():
    """orin-fp16 with the shapes of the tiny export (cpu planner: max_len 512)."""
    return dataclasses.replace(load_profile("orin-fp16"), name="orin-fp16",
                               shapes=Shapes(max_prompt=448, max_len=512, k_max=8))


def build_fake_engines(folder: Path, version: str = TRT) -> dict:
    """What `specdrive engines build` does on a device, with the double's engine format: one engine
    per graph with the optimization profiles engines/build.py asks TensorRT for, then the manifest
    (engines/build.py's own writer)."""
    meta = json.loads((folder / "meta.json").read_text())
    prof = engine_profile()
    (folder / "trt").mkdir(exist_ok=True)
    engines = {}
    for graph, g in meta["graphs"].items():
        profiles = []
        for axes in eb.dim_ranges(prof, graph):
            profiles.append({s["name"]: [eb._shape(s, axes, i) for i in range(3)] for s in g["inputs"]
                             if any(isinstance(d, str) for d in s["shape"])})
        dst = folder / "trt" / f"{graph}.engine"
        dst.write_bytes(build_engine(folder / g["file"], g, profiles, version))
        engines[graph] = {"file": f"trt/{graph}.engine", "sha256": file_sha256(dst), "tensorrt": version}
    return eb.write_manifest(prof, SHIPPED, folder, meta, {"export": "done", "build": "done"},
                             {"status": "not needed", "graphs": {}}, built=True, engines=engines)
