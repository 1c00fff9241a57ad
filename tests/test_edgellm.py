"""`specdrive export edgellm` (issues 38, 49): the exported draft reads back equal to specdrive's,
the chat template renders specdrive's prompt, bad requests exit 2, and TensorRT Edge-LLM's own
exporter (tensorrt-edgellm in .venv-edgellm, made by `make edgellm`, a dependency of `make test`)
exports every folder with its documented commands on the causal twin (checkpoints/tiny-causal, or
the shipped weights declared causal where the tree has no twin):

    tensorrt-edgellm-export target onnx/base --eagle-base     language model + vision tower
    tensorrt-edgellm-export draft onnx/draft                   the EAGLE-3 draft
    tensorrt-edgellm-export action onnx/action                 the Alpamayo-R1 folder: llm, visual, action

The graphs' inputs and outputs and the values Edge-LLM derives into its configs (token ids, the
layers the base feeds the draft, vocabulary sizes, traj_token_start) are checked against the
checkpoint; two planted faults show the checks fail: fp32 vision weights, and a draft config naming
other target layers. The exporter tests skip, naming the package, only where the venv could not be
made. About 4-5 minutes on 2 shared CPU cores (the exporter's runs)."""
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from export import edgellm
from folders import set_layout
from models import io
from models.config import load_preset
from models.draft import Draft
from core.config import ConfigError
from prompt.draft_vocab import build_d2t, d2t_sha256, token_counts
from prompt.layout import build_prompt
from prompt.tokenizer import load_tokenizer
from safetensors.torch import load_file
from train import ckpt

pytestmark = pytest.mark.usefixtures("one_thread")   # tiny models: one torch thread

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "checkpoints" / "tiny"
TWIN = ROOT / "checkpoints" / "tiny-causal"
VENV = ROOT / ".venv-edgellm"
EXPORTER = VENV / "bin" / "tensorrt-edgellm-export"
TEXTS = ["the lead vehicle brakes ahead so slow down", "keep the lane at steady speed"]


