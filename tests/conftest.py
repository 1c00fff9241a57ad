"""Test-wide settings. CI (CI=true) runs hypothesis derandomized, so a submission's result does
not depend on the examples drawn that day; local runs keep exploring new examples."""
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

# the micro preset of the bench tests (`preset`): 2 layers, hidden 32, random weights
BENCH_MICRO = {
    "target": {"vision": {"depth": 1, "hidden": 16, "heads": 2, "intermediate": 32, "patch": 8,
                          "temporal_patch": 2, "merge": 2, "num_position_embeddings": 144,
                          "deepstack_layers": [0]},
               "llm": {"layers": 2, "hidden": 32, "heads": 2, "kv_heads": 1, "head_dim": 16,
                       "intermediate": 64, "vocab_size": 1100, "mrope_section": [4, 2, 2],
                       "interleaved": True}},
    "draft": {"layers": 1, "rope": "flat", "features": "fused", "feature_layers": [0, 1, 1]},
    "expert": {"hidden": 32, "heads": 2, "intermediate": 32, "euler_steps": 2},
}

# The modules whose fixtures take minutes on one core (measured single-process at 900dffd:
# calibration's setup makes the shared ONNX export, TensorRT-LLM's makes its own, Edge-LLM's runs
# NVIDIA's exporter, then the longest spec-equals-plain files). Under pytest-xdist (`make test`) a
# worker takes whole files in collection order (two at a time); these go first so that no worker
# starts a five-minute file when the others are nearly done (longest first: the run ends when the
# last worker does). Calibration's setup makes the shared export (tiny_onnx); the files that wait
# for it come after the heavy ones that do not (a fresh-clone run at 8042914 had test_onnx's worker
# wait 235 s for it).
HEAVY_FIRST = ("test_calibration.py", "test_tensorrt_llm_backend.py", "test_edgellm.py", "test_eagle3.py",
               "test_spec_torch.py", "test_tensorrt_backend.py", "test_soak.py", "test_onnx.py", "test_trees.py")


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(Path(str(item.fspath)).name, len(rank)), order[id(item)]))


settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


def once_per_run(tmp_path_factory, name: str, make):
    """A session fixture's folder made once per test run: `make(folder)` into a fresh temporary
    folder; under pytest-xdist (`make test` runs several workers) into the run's folder that every
    worker shares, the first worker making it under a file lock and the others reading it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp(name) / name
        make(out)
        return out
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent        # this run's folder (popen-gwN's parent)
    out = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (shared / f"{name}.made").is_file():
            make(out)
            (shared / f"{name}.made").write_text("")
    return out


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory):
    """checkpoints/tiny exported to ONNX once per run, for the cpu planner profile (about four
    minutes on one core). Tests that change files copy it first (shutil.copytree)."""
    from export import onnx as ex
    from runtime.config import load_planner_config

    prof = load_planner_config("cpu")
    return once_per_run(tmp_path_factory, "tiny-ort", lambda out: ex.export_onnx(
        ROOT / "checkpoints" / "tiny", out, None,
        ex.ExportConfig(max_len=prof.max_len, k_max=8, samples=prof.trajectory_samples), progress=lambda *_: None))


@pytest.fixture(scope="session")
def frame_local_ckpt(tmp_path_factory):
    """checkpoints/tiny with its target in the frame_local image layout (llm.image_attention): the
    shipped one is trained so; a copy, declared so whatever the shipped layout."""
    from folders import planner_copy

    return planner_copy(ROOT / "checkpoints" / "tiny", tmp_path_factory.mktemp("ckpt") / "tiny-frame-local",
                        "frame_local")


@pytest.fixture(scope="session")
def causal_ckpt(tmp_path_factory):
    """checkpoints/tiny's weights declared in the HF-exact causal image layout: the layout the
    runtimes with their own causal mask take (transformers, TensorRT-LLM, TensorRT Edge-LLM) and the
    approximate streaming mode needs. A valid model, though not the one the training made."""
    from folders import planner_copy

    return planner_copy(ROOT / "checkpoints" / "tiny", tmp_path_factory.mktemp("ckpt") / "tiny-causal", "causal")


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for the module, restored after (pytestmark = usefixtures): tiny models
    on the shared 2-core machine, where intra-op threads only spin against other processes
    (measured 3.5 ms vs 17 ms per forward under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """BENCH_MICRO as a preset file (bench tests: --preset)."""
    path = tmp_path_factory.mktemp("preset") / "micro.yaml"
    path.write_text(yaml.safe_dump(BENCH_MICRO))
    return path


@pytest.fixture(scope="module")
def drive(request):
    """A short test drive of helpers.CYCLES cycles from the module's DRIVE_SEED (the seed its
    expected counts were written for)."""
    from helpers import CYCLES
    from scenes.config import DT
    from scenes.world import make_drive

    return make_drive(request.module.DRIVE_SEED, None, "test", CYCLES * DT)


@pytest.fixture(scope="module")
def tiny_models():
    """(cfg, target, expert): the tiny preset with checkpoints/tiny's tokenizer, random weights
    (seed 0), in eval mode."""
    from models import io
    from models.config import load_preset
    from prompt.tokenizer import load_tokenizer

    cfg = io.with_tokenizer(load_preset("tiny"), load_tokenizer(ROOT / "checkpoints" / "tiny"))
    target, expert, _ = io.new_models(cfg, 0)
    return cfg, target.eval(), expert.eval()


@pytest.fixture(scope="module")
def tiny_backends():
    """Torch backends on one random tiny model (tests/tiny_torch.py), by draft: the target itself
    (every draft accepted), a noised copy of it (partial acceptance), the random FlatRoPE routine
    draft (mostly first-token rejections)."""
    from runtime.backends.torch import TorchBackend, noised_copy
    from tiny_torch import build, tiny_config

    cfg = tiny_config()
    target, expert, routine = build(cfg)
    return {"self": TorchBackend(cfg, target, expert, target, "self", max_len=128),
            "noised": TorchBackend(cfg, target, expert, noised_copy(target, 0.05, 1), "self", max_len=128),
            "routine": TorchBackend(cfg, target, expert, routine, "routine", max_len=128)}
