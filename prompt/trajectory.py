"""Trajectory tokens: the ego history as binned pose deltas, the future as binned waypoints.

History: 16 poses (x, y, heading) at 10 Hz in the ego frame at t0 (poses[-1] is t0). The chain
starts at the origin and walks back in time; each delta is binned against the *rebuilt* previous
pose, so every rounding error is carried into the next delta and every rebuilt pose stays within
half a bin of the original. Tokens are emitted oldest pose first: 16 x 3 = 48 bins.

Future: 64 waypoints, x and y binned absolutely (ordinal bins, so "within r bins" is meaningful
for relaxed acceptance and the error never accumulates): 64 x 2 = 128 bins, x then y per step.
"""
from __future__ import annotations

import numpy as np

HIST_POSES = 16
HIST_BINS = 128                                   # per-component bins, shared id range
HIST_STEP = np.array([0.05, 0.02, 0.002])         # m, m, rad per bin -> |dx| <= 3.2 m per 0.1 s
FUT_WAYPOINTS = 64
FUT_X_BINS, FUT_X_STEP, FUT_X_MIN = 512, 0.5, -16.0   # x in [-16, 240) m
FUT_Y_BINS, FUT_Y_STEP, FUT_Y_MIN = 256, 0.25, -32.0  # y in [-32, 32) m
DT = 0.1


class TrajectoryRangeError(ValueError):
    """A pose or waypoint that the bins cannot represent (the message says which and the range)."""


