"""What the training tests train on: a micro model preset, a handful of real scenes and their
encoded examples, a run folder with both (torch on one thread: the `one_thread` fixture in
tests/conftest.py)."""
import functools
from pathlib import Path

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

