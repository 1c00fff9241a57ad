"""Statistical checks that speculative sampling emits the target's distribution: a chi-square
z-score, the exact joint of a backend's outputs by enumeration, and a wrong acceptance rule the
checks must catch."""
import math
from itertools import product

import numpy as np

from runtime.acceptance import process_logits, sample
from runtime.backend import PrefillInputs


def chi2_z(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square of counts against probs (cells with expected < 5 pooled), as a
    Wilson-Hilferty z-score: z > 4 means p < 3e-5 under the null."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = max(int(keep.sum()) - 1, 1)
    return ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


def exact_joint(be, prompt, n, temperature, top_p):
    """P(x_1..x_n) of the target with temperature/top-p, by enumerating every sequence."""
    probs = {}
    pos = np.tile(np.arange(len(prompt)), (3, 1))
    for seq in product(range(be.vocab_size), repeat=n):
        first = be.prefill(PrefillInputs(prompt, pos, 0), "logits")
        rest = be.verify(np.array(seq[:-1]), len(prompt), "logits")
        p = process_logits(np.concatenate([first, rest]), temperature, top_p)
        probs[seq] = float(np.prod([p[i, s] for i, s in enumerate(seq)]))
    return probs


def wrong_rule_resample_from_p(draft, q, p, rng):
    """A classic bug: on rejection sample from p instead of norm(max(0, p - q))."""
    for i, x in enumerate(draft):
        if rng.random() * q[i, x] >= p[i, x]:
            return i, sample(p[i], rng.random())
    return len(draft), sample(p[len(draft)], rng.random())