def causal_planner(folder: Path) -> Path:
    """The shipped target and expert, declared causal (Edge-LLM builds its own causal mask, so
    export edgellm takes only a causal target; the shipped one is frame_local)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    for part in ("target", "expert"):
        if not (folder / part).exists():
            shutil.copytree(SHIPPED / part, folder / part)
    set_layout(folder, "causal")
    return folder


def planner_with(folder: Path, variant: str, vocab: int = 64, seed: int = 0) -> Path:
    """A planner folder: the shipped target and expert, and a random-weight draft of `variant`."""
    causal_planner(folder)
    tok, cfg, target, _ = io.load_planner(folder)
    torch.manual_seed(seed)
    d = Draft(ckpt.draft_config(cfg, variant, vocab), target.embed_tokens, target.lm_head)
    if vocab:
        d.set_vocab(build_d2t(token_counts(TEXTS, tok), tok, vocab))
    ckpt.save_draft(folder, variant, cfg, d, {"stage": "test"})
    return folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("edgellm")
    planner = planner_with(base / "planner", "eagle3")
    done = edgellm.export_edgellm(planner, base / "out", dtype="float32", progress=lambda *_: None)
    return planner, done


def test_the_exported_draft_reads_back_equal_to_specdrives(exported):
    planner, done = exported
    tok, cfg, target, _ = io.load_planner(planner)
    cfg, draft, _ = io.load_draft(planner / "draft-eagle3-v64", cfg, target, tok)
    ours = draft.state_dict()
    back = edgellm.read_draft_tensors(done.out / "draft")
    assert sorted(back) == sorted(ours)
    for k, v in ours.items():
        assert torch.equal(back[k].to(v.dtype), v), k
    raw = load_file(str(done.out / "draft" / "model.safetensors"))
    assert "midlayer.hidden_norm.weight" in raw and "layers.0.hidden_norm.weight" not in raw
    assert torch.equal(raw["t2d"].nonzero()[:, 0], torch.sort(draft.d2t).values)
    conf = json.loads((done.out / "draft" / "config.json").read_text())
    assert conf["draft_vocab_size"] == 64 and conf["target_hidden_size"] == cfg.target.llm.hidden
    assert conf["vocab_size"] == len(tok) and conf["rope_theta"] == cfg.target.llm.rope_theta
    assert done.feature_layers == (1, 5, 8) and done.hf_layers == (2, 6, 9)
    assert (done.out / "README.md").read_text().count("--specDecode") == 1


def test_the_chat_template_renders_specdrives_prompt(exported):
    """Rendered with the scene's images and history, tokenized with the exported tokenizer.json
    and each <|image_pad|> expanded to its image's tokens: build_prompt's ids."""
    jinja2 = pytest.importorskip("jinja2")
    tokenizers = pytest.importorskip("tokenizers")
    _, done = exported
    tok = load_tokenizer(SHIPPED)
    rng = np.random.default_rng(0)
    back = np.arange(15, -1, -1.0)                      # 16 poses, the last at t = 0
    history = np.stack([-1.2 * back, 0.05 * back, 0.002 * back], 1) + rng.normal(0, 0.01, (16, 3))
    images = [4, 4, 4]
    prompt = build_prompt(tok, images, history)
    hist = prompt.ids[prompt.segment == 2]
    text = "<|traj_history_start|>" + "".join(tok.token(int(i)) for i in hist) + "<|traj_history_end|>"
    messages = [{"role": "user", "content": [{"type": "image"}] * len(images) + [{"type": "text", "text": text}]}]
    template = (done.out / "target" / "chat_template.jinja").read_text()
    rendered = jinja2.Template(template).render(messages=messages, add_generation_prompt=True)
    ids = tokenizers.Tokenizer.from_file(str(done.out / "target" / "tokenizer.json")).encode(
        rendered, add_special_tokens=False).ids
    expanded = []
    for i in ids:
        expanded += [i] * (images[0] if i == tok.image_pad else 1)
    assert expanded == prompt.ids[:prompt.reasoning_start].tolist()


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tools.cli", "export", "edgellm", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("variant,args,match", [
    ("flat", ["--draft", "flat"], "draft.arch='specdrive'"),       # another architecture, named
    ("flat", [], "has no EAGLE-3 draft"),                           # another architecture, the only draft
    (None, [], "has no draft"),                                     # no draft at all
])
def test_bad_requests_exit_2_with_a_message(tmp_path, variant, args, match):
    planner = tmp_path / "p"
    if variant is None:
        causal_planner(planner)
    else:
        planner_with(planner, variant, vocab=0)
    proc = run_cli("--checkpoint", planner, "--out", tmp_path / "out", *args)
    assert proc.returncode == 2 and match in proc.stderr, proc.stderr[-800:]
    assert "Traceback" not in proc.stderr


def test_the_shipped_frame_local_target_is_refused_naming_the_layout_and_nothing_is_written(tmp_path):
    proc = run_cli("--checkpoint", SHIPPED, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "'frame_local'" in proc.stderr and "make train-causal" in proc.stderr, \
        proc.stderr[-800:]
    assert not (tmp_path / "out").exists()


def test_a_draft_on_other_layers_exits_2(tmp_path):
    """An EAGLE-3 draft fused on the layers our specdrive drafts read (2, 6, 9), not Edge-LLM's."""
    tok = load_tokenizer(SHIPPED)
    cfg = io.with_tokenizer(load_preset("tiny"), tok)
    target, _, _ = io.new_models(cfg, 0)
    moved = ckpt.draft_config(cfg, "eagle3", 64)
    moved = dataclasses.replace(moved, draft=dataclasses.replace(moved.draft, feature_layers=(2, 6, 9)))
    torch.manual_seed(0)
    d = Draft(moved, target.embed_tokens, target.lm_head)
    d.set_vocab(build_d2t(token_counts(TEXTS, tok), tok, 64))
    planner = planner_with(tmp_path / "p", "eagle3")
    shutil.rmtree(planner / "draft-eagle3-v64")
    io.save(planner / "draft-eagle3-v64", {"draft": d}, moved, {"kind": "draft", "variant": "eagle3-v64",
            "draft_vocab": 64, "d2t_sha256": d2t_sha256(d.d2t.numpy())})
    assert io.read_meta(planner / "draft-eagle3-v64").config["draft"]["feature_layers"] == [2, 6, 9]
    proc = run_cli("--checkpoint", planner, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr[-800:]
    assert "reads target layers [2, 6, 9]" in proc.stderr and "feeds layers [1, 5, 8]" in proc.stderr
    with pytest.raises(ConfigError, match="draft.rope='mrope'"):
        edgellm.check_draft(dataclasses.replace(cfg, draft=dataclasses.replace(
            ckpt.draft_config(cfg, "eagle3").draft, rope="mrope")), "x")


def test_a_target_without_mrope_is_not_a_qwen_vl_layout():
    tok = load_tokenizer(SHIPPED)
    cfg = io.with_tokenizer(load_preset("tiny"), tok)
    flat = dataclasses.replace(cfg.target.llm, mrope_section=())
    with pytest.raises(ConfigError, match="not a Qwen-VL layout"):
        edgellm.check_target(dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, llm=flat)), tok)


