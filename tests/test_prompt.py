"""The prompt contract: tokenizer round trips, trajectory bins, layout."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from core.config import ConfigError
from prompt.layout import SEG_COC, SEG_FUTURE, SEG_HISTORY, SEG_VISION, build_prompt
from prompt.trajectory import (FUT_X_STEP, FUT_Y_STEP, HIST_STEP, TrajectoryRangeError, decode_future,
                               decode_history, encode_future, encode_history, tokens_to_future,
                               tokens_to_history, history_tokens, future_tokens)
from prompt.vocab import SPECIAL, Tokenizer

WORDS = ["ego", "is", "cruising", "at", "12", "m/s", ",", "so", "keep", "speed", "the", "lead", "brakes"]


def random_history(rng, speed=12.0, yaw_rate=0.05):
    t = np.arange(-15, 1) * 0.1
    heading = yaw_rate * t
    x = speed * t + rng.normal(0, 0.01, 16)          # 1 cm localisation jitter
    y = 0.5 * yaw_rate * speed * t**2 + rng.normal(0, 0.01, 16)
    poses = np.stack([x, y, heading], 1)
    poses[-1] = 0
    return poses


def test_tokenizer_round_trip_and_json(tmp_path):
    tok = Tokenizer.build(WORDS)
    text = "ego is cruising at 12 m/s , so keep speed"
    assert tok.decode(tok.encode(text)) == text
    assert tok.cot_end == SPECIAL.index("<|cot_end|>")
    tok.save(tmp_path / "tok.json")
    tok2 = Tokenizer.load(tmp_path / "tok.json")
    assert tok2.words == tok.words and len(tok2) == len(tok)
    with pytest.raises(KeyError, match="not in the closed vocabulary"):
        tok.encode("ego is flying")
    assert tok.decode(tok.encode("ego flying", strict=False)) == "ego <|unk|>"


def test_tokenizer_refuses_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Tokenizer.load(bad)
    data = Tokenizer.build(WORDS).to_json()
    data["hist_bins"] = 7
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="hist_bins=7"):
        Tokenizer.load(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        Tokenizer.load(tmp_path / "missing.json")


def test_masks_partition_the_vocabulary():
    tok = Tokenizer.build(WORDS)
    m = tok.masks()
    assert (m["text"] ^ m["trajectory"]).all()
    assert m["history"][tok.hist_ids.start] and not m["history"][tok.fut_x_ids.start]
    assert m["future"][tok.fut_y_ids.stop - 1] and not m["future"][tok.word_ids.start]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), speed=st.floats(0, 30), lateral_accel=st.floats(-4, 4))
def test_history_round_trip_within_half_a_bin(seed, speed, lateral_accel):
    # drivable histories: |lateral acceleration| = speed * yaw rate <= 4 m/s^2, |yaw rate| <= 1 rad/s
    yaw_rate = float(np.clip(lateral_accel / max(speed, 1.0), -1.0, 1.0))
    poses = random_history(np.random.default_rng(seed), speed, yaw_rate)
    rebuilt = decode_history(encode_history(poses))
    err = np.abs(rebuilt - poses).max(axis=0)
    assert (err <= HIST_STEP / 2 + 1e-6).all(), f"max error per component {err}, half bins {HIST_STEP / 2}"


def test_history_carries_rounding_error():
    # a constant velocity that is not a multiple of the bin: without carrying, the error grows
    poses = random_history(np.random.default_rng(0), speed=12.34, yaw_rate=0.0) * 0
    poses[:, 0] = np.arange(-15, 1) * 0.1 * 12.34
    err = np.abs(decode_history(encode_history(poses))[:, 0] - poses[:, 0]).max()
    assert err <= HIST_STEP[0] / 2 + 1e-9
    assert len(set(encode_history(poses)[0::3].tolist())) > 1  # the bins alternate to carry the error


def test_history_refuses_absurd_input():
    poses = random_history(np.random.default_rng(0))
    bad = poses.copy(); bad[3, 0] = np.nan
    with pytest.raises(TrajectoryRangeError, match="non-finite"):
        encode_history(bad)
    bad = poses.copy(); bad[:, 0] *= 20  # 240 m/s
    with pytest.raises(TrajectoryRangeError, match="allowed per 0.1 s"):
        encode_history(bad)
    with pytest.raises(TrajectoryRangeError, match="shape"):
        encode_history(poses[:8])


def test_future_round_trip_and_ids():
    tok = Tokenizer.build(WORDS)
    t = np.arange(1, 65) * 0.1
    wp = np.stack([10 * t + 0.3 * t**2, 0.2 * t**2, 0 * t], 1)
    ids = future_tokens(tok, wp)
    assert ids.shape == (128,)
    assert all(i in tok.fut_x_ids for i in ids[0::2]) and all(i in tok.fut_y_ids for i in ids[1::2])
    back = tokens_to_future(tok, ids)
    assert np.abs(back[:, 0] - wp[:, 0]).max() <= FUT_X_STEP / 2 + 1e-6
    assert np.abs(back[:, 1] - wp[:, 1]).max() <= FUT_Y_STEP / 2 + 1e-6
    assert np.array_equal(encode_future(back), encode_future(wp))
    with pytest.raises(TrajectoryRangeError, match="allowed"):
        encode_future(wp * 50)
    hist = random_history(np.random.default_rng(1))
    assert np.allclose(tokens_to_history(tok, history_tokens(tok, hist)), decode_history(encode_history(hist)))


def test_layout_segments_and_reasoning_start():
    tok = Tokenizer.build(WORDS)
    hist = random_history(np.random.default_rng(2))
    t = np.arange(1, 65) * 0.1
    fut = np.stack([12 * t, 0 * t], 1)
    coc = "ego is cruising at 12 m/s , so keep speed"
    p = build_prompt(tok, [24] * 8, hist, coc=coc, future=fut, coc_routine=[True] * 6 + [False] * 4)
    assert (p.segment == SEG_VISION).sum() == 192 and (p.ids == tok.image_pad).sum() == 192
    assert (p.segment == SEG_HISTORY).sum() == 48 and (p.segment == SEG_FUTURE).sum() == 128
    assert p.ids[p.reasoning_start - 1] == tok.cot_start
    assert tok.decode(p.ids[p.segment == SEG_COC]) == coc
    assert (p.coc_kind == 1).sum() == 6 and (p.coc_kind == 2).sum() == 4
    infer = build_prompt(tok, [24] * 8, hist)
    assert np.array_equal(infer.ids, p.ids[: p.reasoning_start])
    for start, n in p.image_spans:
        assert p.ids[start - 1] == tok.vision_start and p.ids[start + n] == tok.vision_end


def test_sampling_mask_keeps_text_and_cot_end_and_drops_the_prompt_structure():
    from train.vocab import build_tokenizer

    for tok in (Tokenizer.build(WORDS), build_tokenizer(n=500)):
        m = tok.sampling_mask()
        assert m[tok.cot_end] and m[tok.encode("ego")[0]]
        for name in ("image_pad", "vision_start", "vision_end", "im_start", "cot_start", "traj_future_start"):
            assert not m[getattr(tok, name)], name
        assert not (m & tok.traj_mask()).any()
