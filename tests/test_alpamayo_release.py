"""A released Alpamayo-R1 folder, prompted and conditioned as upstream, through `specdrive plan`.

Upstream: NVlabs/alpamayo @ 1cba38cabffb4b4416dbdd312c868e21ccd57394. Rules are cited where a
test asserts them:
  helper.py create_message            the chat (system, user = images then history + instruction,
                                      assistant "<|cot_start|>"), continue_final_message=True
  models/base_model.py                trajectory tokens <i0>..; hist_token_start_idx =
                                      traj_token_start_idx + traj_tokenizer.vocab_size;
                                      fuse_traj_tokens fills the <|traj_history|> slots in order;
                                      ReasoningVLAConfig keys
  models/delta_tokenizer.py           history bins (origin padded first, deltas, scaled, rounded)
  models/alpamayo_r1.py, config.py    AlpamayoR1Config keys; the expert reads the cache through
                                      <|traj_future_start|>; trajectory ids masked while reasoning
  action_space/unicycle_accel_curvature.py, utils.py   estimate_t0_states (v0 least squares)
The tokenizer.json is built by tests/alpamayo_tokenizer.py with the `tokenizers` library in Qwen's
format (byte-level BPE, Qwen's added tokens in Qwen's order), then Alpamayo's added tokens as
upstream adds them.
"""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

tokenizers = pytest.importorskip("tokenizers")

