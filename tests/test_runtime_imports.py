"""The runtime is lean: importing it (every module but the engine backends) loads no torch,
no models/ and no scenes/; the torch backend loads torch only when chosen."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEAN = sorted(f"runtime.{p.stem}" for p in (ROOT / "runtime").glob("*.py") if p.stem != "__init__")
HEAVY = ("torch", "models", "scenes", "onnxruntime", "tensorrt", "tensorrt_llm", "matplotlib")


def loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_every_runtime_module_imports_without_torch():
    assert "runtime.planner" in LEAN and "runtime.loop" in LEAN
    code = "import runtime, runtime.backends, runtime.backends.graphs\n" + "\n".join(f"import {m}" for m in LEAN)
    heavy = {m for m in loaded_after(code) if m.split(".")[0] in HEAVY}
    assert not heavy, f"lean runtime imported {sorted(heavy)[:5]}"


def test_the_onnxruntime_backend_loads_by_name_without_torch(tiny_onnx):
    mods = loaded_after("from runtime.artifacts import ModelSource, open_backend\n"
                        f"open_backend(ModelSource(engines={str(tiny_onnx)!r}), None)")
    assert "runtime.backends.onnxruntime" in mods and "torch" not in mods


def test_the_torch_backend_brings_torch_only_when_chosen():
    mods = loaded_after("import runtime.backends.torch")
    assert "torch" in mods and "models.target" in mods
