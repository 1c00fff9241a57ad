"""The closed word-level vocabulary: special tokens, trajectory tokens, words.

Id layout (fixed, so trajectory ids never move when the word list changes):

    [0, n_special)                      Alpamayo-R1's special tokens (SPECIAL, in order)
    [hist_ids.start, hist_ids.stop)     HIST_BINS history bins (binned pose deltas)
    [fut_x_ids...], [fut_y_ids...]      future waypoint bins, x then y (ordinal inside a range)
    [words...]                          the words, in the order given to `build`

Text is words separated by single spaces; "," is a word. Saved as JSON, never pickled.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from core.config import ConfigError, from_dict, read_json, to_dict
from prompt.layout import Conditioning
from prompt.trajectory import FUT_X_BINS, FUT_Y_BINS, HIST_BINS

SPECIAL = (
    "<|pad|>", "<|unk|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|traj_history_start|>", "<|traj_history|>", "<|traj_history_end|>",
    "<|traj_future_start|>", "<|traj_future_end|>",
    "<|cot_start|>", "<|cot_end|>",
)
ROLE_WORDS = ("user", "assistant")  # chat roles, always in the vocabulary
FORMAT = "specdrive-tokenizer-v1"


def attr_name(token: str) -> str:
    return token.strip("<|>")


class VocabMasks:
    """The mask accessors every tokenizer shares; a subclass defines masks() -> {history,
    future, trajectory, text}: bool (V,)."""

    def traj_mask(self) -> np.ndarray:
        return self.masks()["trajectory"]

    def future_mask(self) -> np.ndarray:
        return self.masks()["future"]

    def text_mask(self) -> np.ndarray:
        return self.masks()["text"]

    def sampling_mask(self) -> np.ndarray:
        """What a sampled rollout may write while reasoning: text without the prompt's structural
        special tokens (an <|image_pad|> written as reasoning would be read as an image slot);
        <|cot_end|> stays allowed."""
        m = self.text_mask().copy()
        for name in ("pad", "unk", "im_start", "im_end", "vision_start", "vision_end", "image_pad",
                     "traj_history_start", "traj_history", "traj_history_end", "traj_future_start",
                     "traj_future_end", "cot_start"):
            i = getattr(self, name, None)
            if i is not None:
                m[i] = False
        return m


class Tokenizer(VocabMasks):
    """Word-level tokenizer over a closed vocabulary; `tok.cot_end` etc. are special-token ids.

    Its layout is specdrive's (prompt/layout.py); `conditioning` (how the action expert reads the
    cache) is the trained one: through <|cot_end|>, v0 by backward difference, unless the saved
    JSON says otherwise (the key is written only when it differs, so fingerprints stay)."""
    layout = "specdrive"
    token_trajectory = True      # the 128-token trajectory output (x, y bins) is available

    def __init__(self, words: list[str], conditioning: Conditioning | None = None):
        bad = [w for w in words if not w or " " in w or w in SPECIAL]
        if bad:
            raise ConfigError(f"vocabulary words must be non-empty, space-free and not special tokens; bad: {bad[:5]}")
        words = list(dict.fromkeys([*ROLE_WORDS, *words]))  # dedupe, keep order
        n = len(SPECIAL)
        self.hist_ids = range(n, n + HIST_BINS)
        self.fut_x_ids = range(self.hist_ids.stop, self.hist_ids.stop + FUT_X_BINS)
        self.fut_y_ids = range(self.fut_x_ids.stop, self.fut_x_ids.stop + FUT_Y_BINS)
        self.word_ids = range(self.fut_y_ids.stop, self.fut_y_ids.stop + len(words))
        self.text_ids = self.word_ids     # the ids text is written in (BpeTokenizer has the same name)
        self.words = words
        self.conditioning = conditioning or Conditioning()
        self._id = {t: i for i, t in enumerate(SPECIAL)}
        self._id.update({w: self.word_ids.start + i for i, w in enumerate(words)})
        for i, t in enumerate(SPECIAL):
            setattr(self, attr_name(t), i)

    @classmethod
    def build(cls, words) -> "Tokenizer":
        return cls(list(words))

    def __len__(self) -> int:
        return self.word_ids.stop

    def id(self, token: str) -> int:
        if token not in self._id:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return self._id[token]

    def token(self, i: int) -> str:
        i = int(i)
        if i < len(SPECIAL):
            return SPECIAL[i]
        for name, r in (("hist", self.hist_ids), ("fx", self.fut_x_ids), ("fy", self.fut_y_ids)):
            if i in r:
                return f"<{name}_{i - r.start}>"
        if i in self.word_ids:
            return self.words[i - self.word_ids.start]
        raise KeyError(f"id {i} is outside the vocabulary [0, {len(self)})")

    def encode(self, text: str, strict: bool = True) -> list[int]:
        """Words separated by single spaces -> ids. Unknown words raise (strict) or map to <|unk|>."""
        ids = []
        for w in text.split():
            if w in self._id:
                ids.append(self._id[w])
            elif strict:
                raise KeyError(f"word {w!r} is not in the closed vocabulary ({len(self.words)} words)")
            else:
                ids.append(self.unk)
        return ids

    def decode(self, ids) -> str:
        return " ".join(self.token(i) for i in ids)

    def masks(self) -> dict[str, np.ndarray]:
        """Bool masks over the vocabulary: text (special + words), history, future, trajectory."""
        v = np.arange(len(self))
        hist = (v >= self.hist_ids.start) & (v < self.hist_ids.stop)
        fut = (v >= self.fut_x_ids.start) & (v < self.fut_y_ids.stop)
        return {"history": hist, "future": fut, "trajectory": hist | fut, "text": ~(hist | fut)}

    def to_json(self) -> dict:
        data = {"format": FORMAT, "special": list(SPECIAL), "hist_bins": HIST_BINS,
                "fut_x_bins": FUT_X_BINS, "fut_y_bins": FUT_Y_BINS, "words": self.words}
        if self.conditioning != Conditioning():
            data["conditioning"] = to_dict(self.conditioning)
        return data

    @property
    def fingerprint(self) -> str:
        """sha256 of the vocabulary in id order: a checkpoint records the one it was trained with,
        so a tokenizer.json with the same words in another order is refused, not misread."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        return cls.from_json(read_json(path, "tokenizer file"), str(path))

    @classmethod
    def from_json(cls, data: dict, where: str = "tokenizer") -> "Tokenizer":
        expect = {"format": FORMAT, "special": list(SPECIAL), "hist_bins": HIST_BINS,
                  "fut_x_bins": FUT_X_BINS, "fut_y_bins": FUT_Y_BINS}
        for key, value in expect.items():
            if data.get(key) != value:
                raise ConfigError(f"{where}: {key}={data.get(key)!r} does not match this specdrive ({value!r})")
        cond = data.get("conditioning")
        return cls(data["words"], None if cond is None else from_dict(Conditioning, cond, f"{where}: conditioning"))
