"""The shipped tokenizer: byte-level BPE (prompt/bpe.py) trained on the synthetic world's CoC text
and the prompt's words; `build_word_tokenizer` is the old closed word vocabulary (checkpoints
trained before the subword tokenizer)."""
from __future__ import annotations

import numpy as np

from prompt.bpe import DEFAULT_VOCAB_SIZE, BpeTokenizer, train_bpe
from prompt.config import ConfigError
from prompt.vocab import ROLE_WORDS, Tokenizer
from scenes import coc
from scenes.config import DECISIONS, DT, FAMILIES

CORPUS_SIZE = 20000     # CoC texts drawn from the world when none are given
CORPUS_SEED = 0


def build_tokenizer(texts=None, vocab_size: int = DEFAULT_VOCAB_SIZE, n: int = CORPUS_SIZE,
                    seed: int = CORPUS_SEED) -> BpeTokenizer:
    """BPE over `texts` (CoC strings) plus the prompt words (ROLE_WORDS: the specdrive layout's
    only fixed text); with texts=None, over `n` CoCs the world draws with `seed`
    (`scenes.coc.corpus` where the world has it). Deterministic: same corpus -> same bytes."""
    if texts is None:
        texts = corpus(n, seed)
    return train_bpe(texts, vocab_size, prompt_words=ROLE_WORDS)


def build_word_tokenizer() -> Tokenizer:
    """The closed word vocabulary over `scenes.coc.vocabulary()` (the pre-BPE format)."""
    return Tokenizer.build(coc.vocabulary())


def corpus(n: int, seed: int) -> list[str]:
    """n CoC texts: `scenes.coc.corpus(n, seed)` when the world provides it, else `_grammar_corpus`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"corpus size n={n!r}: need an int >= 1")
    if hasattr(coc, "corpus"):
        return list(coc.corpus(n, seed))
    return _grammar_corpus(n, seed)


def _grammar_corpus(n: int, seed: int) -> list[str]:
    """Stand-in until scenes.coc.corpus exists: scenes.coc.make_coc over random kinematic
    histories (speed, accel, yaw rate), families, facts, decisions and variants."""
    rng = np.random.default_rng(seed)
    t = np.arange(-15, 1) * DT
    texts = []
    for _ in range(n):
        v, a, w = rng.uniform(0, 30), rng.uniform(-4, 3), rng.choice([0.0, rng.uniform(-0.5, 0.5)])
        if rng.random() < 0.05:
            v, a = 0.0, 0.0
        speed = np.maximum(v + a * t, 0.0)
        s = np.concatenate([[0.0], np.cumsum(speed[1:] * DT)])
        heading = w * t
        x, y = np.cumsum(np.cos(heading) * np.gradient(s)), np.cumsum(np.sin(heading) * np.gradient(s))
        hist = np.stack([x - x[-1], y - y[-1], heading - heading[-1]], 1)
        facts = {"noun": str(rng.choice(coc.NOUNS)), "light": str(rng.choice(["red", "yellow", "green"])),
                 "side": str(rng.choice(["left", "right"])), "occluded": bool(rng.random() < 0.3),
                 "blocked": bool(rng.random() < 0.5), "turned": bool(rng.random() < 0.3),
                 "walking": bool(rng.random() < 0.5)}
        text, _ = coc.make_coc(hist, str(rng.choice(FAMILIES)), facts, str(rng.choice(DECISIONS)),
                               int(rng.integers(0, 2)))
        texts.append(text)
    return texts
