"""Chain-of-causation text of world v2: the language is scenes/language.py; this module keeps the
names the rest of the project uses (history_facts, make_coc, vocabulary) and the corpus the
tokenizer is trained on."""
from __future__ import annotations

import numpy as np

from scenes.config import DT
from scenes.language import (ACTION, CAUSE, LIGHTS, NOUNS, SIDES, history_facts, make_coc,  # noqa: F401
                             num, vocabulary_texts)


def corpus(n: int, seed: int = 0) -> list[str]:
    """n CoC texts drawn from the language alone (fast: no world simulation): random kinematic
    histories, every cause kind with random facts and distance, random decisions and details.
    The tokenizer of a training run is trained on the dataset's own CoCs; this serves tests and
    a tokenizer without a dataset."""
    rng = np.random.default_rng([seed, 31337])
    t = np.arange(-15, 1) * DT
    kinds, decisions = sorted(CAUSE), sorted(ACTION)
    texts = []
    for _ in range(n):
        v, a = rng.uniform(0, 20), rng.uniform(-4, 3)
        w = 0.0 if rng.random() < 0.6 else rng.uniform(-0.5, 0.5)
        if rng.random() < 0.08:
            v, a = 0.0, 0.0
        speed = np.maximum(v + a * t, 0.0)
        s = np.concatenate([[0.0], np.cumsum(speed[1:] * DT)])
        heading = w * t
        x, y = np.cumsum(np.cos(heading) * np.gradient(s)), np.cumsum(np.sin(heading) * np.gradient(s))
        hist = np.stack([x - x[-1], y - y[-1], heading - heading[-1]], 1)
        facts = {"noun": str(rng.choice(NOUNS)), "light": str(rng.choice(LIGHTS)), "side": str(rng.choice(SIDES)),
                 "distance": float(rng.uniform(0, 90))}
        extra = {"lane": None, "oncoming": None, "parked": None, "brake_lights": None,
                 "gap": num(rng.uniform(0.5, 4)), "ttc": num(rng.uniform(0.5, 9.9))}
        text, _ = make_coc(hist, str(rng.choice(kinds)), facts, str(rng.choice(decisions)), extra, rng)
        texts.append(text)
    return texts


def vocabulary() -> list[str]:
    """Every word the grammar's fixed phrases use, with the numbers 0..99 and one-decimal digits
    (sorted, no duplicates). A subword tokenizer covers any number; this list seeds it."""
    words = {w for t in vocabulary_texts() for w in t.split()} | {",", "so"}
    words |= {str(i) for i in range(100)} | {f"{i}.{d}" for i in range(10) for d in range(10)}
    return sorted(w for w in words if not w.startswith("{"))


def routine_share(scenes) -> float:
    """Fraction of CoC words that are routine."""
    flags = [f for s in scenes for f in s.coc_routine]
    return float(np.mean(flags)) if flags else 0.0
