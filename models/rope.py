"""Rotary embeddings in torch: one table maker for 1D RoPE / M-RoPE, one for the ViT's 2D rope,
and one `apply_rope` that every attention uses (target, draft, expert, vision).

Public API (stable):
    inv_freq(dim, theta) -> (dim/2,) float32
    rope_cos_sin(position_ids, head_dim, theta, mrope_section=(), interleaved=False)
        position_ids (B, T) for 1D/FlatRoPE or (3, B, T) for M-RoPE -> cos, sin (B, T, head_dim)
    vision_cos_sin(hw_ids (N, 2), head_dim, theta) -> cos, sin (N, head_dim)
    rotate_half(x); apply_rope(x, cos, sin): x (B, H, T, D), cos/sin (B, T, D)

The maths is the numpy reference in prompt.positions (same frequencies, same t/h/w axis map);
these build the tables on the model's device.
"""
from __future__ import annotations

import torch

from prompt.positions import mrope_axis_map


def inv_freq(dim: int, theta: float, device=None) -> torch.Tensor:
    """(dim/2,) float32: 1 / theta^(2i/dim), computed as transformers does (fp32 pow)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, mrope_section=(),
                 interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, T, head_dim) float32.

    1D: angle[b, t, i] = pos[b, t] * f[i]. M-RoPE: angle[b, t, i] = pos[axis(i), b, t] * f[i]
    with axis(i) from `mrope_axis_map` (Qwen2.5 sectioned or Qwen3 interleaved). 1D ids with
    an M-RoPE model mean t = h = w (plain text). Table = [angle, angle] (rotate_half pairing).
    """
    f = inv_freq(head_dim, theta, position_ids.device)
    pos = position_ids.float()
    if mrope_section:
        if pos.dim() == 2:
            pos = pos.unsqueeze(0).expand(3, -1, -1)
        if pos.dim() != 3 or pos.shape[0] != 3:
            raise ValueError(f"M-RoPE position_ids must be (3, B, T) or (B, T), "
                             f"got {tuple(position_ids.shape)}")
        axis = torch.as_tensor(mrope_axis_map(head_dim // 2, mrope_section, interleaved),
                               device=pos.device)
        freqs = pos[..., None] * f                                  # (3, B, T, half)
        angles = freqs.gather(0, axis.view(1, 1, 1, -1).expand(1, *freqs.shape[1:]))[0]
    else:
        if pos.dim() != 2:
            raise ValueError(f"1D RoPE position_ids must be (B, T), got {tuple(position_ids.shape)}")
        angles = pos[..., None] * f                                 # (B, T, half)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def vision_cos_sin(hw_ids: torch.Tensor, head_dim: int, theta: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """ViT 2D rope: cos, sin (N, head_dim) for patch coordinates hw_ids (N, 2) = (row, col).

    One frequency set g of size head_dim/4 (from dim head_dim/2) serves both axes:
    angles = [row * g, col * g] (head_dim/2), table = [angles, angles].
    """
    g = inv_freq(head_dim // 2, theta, hw_ids.device)
    freqs = hw_ids.float()[..., None] * g                           # (N, 2, head_dim/4)
    angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dim (pairs dim i with i + D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D), cos/sin (B, T, D) -> x*cos + rotate_half(x)*sin, in x's dtype."""
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    return x * cos + rotate_half(x) * sin
