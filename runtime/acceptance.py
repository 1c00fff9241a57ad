"""Acceptance rules of speculative decoding, over small host arrays.

Notation for one step: the draft proposed d[0..k-1]; the target, fed the pending token and the
draft, gave one row per position, row i being its prediction for the token after d[i-1] (row 0:
after the pending token). Every rule returns (n, t): the first n draft tokens are accepted and
t is the one token the target adds (a correction at position n, or the bonus when n == k).
The emitted tokens of the step are d[:n] + [t].

    greedy exact   accept d[i] while d[i] == argmax row i; t = argmax row n
    relaxed (r)    as greedy, but a trajectory token d[i] is also accepted when the argmax is a
                   trajectory token of the same range within r bins (Spec-VLA); text exact
    sampling       accept d[i] with prob min(1, p_i(d[i]) / q_i(d[i])); on the first rejection
                   t ~ norm(max(0, p_i - q_i)); when all k pass, the bonus t ~ p_k
                   (Leviathan et al. 2023, Chen et al. 2023): the emitted tokens follow p exactly.

Probabilities are fp32, after the same processing (mask, temperature, top-p) on p and q.
"""
from __future__ import annotations

import numpy as np

# range_id of a token: -1 = text, else the index of its trajectory range (hist, fut x, fut y)
TEXT_RANGE = -1


def trajectory_range_ids(tok) -> np.ndarray:
    """(V,) int8: -1 for text tokens, 0/1/2 for history / future-x / future-y bins."""
    ids = np.full(len(tok), TEXT_RANGE, dtype=np.int8)
    for i, r in enumerate((tok.hist_ids, tok.fut_x_ids, tok.fut_y_ids)):
        ids[r.start:r.stop] = i
    return ids


def accept_greedy(draft: np.ndarray, target: np.ndarray) -> tuple[int, int]:
    """draft (k,) ids, target (k+1,) argmax ids -> (n, t)."""
    k = len(draft)
    miss = np.flatnonzero(np.asarray(draft) != np.asarray(target[:k]))
    n = int(miss[0]) if miss.size else k
    return n, int(target[n])


def accept_relaxed(draft: np.ndarray, target: np.ndarray, range_ids: np.ndarray, r: int) -> tuple[int, int]:
    """Spec-VLA: accept d[i] when d[i] == a[i], or both are bins of one trajectory range and
    |d[i] - a[i]| <= r (ids are ordinal inside a range). r = 0 is exactly accept_greedy."""
    k = len(draft)
    d, a = np.asarray(draft, dtype=np.int64), np.asarray(target[:k], dtype=np.int64)
    same_range = (range_ids[d] == range_ids[a]) & (range_ids[d] != TEXT_RANGE)
    ok = (d == a) | (same_range & (np.abs(d - a) <= r))
    miss = np.flatnonzero(~ok)
    n = int(miss[0]) if miss.size else k
    return n, int(target[n])


def process_logits(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """Logits (..., V) (masked entries -inf) -> fp32 probabilities, as transformers' sampling:
    p = softmax(logits / T), then top-p keeps the most likely tokens whose cumulative mass
    reaches top_p (sorted ascending, drop tokens with cumulative prob <= 1 - top_p, keep >= 1)."""
    x = np.asarray(logits, dtype=np.float32) / np.float32(temperature)
    p = _softmax(x)
    if top_p < 1.0:
        order = np.argsort(x, axis=-1, kind="stable")            # ascending
        cum = np.cumsum(np.take_along_axis(p, order, -1), axis=-1)
        drop_sorted = cum <= np.float32(1.0 - top_p)
        drop_sorted[..., -1] = False                              # keep the most likely token
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, -1)
        p = _softmax(np.where(drop, -np.inf, x).astype(np.float32))
    return p


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def sample(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from p (V,) with u ~ U[0, 1); never returns a zero-probability token."""
    cum = np.cumsum(p, dtype=np.float64)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    return min(i, int(np.flatnonzero(p > 0)[-1]))


def accept_sampling(draft: np.ndarray, q: np.ndarray, p: np.ndarray,
                    rng: np.random.Generator) -> tuple[int, int]:
    """draft (k,), q (k, V) draft probs it was sampled from, p (k+1, V) target probs -> (n, t)."""
    k = len(draft)
    for i in range(k):
        x = int(draft[i])
        # accept x with prob min(1, p(x)/q(x)): u < p/q, written without the division
        if rng.random() * q[i, x] < p[i, x]:
            continue
        # rejected: t ~ norm(max(0, p - q)), the part of p the draft under-proposes
        residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0:      # p == q up to rounding: rejection then has prob ~0
            residual = p[i]
        return i, sample(residual / residual.sum(), rng.random())
    # all k accepted: the bonus token comes from the target's last row
    return k, sample(p[k], rng.random())
