"""Camera images -> the vision tower's flattened patch layout (numpy only, for the runtime too).

    patches, grid_thw = images_to_patches(images, patch=8, temporal_patch=2, merge=2)

images (n, H, W, 3) uint8 -> patches (n * gh * gw, 3 * tp * p * p) float32 and grid_thw (n, 3)
= (1, H/p, W/p), exactly the layout of transformers' Qwen2-VL/Qwen3-VL image processor with
resizing off: x = (pixel/255 - mean) / std; a still image is repeated over the temporal patch;
rows in merge-block order (merged row, merged col, then the m x m patches inside); each row
is (C, tp, p, p) flattened. The normalization is fixed (Qwen3-VL's mean = std = 0.5).
"""
from __future__ import annotations

import numpy as np

QWEN3_MEAN = (0.5, 0.5, 0.5)
QWEN3_STD = (0.5, 0.5, 0.5)


def images_to_patches(images, patch: int, temporal_patch: int, merge: int,
                      mean=QWEN3_MEAN, std=QWEN3_STD) -> tuple[np.ndarray, np.ndarray]:
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (n, H, W, 3), got {images.dtype} {images.shape}")
    n, H, W, C = images.shape
    if H % (patch * merge) or W % (patch * merge):
        raise ValueError(f"image size {H}x{W} must be divisible by patch*merge={patch * merge}")
    x = images.astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    gh, gw = H // patch, W // patch
    x = x.transpose(0, 3, 1, 2).reshape(n, C, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 2, 5, 3, 6, 1, 4, 7)          # (n, gh/m, gw/m, m, m, C, p, p)
    x = np.broadcast_to(x[..., None, :, :], (*x.shape[:6], temporal_patch, patch, patch))
    patches = np.ascontiguousarray(x).reshape(n * gh * gw, C * temporal_patch * patch * patch)
    grid_thw = np.tile(np.array([[1, gh, gw]], dtype=np.int64), (n, 1))
    return patches, grid_thw
