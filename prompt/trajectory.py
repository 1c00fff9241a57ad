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


def history_bins(poses) -> tuple[np.ndarray, np.ndarray]:
    """(..., 16, 3) poses -> ((..., 48) bins, (...) the first pose (walking back from t0) whose delta
    the bins cannot hold, -1 where every pose fits). Element for element the same arithmetic as
    encode_history, so a batch of histories (every cycle of a drive) is checked in one call."""
    poses = np.array(poses, dtype=np.float64)
    poses[..., 2] = np.unwrap(poses[..., 2], axis=-1)
    half = HIST_BINS // 2
    batch = poses.shape[:-2]
    bins = np.zeros(batch + (HIST_POSES, 3), dtype=np.int64)
    bad = np.full(batch, -1, dtype=np.int64)
    rebuilt = np.zeros(batch + (3,))
    for i in range(HIST_POSES - 1, -1, -1):     # t0 first, walking back in time
        q = np.rint((poses[..., i, :] - rebuilt) / HIST_STEP).astype(np.int64)
        out = ((q < -half) | (q >= half)).any(axis=-1)
        bad = np.where(out & (bad < 0), i, bad)
        rebuilt = rebuilt + q * HIST_STEP
        bins[..., i, :] = q + half
    return bins.reshape(batch + (HIST_POSES * 3,)), bad


def encode_history(poses) -> np.ndarray:
    """(16, 3) poses -> (48,) bins in [0, HIST_BINS), oldest pose first."""
    poses = _check(poses, (HIST_POSES, 3), "ego history")
    bins, bad = history_bins(poses)
    if bad >= 0:
        i, half = int(bad), HIST_BINS // 2
        q = bins.reshape(HIST_POSES, 3) - half
        rebuilt = np.zeros(3)
        for j in range(HIST_POSES - 1, i, -1):   # the chain as it stood when pose i broke it
            rebuilt = rebuilt + q[j] * HIST_STEP
        pose = poses.copy()
        pose[:, 2] = np.unwrap(pose[:, 2])
        raise TrajectoryRangeError(
            f"ego history pose {i} moves {np.round(pose[i] - rebuilt, 3).tolist()} from the next pose; "
            f"allowed per 0.1 s: |dx| < {half * HIST_STEP[0]:.2f} m, |dy| < {half * HIST_STEP[1]:.2f} m, "
            f"|dheading| < {half * HIST_STEP[2]:.3f} rad")
    return bins


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


def future_fits(waypoints) -> np.ndarray:
    """(..., 64, 2 or 3) waypoints -> (...) bool: every waypoint finite and inside the bins
    (encode_future's test, element for element, on a batch)."""
    wp = np.asarray(waypoints, dtype=np.float64)[..., :2]
    bx = np.floor((wp[..., 0] - FUT_X_MIN) / FUT_X_STEP)
    by = np.floor((wp[..., 1] - FUT_Y_MIN) / FUT_Y_STEP)
    inside = (bx >= 0) & (bx < FUT_X_BINS) & (by >= 0) & (by < FUT_Y_BINS)
    return (inside & np.isfinite(wp).all(axis=-1)).all(axis=-1)


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


# --- the expert's initial speed, and Alpamayo-R1's history tokens ------------------------------
# Upstream (NVlabs/alpamayo @ 1cba38c): action_space/unicycle_accel_curvature.py
# estimate_t0_states -> action_space/utils.py dxy_theta_to_v_without_v0, and
# models/delta_tokenizer.py DeltaTrajectoryTokenizer.encode (via base_model.py
# tokenize_history_trajectory, which passes the history as the "future" to encode).

V0_ESTIMATORS = ("backward_difference", "least_squares")


def v0_backward_difference(history, dt: float = DT) -> float:
    """(3 x[-1] - 4 x[-2] + x[-3]) / (2 dt) along the t0 heading: specdrive's own estimator
    (models.action_expert.v0_from_history, what checkpoints/tiny was trained with)."""
    x = np.asarray(history, dtype=np.float64)[:, 0]
    return float((3 * x[-1] - 4 * x[-2] + x[-3]) / (2 * dt))


def v0_least_squares(history, dt: float = DT, v_lambda: float = 1e-6, v_ridge: float = 1e-4) -> float:
    """Upstream's estimate_t0_states: speeds v[0..N] of the N+1 poses solve
        min |A v - 2 dp / dt|^2 + (v_lambda / dt^6) |D3 v|^2 + v_ridge |v|^2
    with rows (x, y) of step k holding u(th[k]) at column k and u(th[k+1]) at k+1 (the
    trapezoid rule p[k+1] - p[k] = dt/2 (v[k] u[k] + v[k+1] u[k+1])), D3 the third difference,
    th the unwrapped headings; v0 = v[N] (the t0 pose). history (T, 3) x, y, heading."""
    h = np.asarray(history, dtype=np.float64)
    n = h.shape[0] - 1
    th = h[0, 2] + np.concatenate([[0.0], np.cumsum(_wrap(np.diff(h[:, 2])))])
    A = np.zeros((2 * n, n + 1))
    rows, cols = 2 * np.arange(n), np.arange(n)
    A[rows, cols], A[rows, cols + 1] = np.cos(th[:-1]), np.cos(th[1:])
    A[rows + 1, cols], A[rows + 1, cols + 1] = np.sin(th[:-1]), np.sin(th[1:])
    b = (2 / dt * np.diff(h[:, :2], axis=0)).reshape(-1)
    D3 = np.zeros((max(n - 2, 0), n + 1))
    r = np.arange(max(n - 2, 0))
    D3[r, r], D3[r, r + 1], D3[r, r + 2], D3[r, r + 3] = -1.0, 3.0, -3.0, 1.0
    lhs = A.T @ A + v_lambda / dt**6 * D3.T @ D3 + v_ridge * np.eye(n + 1)
    return float(np.linalg.solve(lhs, A.T @ b)[-1])


def _wrap(d: np.ndarray) -> np.ndarray:
    """Angles into [-pi, pi] as upstream's round_2pi_torch: atan2(sin d, cos d)."""
    return np.arctan2(np.sin(d), np.cos(d))


def delta_history_bins(history, num_bins: int = 1000, xyz_min=(-4.0, -4.0, -10.0),
                       xyz_max=(4.0, 4.0, 10.0)) -> np.ndarray:
    """Alpamayo-R1's history tokens: (T, 3) poses (x, y, heading; z = 0) -> (3 T,) bins of the
    per-step displacement (x, y, z), the first step taken from the origin (upstream pads the
    origin before the oldest pose), each scaled from [xyz_min, xyz_max] to [0, num_bins - 1],
    rounded half to even (torch.round) and clipped."""
    h = np.asarray(history, dtype=np.float64)
    xyz = np.concatenate([h[:, :2], np.zeros((h.shape[0], 1))], axis=1)
    d = np.diff(np.concatenate([np.zeros((1, 3)), xyz]), axis=0)
    lo, hi = np.asarray(xyz_min, np.float64), np.asarray(xyz_max, np.float64)
    q = np.rint((d - lo) / (hi - lo) * (num_bins - 1)).astype(np.int64)
    return np.clip(q, 0, num_bins - 1).reshape(-1)
