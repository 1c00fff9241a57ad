"""Roads as chains of straight and arc pieces, dense paths with arc length, box overlap.

A Road is a centre line (chain of pieces of constant curvature) with `lanes` lanes of
LANE_WIDTH per direction, a shoulder (parking strip) and a sidewalk on each side. `frenet`
maps world points to (s along the chain, d left of the centre line) analytically, so the
renderer can shade thousands of ground points at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scenes.config import LANE_WIDTH

SHOULDER, SIDEWALK = 2.5, 2.0    # m beyond the edge line: asphalt parking strip, then pavement


def arc_pose(x0, y0, th0, kappa, u):
    """Pose after travelling u along a piece of curvature kappa from (x0, y0, th0)."""
    u = np.asarray(u, dtype=np.float64)
    th = th0 + kappa * u
    if abs(kappa) < 1e-9:
        return x0 + u * np.cos(th0), y0 + u * np.sin(th0), th
    return x0 + (np.sin(th) - np.sin(th0)) / kappa, y0 - (np.cos(th) - np.cos(th0)) / kappa, th


@dataclass
class Road:
    start: tuple                 # (x, y, heading) of the centre line's first point
    pieces: list                 # [(length, curvature), ...]
    lanes: int = 1               # lanes per direction (two-way road)
    starts: list = field(init=False)   # (x, y, th, s) at the start of each piece

    def __post_init__(self):
        x, y, th = self.start
        s, self.starts = 0.0, []
        for length, kappa in self.pieces:
            self.starts.append((x, y, th, s))
            x, y, th = (float(v) for v in arc_pose(x, y, th, kappa, length))
            s += length

    @property
    def length(self) -> float:
        return float(sum(p[0] for p in self.pieces))

    @property
    def half_width(self) -> float:
        return self.lanes * LANE_WIDTH

    def pose(self, s, d=0.0):
        """World (x, y, heading) at arc length s and left offset d (arrays broadcast)."""
        s = np.asarray(s, dtype=np.float64)
        x, y, th = np.zeros_like(s), np.zeros_like(s), np.zeros_like(s)
        for (length, kappa), (x0, y0, th0, s0) in zip(self.pieces, self.starts):
            m = (s >= s0) | (s0 == 0.0)          # later pieces overwrite; first covers s < 0
            px, py, pth = arc_pose(x0, y0, th0, kappa, s - s0)
            x, y, th = np.where(m, px, x), np.where(m, py, y), np.where(m, pth, th)
        return x - np.sin(th) * d, y + np.cos(th) * d, th

    def frenet(self, px, py):
        """World points -> (s, d, inside): inside is False past either end of the chain."""
        s_out = np.full(px.shape, np.nan)
        d_out = np.full(px.shape, np.inf)
        for (length, kappa), (x0, y0, th0, s0) in zip(self.pieces, self.starts):
            s, d = _piece_frenet(px, py, x0, y0, th0, kappa)
            m = (s >= 0) & (s <= length) & (np.abs(d) < np.abs(d_out))
            s_out, d_out = np.where(m, s + s0, s_out), np.where(m, d, d_out)
        return s_out, d_out, np.isfinite(d_out)


def _piece_frenet(px, py, x0, y0, th0, kappa):
    """(s, d) of points relative to one piece (s may fall outside [0, length])."""
    c, s_ = np.cos(th0), np.sin(th0)
    if abs(kappa) < 1e-9:
        dx, dy = px - x0, py - y0
        return dx * c + dy * s_, -dx * s_ + dy * c
    cx, cy = x0 - s_ / kappa, y0 + c / kappa             # centre of the circle
    wx, wy = px - cx, py - cy
    rx, ry = x0 - cx, y0 - cy                           # centre -> start point
    phi = np.arctan2(rx * wy - ry * wx, rx * wx + ry * wy)   # signed angle start -> point
    return phi / kappa, 1.0 / kappa - np.sign(kappa) * np.hypot(wx, wy)


class Path:
    """A dense polyline parametrised by its own arc length: positions, heading, curvature."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        seg = np.hypot(np.diff(x), np.diff(y))
        self.s = np.concatenate([[0.0], np.cumsum(seg)])
        self.x, self.y = x, y
        self.heading = np.unwrap(np.arctan2(np.gradient(y), np.gradient(x)))
        self.kappa = np.gradient(self.heading) / np.maximum(np.gradient(self.s), 1e-6)
        coarse = np.arange(0, len(x), 4)
        self._coarse = (coarse, x[coarse], y[coarse])

    @classmethod
    def along(cls, road: Road, s0: float, s1: float, offset=None, step: float = 0.25) -> "Path":
        """The road's centre line from s0 to s1 shifted left by offset(s) (callable or float)."""
        s = np.arange(s0, s1 + step, step)
        d = offset(s) if callable(offset) else np.full_like(s, 0.0 if offset is None else offset)
        x, y, _ = road.pose(s, d)
        return cls(x, y)

    def at(self, s):
        """(x, y, heading) at arc lengths s (clamped to the path)."""
        s = np.clip(s, 0.0, self.s[-1])
        return (np.interp(s, self.s, self.x), np.interp(s, self.s, self.y),
                np.interp(s, self.s, self.heading))

    def curvature_at(self, s):
        return np.interp(np.clip(s, 0.0, self.s[-1]), self.s, self.kappa)

    def project(self, px, py):
        """Points -> (s, lateral left of the path): nearest coarse vertex, then its two segments."""
        idx, cx, cy = self._coarse
        flat_x, flat_y = px.reshape(-1), py.reshape(-1)
        near = idx[np.argmin((flat_x[:, None] - cx) ** 2 + (flat_y[:, None] - cy) ** 2, axis=1)]
        best_s, best_l, best_d2 = None, None, None
        for lo in (near - 4, near):
            a = np.clip(lo, 0, len(self.x) - 5)
            b = a + 4
            ax, ay, bx, by = self.x[a], self.y[a], self.x[b], self.y[b]
            ux, uy = bx - ax, by - ay
            u2 = np.maximum(ux * ux + uy * uy, 1e-12)
            t = np.clip(((flat_x - ax) * ux + (flat_y - ay) * uy) / u2, 0.0, 1.0)
            qx, qy = ax + t * ux, ay + t * uy
            d2 = (flat_x - qx) ** 2 + (flat_y - qy) ** 2
            s = self.s[a] + t * (self.s[b] - self.s[a])
            lat = np.sign(ux * (flat_y - ay) - uy * (flat_x - ax)) * np.sqrt(d2)
            if best_d2 is None:
                best_s, best_l, best_d2 = s, lat, d2
            else:
                m = d2 < best_d2
                best_s, best_l, best_d2 = np.where(m, s, best_s), np.where(m, lat, best_l), np.minimum(d2, best_d2)
        return best_s.reshape(px.shape), best_l.reshape(px.shape)