def test_the_default_checkpoint_is_the_causal_twin_and_its_absence_is_named(tmp_path):
    """Without --checkpoint: checkpoints/tiny-causal (relative to the working directory, as every
    default checkpoint of the CLI); where there is none, exit 2 naming it and how to get one."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "export", "edgellm", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-800:]
    assert "checkpoints/tiny-causal" in proc.stderr and "make train-causal" in proc.stderr, proc.stderr[-800:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def twin(request):
    """The causal twin: checkpoints/tiny-causal where the tree has it, else the shipped weights
    declared causal (conftest causal_ckpt: a valid model, not the one the causal training made)."""
    return TWIN if TWIN.is_dir() else request.getfixturevalue("causal_ckpt")


@pytest.fixture(scope="module")
def twin_export(twin, tmp_path_factory):
    """export edgellm of the twin with the defaults (float16)."""
    return edgellm.export_edgellm(twin, tmp_path_factory.mktemp("twin") / "out", progress=lambda *_: None)


def safetensors_in(folder: Path) -> dict:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def test_every_folder_is_written_in_float16_by_default(twin, twin_export):
    """Edge-LLM's visual and action layers take float16: every floating tensor of the three folders
    is float16 and is the checkpoint's tensor rounded to float16; d2t / t2d keep their kinds."""
    tok, cfg, target, expert = io.load_planner(twin)
    out = twin_export.out
    for part in ("target", "draft", "action"):
        tensors = safetensors_in(out / part)
        floats = {k: v.dtype for k, v in tensors.items() if v.is_floating_point()}
        assert floats and set(floats.values()) == {torch.float16}, (part, set(floats.values()))
    assert json.loads((out / "target" / "config.json").read_text())["dtype"] == "float16"
    assert json.loads((out / "draft" / "config.json").read_text())["torch_dtype"] == "float16"
    assert json.loads((out / "action" / "config.json").read_text())["model_dtype"] == "float16"
    ours = target.state_dict()["visual.blocks.0.attn.qkv.weight"]
    theirs = safetensors_in(out / "target")["model.visual.blocks.0.attn.qkv.weight"]
    assert torch.equal(theirs, ours.half())
    draft = safetensors_in(out / "draft")
    assert draft["d2t"].dtype == torch.int64 and draft["t2d"].dtype == torch.bool


def test_token_ids_and_the_trajectory_start_are_the_tokenizers(twin, twin_export):
    tok = load_tokenizer(twin)
    out = twin_export.out
    for conf in (json.loads((out / "target" / "config.json").read_text()),
                 json.loads((out / "action" / "config.json").read_text())):
        assert (conf["image_token_id"], conf["vision_start_token_id"], conf["vision_end_token_id"]) == \
            (tok.image_pad, tok.vision_start, tok.vision_end)
        assert conf["video_token_id"] == -1            # no video token in the vocabulary
    action = json.loads((out / "action" / "config.json").read_text())
    # Edge-LLM's derivation (scripts/export.py _build_action_config): the first history token
    assert action["traj_token_start_idx"] + action["traj_tokenizer_cfg"]["num_bins"] == tok.hist_ids.start
    assert tok.token(tok.hist_ids.start) == "<hist_0>"
    assert action["text_config"]["hidden_size"] == action["hidden_size"] == io.load_planner(twin)[1].target.llm.hidden


def test_the_draft_config_names_the_layers_it_fuses(twin_export):
    conf = json.loads((twin_export.out / "draft" / "config.json").read_text())
    want = list(twin_export.hf_layers)
    assert conf["target_layer_ids"] == conf["eagle_aux_hidden_state_layer_ids"] == want
    assert conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == want
    assert want == [i + 1 for i in twin_export.feature_layers]


def onnx_io(path: Path) -> dict:
    """{'inputs': {name: [type, dims]}, 'outputs': {...}} of an ONNX file, read in the Edge-LLM venv
    (its onnx)."""
    code = ("import json, sys, onnx\n"
            "m = onnx.load(sys.argv[1], load_external_data=False)\n"
            "d = lambda v: [x.dim_value or x.dim_param for x in v.type.tensor_type.shape.dim]\n"
            "t = lambda v: onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)\n"
            "print(json.dumps({'inputs': {i.name: [t(i), d(i)] for i in m.graph.input},"
            " 'outputs': {o.name: [t(o), d(o)] for o in m.graph.output}}))\n")
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", code, str(path)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


