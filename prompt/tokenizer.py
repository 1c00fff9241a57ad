"""The tokenizer seam: a folder's tokenizer.json, whichever of the three kinds it is.

    tok = load_tokenizer(folder)

  - specdrive's closed word vocabulary (prompt.vocab.Tokenizer, `"format": "specdrive-tokenizer-v1"`),
    the format of checkpoints trained before the subword tokenizer;
  - specdrive's BPE (prompt.bpe.BpeTokenizer): a Hugging Face tokenizer.json whose added tokens
    are specdrive's fixed special and trajectory tokens (<|pad|> .. <|cot_end|>, <hist_0> ..,
    <fx_0> .., <fy_0> .. at ids 0..909); no config.json needed;
  - a released Alpamayo-R1 tokenizer.json (Qwen's vocabulary + Alpamayo-R1's added tokens), read
    beside the release config.json (prompt.hf_tokenizer.AlpamayoTokenizer).
The `tokenizers` library is imported only for the last two. All give the same contract:
special-token ids as attributes, `hist_ids` / `fut_x_ids` / `fut_y_ids` ranges, `text_mask()`,
`encode` / `decode`, `layout`, `conditioning`, `fingerprint`.
"""
from __future__ import annotations

from pathlib import Path

from core.config import ConfigError, read_json
from prompt.trajectory import FUT_X_BINS, FUT_Y_BINS, HIST_BINS
from prompt.vocab import FORMAT, SPECIAL, Tokenizer

N_FIXED = len(SPECIAL) + HIST_BINS + FUT_X_BINS + FUT_Y_BINS
EXPECTED = (f"a specdrive word-level tokenizer (\"format\": {FORMAT!r}), a specdrive BPE tokenizer.json "
            f"(Hugging Face, added tokens <|pad|>.. <hist_0>.. <fx_0>.. <fy_0>.. at ids 0..{N_FIXED - 1}) or a released "
            "Alpamayo-R1 tokenizer.json (Hugging Face model + added_tokens, with the release config.json beside it)")


def load_tokenizer(folder):
    """folder/tokenizer.json -> Tokenizer, BpeTokenizer or AlpamayoTokenizer, by the file's own contents."""
    file = Path(folder) / "tokenizer.json"
    data = read_json(file, "tokenizer file")
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return Tokenizer.from_json(data, str(file))
    if isinstance(data, dict) and "model" in data and "added_tokens" in data:
        from prompt.bpe import BpeTokenizer, is_specdrive_bpe
        if is_specdrive_bpe(data):
            return BpeTokenizer.from_json(data, str(file))
        if not (Path(folder) / "config.json").is_file():
            raise ConfigError(f"{file} is a Hugging Face tokenizer without specdrive's trajectory added tokens "
                              f"(<hist_0>..), so it must be an Alpamayo-R1 release, whose trajectory tokens are "
                              f"described by the release config.json beside it, and {folder} has none")
        from prompt.hf_tokenizer import AlpamayoTokenizer
        return AlpamayoTokenizer.load(folder)
    raise ConfigError(f"{file}: not a tokenizer this specdrive reads; expected {EXPECTED}")
