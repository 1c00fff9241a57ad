"""Vision tower: Qwen3-VL style (learned + 2D rotary positions, DeepStack mergers), or Qwen2.5-VL
style by config (RMSNorm, SwiGLU MLP, window attention). Module names follow transformers.

Input is HF's flattened patch layout: pixel_patches (N, C*tp*p*p), rows in merge-block order
(for each frame: merged row, merged col, then the m x m patches inside), and grid_thw (n, 3)
in patches. Output: (N / m^2, out_hidden) LLM-width embeddings, one per merged 2x2 block, and
the DeepStack features (same shape), one per `deepstack_layers` entry.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.config import VisionConfig
from models.layers import RMSNorm, SwiGLU
from models.rope import apply_rope, vision_cos_sin


def _grids(grid_thw) -> list[tuple[int, int, int]]:
    """grid_thw (n, 3) as host data (numpy, a list or a CPU tensor): the grid shapes the work,
    so it is an argument known before the call, never read back from a device."""
    if torch.is_tensor(grid_thw):
        if grid_thw.device.type != "cpu":
            raise ValueError(f"grid_thw is on {grid_thw.device}; pass it as host data (numpy or CPU)")
        grid_thw = grid_thw.tolist()
    return [tuple(int(v) for v in row) for row in np.asarray(grid_thw, np.int64).reshape(-1, 3)]


def merge_order_rows_cols(h: int, w: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h*w,) row and col of each patch of one frame, in merge-block order."""
    rows = torch.arange(h)[:, None].expand(h, w).reshape(h // m, m, w // m, m)
    cols = torch.arange(w)[None, :].expand(h, w).reshape(h // m, m, w // m, m)
    return rows.transpose(1, 2).flatten(), cols.transpose(1, 2).flatten()


def _interp_taps(index: torch.Tensor, size: int, side: int):
    """Bilinear (align_corners) taps into a side-long table for `index` on a size-long axis:
    src = index * (side-1)/(size-1); taps floor, floor+1 (clamped); weight 1 - |src - tap|."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = src.floor()
    taps = floor.long()[:, None] + torch.arange(2)
    weights = (1 - (src[:, None] - floor[:, None] - torch.arange(2)).abs()).clamp(min=0)
    return taps.clamp(0, side - 1), weights


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x, cos, sin, seg_lens: list[int]) -> torch.Tensor:
        """x (N, dim); attention is full inside each segment (image frame or window)."""
        N = x.shape[0]
        q, k, v = self.qkv(x).view(N, 3, self.heads, -1).permute(1, 2, 0, 3).unbind(0)
        q = apply_rope(q[None].float(), cos[None], sin[None]).to(x.dtype)   # (1, H, N, hd)
        k = apply_rope(k[None].float(), cos[None], sin[None]).to(x.dtype)
        v = v[None]
        if len(set(seg_lens)) == 1:  # equal segments: fold them into the batch dim
            n, L = len(seg_lens), seg_lens[0]
            q, k, v = (t.view(self.heads, n, L, -1).transpose(0, 1) for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v)                   # (n, H, L, hd)
        else:
            parts = zip(*(t.split(seg_lens, dim=2) for t in (q, k, v)))
            out = torch.cat([F.scaled_dot_product_attention(*p) for p in parts], dim=2)
        return self.proj(out.transpose(1, 2).reshape(N, -1))


class VisionMLP(nn.Module):
    """Qwen3-VL: fc2(gelu_tanh(fc1(x)))."""

    def __init__(self, dim: int, intermediate: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, intermediate)
        self.linear_fc2 = nn.Linear(intermediate, dim)

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        qwen3 = cfg.style == "qwen3"
        norm = (lambda: nn.LayerNorm(cfg.hidden, eps=1e-6)) if qwen3 else (lambda: RMSNorm(cfg.hidden))
        self.norm1, self.norm2 = norm(), norm()
        self.attn = VisionAttention(cfg.hidden, cfg.heads)
        self.mlp = (VisionMLP(cfg.hidden, cfg.intermediate) if qwen3
                    else SwiGLU(cfg.hidden, cfg.intermediate, bias=True))

    def forward(self, x, cos, sin, seg_lens):
        x = x + self.attn(self.norm1(x), cos, sin, seg_lens)
        return x + self.mlp(self.norm2(x))


class Merger(nn.Module):
    """m x m patches -> one LLM token: norm, concat the m^2 patch vectors, MLP to out width.
    Qwen3 main merger norms each patch (LayerNorm dim); DeepStack mergers norm the concatenated
    vector (post-shuffle). Qwen2.5 uses RMSNorm `ln_q` and `mlp.0` / `mlp.2` names."""

    def __init__(self, dim: int, merge: int, out: int, style: str, postshuffle: bool = False):
        super().__init__()
        self.big = dim * merge * merge
        self.style, self.postshuffle = style, postshuffle
        if style == "qwen3":
            self.norm = nn.LayerNorm(self.big if postshuffle else dim, eps=1e-6)
            self.linear_fc1 = nn.Linear(self.big, self.big)
            self.linear_fc2 = nn.Linear(self.big, out)
        else:
            self.ln_q = RMSNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(self.big, self.big), nn.GELU(), nn.Linear(self.big, out))

    def forward(self, x):
        if self.style != "qwen3":
            return self.mlp(self.ln_q(x).view(-1, self.big))
        x = self.norm(x.view(-1, self.big) if self.postshuffle else x)
        return self.linear_fc2(F.gelu(self.linear_fc1(x.view(-1, self.big))))


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig, out_hidden: int):
        super().__init__()
        self.cfg = cfg
        qwen3 = cfg.style == "qwen3"
        # a Conv3d with kernel = stride = (tp, p, p) on one patch is this Linear on its flat row
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Linear(cfg.patch_dim, cfg.hidden, bias=qwen3)
        if qwen3:
            self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = Merger(cfg.hidden, cfg.merge, out_hidden, cfg.style)
        self.deepstack_merger_list = nn.ModuleList(
            Merger(cfg.hidden, cfg.merge, out_hidden, cfg.style, postshuffle=True)
            for _ in cfg.deepstack_layers)

    def _learned_positions(self, grids) -> torch.Tensor:
        """(N, hidden): the side x side table resampled bilinearly to each frame's h x w grid."""
        side, m, out = round(self.cfg.num_position_embeddings ** 0.5), self.cfg.merge, []
        for t, h, w in grids:
            rows, cols = merge_order_rows_cols(h, w, m)
            (rt, rw), (ct, cw) = _interp_taps(rows, h, side), _interp_taps(cols, w, side)
            idx = (rt[:, :, None] * side + ct[:, None, :]).reshape(-1, 4)
            wts = (rw[:, :, None] * cw[:, None, :]).reshape(-1, 4)
            pos = (self.pos_embed(idx.to(self.pos_embed.weight.device)) * wts[..., None].to(
                self.pos_embed.weight)).sum(1)
            out.append(pos.repeat(t, 1))
        return torch.cat(out)

    def _rotary(self, grids, device):
        ids = [torch.stack(merge_order_rows_cols(h, w, self.cfg.merge), -1).repeat(t, 1)
               for t, h, w in grids]
        return vision_cos_sin(torch.cat(ids).to(device), self.cfg.head_dim, self.cfg.rope_theta)

    def _windows(self, grids) -> tuple[torch.Tensor, list[int]]:
        """Qwen2.5 window attention: permutation of merged units grouping each window's units
        (windows of win x win units, raster order per frame) and the window lengths in units."""
        m, win = self.cfg.merge, self.cfg.window_size // self.cfg.merge // self.cfg.patch
        order, lens, base = [], [], 0
        for t, h, w in grids:
            lh, lw = h // m, w // m
            grid = torch.arange(t * lh * lw).view(t, lh, lw) + base
            for f in range(t):
                for i in range(0, lh, win):
                    for j in range(0, lw, win):
                        cell = grid[f, i:i + win, j:j + win].flatten()
                        order.append(cell)
                        lens.append(cell.numel())
            base += t * lh * lw
        return torch.cat(order), lens

    def forward(self, pixel_patches: torch.Tensor, grid_thw) -> tuple[torch.Tensor, list]:
        cfg, grids = self.cfg, _grids(grid_thw)
        odd = [k for k, (t, h, w) in enumerate(grids) if h % cfg.merge or w % cfg.merge]
        if odd:
            raise ValueError(f"image {odd[0]}: patch grid {grids[odd[0]]} (t, h, w) is not divisible by the "
                             f"spatial merge {cfg.merge}; give images whose sides are multiples of "
                             f"patch*merge={cfg.patch * cfg.merge} pixels")
        unit = cfg.merge * cfg.merge
        if pixel_patches.shape != (sum(t * h * w for t, h, w in grids), cfg.patch_dim):
            raise ValueError(f"pixel_patches shape {tuple(pixel_patches.shape)} does not match "
                             f"grid_thw {grids}: expected (sum t*h*w, {cfg.patch_dim})")
        x = self.patch_embed.proj(pixel_patches.to(self.patch_embed.proj.weight.dtype))
        if cfg.style == "qwen3":
            x = x + self._learned_positions(grids).to(x.dtype)
        cos, sin = self._rotary(grids, x.device)
        frames = [h * w for t, h, w in grids for _ in range(t)]
        windows, perm = frames, None
        if cfg.style == "qwen2.5" and cfg.window_size:
            units, lens = self._windows(grids)
            perm = (units[:, None] * unit + torch.arange(unit)).flatten().to(x.device)
            x, cos, sin = x[perm], cos[perm], sin[perm]
            windows = [n * unit for n in lens]
        deepstack = []
        for i, blk in enumerate(self.blocks):
            full = cfg.style == "qwen3" or i in cfg.fullatt_blocks
            x = blk(x, cos, sin, frames if full else windows)
            if i in cfg.deepstack_layers:
                deepstack.append(self.deepstack_merger_list[cfg.deepstack_layers.index(i)](x))
        merged = self.merger(x)
        if perm is not None:
            merged = merged[torch.argsort(units.to(x.device))]
        return merged, deepstack
