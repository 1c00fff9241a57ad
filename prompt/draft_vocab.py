"""The draft's reduced vocabulary (EAGLE-3 / FR-Spec `d2t`): which target tokens its head covers.

    counts = token_counts(texts, tok)        (V,) int64 occurrences of each id in the texts
    d2t = build_d2t(counts, tok, n)          (n,) int64 target ids, ascending: the special
                                             tokens (always) + the n - k most frequent text tokens
    check_d2t(d2t, tok, where, sha256=None)  refuse a map that does not fit the tokenizer
    d2t_sha256(d2t)                          the hash meta.json records
    coverage(counts, d2t)                    share of the counted tokens inside the head

Draft id i means target id d2t[i]. The head never holds trajectory tokens (they are masked while
the planner reasons, and the action expert writes the trajectory), and always holds every
special token of the tokenizer (`kept_ids`): <|cot_end|> closes the reasoning, the others keep
the map valid for any prompt layout. Ties in frequency go to the smaller id, so the same corpus
gives the same map.
"""
from __future__ import annotations

import hashlib

import numpy as np

from core.config import ConfigError
from prompt.vocab import SPECIAL, attr_name


def kept_ids(tok) -> np.ndarray:
    """The special-token ids a head always keeps (those of SPECIAL the tokenizer has)."""
    ids = {getattr(tok, attr_name(t), None) for t in SPECIAL}
    return np.array(sorted(i for i in ids if i is not None), np.int64)


def token_counts(texts, tok) -> np.ndarray:
    """(V,) int64: how often each id occurs in the tokenized `texts` (the target's CoC strings)."""
    counts = np.zeros(len(tok), np.int64)
    for text in texts:
        np.add.at(counts, np.asarray(tok.encode(text), np.int64), 1)
    return counts


def build_d2t(counts: np.ndarray, tok, n: int) -> np.ndarray:
    """The n-token head: the kept special ids + the n - len(kept) most frequent text tokens
    (trajectory tokens excluded) -> (n,) int64 ascending."""
    counts = np.asarray(counts)
    keep = kept_ids(tok)
    text = np.flatnonzero(tok.text_mask())
    text = text[~np.isin(text, keep)]
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not len(keep) < n <= len(keep) + len(text):
        raise ConfigError(f"draft vocabulary n={n!r}: need an int in [{len(keep) + 1}, {len(keep) + len(text)}] "
                          f"(the {len(keep)} special tokens + up to {len(text)} text tokens of this tokenizer)")
    if counts.shape != (len(tok),):
        raise ConfigError(f"token counts of shape {counts.shape}: expected ({len(tok)},) for this tokenizer")
    order = text[np.lexsort((text, -counts[text]))]          # most frequent first, ties: smaller id
    return np.sort(np.concatenate([keep, order[:n - len(keep)]])).astype(np.int64)


def d2t_sha256(d2t) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(d2t, "<i8")).tobytes()).hexdigest()


def check_d2t(d2t, tok, where: str, sha256: str | None = None) -> None:
    """ConfigError unless d2t is a 1-D int map into this tokenizer: ids in [0, V), no
    duplicates, ascending, every kept special token present, no trajectory token, and (when given) the
    sha256 meta.json recorded."""
    d2t = np.asarray(d2t)
    V = len(tok)
    if d2t.ndim != 1 or d2t.size == 0 or not np.issubdtype(d2t.dtype, np.integer):
        raise ConfigError(f"{where}: d2t has shape {d2t.shape} dtype {d2t.dtype}; expected (N,) integer target ids")
    bad = d2t[(d2t < 0) | (d2t >= V)]
    if bad.size:
        raise ConfigError(f"{where}: d2t holds ids {bad[:5].tolist()} outside the tokenizer's [0, {V})")
    if np.unique(d2t).size != d2t.size:
        dup = np.unique(d2t[np.argsort(d2t, kind="stable")][1:][np.diff(np.sort(d2t)) == 0])
        raise ConfigError(f"{where}: d2t repeats target ids {dup[:5].tolist()}; each draft id must map to its own token")
    missing = np.setdiff1d(kept_ids(tok), d2t)
    if missing.size:
        raise ConfigError(f"{where}: d2t lacks the special tokens {[tok.token(int(i)) for i in missing[:5]]} "
                          f"(ids {missing[:5].tolist()}); a draft head always keeps every special token")
    traj = np.flatnonzero(tok.traj_mask()[d2t])
    if traj.size:
        raise ConfigError(f"{where}: d2t holds trajectory tokens (ids {d2t[traj[:5]].tolist()}); the head "
                          "covers reasoning text only")
    down = np.flatnonzero(np.diff(d2t) < 0)
    if down.size:
        i = int(down[0])
        raise ConfigError(f"{where}: d2t is not ascending (index {i} holds id {int(d2t[i])}, index {i + 1} id "
                          f"{int(d2t[i + 1])}); a map lists its target ids in ascending order")
    if sha256 is not None and d2t_sha256(d2t) != sha256:
        raise ConfigError(f"{where}: d2t sha256 {d2t_sha256(d2t)[:12]}... does not match meta.json's "
                          f"d2t_sha256 {str(sha256)[:12]}...: the map was changed")


def coverage(counts: np.ndarray, d2t) -> float:
    """Share of the counted tokens that the head holds."""
    counts = np.asarray(counts)
    total = int(counts.sum())
    return float(counts[np.asarray(d2t)].sum() / total) if total else 0.0
