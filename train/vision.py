"""Vision pretraining: the target's vision tower learns what the cameras show before SFT.

Real Qwen-VL towers arrive pretrained; ours starts from random weights, and in SFT its only
signal is the one or two CoC words per scene that name a visual fact (left or right, car or
van, the light's colour). Per scene an SFT step costs ~12x a tower step (the 12-layer LLM over ~430
tokens), so the tower first learns those facts on its own, at a fraction of the cost:

    tower(8 images) -> 192 merged tokens (+ DeepStack features) -> 16 dims each, concatenated
                    -> MLP -> cause-word logits, decision logits
    loss = BCE over the cause words of the scene's commitment (multi-hot over every cause word
           in the training split) + CE over the expert's decision

The probe head is thrown away; SFT starts its tower from RUN/vision.safetensors
(`init_vision` in configs/train/sft.yaml). Validation numbers go to RUN/val.json:
cause-set exact match and decision accuracy, per family.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from models.config import load_preset
from models.vision import VisionTower
from core.config import ConfigError, to_dict
from scenes import dataset
from scenes.config import DECISIONS
from train import data, dist, loop
from train.config import DataConfig, VisionStageConfig
from train.metrics import cause_words   # the cause phrase: what the cameras should show

WEIGHTS = "vision.safetensors"


class Probe(nn.Module):
    """The tower plus a small head that keeps where each token sits: every merged token is
    projected to `slot` dims, the 192 slots are concatenated (left is never confused with
    right) and an MLP reads the cause words and the decision. (An attention-pooling head,
    tried first, stayed at chance: pooling throws away the position the facts depend on.)"""

    def __init__(self, vision_cfg, out_hidden: int, tokens: int, n_words: int, n_decisions: int,
                 slot: int = 16, hidden: int = 256):
        super().__init__()
        self.tower = VisionTower(vision_cfg, out_hidden)
        self.proj = nn.Linear(out_hidden, slot)
        self.hidden = nn.Linear(tokens * slot, hidden)
        self.words = nn.Linear(hidden, n_words)
        self.decisions = nn.Linear(hidden, n_decisions)

    def forward(self, pixels: torch.Tensor, grid_thw: torch.Tensor, B: int):
        merged, deepstack = self.tower(pixels, grid_thw)
        x = merged + sum(deepstack) if deepstack else merged
        h = F.gelu(self.hidden(self.proj(x).view(B, -1)))
        return self.words(h), self.decisions(h)


def labels(scenes, word_index: dict, decisions: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(multi-hot (N, n_words) float32, decision index (N,) int64); unknown words are ignored."""
    hot = np.zeros((len(scenes), len(word_index)), np.float32)
    for i, s in enumerate(scenes):
        for w in cause_words(s):
            if w in word_index:
                hot[i, word_index[w]] = 1.0
    dec = np.array([decisions.index(s.decision) for s in scenes], np.int64)
    return hot, dec


def load_split(data_cfg, split: str | None = None):
    """(images (N, 8, H, W, 3) uint8, scenes without their pixels kept twice)."""
    scenes = []
    for i, s in enumerate(dataset.load(data_cfg.dir, split or data_cfg.split)):
        if data_cfg.max_scenes and i >= data_cfg.max_scenes:
            break
        scenes.append(s)
    if not scenes:
        raise ConfigError(f"no scenes of split {split or data_cfg.split!r} in {data_cfg.dir!r}; "
                          "generate them with `specdrive scenes generate`")
    images = np.stack([data.scene_images(s) for s in scenes])
    return images, scenes


def batch_pixels(images: np.ndarray, vision) -> tuple[torch.Tensor, torch.Tensor]:
    flat = images.reshape(-1, *images.shape[-3:])
    pixels, grid = data.patchify(flat, vision.patch, vision.temporal_patch, vision.merge)
    return torch.from_numpy(pixels), torch.from_numpy(grid)


@torch.no_grad()
def evaluate(probe: Probe, images, scenes, word_index, decisions, vision, batch: int = 32) -> dict:
    """Cause-set exact match and decision accuracy, overall and per family."""
    probe.eval()
    hot, dec = labels(scenes, word_index, decisions)
    right_c, right_d = [], []
    for s in range(0, len(scenes), batch):
        px, grid = batch_pixels(images[s:s + batch], vision)
        w, d = probe(px, grid, len(images[s:s + batch]))
        right_c += ((w > 0).numpy() == (hot[s:s + batch] > 0.5)).all(1).tolist()
        right_d += (d.argmax(-1).numpy() == dec[s:s + batch]).tolist()
    probe.train()
    fams = sorted({sc.family for sc in scenes})
    per = {f: {"n": sum(sc.family == f for sc in scenes),
               "cause": float(np.mean([c for c, sc in zip(right_c, scenes) if sc.family == f])),
               "decision": float(np.mean([d for d, sc in zip(right_d, scenes) if sc.family == f]))}
           for f in fams}
    return {"scenes": len(scenes), "cause": float(np.mean(right_c)), "decision": float(np.mean(right_d)),
            "families": per}