def edgellm_export(src: Path, dst: Path, *extra: str) -> None:
    """Edge-LLM's exporter, its documented command: tensorrt-edgellm-export SRC DST [flags]; exit 0
    or an AssertionError with the end of its output."""
    env = {"PATH": f"{VENV / 'bin'}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HOME": str(dst.parent)}
    proc = subprocess.run([str(EXPORTER), str(src), str(dst), *extra], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, f"tensorrt-edgellm-export {src.name} {' '.join(extra)}: {proc.stderr[-2000:]}"


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


needs_edgellm = pytest.mark.skipif(
    not EXPORTER.is_file(), reason="tensorrt-edgellm (pinned in the Makefile, `make edgellm`) is not installed "
    "in .venv-edgellm: it could not install on this machine")


@pytest.fixture(scope="module")
def onnx_out(twin_export, tmp_path_factory):
    """The three documented commands on the twin's folders, once for the module."""
    out, onnx = twin_export.out, tmp_path_factory.mktemp("edgellm-onnx")
    edgellm_export(out / "target", onnx / "base", "--eagle-base")
    edgellm_export(out / "draft", onnx / "draft")
    edgellm_export(out / "action", onnx / "action")
    return onnx


def check_layers(draft_dir: Path, base: dict, feature_layers) -> None:
    """The layers the base feeds (eagle_hidden_state_layers) are the draft's, in Edge-LLM's exported
    draft config and in the folder's own, and they are the layers the draft was trained on."""
    want = [int(i) + 1 for i in feature_layers]
    assert base["eagle_hidden_state_layers"] == want
    assert config(draft_dir)["eagle3_config"]["target_layer_ids"] == want


@needs_edgellm
def test_the_base_language_model_and_what_it_feeds_the_draft(twin, twin_export, onnx_out):
    tok, cfg, _, _ = io.load_planner(twin)
    llm, D = cfg.target.llm, cfg.target.llm.hidden
    graph = onnx_io(onnx_out / "base" / "llm" / "model.onnx")
    ins, outs = graph["inputs"], graph["outputs"]
    assert outs["logits"][1][-1] == len(tok) == llm.vocab_size
    assert outs["hidden_states"] == ["FLOAT16", [outs["hidden_states"][1][0], 3 * D]]   # 3 fused layers
    assert ins["inputs_embeds"] == ["FLOAT16", [ins["inputs_embeds"][1][0], D]]
    assert sorted(k for k in ins if k.startswith("past_key_values_")) == \
        sorted(f"past_key_values_{i}" for i in range(llm.layers))
    assert ins["past_key_values_0"][1][-2:] == [llm.kv_heads, llm.head_dim]
    assert sorted(k for k in ins if k.startswith("deepstack_embeds_")) == \
        [f"deepstack_embeds_{i}" for i in range(len(cfg.target.vision.deepstack_layers))]
    assert {"tree_parent_ids", "packed_attention_mask"} <= set(ins)            # --eagle-base: tree attention
    base = config(onnx_out / "base" / "llm")
    assert base["vocab_size"] == len(tok) and base["spec_decode_type"] == "eagle3"
    assert (base["image_token_id"], base["vision_start_token_id"], base["vision_end_token_id"]) == \
        (tok.image_pad, tok.vision_start, tok.vision_end)
    assert base["eagle_hidden_state_layers"] == list(twin_export.hf_layers)
    assert (onnx_out / "base" / "llm" / "chat_template.jinja").is_file()


@needs_edgellm
def test_the_vision_tower(twin, onnx_out):
    tok, cfg, _, _ = io.load_planner(twin)
    v = cfg.target.vision
    graph = onnx_io(onnx_out / "base" / "visual" / "model.onnx")
    ins, outs = graph["inputs"], graph["outputs"]
    assert ins["input"] == ["FLOAT16", [ins["input"][1][0], v.in_channels * v.temporal_patch * v.patch ** 2]]
    assert outs["output"][0] == "FLOAT16" and outs["output"][1][-1] == cfg.target.llm.hidden
    assert sorted(k for k in outs if k.startswith("deepstack_features_")) == \
        [f"deepstack_features_{i}" for i in range(len(v.deepstack_layers))]
    vis = config(onnx_out / "base" / "visual")
    assert vis["vision_config"]["depth"] == v.depth and vis["vision_config"]["patch_size"] == v.patch
    assert (vis["image_token_id"], vis["vision_end_token_id"], vis["vocab_size"]) == \
        (tok.image_pad, tok.vision_end, len(tok))


@needs_edgellm
def test_the_eagle3_draft(twin, twin_export, onnx_out):
    tok, cfg, _, _ = io.load_planner(twin)
    meta = io.read_meta(io.scan_checkpoints(twin)[1][twin_export.draft])
    D, N = cfg.target.llm.hidden, meta.config["draft"]["vocab"] or len(tok)
    graph = onnx_io(onnx_out / "draft" / "llm" / "model.onnx")
    ins, outs = graph["inputs"], graph["outputs"]
    assert ins["hidden_states_input"][1][-1] == 3 * D and ins["hidden_states_from_draft"][1][-1] == D
    assert ins["inputs_embeds"][1][-1] == D
    assert outs["logits"][1][-1] == N and outs["hidden_states"][1][-1] == D
    draft = config(onnx_out / "draft" / "llm")
    assert draft["spec_decode_type"] == "eagle3" and draft["draft_vocab_size"] == N
    assert draft["vocab_size"] == len(tok) and draft["base_model_hidden_size"] == 3 * D
    check_layers(onnx_out / "draft" / "llm", config(onnx_out / "base" / "llm"), twin_export.feature_layers)


@needs_edgellm
def test_the_action_expert_through_the_default_command(twin, twin_export, onnx_out):
    """The Alpamayo-R1 folder through the default command (llm, visual and action); the expert's
    rotary sections stay Edge-LLM's fixed ones (the folder's README names the limit)."""
    tok, cfg, _, _ = io.load_planner(twin)
    e, llm = cfg.expert, cfg.target.llm
    act = config(onnx_out / "action" / "action")
    assert act["traj_token_start"] == tok.hist_ids.start < len(tok)
    assert (act["num_hidden_layers"], act["hidden_size"], act["num_attention_heads"], act["head_dim"]) == \
        (llm.layers, e.hidden, e.heads, llm.head_dim)
    assert act["n_diffusion_tokens"] == e.n_waypoints
    fixed = edgellm.EDGELLM_ACTION_FIXED["mrope_section"]
    assert act["rope_scaling"]["mrope_section"] == fixed != list(llm.mrope_section)
    readme = (twin_export.out / "README.md").read_text()     # the limit, named
    assert "rotary sections" in readme and str(fixed) in readme and str(list(llm.mrope_section)) in readme
    graph = onnx_io(onnx_out / "action" / "action" / "model.onnx")
    ins, outs = graph["inputs"], graph["outputs"]
    assert ins["noise_trajectory"][1][1:] == [e.n_waypoints, e.action_dim]
    assert outs["denoised_trajectory"][1][1:] == [e.n_waypoints, e.action_dim]
    assert sorted(k for k in ins if k.startswith("k_cache_")) == sorted(f"k_cache_{i}" for i in range(llm.layers))
    assert ins["k_cache_0"][1][1] == llm.kv_heads and ins["k_cache_0"][1][-1] == llm.head_dim
    assert config(onnx_out / "action" / "llm")["vocab_size"] == len(tok)
    assert (onnx_out / "action" / "visual" / "model.onnx").is_file()


@needs_edgellm
def test_the_checks_fail_on_float32_vision_weights(twin, tmp_path):
    """Planted: the target written in float32 (what export edgellm wrote before issue 49). Edge-LLM's
    vision export then fails, and so does the command the exporter test runs."""
    done = edgellm.export_edgellm(twin, tmp_path / "out", dtype="float32", progress=lambda *_: None)
    with pytest.raises(AssertionError, match="FP16Linear expects float16 input, got torch.float32"):
        edgellm_export(done.out / "target", tmp_path / "base", "--skip-llm")


@needs_edgellm
def test_the_checks_fail_on_a_draft_config_naming_other_layers(twin_export, onnx_out, tmp_path):
    """Planted: the draft folder's config names other target layers than those it was trained on;
    Edge-LLM's draft config carries them and check_layers fails."""
    draft = tmp_path / "draft"
    shutil.copytree(twin_export.out / "draft", draft)
    conf = config(draft)
    wrong = [i + 1 for i in conf["target_layer_ids"]]
    conf.update(target_layer_ids=wrong, eagle_aux_hidden_state_layer_ids=wrong,
                eagle_config={**conf["eagle_config"], "eagle_aux_hidden_state_layer_ids": wrong})
    (draft / "config.json").write_text(json.dumps(conf))
    edgellm_export(draft, tmp_path / "onnx")
    assert config(tmp_path / "onnx" / "llm")["eagle3_config"]["target_layer_ids"] == wrong
    with pytest.raises(AssertionError):
        check_layers(tmp_path / "onnx" / "llm", config(onnx_out / "base" / "llm"), twin_export.feature_layers)
