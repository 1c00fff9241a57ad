"""`specdrive train ship`: assemble checkpoints/tiny from the run folders (copies, hash-checked).

    OUT/tokenizer.json, OUT/target, OUT/expert      from the SFT checkpoint folder
    OUT/draft-<variant>                               from each distillation / AARL checkpoint
                                                      (<variant>-v<N>: a reduced head of N rows,
                                                      its meta.json's draft_vocab must be N)

A draft whose meta.json records another target's weights (target_sha256) is refused.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from models import io
from core.config import ConfigError
from train.ckpt import target_sha256
from train.config import ShipConfig, ship_vocab


def _copy(src: Path, dst: Path) -> None:
    io.load(src)                       # refuses a folder that does not match its meta.json
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def _draft(variant: str, src: Path, shipped: str, sft: Path) -> bool:
    """Whether draft `variant` at `src` ships (False: not there); ConfigError when it cannot."""
    if not (src / "meta.json").is_file():
        print(f"ship: skipping draft {variant!r}: {src} does not exist")
        return False
    meta = io.read_meta(src)
    if meta.variant != variant:
        raise ConfigError(f"{src}: meta.json variant is {meta.variant!r}, not {variant!r}")
    vocab, head = ship_vocab(variant), meta.config.get("draft", {}).get("vocab", 0)
    if meta.draft_vocab != vocab or head != vocab:
        raise ConfigError(f"{src}: a draft head of draft_vocab={meta.draft_vocab} / "
                          f"config draft.vocab={head} rows, but {variant!r} needs {vocab or 'the target'}'s")
    trained_for = meta.extra.get("target_sha256")
    if trained_for is None:
        print(f"ship: draft {variant!r} ({src}) records no target_sha256; "
              "it cannot be checked against the shipped target")
    elif trained_for != shipped:
        raise ConfigError(f"{src}: draft {variant!r} was trained against target weights "
                          f"{trained_for[:12]}..., not the shipped {shipped[:12]}... of {sft}; "
                          "re-distill it from this target")
    return True


def run(cfg: ShipConfig) -> str:
    """Every draft is checked before anything is written, so a refused one leaves OUT as it was."""
    sft, out = Path(cfg.sft), Path(cfg.out)
    if not (sft / "tokenizer.json").is_file():
        raise ConfigError(f"sft={str(sft)!r} is not an SFT checkpoint folder (no tokenizer.json); "
                          "run `specdrive train sft` first")
    shipped = target_sha256(sft)
    drafts = {v: Path(src) for v, src in cfg.drafts.items() if _draft(v, Path(src), shipped, sft)}
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(sft / "tokenizer.json", out / "tokenizer.json")
    for name in ("target", "expert"):
        _copy(sft / name, out / name)
    for variant, src in drafts.items():
        _copy(src, out / f"draft-{variant}")
    return str(out)