def load_into_target(target, path) -> None:
    """Copy a pretrained tower (RUN/vision.safetensors) into `target.visual`, checking every
    tensor's name and shape; a mismatch names the tensor and both shapes."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"init_vision: {path} does not exist; run `specdrive train vision` first "
                          "or set init_vision: '' to start the tower from random weights")
    found = safetensors.torch.load_file(str(path))
    want = target.visual.state_dict()
    missing, extra = sorted(set(want) - set(found)), sorted(set(found) - set(want))
    if missing or extra:
        raise ConfigError(f"init_vision {path}: tensors missing {missing[:4]}, unexpected {extra[:4]} "
                          "(was it trained for another preset?)")
    for k, v in found.items():
        if v.shape != want[k].shape:
            raise ConfigError(f"init_vision {path}: {k} has shape {tuple(v.shape)}, this preset's "
                              f"tower needs {tuple(want[k].shape)}")
    target.visual.load_state_dict(found)


def run(cfg: VisionStageConfig) -> Path:
    """Pretrain the tower; writes RUN/vision.safetensors and RUN/val.json."""
    if cfg.run.device != "cpu":
        raise ConfigError(f"run.device={cfg.run.device!r}: the vision stage runs on the cpu only")
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    world = dist.init()
    out = Path(cfg.run.out)
    model_cfg = load_preset(cfg.preset)
    vision = model_cfg.target.vision
    images, scenes = load_split(cfg.data)
    vocab = sorted({w for s in scenes for w in cause_words(s)})
    word_index = {w: i for i, w in enumerate(vocab)}
    hot, dec = labels(scenes, word_index, DECISIONS)
    tokens = images.shape[1] * (images.shape[2] // vision.patch // vision.merge) * (
        images.shape[3] // vision.patch // vision.merge)
    torch.manual_seed(cfg.run.seed)
    probe = Probe(vision, model_cfg.target.llm.hidden, tokens, len(vocab), len(DECISIONS), cfg.slot)
    weights = data.balance_weights([data.fact_key(s) for s in scenes], cfg.data.balance)

    def step_fn(step):
        idx = data.batch_indices(len(scenes), cfg.run.batch_size, step, cfg.run.seed, world.rank, world.size,
                                 weights)
        px, grid = batch_pixels(images[idx], vision)
        w, d = probe(px, grid, len(idx))
        bce = F.binary_cross_entropy_with_logits(w, torch.from_numpy(hot[idx]))
        ce = F.cross_entropy(d, torch.from_numpy(dec[idx]))
        cause_hit = ((w.detach() > 0).numpy() == (hot[idx] > 0.5)).all(1).mean()
        dec_hit = (d.detach().argmax(-1).numpy() == dec[idx]).mean()
        return bce + cfg.decision_weight * ce, {"bce": float(bce.detach()), "ce": float(ce.detach()),
                                                "cause_acc": float(cause_hit), "decision_acc": float(dec_hit)}

    def on_checkpoint(step):
        out.mkdir(parents=True, exist_ok=True)
        weights = {k: v.detach().contiguous().clone() for k, v in probe.tower.state_dict().items()}
        safetensors.torch.save_file(weights, str(out / WEIGHTS), metadata={
            "stage": "vision", "preset": cfg.preset, "step": str(step), "cause_words": json.dumps(vocab)})

    loop.fit(cfg.run, {"probe": probe}, step_fn, world, on_checkpoint, {"config": to_dict(cfg)})
    if world.main and cfg.val_scenes:
        val = DataConfig(dir=cfg.data.dir, split="val", max_scenes=cfg.val_scenes)
        val_images, val_scenes = load_split(val)
        result = evaluate(probe, val_images, val_scenes, word_index, DECISIONS, vision)
        (out / "val.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"val: cause {result['cause']:.3f}, decision {result['decision']:.3f} "
              f"over {result['scenes']} scenes", flush=True)
    return out / WEIGHTS
