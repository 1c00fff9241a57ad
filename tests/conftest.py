"""Test-wide settings. CI (CI=true) runs hypothesis derandomized, so a submission's result does
not depend on the examples drawn that day; local runs keep exploring new examples."""
import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory):
    """checkpoints/tiny exported to ONNX once per session, for the cpu planner profile (about a
    minute on 2 cores). Tests that change files copy it first (shutil.copytree)."""
    from export import onnx as ex
    from runtime.config import load_planner_config

    out = tmp_path_factory.mktemp("engines") / "tiny-ort"
    prof = load_planner_config("cpu")
    ex.export_onnx(ROOT / "checkpoints" / "tiny", out, None,
                   ex.ExportConfig(max_len=prof.max_len, k_max=8, samples=prof.trajectory_samples),
                   progress=lambda *_: None)
    return out
