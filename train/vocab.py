"""The shipped tokenizer: byte-level BPE (prompt/bpe.py) trained on the synthetic world's CoC text
and the prompt's words; `build_word_tokenizer` is the old closed word vocabulary (checkpoints
trained before the subword tokenizer)."""
from __future__ import annotations

import json
from pathlib import Path

from prompt.bpe import DEFAULT_VOCAB_SIZE, BpeTokenizer, train_bpe
from core.config import ConfigError
from prompt.vocab import ROLE_WORDS, Tokenizer
from scenes import coc

CORPUS_SIZE = 20000     # CoC texts drawn from the world when none are given
CORPUS_SEED = 0


def build_tokenizer(texts=None, vocab_size: int = DEFAULT_VOCAB_SIZE, n: int = CORPUS_SIZE,
                    seed: int = CORPUS_SEED) -> BpeTokenizer:
    """BPE over `texts` (CoC strings) plus the prompt words (ROLE_WORDS: the specdrive layout's
    only fixed text); with texts=None, over `n` CoCs the world draws with `seed`
    (`scenes.coc.corpus`). Deterministic: same corpus -> same bytes."""
    if texts is None:
        texts = corpus(n, seed)
    return train_bpe(texts, vocab_size, prompt_words=ROLE_WORDS)


def build_word_tokenizer() -> Tokenizer:
    """The closed word vocabulary over `scenes.coc.vocabulary()` (the pre-BPE format)."""
    return Tokenizer.build(coc.vocabulary())


def corpus(n: int, seed: int) -> list[str]:
    """n CoC texts of the world's language (`scenes.coc.corpus`)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"corpus size n={n!r}: need an int >= 1")
    return list(coc.corpus(n, seed))


def dataset_corpus(data_dir) -> list[str]:
    """The CoC texts of a dataset's train split (what the target learns to write), read from the
    shards' JSON without touching the arrays."""
    from scenes.dataset import read_dataset_manifest

    root = Path(data_dir)
    manifest = read_dataset_manifest(root)
    if "train" not in manifest.splits:
        raise ConfigError(f"{root} has no train split to build the tokenizer from")
    texts = []
    for shard in manifest.parts("train"):
        texts += [s["coc"] for s in json.loads((root / f"{shard.file}.json").read_text())["scenes"]]
    return texts
