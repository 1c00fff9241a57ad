"""Scenes -> training tensors: pixel patches, prompt ids, M-RoPE ids, loss masks, expert targets.

One scene becomes one `Example` (numpy): the full token-output sequence

    <|im_start|> user [8 images] <|traj_history_start|> 48 bins ... <|cot_start|>
    CoC words <|cot_end|> <|traj_future_start|> 128 bins <|traj_future_end|> <|im_end|>

Images: 4 cameras x 2 frames, each (camera, frame) one image, camera-major (cam0 f0, cam0 f1,
cam1 f0, ...), patchified by prompt.pixels (HF's Qwen-VL layout, still images repeated over the
temporal patch, pixels to [-1, 1]) as the runtime does. 64 x 96 with p = 8, m = 2: grid
(1, 8, 12), 24 LLM tokens per image, 192 per scene.

Loss masks index the *logit* position t that predicts ids[t+1]:
    coc[t]     target ids[t+1] is a CoC word or <|cot_end|> (trajectory logits masked there)
    future[t]  target is <|traj_future_start|>, a future bin, <|traj_future_end|> or <|im_end|>
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import torch

from models.action_expert import v0_from_history, waypoints_to_actions
from prompt.layout import COMMITMENT, build_prompt
from prompt.pixels import images_to_patches
from prompt.positions import mrope_position_ids
from scenes import dataset


@dataclass
class Example:
    ids: np.ndarray          # (T,) int64 full sequence
    positions: np.ndarray    # (3, T) int64 M-RoPE ids
    rope_delta: int
    coc_kind: np.ndarray     # (T,) int8 ROUTINE / COMMITMENT on CoC words
    images: np.ndarray       # (n_img, H, W, 3) uint8, camera-major (patchified when batched)
    grid_thw: np.ndarray     # (n_img, 3) int64
    reasoning_start: int     # index after <|cot_start|>: the inference prompt is ids[:reasoning_start]
    cot_end: int             # index of <|cot_end|>
    actions: np.ndarray      # (64, 2) expert (accel, curvature) targets
    v0: float                # ego speed at t0, m/s
    future: np.ndarray       # (64, 3) expert future waypoints
    history: np.ndarray      # (16, 3)
    index: int = 0           # scene index in its dataset (seeds its training randomness)


def patchify(images: np.ndarray, patch: int, temporal_patch: int, merge: int):
    """(n_img, H, W, 3) uint8 -> (pixels (n_img*h*w, 3*tp*p*p) float32, grid (n_img, 3)): the
    vision tower's HF layout, from the one place the runtime uses too (prompt.pixels)."""
    return images_to_patches(images, patch, temporal_patch, merge)


def vision_embeds(target, e):
    """(image embeds, deepstack) of one example, fp32 from the target's vision tower."""
    v = target.cfg.vision
    pixels, grid = patchify(e.images, v.patch, v.temporal_patch, v.merge)
    return target.encode_images(torch.from_numpy(pixels).to(target.embed_tokens.weight.device), torch.from_numpy(grid))