from models.action_expert import ActionExpert  # noqa: E402
from models.alpamayo import expected_shapes, load_alpamayo, model_config, save_alpamayo  # noqa: E402
from models.config import load_preset  # noqa: E402
from models.target import Target  # noqa: E402
from core.config import ConfigError  # noqa: E402
from prompt.hf_tokenizer import AlpamayoTokenizer  # noqa: E402
from prompt.layout import ALPAMAYO_INSTRUCTION, ALPAMAYO_SYSTEM, SEG_HISTORY, SEG_VISION, build_prompt  # noqa: E402
from prompt.tokenizer import load_tokenizer  # noqa: E402
from prompt.trajectory import delta_history_bins, v0_backward_difference, v0_least_squares  # noqa: E402
from alpamayo_tokenizer import FUTURE_BINS, HIST_BINS, TOKENS, qwen_alpamayo_tokenizer, text_ids  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def straight_history(speed: float = 10.0) -> np.ndarray:
    h = np.zeros((16, 3))
    h[:, 0] = -speed * 0.1 * np.arange(15, -1, -1)
    return h


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A tiny folder in the release layout: config.json, sharded weights + index, vlm_config.json,
    tokenizer.json (Qwen format + Alpamayo's tokens)."""
    folder = tmp_path_factory.mktemp("alpamayo-release")
    tk = qwen_alpamayo_tokenizer()
    tk.save(str(folder / "tokenizer.json"))
    cfg = load_preset("tiny")
    vocab = tk.get_vocab_size(with_added_tokens=True)
    cfg.target.llm.vocab_size = vocab
    cfg.target.image_token_id, cfg.target.vision_start_id = tk.token_to_id("<|image_pad|>"), tk.token_to_id("<|vision_start|>")
    torch.manual_seed(0)
    target, expert = Target(cfg.target), ActionExpert(cfg.expert, cfg.target.llm)
    with torch.no_grad():
        expert.action_std.copy_(torch.tensor([0.7, 0.03]))
    save_alpamayo(folder, target, expert, cfg, vlm_name_or_path="tiny-qwen3-vl", shard_bytes=2_000_000,
                  tokens=TOKENS)
    return folder, target, expert, cfg


def test_tokenizer_seam_reads_the_release_tokens(release):
    folder = release[0]
    tok = load_tokenizer(folder)
    assert isinstance(tok, AlpamayoTokenizer) and tok.layout == "alpamayo"
    # 256 bytes + 26 Qwen added + 40 <i*> + 28 new Alpamayo specials (<|image_pad|> was Qwen's)
    assert len(tok) == 256 + 26 + 40 + 28
    start = tok.id("<i0>")
    assert start == 256 + 26
    assert tok.fut_ids == range(start, start + FUTURE_BINS)
    # base_model._initialize_trajectory_tokenizers: history ids after the future tokenizer's bins
    assert tok.hist_ids == range(start + FUTURE_BINS, start + FUTURE_BINS + HIST_BINS)
    text = tok.text_mask()   # alpamayo_r1.py ExpertLogitsProcessor: [start, start + traj_vocab_size)
    assert not text[start:start + 40].any() and text[:start].all() and text[start + 40:].all()
    assert tok.conditioning.through == "traj_future_start" and tok.conditioning.v0 == "least_squares"
    assert tok.conditioning.tail(tok) == [tok.id("<|traj_future_start|>")]


def test_prompt_ids_equal_upstreams_for_one_scene(release):
    """8 images of 24 merged tokens, a 10 m/s straight history: the ids written out by hand from
    create_message + Qwen3-VL's chat template (continue_final_message) + fuse_traj_tokens."""
    tok = load_tokenizer(release[0])
    prompt = build_prompt(tok, [24] * 8, straight_history(10.0))
    s = {k: tok.id(f"<|{k}|>") for k in ("im_start", "im_end", "vision_start", "vision_end", "image_pad",
                                        "traj_history_start", "traj_history_end", "cot_start")}
    hist_start = tok.id("<i0>") + FUTURE_BINS
    # DeltaTrajectoryTokenizer: origin padded first -> first delta = oldest pose (-15, 0, 0) m,
    # clipped to bin 0 in x; later deltas (1, 0, 0) m; bins (d + 4) / 8 * 31 (z: (d + 10) / 20 * 31),
    # rounded half to even: x 19.375 -> 19, y and z 15.5 -> 16
    hist = [0, 16, 16] + [19, 16, 16] * 15
    expected = ([s["im_start"]] + text_ids("system\n" + ALPAMAYO_SYSTEM) + [s["im_end"]] + text_ids("\n")
                + [s["im_start"]] + text_ids("user\n")
                + ([s["vision_start"]] + [s["image_pad"]] * 24 + [s["vision_end"]]) * 8
                + [s["traj_history_start"]] + [hist_start + b for b in hist] + [s["traj_history_end"]]
                + text_ids(ALPAMAYO_INSTRUCTION) + [s["im_end"]] + text_ids("\n")
                + [s["im_start"]] + text_ids("assistant\n") + [s["cot_start"]])
    assert prompt.ids.tolist() == expected
    assert prompt.reasoning_start == len(expected)
    assert [n for _, n in prompt.image_spans] == [24] * 8
    assert (prompt.segment == SEG_VISION).sum() == 192 and (prompt.segment == SEG_HISTORY).sum() == 48
    assert ALPAMAYO_SYSTEM == "You are a driving assistant that generates safe and accurate actions."


def test_v0_least_squares_is_upstreams_estimator():
    """estimate_t0_states: exact (up to the ridge) wherever the third difference of v is 0."""
    for v0 in (0.0, 4.0, 25.0):
        assert abs(v0_least_squares(straight_history(v0)) - v0) < 2e-3 * max(v0, 1)
    t = np.arange(-15, 1) * 0.1           # constant acceleration 2 m/s^2 up to 12 m/s at t0
    h = np.zeros((16, 3))
    h[:, 0] = 12 * t + t ** 2
    assert abs(v0_least_squares(h) - 12.0) < 1e-2 and abs(v0_backward_difference(h) - 12.0) < 1e-9
    arc = np.zeros((16, 3))                # 8 m/s on a circle of radius 40 m, headings wrapped
    th = 8 / 40 * t
    arc[:, 0], arc[:, 1], arc[:, 2] = 40 * np.sin(th), 40 * (1 - np.cos(th)), np.angle(np.exp(1j * th))
    assert abs(v0_least_squares(arc) - 8.0) < 1e-2


def test_delta_history_bins_round_half_to_even():
    bins = delta_history_bins(straight_history(10.0), num_bins=1000).reshape(16, 3)
    assert bins[0].tolist() == [0, 500, 500]                   # (0 + 4) / 8 * 999 = 499.5 -> 500
    assert bins[1:, 0].tolist() == [round((1 + 4) / 8 * 999)] * 15


def test_release_runs_through_plan_speculative_equals_plain(release, tmp_path):
    """specdrive plan on the release folder: the target drafting for itself (speculative) and
    plain decoding give the same reasoning and the same trajectory, scene by scene."""
    pytest.importorskip("scenes.world")
    folder = release[0]
    runs = {}
    for draft in ("self", "none"):
        out = tmp_path / draft
        r = subprocess.run([sys.executable, "-m", "tools.cli", "plan", "--checkpoint", str(folder),
                            "--draft", draft, "--scenes", "2", "--seed", "0", "--budget-ms", "0",
                            "--max-reasoning", "12", "--warmup", "0", "--pictures", "0", "--quiet",
                            "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[draft] = [json.loads(x) for x in (out / "cycles.jsonl").read_text().splitlines()]
    for spec, plain in zip(runs["self"], runs["none"]):
        assert spec["error"] is None and plain["error"] is None, (spec["error"], plain["error"])
        assert spec["reasoning_ids"] == plain["reasoning_ids"] and len(spec["reasoning_ids"]) > 0
        assert spec["trajectory"] == plain["trajectory"] and spec["source"] == plain["source"]
    assert any(c["decode"].get("steps") for c in runs["self"])   # the speculative loop ran


def test_save_alpamayo_writes_every_key_upstream_reads(release):
    folder, target, expert, cfg = release
    c = json.loads((folder / "config.json").read_text())
    # ReasoningVLAConfig.__init__ and AlpamayoR1Config.__init__ arguments (base_model.py, config.py)
    reads = ["vlm_name_or_path", "vlm_backend", "traj_tokenizer_cfg", "hist_traj_tokenizer_cfg",
             "traj_vocab_size", "tokens_per_history_traj", "tokens_per_future_traj", "model_dtype",
             "attn_implementation", "min_pixels", "max_pixels", "add_special_tokens", "diffusion_cfg",
             "action_space_cfg", "action_in_proj_cfg", "action_out_proj_cfg", "expert_cfg",
             "keep_same_dtype", "expert_non_causal_attention"]
    assert [k for k in reads if k not in c] == []
    assert c["model_type"] == "alpamayo_r1" and c["vlm_backend"] == "qwenvl3"
    # history ids start traj_tokenizer.vocab_size after <i0> and must end inside the <i*> block
    assert c["traj_tokenizer_cfg"]["num_bins"] + c["hist_traj_tokenizer_cfg"]["num_bins"] <= c["traj_vocab_size"]
    # DiscreteTrajectoryTokenizer.encode: (B, n_waypoints, 2) actions -> n_waypoints * 2 tokens
    assert c["tokens_per_future_traj"] == c["action_space_cfg"]["n_waypoints"] * 2 == 128
    # create_message: 48 <|traj_history|> slots = 16 poses x 3 delta tokens (DeltaTrajectoryTokenizer)
    assert c["tokens_per_history_traj"] == 48
    assert c["expert_non_causal_attention"] is True and c["keep_same_dtype"] is True
    assert c["add_special_tokens"] is True   # <|cot_start|> etc. exist only then
    # vocab_size = len(tokenizer) (ReasoningVLAConfig._initialize_vlm_config) = lm_head rows
    tok = load_tokenizer(folder)
    assert c["vocab_size"] == len(tok) == cfg.target.llm.vocab_size
    # AlpamayoR1.__init__: text_config overlaid with expert_cfg; action_space buffers from its cfg
    assert c["expert_cfg"]["intermediate_size"] == cfg.expert.intermediate
    assert c["action_space_cfg"]["accel_std"] == pytest.approx(0.7)
    assert c["diffusion_cfg"]["num_inference_steps"] == cfg.expert.euler_steps
    assert model_config(c, json.loads((folder / "vlm_config.json").read_text()), len(tok)) == cfg


def test_missing_buffers_are_rebuilt_and_vocab_comes_from_the_folder(release, tmp_path):
    folder, target, expert, cfg = release
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    buffers = [f"action_in_proj.sinus.{i}.freqs" for i in range(2)] + [
        "action_in_proj.timestep_fourier_encoder.freqs"] + [
        f"action_space.{n}_{s}" for n in ("accel", "curvature") for s in ("mean", "std")]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        state = safetensors.torch.load_file(str(tmp_path / shard))
        safetensors.torch.save_file({k: v for k, v in state.items() if k not in buffers}, str(tmp_path / shard))
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k not in buffers}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    c = json.loads((tmp_path / "config.json").read_text())
    del c["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(c))
    t2, e2, cfg2 = load_alpamayo(tmp_path)
    assert cfg2.target.llm.vocab_size == len(load_tokenizer(folder))
    for k, v in expert.state_dict().items():
        assert torch.allclose(e2.state_dict()[k], v, rtol=1e-6, atol=0), k
    (tmp_path / "vlm_config.json").unlink()
    with pytest.raises(ConfigError, match="no vlm_config: put that model's config.json"):
        load_alpamayo(tmp_path)


def test_preset_is_the_release_shape():
    """configs/models/alpamayo-r1-10b.yaml against the release: 1,166 tensors' shapes follow from
    it; upstream's `expert` (text model, embed_tokens deleted) has 2.279B parameters."""
    from models.sizes import param_counts
    cfg = load_preset("alpamayo-r1-10b")
    counts = param_counts(cfg)
    assert round(counts["expert_decoder"] / 1e9, 3) == 2.279
    assert cfg.expert.intermediate == 8256 and cfg.target.llm.vocab_size == 155697
    shapes = expected_shapes(cfg)
    assert len(shapes) == 1166
    assert shapes["action_in_proj.encoder.trunk.0.weight"] == (512, 60)
    assert shapes["action_in_proj.encoder.trunk.3.weight"] == (512, 512)
    assert shapes["action_in_proj.encoder.trunk.6.weight"] == (2048, 512)
    assert shapes["expert.layers.0.mlp.up_proj.weight"] == (8256, 2048)


def test_expert_non_causal_attention_is_honoured():
    cfg = load_preset("tiny")
    torch.manual_seed(0)
    causal = ActionExpert(dataclasses.replace(cfg.expert, non_causal=False), cfg.target.llm).eval()
    full = ActionExpert(cfg.expert, cfg.target.llm).eval()
    full.load_state_dict(causal.state_dict())
    cache = torch.randn(12, 2, 1, 2, 40, 32)
    x, t = torch.randn(1, 64, 2), torch.tensor([0.3])
    cos, sin = full.rope(30)
    v_full = full.velocity(x, t, cache, 30, cos, sin)
    v_causal = causal.velocity(x, t, cache, 30, cos, sin)
    assert not torch.allclose(v_full, v_causal)
    x2 = x.clone()
    x2[:, 40:] += 1.0              # causal: later action tokens cannot reach earlier ones; full: they do
    assert torch.allclose(causal.velocity(x2, t, cache, 30, cos, sin)[:, :40], v_causal[:, :40], atol=1e-6)
    assert not torch.allclose(full.velocity(x2, t, cache, 30, cos, sin)[:, :40], v_full[:, :40], atol=1e-4)
