"""Checkpoint I/O: our safetensors + meta.json format (round trip, every refusal), and the
Alpamayo-R1 release layout (round trip; key/shape list checked against transformers' classes).

Upstream layout: NVlabs/alpamayo @ 1cba38cabffb4b4416dbdd312c868e21ccd57394,
src/alpamayo_r1/models/alpamayo_r1.py (vlm, expert without embed_tokens, action_in_proj,
action_out_proj = torch.nn.Linear), src/alpamayo_r1/models/action_in_proj.py
(PerWaypointActionInProjV2), src/alpamayo_r1/action_space/unicycle_accel_curvature.py (buffers).
"""
import dataclasses
import json

import pytest
import safetensors.torch
import torch

from models import io
from models.action_expert import ActionExpert
from models.alpamayo import expected_shapes, load_alpamayo, save_alpamayo, to_alpamayo
from models.config import load_preset
from models.draft import Draft
from models.target import Target


@pytest.fixture(scope="module")
def cfg():
    return load_preset("tiny")


@pytest.fixture(scope="module")
def planner(cfg):
    torch.manual_seed(0)
    target = Target(cfg.target)
    draft = Draft(cfg, target.embed_tokens, target.lm_head)
    expert = ActionExpert(cfg.expert, cfg.target.llm)
    with torch.no_grad():
        expert.action_std.copy_(torch.tensor([1.7, 0.04]))
    return target, draft, expert


def same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_round_trip_of_our_format(tmp_path, cfg, planner):
    target, draft, expert = planner
    out = tmp_path / "weights_named_like_a_draft"   # the path says nothing; meta.json does
    io.save(out, {"target": target, "draft": draft, "expert": expert}, cfg,
            {"kind": "planner", "source": "test"})
    states, cfg2, meta = io.load(out)
    assert cfg2 == cfg and meta.kind == "planner" and meta.extra["source"] == "test"
    assert meta.dtype == "float32" and set(meta.extra["versions"]) >= {"torch", "safetensors", "python"}
    assert meta.extra["created_by"] and len(meta.modules["draft"].sha256) == 64
    same_state(states["draft"], draft.state_dict())
    with pytest.raises(io.CheckpointError, match="kind is 'planner', expected 'draft'"):
        io.load(out, kind="draft")
    torch.manual_seed(5)
    fresh_t = Target(cfg.target)
    fresh = {"target": fresh_t, "draft": Draft(cfg, fresh_t.embed_tokens, fresh_t.lm_head),
             "expert": ActionExpert(cfg.expert, cfg.target.llm)}
    io.load_into(out, fresh, kind="planner")
    for name, module in zip(("target", "draft", "expert"), planner):
        same_state(fresh[name].state_dict(), module.state_dict())


@pytest.fixture()
def expert_ckpt(tmp_path, cfg, planner):
    path = tmp_path / "expert"
    io.save(path, {"expert": planner[2]}, cfg, {"kind": "expert"})
    return path


def fresh_expert(cfg):
    return {"expert": ActionExpert(cfg.expert, cfg.target.llm)}


def rewrite(path, state):
    """Replace expert.safetensors by `state` and update meta.json to match (a consistent but
    different checkpoint, so the refusal comes from the module check, not the hash)."""
    io.save(path, {"expert": state}, load_preset("tiny"), {"kind": "expert"})


def test_missing_tensor_is_named(expert_ckpt, cfg, planner):
    state = planner[2].state_dict()
    del state["layers.3.mlp.up_proj.weight"]
    rewrite(expert_ckpt, state)
    with pytest.raises(io.CheckpointError, match=r"missing tensor 'layers.3.mlp.up_proj.weight' "
                                                 r"\(expected shape \(160, 64\) float32\)"):
        io.load_into(expert_ckpt, fresh_expert(cfg))


def test_wrong_shape_is_named(expert_ckpt, cfg, planner):
    state = planner[2].state_dict()
    state["norm.weight"] = torch.ones(32)
    rewrite(expert_ckpt, state)
    with pytest.raises(io.CheckpointError, match=r"'norm.weight' has shape \(32,\) float32, "
                                                 r"expected shape \(64,\) float32"):
        io.load_into(expert_ckpt, fresh_expert(cfg))


def test_wrong_dtype_is_refused_not_cast(expert_ckpt, cfg, planner):
    rewrite(expert_ckpt, {k: v.half() for k, v in planner[2].state_dict().items()})
    assert io.read_meta(expert_ckpt).dtype == "float16"
    with pytest.raises(io.CheckpointError, match=r"float16, expected shape .* float32"):
        io.load_into(expert_ckpt, fresh_expert(cfg))


def test_truncated_file_is_refused(expert_ckpt):
    file = expert_ckpt / "expert.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    with pytest.raises(io.CheckpointError, match="expert.safetensors: truncated"):
        io.load(expert_ckpt)


def test_changed_bytes_fail_the_hash(expert_ckpt):
    file = expert_ckpt / "expert.safetensors"
    data = bytearray(file.read_bytes())
    data[-5] ^= 0xFF   # same size, one weight changed
    file.write_bytes(bytes(data))
    with pytest.raises(io.CheckpointError, match="sha256 .* does not match meta.json"):
        io.load(expert_ckpt)