def image_grid(shape: tuple, vision) -> np.ndarray:
    """(n_img, H, W, 3) -> grid_thw (n_img, 3) in patches: (1, H/p, W/p) per still image."""
    n, H, W = shape[:3]
    return np.tile(np.array([[1, H // vision.patch, W // vision.patch]], np.int64), (n, 1))


def scene_images(scene) -> np.ndarray:
    """(4, 2, H, W, 3) -> (8, H, W, 3), camera-major."""
    imgs = np.asarray(scene.images)
    return imgs.reshape(-1, *imgs.shape[-3:])


def encode_scene(scene, tok, vision, index: int = 0) -> Example:
    """One Scene -> Example. `vision` is models.config.VisionConfig; the expert future becomes
    (accel, curvature) targets through `inverse_unicycle` (models' own)."""
    images = scene_images(scene)
    grid = image_grid(images.shape, vision)
    n_tok = [int(t * h * w) // vision.merge ** 2 for t, h, w in grid]
    p = build_prompt(tok, n_tok, scene.history, scene.coc, scene.future, scene.coc_routine)
    pos, delta = mrope_position_ids(p.ids, grid, vision.merge, tok.image_pad, tok.vision_start)
    cot_end = int(np.flatnonzero(p.ids == tok.cot_end)[0])
    v0 = float(v0_from_history(torch.as_tensor(np.asarray(scene.history, np.float64))))
    actions = np.asarray(inverse_unicycle(np.asarray(scene.future), v0), dtype=np.float32)
    return Example(p.ids, pos, delta, p.coc_kind, images, grid, p.reasoning_start, cot_end,
                   actions, v0, np.asarray(scene.future, np.float32),
                   np.asarray(scene.history, np.float32), index)


def inverse_unicycle(future, v0: float):
    """(64, 3) expert future -> (64, 2) (accel, curvature) targets (models' inverse unicycle)."""
    return waypoints_to_actions(torch.as_tensor(future, dtype=torch.float64), torch.tensor(v0, dtype=torch.float64)).float().numpy()


def load_examples(data_cfg, tok, vision, keys: bool = False):
    """The split's scenes as Examples; with keys=True also each scene's data.fact_key."""
    out, facts = [], []
    for i, scene in enumerate(dataset.load(data_cfg.dir, data_cfg.split)):
        if data_cfg.max_scenes and i >= data_cfg.max_scenes:
            break
        out.append(encode_scene(scene, tok, vision, index=i))
        if keys:
            facts.append(fact_key(scene))
    if not out:
        raise ValueError(f"no scenes of split {data_cfg.split!r} in {data_cfg.dir!r}; "
                         "generate them with `specdrive scenes generate`")
    return (out, facts) if keys else out


def loss_masks(ex: Example) -> tuple[np.ndarray, np.ndarray]:
    """(coc (T,), future (T,)) bool over logit positions (position t predicts ids[t+1])."""
    T = len(ex.ids)
    coc, future = np.zeros(T, bool), np.zeros(T, bool)
    coc[ex.reasoning_start - 1:ex.cot_end] = True       # targets reasoning_start .. cot_end
    future[ex.cot_end:T - 1] = True                     # targets cot_end+1 .. T-1
    return coc, future


@dataclass
class Batch:
    ids: torch.Tensor         # (B, T) right-padded with <|pad|>
    positions: torch.Tensor   # (3, B, T)
    coc: torch.Tensor         # (B, T) bool logit positions of the CoC loss
    future: torch.Tensor      # (B, T) bool logit positions of the future-token loss
    commitment: torch.Tensor  # (B, T) bool logit positions whose target is a commitment CoC word
    pixels: torch.Tensor      # (sum patches, patch_dim)
    grid_thw: torch.Tensor    # (B * n_img, 3)
    reasoning_start: torch.Tensor  # (B,)
    cot_end: torch.Tensor     # (B,)
    rope_delta: torch.Tensor  # (B,)
    actions: torch.Tensor     # (B, 64, 2)
    v0: torch.Tensor          # (B,)
    index: torch.Tensor       # (B,) scene indices
    lengths: torch.Tensor     # (B,) unpadded lengths

    def to(self, device) -> "Batch":
        """The tensors the models and losses read, on `device`; grid_thw and the per-scene rows,
        deltas, indices and lengths stay host data (read on the host)."""
        moved = ("ids", "positions", "coc", "future", "commitment", "pixels", "actions", "v0")
        return replace(self, **{k: getattr(self, k).to(device) for k in moved})


def collate(examples: list[Example], pad_id: int, vision) -> Batch:
    """Right-pad to the longest sequence; padding sits after every real token so causal
    attention never lets a real token see it, and no loss mask covers it."""
    T = max(len(e.ids) for e in examples)
    B = len(examples)
    ids = np.full((B, T), pad_id, np.int64)
    pos = np.zeros((3, B, T), np.int64)
    coc, fut, commit = np.zeros((B, T), bool), np.zeros((B, T), bool), np.zeros((B, T), bool)
    for b, e in enumerate(examples):
        n = len(e.ids)
        ids[b, :n] = e.ids
        pos[:, b, :n] = e.positions
        pos[:, b, n:] = e.positions[:, -1:] + np.arange(1, T - n + 1)
        coc[b, :n], fut[b, :n] = loss_masks(e)
        commit[b, :n - 1] = e.coc_kind[1:] == COMMITMENT
    t = torch.from_numpy
    return Batch(
        t(ids), t(pos), t(coc), t(fut), t(commit),
        t(np.concatenate([patchify(e.images, vision.patch, vision.temporal_patch, vision.merge)[0]
                          for e in examples])),
        t(np.concatenate([e.grid_thw for e in examples])),
        torch.tensor([e.reasoning_start for e in examples]), torch.tensor([e.cot_end for e in examples]),
        torch.tensor([e.rope_delta for e in examples]),
        t(np.stack([e.actions for e in examples])), torch.tensor([e.v0 for e in examples], dtype=torch.float32),
        torch.tensor([e.index for e in examples]), torch.tensor([len(e.ids) for e in examples]))


def expert_noise(expert, index: int, samples: int, device=None) -> torch.Tensor:
    """The expert's starting noise (samples, W, A) for scene `index`: what expert.sample draws
    from Generator().manual_seed(index) for one scene, drawn on the host (the same on any device)."""
    g = torch.Generator().manual_seed(int(index))
    return torch.randn((samples, expert.cfg.n_waypoints, expert.cfg.action_dim), generator=g).to(device)


def sample_rng(seed: int, step: int, index: int, device=None) -> torch.Generator:
    """The generator of one scene's training randomness at one step (flow noise, time, cut).
    A function of (seed, step, scene index) only, so data-parallel shards and resumed runs draw
    exactly what one uninterrupted process draws."""
    g = torch.Generator(device=device or "cpu")
    g.manual_seed((seed * 1_000_003 + step) * 1_000_033 + index)
    return g


def fact_key(scene) -> str:
    """What a scene teaches about the world: its family, the cause its commitment names (kind and
    facts, not the wording: the paraphrase is drawn at random) and the decision label."""
    facts = [f"{k}={v}" for k, v in sorted(scene.cause_facts.items())]
    return " ".join([scene.family, scene.cause_kind, *facts, "->", scene.decision])


def balance_weights(keys, power: float) -> np.ndarray | None:
    """Sampling probabilities with p(item) proportional to count(its key) ** -power: 0 keeps
    the data's own frequencies (returns None: plain epochs), 1 draws every key equally often.
    Rare facts (a yellow light is ~1.5% of the scenes) are then seen more than once an epoch."""
    if power == 0:
        return None
    keys = list(keys)
    counts = Counter(keys)
    w = np.array([counts[k] ** -float(power) for k in keys])
    return w / w.sum()


def batch_indices(n_items: int, batch: int, step: int, seed: int, rank: int = 0, world: int = 1,
                  weights: np.ndarray | None = None) -> np.ndarray:
    """Indices of this rank's slice of global batch `step`: epochs are seeded permutations,
    the global batch (batch * world items) is cut into `world` consecutive slices. With
    `weights` (balance_weights) the global batch is drawn with replacement from them, seeded by
    (seed, step), so every rank and a resumed run draw the same batch."""
    if n_items < 1:
        raise ValueError("the dataset is empty: no scenes to train on")
    if weights is not None:
        if len(weights) != n_items:
            raise ValueError(f"{len(weights)} sampling weights for {n_items} items")
        drawn = np.random.default_rng([seed, step, 0xBA1]).choice(n_items, size=batch * world, p=weights)
        return drawn[rank * batch:(rank + 1) * batch].astype(np.int64)
    g = batch * world
    start = step * g
    out = []
    for i in range(start + rank * batch, start + (rank + 1) * batch):
        epoch, j = divmod(i, n_items)
        out.append(_permutation(n_items, seed, epoch)[j])
    return np.array(out, dtype=np.int64)


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)
