"""The shipped tokenizer: the closed vocabulary of the synthetic world's CoC grammar."""
from __future__ import annotations

from prompt.vocab import Tokenizer
from scenes.coc import vocabulary


def build_tokenizer() -> Tokenizer:
    """Tokenizer over `scenes.coc.vocabulary()` (every word the CoC grammar can produce)."""
    return Tokenizer.build(vocabulary())
