"""The shipped tokenizer: the closed vocabulary of the synthetic world's CoC grammar."""
from __future__ import annotations

from prompt.vocab import Tokenizer


def build_tokenizer() -> Tokenizer:
    """Tokenizer over `scenes.coc.vocabulary()` (every word the CoC grammar can produce)."""
    from scenes.coc import vocabulary

    return Tokenizer.build(vocabulary())
