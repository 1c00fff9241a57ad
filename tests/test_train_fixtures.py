"""Shared pieces of the training tests: a micro model preset, a handful of real scenes, and a
fixture that runs torch on one thread."""
import functools
from pathlib import Path

import pytest

MICRO = """
target:
  vision: {style: qwen3, depth: 1, hidden: 32, heads: 2, intermediate: 64, patch: 8,
           temporal_patch: 2, merge: 2, num_position_embeddings: 144, deepstack_layers: [0]}
  llm: {layers: 4, hidden: 64, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 128,
        vocab_size: 1200, mrope_section: [4, 2, 2], interleaved: true, qk_norm: true}
draft: {layers: 1, rope: flat, features: fused, feature_layers: [0, 2, 3]}
expert: {hidden: 32, heads: 2, intermediate: 64, n_waypoints: 64, euler_steps: 4, action_dim: 2}
"""


def micro_preset(folder: Path) -> str:
    path = Path(folder) / "micro.yaml"
    path.write_text(MICRO)
    return str(path)


def stage_root(folder: Path, seed: int, n: int = 40) -> Path:
    """A run folder with a generated dataset (folder/scenes) and the micro preset (micro.yaml)."""
    from scenes.dataset import GenerateConfig, generate

    generate(GenerateConfig(out=str(folder / "scenes"), n=n, seed=seed), progress=False)
    micro_preset(folder)
    return folder


@functools.lru_cache(maxsize=None)
def scenes(n: int, split: str = "train") -> tuple:
    from scenes.world import make_scene

    return tuple(make_scene(seed, split=split) for seed in range(n))


def examples(n: int, tok, vision, split: str = "train") -> list:
    from train import data

    return [data.encode_scene(s, tok, vision, index=i)
            for i, s in enumerate(scenes(n, split))]


def test_micro_preset_loads(tmp_path):
    from models.config import load_preset

    cfg = load_preset(micro_preset(tmp_path))
    assert cfg.target.llm.layers == 4 and cfg.expert.head_dim == cfg.target.llm.head_dim


@pytest.fixture(autouse=False)
def one_thread():
    """Torch on one thread for the test, restored after: on the shared 2-core machine two
    OpenMP threads spin against other processes and run many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
