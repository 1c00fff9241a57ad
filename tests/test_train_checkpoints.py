"""The shipped checkpoints (checkpoints/tiny) load through models.io, stay small, and are
trained: the target's greedy reasoning on fresh scenes is CoC text ending in <|cot_end|>."""
from pathlib import Path

import pytest
import torch

from models import io
from train import ckpt, data, reasoning

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny"
DRAFTS = ("flat", "mrope", "flat-standalone", "flat-aarl")

pytestmark = [pytest.mark.skipif(not (SHIPPED / "target" / "meta.json").is_file(),
                                 reason="checkpoints/tiny has not been shipped in this tree"),
              pytest.mark.usefixtures("one_thread")]


def test_shipped_folder_is_small_and_complete():
    size = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    assert size < 64 * 2**20, f"checkpoints/tiny holds {size / 2**20:.1f} MiB; keep it to tens of MB"
    assert (SHIPPED / "tokenizer.json").is_file() and (SHIPPED / "MODEL_CARD.md").is_file()
    for name, kind in [("target", "target"), ("expert", "expert")] + [(f"draft-{d}", "draft") for d in DRAFTS]:
        if (SHIPPED / name).exists():
            assert io.read_meta(SHIPPED / name).kind == kind


def test_shipped_models_load_and_reason():
    from scenes.world import make_scene

    tok, cfg, target, expert = io.load_planner(SHIPPED)
    exs = [data.encode_scene(make_scene(s, split="test"), tok, cfg.target.vision, s)
           for s in (101, 202)]
    from scenes.language import parse

    tokens, lengths = reasoning.greedy_reasoning(target, exs, tok, max_new=96)
    for t, n in zip(tokens, lengths):
        words = tok.decode(t[:n - 1]).split()
        first = parse(words)[0]
        assert t[n - 1] == tok.cot_end and first is not None and first[1] in ("speed", "stopped"), \
            f"untrained-looking CoC: {words[:8]}"
    for d in DRAFTS:
        if (SHIPPED / f"draft-{d}").exists():
            _, draft, meta = io.load_draft(SHIPPED / f"draft-{d}", cfg, target)
            assert meta.variant == d and draft.cfg.rope == ckpt.VARIANTS[d][0]
            assert all(torch.isfinite(p).all() for p in draft.parameters())


def test_one_loader_refuses_a_reordered_tokenizer():
    """models.io checks the tokenizer fingerprint the checkpoint recorded: two tokens with their
    ids swapped give the same sizes and special ids but other meanings."""
    from core.config import ConfigError
    from prompt.tokenizer import load_tokenizer

    tok = load_tokenizer(SHIPPED)
    data = tok.to_json()
    vocab = data["model"]["vocab"]
    a, b = tok.token(len(tok) - 1), tok.token(len(tok) - 2)
    vocab[a], vocab[b] = vocab[b], vocab[a]
    other = type(tok).from_json(data)
    assert len(other) == len(tok) and other.fingerprint != tok.fingerprint
    with pytest.raises(ConfigError, match="not the one this checkpoint was trained with"):
        io.load_models(io.scan_checkpoints(SHIPPED)[0], other)
