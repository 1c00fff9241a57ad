"""The tokenizer seam: a folder's tokenizer.json, whichever of the two kinds it is.

    tok = load_tokenizer(folder)

specdrive's closed word vocabulary (prompt.vocab.Tokenizer, `"format": "specdrive-tokenizer-v1"`)
or a Hugging Face tokenizer.json (a "model" and "added_tokens") with Alpamayo-R1's added tokens,
read beside the release config.json (prompt.hf_tokenizer.AlpamayoTokenizer; the `tokenizers`
library is imported only then). Both give the same contract: special-token ids as attributes,
`hist_ids` / `fut_x_ids` / `fut_y_ids` ranges, `text_mask()`, `encode` / `decode`, `layout`,
`conditioning`, `fingerprint`.
"""
from __future__ import annotations

from pathlib import Path

from prompt.config import ConfigError, read_json
from prompt.vocab import FORMAT, Tokenizer


def load_tokenizer(folder):
    """folder/tokenizer.json -> Tokenizer or AlpamayoTokenizer, by the file's own contents."""
    file = Path(folder) / "tokenizer.json"
    data = read_json(file, "tokenizer file")
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return Tokenizer.from_json(data, str(file))
    if isinstance(data, dict) and "model" in data and "added_tokens" in data:
        if not (Path(folder) / "config.json").is_file():
            raise ConfigError(f"{file} is a Hugging Face tokenizer; its trajectory tokens are described by "
                              f"the release config.json beside it, and {folder} has none")
        from prompt.hf_tokenizer import AlpamayoTokenizer
        return AlpamayoTokenizer.load(folder)
    raise ConfigError(f"{file}: neither a specdrive tokenizer (format {FORMAT!r}) nor a Hugging Face "
                      "tokenizer.json (model + added_tokens)")
