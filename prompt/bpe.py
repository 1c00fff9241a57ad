"""specdrive's subword tokenizer: byte-level BPE in the specdrive id layout, one tokenizer.json.

    tok = train_bpe(texts, vocab_size=4096)      Hugging Face `tokenizers` BpeTrainer, deterministic
    tok.save(folder / "tokenizer.json");  tok = BpeTokenizer.load(folder / "tokenizer.json")

Id layout (the word-level prompt.vocab.Tokenizer's, so trajectory ids never move):

    [0, n_special)                      SPECIAL, in order                     } added tokens,
    [hist_ids], [fut_x_ids], [fut_y_ids] <hist_i>, <fx_i>, <fy_i> bins         } special: true
    [text_ids.start, len(tok))          the BPE vocabulary: 256 byte symbols, then merges

The file is a standard Hugging Face tokenizer.json (model BPE, ByteLevel pre-tokenizer with
add_prefix_space false + ByteLevel decoder, no normalizer, no post-processor), so
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)` loads it and encode -> decode gives the
text back byte for byte (every byte has a symbol: nothing is unknown). `tokenizers` rejects keys
it does not know in a tokenizer.json, so the file cannot carry a specdrive `conditioning`: a BPE
tokenizer has the default one (through <|cot_end|>, v0 by backward difference) and refuses others.

A CoC is words separated by single spaces; the pre-tokenizer keeps a word's leading space on its
first token ("ego", "Ġis", "Ġ12", ".", "3"), so no token spans two words and `word_index(ids)`
maps tokens back to words (per-word routine flags -> per-token flags, prompt.layout).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from core.config import ConfigError, read_json
from prompt.layout import Conditioning
from prompt.trajectory import FUT_X_BINS, FUT_Y_BINS, HIST_BINS
from prompt.vocab import ROLE_WORDS, SPECIAL, VocabMasks, attr_name

FORMAT = "specdrive-bpe-v1"     # in the fingerprint only (the file itself is plain Hugging Face)
FIXED = (*SPECIAL, *(f"<hist_{i}>" for i in range(HIST_BINS)), *(f"<fx_{i}>" for i in range(FUT_X_BINS)),
         *(f"<fy_{i}>" for i in range(FUT_Y_BINS)))
DEFAULT_VOCAB_SIZE = 4096       # total, the fixed tokens included (len(tok), the model's vocab_size)
MIN_VOCAB_SIZE = len(FIXED) + 256 + len(ROLE_WORDS)
SPACE = "Ġ"                     # ByteLevel's symbol for the byte 0x20
PRE_TOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
DECODER = {"type": "ByteLevel"}


def _pipeline() -> HFTokenizer:
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return hf


def train_bpe(texts, vocab_size: int = DEFAULT_VOCAB_SIZE, prompt_words=ROLE_WORDS) -> "BpeTokenizer":
    """Byte-level BPE over `texts` (CoC strings) and the prompt's own words, `vocab_size` tokens in
    all (fixed tokens included; fewer when the corpus runs out of pairs to merge). The prompt
    words are counted as often as the corpus has texts, so each becomes a single token. Same
    texts in the same order -> the same tokenizer.json bytes."""
    texts = list(texts)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(f"vocab_size={vocab_size!r}: need an int >= {MIN_VOCAB_SIZE} ({len(FIXED)} fixed "
                          f"special/trajectory tokens + 256 byte symbols + the {len(ROLE_WORDS)} role words)")
    bad = [t for t in texts if not isinstance(t, str) or not t]
    if not texts or bad:
        raise ConfigError(f"train_bpe needs non-empty CoC strings; got {len(texts)} texts, bad: {bad[:3]!r}")
    hf = _pipeline()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(FIXED), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    words = list(prompt_words)
    hf.train_from_iterator([*texts, *(w for _ in range(len(texts)) for w in words)], trainer)
    tok = BpeTokenizer(hf, where="train_bpe")
    split = [w for w in words if len(tok.encode(w)) != 1]
    if split:
        raise ConfigError(f"prompt words {split} did not become single tokens at vocab_size={vocab_size}; "
                          "give a larger vocab_size")
    return tok


class BpeTokenizer(VocabMasks):
    """The prompt contract (prompt.vocab.Tokenizer's) over a specdrive BPE tokenizer.json:
    special-token ids as attributes, hist/fut id ranges, masks, encode/decode, fingerprint."""
    layout = "specdrive"
    token_trajectory = True      # the 128-token trajectory output (x, y bins) is available
    subword = True               # CoC words may be several tokens: see word_index

    def __init__(self, hf: HFTokenizer, conditioning: Conditioning | None = None, where: str = "tokenizer.json"):
        if conditioning is not None and conditioning != Conditioning():
            raise ConfigError(f"{where}: conditioning {conditioning} is not the default {Conditioning()}; a BPE "
                              "tokenizer.json cannot store another (Hugging Face tokenizers rejects extra keys)")
        self.hf, self.where = hf, where
        self.conditioning = Conditioning()
        data = json.loads(hf.to_str())
        _check(data, where)
        self._vocab = sorted(data["model"]["vocab"], key=data["model"]["vocab"].get)
        self._merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in data["model"]["merges"]]
        n = len(SPECIAL)
        self.hist_ids = range(n, n + HIST_BINS)
        self.fut_x_ids = range(self.hist_ids.stop, self.hist_ids.stop + FUT_X_BINS)
        self.fut_y_ids = range(self.fut_x_ids.stop, self.fut_x_ids.stop + FUT_Y_BINS)
        self.text_ids = range(self.fut_y_ids.stop, len(self._vocab))
        for i, t in enumerate(SPECIAL):
            setattr(self, attr_name(t), i)

    # --- files ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "BpeTokenizer":
        return cls.from_json(read_json(path, "tokenizer file"), str(path))

    @classmethod
    def from_json(cls, data, where: str = "tokenizer.json") -> "BpeTokenizer":
        _check(data, where)
        try:
            hf = HFTokenizer.from_str(json.dumps(data))
        except Exception as e:   # the library raises its own exception type
            raise ConfigError(f"{where}: Hugging Face tokenizers cannot read it ({e})") from None
        return cls(hf, where=where)

    def to_json(self) -> dict:
        return json.loads(self.hf.to_str())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.hf.to_str(pretty=True) + "\n")

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical content: the fixed tokens, the vocabulary in id order and the
        merges in order (the pipeline is checked to be the one above), so another vocabulary or
        merge order is refused, while a re-save by another `tokenizers` version is not."""
        canon = {"format": FORMAT, "added": list(FIXED), "vocab": self._vocab, "merges": self._merges}
        return hashlib.sha256(json.dumps(canon, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    # --- tokens ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._vocab)

    def id(self, token: str) -> int:
        i = self.hf.token_to_id(token)
        if i is None:
            raise KeyError(f"token {token!r} is not in the vocabulary (a BPE token is written as the "
                           f"tokenizer stores it, e.g. {SPACE}is for ' is'; encode text instead)")
        return i

    def token(self, i: int) -> str:
        i = int(i)
        if not 0 <= i < len(self):
            raise KeyError(f"id {i} is outside the vocabulary [0, {len(self)})")
        return self._vocab[i]

    def encode(self, text: str, strict: bool = True) -> list[int]:
        """Text -> ids, as transformers' tokenizer(text) gives them (added tokens split out first).
        `strict` is the word-level signature's: byte-level BPE has no unknown text."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def word_index(self, ids) -> list[int]:
        """Per token of an encoded CoC, the index of its word in decode(ids).split(" "): the number
        of spaces before the token's first non-space byte (a token of spaces only, as "Ġ" before
        "w" of a rare word, belongs to the word that follows it)."""
        out, spaces, pending = [], 0, 0
        for i in ids:
            i = int(i)
            if i < self.text_ids.start:
                raise ValueError(f"id {i} ({self.token(i)}) is a special/trajectory token, not CoC text")
            t = self.token(i)
            lead = len(t) - len(t.lstrip(SPACE))
            if lead == len(t):
                pending += 1
            else:
                out += [spaces + lead] * (pending + 1)
                pending = 0
            spaces += t.count(SPACE)
        return out + [spaces] * pending

    def masks(self) -> dict[str, np.ndarray]:
        """Bool masks over the vocabulary: text (special + BPE), history, future, trajectory."""
        v = np.arange(len(self))
        hist = (v >= self.hist_ids.start) & (v < self.hist_ids.stop)
        fut = (v >= self.fut_x_ids.start) & (v < self.fut_y_ids.stop)
        return {"history": hist, "future": fut, "trajectory": hist | fut, "text": ~(hist | fut)}


def is_specdrive_bpe(data) -> bool:
    """Whether a Hugging Face tokenizer.json claims specdrive's layout (its trajectory added
    tokens); `BpeTokenizer.from_json` then checks the rest."""
    added = data.get("added_tokens") if isinstance(data, dict) else None
    contents = {t.get("content") for t in added if isinstance(t, dict)} if isinstance(added, list) else set()
    return "<hist_0>" in contents or "<fx_0>" in contents


def _check(data, where: str) -> None:
    """The file must be specdrive's BPE: ConfigError naming the first thing that is not."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ConfigError(f"{where}: not a Hugging Face tokenizer.json (no \"model\" mapping)")
    model = data["model"]
    if model.get("type") != "BPE":
        raise ConfigError(f"{where}: model type {model.get('type')!r}; a specdrive subword tokenizer is 'BPE'")
    added = data.get("added_tokens")
    if not isinstance(added, list) or len(added) != len(FIXED):
        got = len(added) if isinstance(added, list) else added
        raise ConfigError(f"{where}: added_tokens has {got!r} entries; specdrive's BPE has exactly the {len(FIXED)} "
                          f"fixed tokens ({len(SPECIAL)} special, then <hist_i>, <fx_i>, <fy_i> bins)")
    for i, (want, t) in enumerate(zip(FIXED, added)):
        if not isinstance(t, dict) or (t.get("id"), t.get("content"), t.get("special")) != (i, want, True):
            raise ConfigError(f"{where}: added token {t!r} where {want!r} (id {i}, special true) belongs")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise ConfigError(f"{where}: the BPE vocab must map tokens to the ids 0..N-1, each once")
    moved = [(t, vocab.get(t)) for i, t in enumerate(FIXED) if vocab.get(t) != i]
    if moved:
        raise ConfigError(f"{where}: fixed token {moved[0][0]!r} has BPE id {moved[0][1]}, "
                          f"expected {FIXED.index(moved[0][0])}")
    missing = [c for c in pre_tokenizers.ByteLevel.alphabet() if c not in vocab]
    if missing:
        raise ConfigError(f"{where}: {len(missing)} of the 256 byte symbols are missing from the vocab "
                          f"(e.g. {missing[0]!r}); text with them could not be encoded")
    pre, dec = data.get("pre_tokenizer") or {}, data.get("decoder") or {}
    if any(pre.get(k) != v for k, v in PRE_TOKENIZER.items()) or dec.get("type") != DECODER["type"]:
        raise ConfigError(f"{where}: pre_tokenizer {pre!r} / decoder {dec!r}; specdrive's BPE is {PRE_TOKENIZER} "
                          f"with a {DECODER['type']} decoder (the exact round trip of CoC text)")
    for key in ("normalizer", "post_processor"):
        if data.get(key) is not None:
            raise ConfigError(f"{where}: {key} {data[key]!r}; specdrive's BPE has none (it would change the text "
                              "or add tokens)")