def test_meta_and_file_disagree(expert_ckpt):
    meta = json.loads((expert_ckpt / "meta.json").read_text())
    meta["modules"]["expert"]["tensors"]["norm.weight"]["shape"] = [65]
    (expert_ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(io.CheckpointError,
                       match=r"'norm.weight' has shape \(64,\) float32, expected shape \(65,\)"):
        io.load(expert_ckpt)


@pytest.mark.parametrize("kind", ["vision", None])
def test_unknown_kind_is_refused(expert_ckpt, kind):
    meta = json.loads((expert_ckpt / "meta.json").read_text())
    meta["kind"] = kind
    (expert_ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(io.CheckpointError, match=rf"unknown kind {kind!r}; allowed kinds are "
                                                 r"\['target', 'draft', 'expert', 'planner'\]"):
        io.load(expert_ckpt)


def test_bad_save_arguments(tmp_path, cfg, planner):
    with pytest.raises(io.CheckpointError, match="unknown kind 'model'"):
        io.save(tmp_path, {"expert": planner[2]}, cfg, {"kind": "model"})
    with pytest.raises(io.CheckpointError, match="config must be a config dataclass"):
        io.save(tmp_path, {"expert": planner[2]}, {"hidden": 64}, {"kind": "expert"})
    with pytest.raises(io.CheckpointError, match=r"meta keys \['dtype'\] are written by save"):
        io.save(tmp_path, {"expert": planner[2]}, cfg, {"kind": "expert", "dtype": "int8"})
    with pytest.raises(io.CheckpointError, match="no meta.json"):
        io.load(tmp_path / "nowhere")


def test_alpamayo_round_trip(tmp_path, cfg, planner):
    target, _, expert = planner
    save_alpamayo(tmp_path, target, expert, cfg, shard_bytes=3_000_000)
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    release = json.loads((tmp_path / "config.json").read_text())
    assert release["model_type"] == "alpamayo_r1" and "text_config" not in release
    t2, e2, cfg2 = load_alpamayo(tmp_path)
    assert cfg2 == cfg
    same_state(t2.state_dict(), target.state_dict())
    same_state(e2.state_dict(), expert.state_dict())
    written = {}
    for f in tmp_path.glob("model-*.safetensors"):
        written.update(safetensors.torch.load_file(str(f)))
    assert written["action_space.accel_std"].shape == ()
    assert float(written["action_space.curvature_std"]) == pytest.approx(0.04)


def test_save_alpamayo_refuses_a_frame_local_target_and_writes_nothing(tmp_path, cfg, planner):
    """Like save_hf: upstream's VLM and the runtimes that read the release layout build a causal
    mask, so a frame_local target would be run as another model."""
    from core.config import ConfigError

    _, _, expert = planner
    llm = dataclasses.replace(cfg.target.llm, image_attention="frame_local")
    frame_local = dataclasses.replace(cfg.target, llm=llm)
    with pytest.raises(ConfigError, match="image_attention is 'frame_local'"):
        save_alpamayo(tmp_path / "a", Target(frame_local), expert, cfg)
    assert not (tmp_path / "a").exists()
    save_alpamayo(tmp_path / "b", planner[0], expert, cfg)     # the causal one is written
    assert (tmp_path / "b" / "config.json").is_file()


def test_alpamayo_keys_match_transformers_classes(cfg, planner):
    """The VLM and expert parts of the key/shape list equal the state dicts of transformers'
    Qwen3VLForConditionalGeneration and Qwen3VLTextModel (the upstream `vlm` and `expert`)."""
    tf = pytest.importorskip("transformers")
    from models.alpamayo import release_config
    from models.hf import hf_config

    expected = expected_shapes(cfg)
    assert set(to_alpamayo(planner[0], planner[2])) == set(expected)
    vlm_cfg = tf.Qwen3VLConfig(**hf_config(cfg.target))
    vlm_state = tf.Qwen3VLForConditionalGeneration(vlm_cfg).state_dict()
    vlm = {"vlm." + k: tuple(v.shape) for k, v in vlm_state.items()}
    text = vlm_cfg.text_config
    for key, value in release_config(cfg, "tiny")["expert_cfg"].items():
        setattr(text, key, value)   # AlpamayoR1.__init__: text_config overlaid with expert_cfg
    expert = {"expert." + k: tuple(v.shape) for k, v in tf.AutoModel.from_config(text).state_dict().items()
              if not k.startswith("embed_tokens")}
    ours = {k: v for k, v in expected.items() if k.startswith(("vlm.", "expert."))}
    assert ours == {**vlm, **expert}


def test_alpamayo_refusals(tmp_path, cfg, planner):
    target, _, expert = planner
    save_alpamayo(tmp_path, target, expert, cfg)
    vlm = json.loads((tmp_path / "vlm_config.json").read_text())
    (tmp_path / "vlm_config.json").unlink()
    with pytest.raises(ValueError, match="pass that model's config.json as vlm_config"):
        load_alpamayo(tmp_path)
    shard = next(tmp_path.glob("model-*.safetensors"))
    state = safetensors.torch.load_file(str(shard))
    del state["expert.layers.2.self_attn.k_proj.weight"]
    state["action_out_proj.weight"] = torch.zeros(3, 64)
    safetensors.torch.save_file(state, str(shard))
    with pytest.raises(ValueError, match=r"(?s)expert.layers.2.self_attn.k_proj.weight \(expected shape "
                                         r"\(64, 64\)\).*action_out_proj.weight: file \(3, 64\), "
                                         r"expected \(2, 64\)"):
        load_alpamayo(tmp_path, vlm_config=vlm)
    release = json.loads((tmp_path / "config.json").read_text())
    release["expert_cfg"]["head_dim"] = 64
    (tmp_path / "config.json").write_text(json.dumps(release))
    with pytest.raises(ValueError, match="expert_cfg.head_dim=64 differs from the VLM's 32"):
        load_alpamayo(tmp_path, vlm_config=vlm)