def smoothstep(s, s_a, s_b):
    """Quintic 0 -> 1 between s_a and s_b with zero slope and curvature at both ends."""
    u = np.clip((np.asarray(s, dtype=np.float64) - s_a) / max(s_b - s_a, 1e-6), 0.0, 1.0)
    return u ** 3 * (10 - 15 * u + 6 * u * u)


def box_corners(x, y, yaw, length, width):
    """(..., 4, 2) corners of oriented rectangles."""
    c, s = np.cos(yaw)[..., None], np.sin(yaw)[..., None]
    lx = np.array([1, 1, -1, -1]) * np.asarray(length)[..., None] / 2
    ly = np.array([1, -1, -1, 1]) * np.asarray(width)[..., None] / 2
    return np.stack([x[..., None] + c * lx - s * ly, y[..., None] + s * lx + c * ly], axis=-1)


def boxes_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Separating-axis test of oriented rectangles a, b (..., 5) = (x, y, yaw, length, width)."""
    ca = box_corners(a[..., 0], a[..., 1], a[..., 2], a[..., 3], a[..., 4])
    cb = box_corners(b[..., 0], b[..., 1], b[..., 2], b[..., 3], b[..., 4])
    separated = np.zeros(ca.shape[:-2], dtype=bool)
    for yaw in (a[..., 2], a[..., 2] + np.pi / 2, b[..., 2], b[..., 2] + np.pi / 2):
        axis = np.stack([np.cos(yaw), np.sin(yaw)], axis=-1)[..., None, :]   # (..., 1, 2)
        pa, pb = (ca * axis).sum(-1), (cb * axis).sum(-1)                   # (..., 4)
        separated |= (pa.max(-1) < pb.min(-1)) | (pb.max(-1) < pa.min(-1))
    return ~separated
