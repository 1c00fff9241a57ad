"""Position ids and rotary tables, numpy only (the lean runtime uses them as they are).

Public API:
    flat_position_ids(T, start=0) -> (T,) int64           FlatRoPE / 1D: 0, 1, 2, ...
    mrope_position_ids(ids, image_grid_thw, spatial_merge, image_token_id, vision_start_id)
        -> (positions (3, T) int64, rope_delta int)      exactly transformers' get_rope_index
    mrope_decode_position_ids(start, T, rope_delta) -> (3, T)   text after the prompt
    rope_tables(positions, head_dim, theta, mrope_section=None, interleaved=False)
        -> cos, sin (T, head_dim) float32
    mrope_axis_map(half, mrope_section, interleaved) -> (half,) int   which of t/h/w drives
        each rotary frequency

M-RoPE (Qwen2-VL and later): a text token at running position p gets (p, p, p). An image of
grid (t, h, w) patches becomes t * (h/m) * (w/m) tokens (m = spatial merge); the token at
(ti, hi, wi) gets (p + ti, p + hi, p + wi), and the text after it resumes at
p + max(h, w) / m. So positions grow slower than the token index; `rope_delta` =
max position + 1 - T carries that into decoding: token at cache index i has position i + delta.
"""
from __future__ import annotations

import numpy as np


def flat_position_ids(T: int, start: int = 0) -> np.ndarray:
    """FlatRoPE ids: the plain index of every token, vision tokens included. (T,) int64."""
    if T < 0 or start < 0:
        raise ValueError(f"flat_position_ids: T={T} and start={start} must be >= 0")
    return np.arange(start, start + T, dtype=np.int64)


def _image_runs(is_image: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of image tokens, as transformers groups them."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], is_image.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def _check_runs(ids, runs, grids, merge, vision_start_id) -> None:
    if len(runs) != len(grids):
        raise ValueError(f"mrope_position_ids: {len(runs)} runs of image tokens in ids but "
                         f"{len(grids)} rows in image_grid_thw; they must match one to one")
    for k, ((s, e), (t, h, w)) in enumerate(zip(runs, grids)):
        if h % merge or w % merge:
            raise ValueError(f"image {k}: grid (h={h}, w={w}) is not divisible by "
                             f"spatial_merge={merge}")
        n = t * (h // merge) * (w // merge)
        if e - s != n:
            raise ValueError(f"image {k}: {e - s} image tokens at [{s}, {e}) but grid "
                             f"{(t, h, w)} with merge {merge} needs {n}")
        if s == 0 or ids[s - 1] != vision_start_id:
            raise ValueError(f"image {k}: the token before its run (index {s - 1}) must be "
                             f"vision_start_id={vision_start_id}")


def _image_positions(p: int, t: int, h: int, w: int) -> np.ndarray:
    """(3, t*h*w) positions of one image's tokens in (t, h, w) raster order, offset by p."""
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt, hh, ww]).reshape(3, -1).astype(np.int64) + p


def mrope_position_ids(ids, image_grid_thw, spatial_merge: int, image_token_id: int,
                       vision_start_id: int) -> tuple[np.ndarray, int]:
    """3D M-RoPE ids of one prompt, as transformers' Qwen2.5-VL/Qwen3-VL get_rope_index.

    ids (T,) int; image_grid_thw (n_images, 3) patch grids in prompt order. Returns
    positions (3, T) int64 and rope_delta = positions.max() + 1 - T.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"mrope_position_ids: ids must be 1D (T,), got shape {ids.shape}")
    grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3).tolist()
    runs = _image_runs(ids == image_token_id)
    _check_runs(ids, runs, grids, spatial_merge, vision_start_id)
    pieces, p, cursor = [], 0, 0
    for (s, e), (t, h, w) in zip(runs, grids):
        pieces.append(np.arange(p, p + s - cursor, dtype=np.int64)[None].repeat(3, 0))
        p += s - cursor
        pieces.append(_image_positions(p, t, h // spatial_merge, w // spatial_merge))
        p += max(h, w) // spatial_merge
        cursor = e
    pieces.append(np.arange(p, p + len(ids) - cursor, dtype=np.int64)[None].repeat(3, 0))
    positions = np.concatenate(pieces, axis=1)
    delta = int(positions.max()) + 1 - len(ids) if len(ids) else 0
    return positions, delta


def mrope_decode_position_ids(start: int, T: int, rope_delta: int) -> np.ndarray:
    """(3, T) ids of T text tokens written at cache rows start..start+T-1 after the prompt."""
    return np.repeat(flat_position_ids(T, start)[None] + rope_delta, 3, axis=0)


def mrope_axis_map(half: int, mrope_section, interleaved: bool) -> np.ndarray:
    """(half,) int: which position axis (0=t, 1=h, 2=w) drives rotary frequency i.

    Sectioned (Qwen2.5-VL, e.g. [16, 24, 24]): the first 16 frequencies follow t, the next
    24 follow h, the last 24 follow w. Interleaved (Qwen3-VL, e.g. [24, 20, 20]):
    frequency i follows h if i % 3 == 1 and i < 3*sec[1], w if i % 3 == 2 and
    i < 3*sec[2], else t.
    """
    sec = [int(s) for s in mrope_section]
    if len(sec) != 3 or sum(sec) != half:
        raise ValueError(f"mrope_section={sec} must be 3 ints summing to head_dim/2={half}")
    if not interleaved:
        return np.repeat(np.arange(3), sec)
    i = np.arange(half)
    axis = np.zeros(half, dtype=np.int64)
    axis[(i % 3 == 1) & (i < 3 * sec[1])] = 1
    axis[(i % 3 == 2) & (i < 3 * sec[2])] = 2
    return axis


def inv_freq(dim: int, theta: float) -> np.ndarray:
    """(dim/2,) float32 rotary frequencies 1 / theta^(2i/dim), in fp32 like transformers."""
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)


def rope_tables(positions, head_dim: int, theta: float, mrope_section=None,
                interleaved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (..., T, head_dim) float32 for positions (..., T) (1D) or (3, ..., T) (M-RoPE).

    angle[i] = pos[axis(i)] * inv_freq[i] for i < head_dim/2; the table repeats the angles
    twice ([a, a]) to pair dimension i with i + head_dim/2 (the rotate_half convention).
    """
    pos = np.asarray(positions, dtype=np.float32)
    freq = inv_freq(head_dim, theta)
    if mrope_section:
        if pos.shape[0] != 3:
            raise ValueError(f"rope_tables: M-RoPE needs positions (3, ..., T), got {pos.shape}")
        axis = mrope_axis_map(head_dim // 2, mrope_section, interleaved)
        angles = _select_axis(pos[..., None] * freq, axis)
    else:
        angles = pos[..., None] * freq
    emb = np.concatenate([angles, angles], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def _select_axis(freqs: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """freqs (3, ..., half) -> (..., half), frequency i taken from position axis axis[i]."""
    half = freqs.shape[-1]
    return np.moveaxis(freqs[axis, ..., np.arange(half)], 0, -1)
