"""specdrive's BPE tokenizer (prompt/bpe.py): fixed ids, the transformers round trip, masks,
fingerprint, the load_tokenizer seam, per-word -> per-token routine flags, determinism."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prompt.bpe import FIXED, BpeTokenizer, train_bpe
from core.config import ConfigError
from prompt.layout import COMMITMENT, ROUTINE, SEG_COC, Conditioning, build_prompt
from prompt.tokenizer import load_tokenizer
from prompt.trajectory import FUT_X_BINS, FUT_Y_BINS, HIST_BINS
from prompt.vocab import SPECIAL, Tokenizer
from train.vocab import build_tokenizer, build_word_tokenizer, corpus

ROOT = Path(__file__).resolve().parents[1]
# world-v2-like CoCs: decimals, words the grammar corpus never saw (split into several tokens)
FREE = [
    "ego is cruising at 12.3 m/s in the right lane , slowing down from 14.1 m/s over the last 1.5 s , heading "
    "straight , the white van 23.4 m ahead is braking hard with a time gap of 1.8 s , so ease off and keep the gap",
    "ego is stopped at 0.0 m/s , a pedestrian in a yellow jacket is crossing 7.5 m ahead , so wait for them",
    "probably the cyclist 4.2 m to the left will merge , time to collision 2.9 s , so yield to it",
    "Übergang : caf\u00e9 na\u00efve \u2013 \U0001F697 2.0 m/s",   # any text: every byte has a symbol
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(texts=corpus(3000, 0) + FREE[:1] * 20, vocab_size=2048)


@pytest.fixture(scope="module")
def texts():
    return corpus(300, 7) + FREE


def test_fixed_ids_are_the_word_level_layout(tok):
    word = build_word_tokenizer()
    n = len(SPECIAL) + HIST_BINS + FUT_X_BINS + FUT_Y_BINS
    assert len(FIXED) == n and list(FIXED) == [word.token(i) for i in range(n)]
    assert [tok.id(t) for t in FIXED] == list(range(n)) and [tok.token(i) for i in range(n)] == list(FIXED)
    for name in ("pad", "unk", "im_start", "im_end", "vision_start", "vision_end", "image_pad",
                 "traj_history_start", "traj_history", "traj_history_end", "traj_future_start",
                 "traj_future_end", "cot_start", "cot_end"):
        assert getattr(tok, name) == getattr(word, name) == SPECIAL.index(f"<|{name}|>")
    assert (tok.hist_ids, tok.fut_x_ids, tok.fut_y_ids) == (word.hist_ids, word.fut_x_ids, word.fut_y_ids)
    assert tok.text_ids == range(n, len(tok)) and 1000 < len(tok) <= 2048
    assert tok.layout == "specdrive" and tok.token_trajectory and tok.conditioning == Conditioning()
    data = tok.to_json()
    assert data["model"]["type"] == "BPE"
    assert [(t["id"], t["content"], t["special"]) for t in data["added_tokens"]] == [(i, t, True) for i, t in enumerate(FIXED)]


def test_round_trip_through_transformers(tok, texts, tmp_path):
    import transformers     # a dev dependency: the round trip goes through it, never skipped
    tok.save(tmp_path / "tokenizer.json")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert len(fast) == len(tok)
    for text in texts:
        ids = tok.encode(text)
        assert fast(text)["input_ids"] == ids, text
        assert fast.decode(ids) == text and tok.decode(ids) == text, text
        assert all(i >= tok.text_ids.start for i in ids), text
    assert fast.convert_ids_to_tokens([tok.cot_end, tok.hist_ids.start, tok.fut_y_ids.stop - 1]) == \
        ["<|cot_end|>", "<hist_0>", f"<fy_{FUT_Y_BINS - 1}>"]
    assert all(fast.added_tokens_decoder[i].special for i in range(len(FIXED)))
    # special tokens inside text are split out as their ids, both ways
    mixed = "<|cot_start|>ego is stopped<|cot_end|>"
    assert fast(mixed)["input_ids"] == tok.encode(mixed)
    assert tok.encode(mixed)[0] == tok.cot_start and tok.encode(mixed)[-1] == tok.cot_end
    assert tok.decode(tok.encode(mixed)) == mixed


def test_tokens_per_coc(tok, texts):
    grammar = [len(tok.encode(t)) for t in texts[:300]]
    assert 30 <= np.mean(grammar) <= 80, np.mean(grammar)
    assert 30 <= len(tok.encode(FREE[0])) <= 80
    # a word the corpus never had is several tokens, each with a leading-space token first
    assert len(tok.encode("ego is hovering")) > 3


def test_masks_partition_the_vocabulary(tok):
    m = tok.masks()
    assert all(v.shape == (len(tok),) for v in m.values())
    assert (m["text"] ^ m["trajectory"]).all() and (m["trajectory"] == (m["history"] | m["future"])).all()
    assert m["history"].sum() == HIST_BINS and m["future"].sum() == FUT_X_BINS + FUT_Y_BINS
    assert m["text"][: len(SPECIAL)].all() and m["text"][tok.text_ids.start:].all()
    assert not m["text"][len(SPECIAL): tok.text_ids.start].any()
    assert (tok.traj_mask() == m["trajectory"]).all() and (tok.future_mask() == m["future"]).all()
    assert (tok.text_mask() == m["text"]).all()


def _edited(tok, edit) -> dict:
    data = tok.to_json()
    edit(data)
    return data


def test_fingerprint_is_the_vocabulary_and_merge_order(tok, tmp_path):
    tok.save(tmp_path / "tokenizer.json")
    assert BpeTokenizer.load(tmp_path / "tokenizer.json").fingerprint == tok.fingerprint
    other = build_tokenizer(texts=corpus(3000, 1), vocab_size=2048)
    assert other.fingerprint != tok.fingerprint

    def swap_merges(d):
        m = d["model"]["merges"]
        m[10], m[11] = m[11], m[10]

    def swap_ids(d):
        v = d["model"]["vocab"]
        a, b = tok.token(len(tok) - 1), tok.token(len(tok) - 2)
        v[a], v[b] = v[b], v[a]

    for edit in (swap_merges, swap_ids):
        changed = BpeTokenizer.from_json(_edited(tok, edit))
        assert len(changed) == len(tok) and changed.fingerprint != tok.fingerprint, edit.__name__


def test_load_tokenizer_dispatch(tok, tmp_path):
    bpe, word, hf = tmp_path / "bpe", tmp_path / "word", tmp_path / "hf"
    for d in (bpe, word, hf):
        d.mkdir()
    tok.save(bpe / "tokenizer.json")
    got = load_tokenizer(bpe)
    assert isinstance(got, BpeTokenizer) and got.fingerprint == tok.fingerprint
    build_word_tokenizer().save(word / "tokenizer.json")     # the old format stays loadable
    assert type(load_tokenizer(word)) is Tokenizer
    # a Hugging Face tokenizer without specdrive's added tokens is a release: it needs config.json
    plain = train_bpe(corpus(50, 0), 1300).to_json()
    plain["added_tokens"] = plain["added_tokens"][: len(SPECIAL)]
    (hf / "tokenizer.json").write_text(json.dumps(plain))
    with pytest.raises(ConfigError, match="without specdrive's trajectory added tokens.*config.json"):
        load_tokenizer(hf)
    (hf / "tokenizer.json").write_text(json.dumps({"vocab": ["a"]}))
    with pytest.raises(ConfigError, match="not a tokenizer this specdrive reads; expected a specdrive word-level"):
        load_tokenizer(hf)
    (hf / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_tokenizer(hf)


def _move_fx5(d):
    d["added_tokens"][len(SPECIAL) + HIST_BINS + 5]["content"] = "<fx_500>"


def _drop_byte(d):
    v = d["model"]["vocab"]
    del v["Ā"]


@pytest.mark.parametrize("edit, match", [
    (_move_fx5, r"added token .*<fx_500>.* where '<fx_5>' \(id 147, special true\) belongs"),
    (lambda d: d["added_tokens"].pop(), "added_tokens has 909 entries; specdrive's BPE has exactly the 910"),
    (lambda d: d["model"].update(type="WordPiece"), "model type 'WordPiece'; a specdrive subword tokenizer is 'BPE'"),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer .*Lowercase.* has none"),
    (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "pre_tokenizer .* specdrive's BPE is"),
    (_drop_byte, "the BPE vocab must map tokens to the ids 0..N-1"),
    (lambda d: d.update(conditioning={"through": "traj_future_start"}), "Hugging Face tokenizers cannot read it"),
])
def test_corrupt_specdrive_bpe_is_refused(tok, tmp_path, edit, match):
    (tmp_path / "tokenizer.json").write_text(json.dumps(_edited(tok, edit)))
    with pytest.raises(ConfigError, match=match):
        load_tokenizer(tmp_path)


def test_conditioning_is_default_only(tok):
    assert BpeTokenizer(tok.hf, Conditioning()).conditioning == Conditioning()
    with pytest.raises(ConfigError, match="not the default .* cannot store another"):
        BpeTokenizer(tok.hf, Conditioning("traj_future_start", "least_squares"))


def test_word_index_follows_the_offsets(tok, texts):
    for text in texts:
        enc = tok.hf.encode(text, add_special_tokens=False)
        want = [text[: s + (text[s] == " ")].count(" ") for s, e in enc.offsets]   # spaces before its word
        assert tok.word_index(enc.ids) == want, text
        words = text.split(" ")
        for j, w in enumerate(words):   # a word's tokens decode to that word (its leading space stripped)
            pieces = [i for i, k in zip(enc.ids, want) if k == j]
            assert tok.decode(pieces).lstrip(" ") == w
    with pytest.raises(ValueError, match="special/trajectory token"):
        tok.word_index([tok.cot_end])
    assert tok.word_index(tok.encode("ego  is")) == [0, 2, 2]       # "ego", "Ġ", "Ġis": "" is word 1
    lone = tok.encode("a QZq")                                  # "a", "Ġ", "Q", "Z", "q": "Ġ" alone
    assert tok.token(lone[1]) == "Ġ" and tok.word_index(lone) == [0] + [1] * (len(lone) - 1)


def test_per_word_flags_become_per_token_flags(tok):
    coc = FREE[0]
    words = coc.split(" ")
    flags = [i < 20 for i in range(len(words))]
    flags[30] = True                                  # not only a prefix: each word keeps its own flag
    hist = np.zeros((16, 3))
    hist[:, 0] = np.arange(-15, 1) * 0.1 * 12.3
    p = build_prompt(tok, [24] * 2, hist, coc=coc, coc_routine=flags)
    coc_ids = p.ids[p.segment == SEG_COC]
    assert tok.decode(coc_ids) == coc and len(coc_ids) > len(words)     # some words are several tokens
    widx = tok.word_index(coc_ids)
    assert sorted(set(widx)) == list(range(len(words)))
    want = [ROUTINE if flags[w] else COMMITMENT for w in widx]
    assert p.coc_kind[p.segment == SEG_COC].tolist() == want
    assert (p.coc_kind[p.segment != SEG_COC] == 0).all()
    # "12.3" is three tokens ("Ġ12", ".", "3"): all three carry that word's flag
    three = [k for k, w in enumerate(widx) if w == words.index("12.3")]
    assert len(three) == 3 and len({p.coc_kind[p.segment == SEG_COC][k] for k in three}) == 1
    assert p.ids[p.reasoning_start - 1] == tok.cot_start
    assert p.ids[1] == tok.id("user") and tok.id("assistant") in p.ids[: p.reasoning_start].tolist()
    infer = build_prompt(tok, [24] * 2, hist)
    assert np.array_equal(infer.ids, p.ids[: p.reasoning_start])
    with pytest.raises(ValueError, match=f"coc_routine has {len(coc_ids)} flags for {len(words)} CoC words"):
        build_prompt(tok, [24] * 2, hist, coc=coc, coc_routine=[True] * len(coc_ids))


TRAIN = ("from train.vocab import build_tokenizer, corpus; import sys; "
         "sys.stdout.write(build_tokenizer(texts=corpus(1500, 3), vocab_size=1600).hf.to_str(pretty=True))")


def test_training_is_deterministic(tmp_path):
    a = build_tokenizer(texts=corpus(1500, 3), vocab_size=1600)
    a.save(tmp_path / "a.json")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    runs = [subprocess.run([sys.executable, "-c", TRAIN], capture_output=True, text=True, check=True, cwd=ROOT,
                           env={**env, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1] == (tmp_path / "a.json").read_text()[:-1]
    b = build_tokenizer(texts=corpus(1500, 4), vocab_size=1600)
    assert b.fingerprint != a.fingerprint
    assert corpus(50, 3) == corpus(50, 3) and corpus(50, 3) != corpus(50, 4)


def test_bad_training_arguments():
    with pytest.raises(ConfigError, match="vocab_size=500: need an int >= 1168"):
        train_bpe(["ego is stopped"], 500)
    with pytest.raises(ConfigError, match="non-empty CoC strings"):
        train_bpe([], 2048)
    with pytest.raises(ConfigError, match="non-empty CoC strings"):
        train_bpe(["ego", ""], 2048)
    with pytest.raises(ConfigError, match="corpus size n=0"):
        corpus(0, 0)
