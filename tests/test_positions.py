"""prompt.positions (numpy): 1D/FlatRoPE ids, 3D M-RoPE ids, rotary tables; prompt.pixels.

Exact agreement with transformers' get_rope_index is in test_hf_parity.py; here the rules are
checked from their definitions (independently computed), plus the errors.
"""
import numpy as np
import pytest

from prompt.pixels import images_to_patches
from prompt.positions import (flat_position_ids, mrope_axis_map, mrope_decode_position_ids,
                              mrope_position_ids, rope_tables)

IMG, VS, VE = 90, 91, 92


def make_prompt(rng, grids, merge=2):
    """Random text runs around images; returns ids and the (start, n) span of each image."""
    ids, spans = list(rng.integers(0, 80, 4)), []
    for t, h, w in grids:
        n = t * (h // merge) * (w // merge)
        ids.append(VS)
        spans.append((len(ids), n))
        ids += [IMG] * n + [VE] + list(rng.integers(0, 80, int(rng.integers(1, 5))))
    return np.array(ids), spans


def test_flat_ids_are_the_token_index():
    assert np.array_equal(flat_position_ids(5, start=3), [3, 4, 5, 6, 7])
    with pytest.raises(ValueError, match="T=-1"):
        flat_position_ids(-1)


def test_text_only_mrope_is_plain_1d():
    ids = np.arange(12) % 50
    pos, delta = mrope_position_ids(ids, np.zeros((0, 3)), 2, IMG, VS)
    assert np.array_equal(pos, np.tile(np.arange(12), (3, 1))) and delta == 0


@pytest.mark.parametrize("grids", [[(1, 4, 6)], [(1, 4, 6), (1, 6, 4)], [(2, 4, 4), (1, 8, 2)]])
def test_mrope_ids_follow_the_rule(grids):
    ids, spans = make_prompt(np.random.default_rng(len(grids)), grids)
    pos, delta = mrope_position_ids(ids, grids, 2, IMG, VS)
    p = 0  # running text position, replayed token by token from the rule in the docstring
    cursor = 0
    for (s, n), (t, h, w) in zip(spans, grids):
        text = np.arange(s - cursor) + p
        assert np.array_equal(pos[:, cursor:s], np.tile(text, (3, 1)))
        p += s - cursor
        grid = pos[:, s:s + n].reshape(3, t, h // 2, w // 2)
        ti, hi, wi = np.meshgrid(np.arange(t), np.arange(h // 2), np.arange(w // 2), indexing="ij")
        assert np.array_equal(grid, np.stack([ti, hi, wi]) + p)
        p += max(h, w) // 2
        cursor = s + n
    assert np.array_equal(pos[:, cursor:], np.tile(np.arange(len(ids) - cursor) + p, (3, 1)))
    assert delta == pos.max() + 1 - len(ids)
    nxt = mrope_decode_position_ids(len(ids), 2, delta)
    assert np.array_equal(nxt, np.tile([pos.max() + 1, pos.max() + 2], (3, 1)))


def test_mrope_errors_name_the_problem():
    ids, _ = make_prompt(np.random.default_rng(0), [(1, 4, 6)])
    with pytest.raises(ValueError, match="1 runs of image tokens.*2 rows"):
        mrope_position_ids(ids, [(1, 4, 6), (1, 4, 6)], 2, IMG, VS)
    with pytest.raises(ValueError, match="6 image tokens.*needs 8"):
        mrope_position_ids(ids, [(1, 4, 8)], 2, IMG, VS)
    with pytest.raises(ValueError, match="not divisible by spatial_merge=2"):
        mrope_position_ids(ids, [(1, 3, 6)], 2, IMG, VS)
    with pytest.raises(ValueError, match="vision_start_id=77"):
        mrope_position_ids(ids, [(1, 4, 6)], 2, IMG, 77)


def reference_angles(pos, head_dim, theta):
    """float64 angles pos * theta^(-2i/d), computed without the module."""
    return np.asarray(pos, np.float64)[..., None] * theta ** (-np.arange(0, head_dim, 2) / head_dim)


def test_rope_tables_1d_match_the_formula():
    pos = np.arange(0, 500, 7)
    cos, sin = rope_tables(pos, 32, 10000.0)
    ang = reference_angles(pos, 32, 10000.0)
    assert cos.shape == (len(pos), 32) and cos.dtype == np.float32
    assert np.abs(cos - np.cos(np.concatenate([ang, ang], -1))).max() < 2e-4
    assert np.abs(sin - np.sin(np.concatenate([ang, ang], -1))).max() < 2e-4


@pytest.mark.parametrize("section,interleaved", [((16, 24, 24), False), ((24, 20, 20), True),
                                                 ((6, 5, 5), True)])
def test_mrope_tables(section, interleaved):
    head_dim, rng = 2 * sum(section), np.random.default_rng(0)
    text = np.arange(40)
    same = rope_tables(np.tile(text, (3, 1)), head_dim, 5e6, section, interleaved)
    assert np.array_equal(same[0], rope_tables(text, head_dim, 5e6)[0])  # t=h=w: plain RoPE
    pos = rng.integers(0, 300, (3, 40))
    cos, _ = rope_tables(pos, head_dim, 5e6, section, interleaved)
    axis = mrope_axis_map(head_dim // 2, section, interleaved)
    assert [int((axis == a).sum()) for a in range(3)] == list(section)
    for a in range(3):  # frequency i turns with position axis axis[i] only
        ref = np.cos(reference_angles(pos[a], head_dim, 5e6))
        cols = np.flatnonzero(axis == a)
        assert np.abs(cos[:, cols] - ref[:, cols]).max() < 2e-4
        assert np.abs(cos[:, cols + head_dim // 2] - ref[:, cols]).max() < 2e-4


def test_qwen3_interleave_layout():
    axis = mrope_axis_map(64, (24, 20, 20), interleaved=True)
    assert list(axis[:6]) == [0, 1, 2, 0, 1, 2] and list(axis[60:]) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="summing to head_dim/2=64"):
        mrope_axis_map(64, (16, 24, 20), interleaved=False)


def test_images_to_patches_round_trip():
    """Undo the patch layout by hand: every (C, tp, p, p) row is its image block, tp times."""
    images = np.random.default_rng(0).integers(0, 256, (2, 16, 32, 3), dtype=np.uint8)
    patches, grid = images_to_patches(images, patch=4, temporal_patch=2, merge=2)
    assert patches.shape == (2 * 4 * 8, 3 * 2 * 4 * 4) and grid.tolist() == [[1, 4, 8]] * 2
    norm = (images / 255.0 - 0.5) / 0.5
    row = 0
    for n in range(2):
        for bh in range(2):
            for bw in range(4):
                for ih in range(2):
                    for iw in range(2):
                        y, x = 4 * (2 * bh + ih), 4 * (2 * bw + iw)
                        block = norm[n, y:y + 4, x:x + 4].transpose(2, 0, 1)  # (C, p, p)
                        ref = np.stack([block, block], axis=1).reshape(-1)
                        assert np.abs(patches[row] - ref).max() < 1e-6
                        row += 1
    with pytest.raises(ValueError, match="divisible by patch\\*merge=8"):
        images_to_patches(images[:, :12], patch=4, temporal_patch=2, merge=2)
    with pytest.raises(ValueError, match="uint8"):
        images_to_patches(images.astype(np.float32), patch=4, temporal_patch=2, merge=2)
