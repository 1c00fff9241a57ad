"""`specdrive train ship`: assemble checkpoints/tiny from the run folders (copies, hash-checked).

    OUT/tokenizer.json, OUT/target, OUT/expert      from the SFT checkpoint folder
    OUT/draft-<variant>                               from each distillation / AARL checkpoint
                                                      (<variant>-v<N>: a reduced head of N rows,
                                                      its meta.json's draft_vocab must be N)
"""
from __future__ import annotations

import shutil
from pathlib import Path

from models import io
from prompt.config import ConfigError
from train.config import ShipConfig, ship_vocab


def _copy(src: Path, dst: Path) -> None:
    io.load(src)                       # refuses a folder that does not match its meta.json
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def run(cfg: ShipConfig) -> str:
    sft, out = Path(cfg.sft), Path(cfg.out)
    if not (sft / "tokenizer.json").is_file():
        raise ConfigError(f"sft={str(sft)!r} is not an SFT checkpoint folder (no tokenizer.json); "
                          "run `specdrive train sft` first")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(sft / "tokenizer.json", out / "tokenizer.json")
    for name in ("target", "expert"):
        _copy(sft / name, out / name)
    for variant, src in cfg.drafts.items():
        src = Path(src)
        if not (src / "meta.json").is_file():
            print(f"ship: skipping draft {variant!r}: {src} does not exist")
            continue
        meta = io.read_meta(src)
        if meta.variant != variant:
            raise ConfigError(f"{src}: meta.json variant is {meta.variant!r}, not {variant!r}")
        vocab, head = ship_vocab(variant), meta.config.get("draft", {}).get("vocab", 0)
        if meta.draft_vocab != vocab or head != vocab:
            raise ConfigError(f"{src}: a draft head of draft_vocab={meta.draft_vocab} / "
                              f"config draft.vocab={head} rows, but {variant!r} needs {vocab or 'the target'}'s")
        _copy(src, out / f"draft-{variant}")
    return str(out)