def _check(poses: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    poses = np.asarray(poses, dtype=np.float64)
    if poses.shape != shape:
        raise TrajectoryRangeError(f"{what} must have shape {shape}, got {poses.shape}")
    if not np.isfinite(poses).all():
        bad = np.argwhere(~np.isfinite(poses))[0].tolist()
        raise TrajectoryRangeError(f"{what} has a non-finite value at index {bad}")
    return poses


def encode_history(poses) -> np.ndarray:
    """(16, 3) poses -> (48,) bins in [0, HIST_BINS), oldest pose first."""
    poses = _check(poses, (HIST_POSES, 3), "ego history")
    poses = poses.copy()
    poses[:, 2] = np.unwrap(poses[:, 2])
    half = HIST_BINS // 2
    bins = np.zeros((HIST_POSES, 3), dtype=np.int64)
    rebuilt = np.zeros(3)
    for i in range(HIST_POSES - 1, -1, -1):     # t0 first, walking back in time
        q = np.rint((poses[i] - rebuilt) / HIST_STEP).astype(np.int64)
        if (q < -half).any() or (q >= half).any():
            raise TrajectoryRangeError(
                f"ego history pose {i} moves {np.round(poses[i] - rebuilt, 3).tolist()} from the next pose; "
                f"allowed per 0.1 s: |dx| < {half * HIST_STEP[0]:.2f} m, |dy| < {half * HIST_STEP[1]:.2f} m, "
                f"|dheading| < {half * HIST_STEP[2]:.3f} rad")
        rebuilt = rebuilt + q * HIST_STEP
        bins[i] = q + half
    return bins.reshape(-1)


def saturate_history(poses) -> tuple[np.ndarray, bool]:
    """The history with every step clipped to what the bins hold, rebuilt from t0 backward, and
    whether anything was clipped. A faster history (above ~31 m/s, highway speeds) then
    tokenizes as the fastest the tokens can say instead of being refused; the exact speed
    still reaches whoever reads the raw poses (the action expert's v0)."""
    poses = _check(poses, (HIST_POSES, 3), "ego history").copy()
    poses[:, 2] = np.unwrap(poses[:, 2])
    # rounding carries at most half a bin into the next delta: stay 1.5 bins inside the range
    limit = (HIST_BINS // 2 - 1.5) * HIST_STEP
    deltas = poses[:-1] - poses[1:]                          # (15, 3): pose i minus pose i+1
    clipped = np.clip(deltas, -limit, limit)
    rebuilt = poses[-1] + np.cumsum(clipped[::-1], axis=0)[::-1]
    return np.concatenate([rebuilt, poses[-1:]]), bool((clipped != deltas).any())


def decode_history(bins) -> np.ndarray:
    """(48,) bins -> (16, 3) poses (inverse of encode_history up to half a bin)."""
    q = np.asarray(bins, dtype=np.int64).reshape(HIST_POSES, 3) - HIST_BINS // 2
    deltas = q * HIST_STEP                       # deltas[i]: pose i minus pose i+1 (pose 16 = origin)
    return np.cumsum(deltas[::-1], axis=0)[::-1].astype(np.float32)


def encode_future(waypoints) -> np.ndarray:
    """(64, 2 or 3) waypoints -> (128,) bins: x bin, y bin per waypoint."""
    wp = np.asarray(waypoints, dtype=np.float64)
    if wp.ndim != 2 or wp.shape[0] != FUT_WAYPOINTS or wp.shape[1] not in (2, 3):
        raise TrajectoryRangeError(f"future must have shape (64, 2) or (64, 3), got {wp.shape}")
    wp = _check(wp[:, :2], (FUT_WAYPOINTS, 2), "future")
    bx = np.floor((wp[:, 0] - FUT_X_MIN) / FUT_X_STEP).astype(np.int64)
    by = np.floor((wp[:, 1] - FUT_Y_MIN) / FUT_Y_STEP).astype(np.int64)
    for name, b, n, lo, step in (("x", bx, FUT_X_BINS, FUT_X_MIN, FUT_X_STEP), ("y", by, FUT_Y_BINS, FUT_Y_MIN, FUT_Y_STEP)):
        out = np.flatnonzero((b < 0) | (b >= n))
        if out.size:
            raise TrajectoryRangeError(f"future waypoint {out[0]} has {name}={wp[out[0], 'xy'.index(name)]:.2f} m; "
                                       f"allowed [{lo}, {lo + n * step})")
    return np.stack([bx, by], axis=1).reshape(-1)


def decode_future(bins) -> np.ndarray:
    """(128,) bins -> (64, 3) waypoints at bin centres; heading from the direction of travel."""
    b = np.asarray(bins, dtype=np.int64).reshape(FUT_WAYPOINTS, 2)
    x = FUT_X_MIN + (b[:, 0] + 0.5) * FUT_X_STEP
    y = FUT_Y_MIN + (b[:, 1] + 0.5) * FUT_Y_STEP
    return np.stack([x, y, heading_from_path(x, y)], axis=1).astype(np.float32)


def heading_from_path(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Heading of a path that starts at the origin facing +x; a standstill keeps the last heading."""
    dx, dy = np.diff(np.concatenate([[0.0], x])), np.diff(np.concatenate([[0.0], y]))
    heading = np.zeros(len(x))
    last = 0.0
    for i in range(len(x)):
        if np.hypot(dx[i], dy[i]) > 0.05:
            last = float(np.arctan2(dy[i], dx[i]))
        heading[i] = last
    return heading


def history_tokens(tok, poses) -> np.ndarray:
    return encode_history(poses) + tok.hist_ids.start


def future_tokens(tok, waypoints) -> np.ndarray:
    bins = encode_future(waypoints).reshape(FUT_WAYPOINTS, 2)
    return (bins + np.array([tok.fut_x_ids.start, tok.fut_y_ids.start])).reshape(-1)


def tokens_to_history(tok, ids) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if ids.shape != (HIST_POSES * 3,) or (ids < tok.hist_ids.start).any() or (ids >= tok.hist_ids.stop).any():
        raise TrajectoryRangeError(f"expected 48 history token ids in [{tok.hist_ids.start}, {tok.hist_ids.stop})")
    return decode_history(ids - tok.hist_ids.start)


def tokens_to_future(tok, ids) -> np.ndarray:
    """(128,) future token ids (x, y alternating) -> (64, 3) waypoints."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.shape != (FUT_WAYPOINTS * 2,):
        raise TrajectoryRangeError(f"expected {FUT_WAYPOINTS * 2} future token ids, got {ids.shape[0]}")
    pairs = ids.reshape(FUT_WAYPOINTS, 2)
    ranges = (tok.fut_x_ids, tok.fut_y_ids)
    for c, r in enumerate(ranges):
        if (pairs[:, c] < r.start).any() or (pairs[:, c] >= r.stop).any():
            raise TrajectoryRangeError(f"future {'xy'[c]} token out of its range [{r.start}, {r.stop})")
    return decode_future(pairs - np.array([r.start for r in ranges]))


def future_token_range(tok, index: int) -> range:
    """Which id range the index-th future token (0-based, x/y alternating) must come from."""
    return tok.fut_x_ids if index % 2 == 0 else tok.fut_y_ids
