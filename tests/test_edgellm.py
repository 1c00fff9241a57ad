"""`specdrive export edgellm` (issue 38): the exported draft reads back equal to specdrive's, the
chat template renders specdrive's prompt, bad requests exit 2, and TensorRT Edge-LLM's own
exporter (tensorrt-edgellm in .venv-edgellm, made by `make edgellm`, a dependency of `make test`)
accepts the target and the EAGLE-3 draft folders and writes their ONNX.

The exporter test skips, naming the package, only where the venv could not be made. Its visual
export imports nvidia-modelopt, which only the package's heavier `tools` extra installs, so the
target is exported with --skip-visual: the LLM graph (the one the draft depends on) is checked,
the vision tower's graph is not."""
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
from prompt.config import ConfigError
from prompt.draft_vocab import build_d2t, d2t_sha256, token_counts
from prompt.layout import build_prompt
from prompt.tokenizer import load_tokenizer
from safetensors.torch import load_file
from train import ckpt

pytestmark = pytest.mark.usefixtures("one_thread")   # tiny models: one torch thread

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "checkpoints" / "tiny"
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
    done = edgellm.export_edgellm(planner, base / "out", progress=lambda *_: None)
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


def onnx_io(path: Path) -> dict:
    """{'inputs': {name: dims}, 'outputs': {...}} of an ONNX file, read in the Edge-LLM venv (its onnx)."""
    code = ("import json, sys, onnx\n"
            "m = onnx.load(sys.argv[1], load_external_data=False)\n"
            "d = lambda v: [x.dim_value or x.dim_param for x in v.type.tensor_type.shape.dim]\n"
            "print(json.dumps({'inputs': {i.name: d(i) for i in m.graph.input},"
            " 'outputs': {o.name: d(o) for o in m.graph.output}}))\n")
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", code, str(path)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not EXPORTER.is_file(), reason="tensorrt-edgellm (pinned in the Makefile, `make edgellm`) "
                    "is not installed in .venv-edgellm: it could not install on this machine")
def test_edgellms_own_exporter_accepts_the_target_and_the_eagle3_draft(exported, tmp_path):
    _, done = exported
    env = {"PATH": f"{VENV / 'bin'}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    for src, dst, extra in (("draft", "draft", []), ("target", "base", ["--eagle-base", "--skip-visual"])):
        proc = subprocess.run([str(EXPORTER), str(done.out / src), str(tmp_path / dst), *extra],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, f"{src}: {proc.stderr[-2000:]}"
    D, V, N = 128, 1730, 64
    draft = onnx_io(tmp_path / "draft" / "llm" / "model.onnx")
    assert draft["inputs"]["hidden_states_input"][-1] == 3 * D          # fc over 3 target layers
    assert draft["inputs"]["hidden_states_from_draft"][-1] == D
    assert draft["inputs"]["inputs_embeds"][-1] == D
    assert draft["outputs"]["logits"][-1] == N and draft["outputs"]["hidden_states"][-1] == D
    base = onnx_io(tmp_path / "base" / "llm" / "model.onnx")
    assert base["outputs"]["logits"][-1] == V and base["outputs"]["hidden_states"][-1] == 3 * D
    assert sum(k.startswith("past_key_values_") for k in base["inputs"]) == 12
    dconf = json.loads((tmp_path / "draft" / "llm" / "config.json").read_text())
    bconf = json.loads((tmp_path / "base" / "llm" / "config.json").read_text())
    assert dconf["spec_decode_type"] == "eagle3" and dconf["draft_vocab_size"] == N
    assert dconf["base_model_hidden_size"] == 3 * D
    # the layers Edge-LLM's base feeds are the ones the draft was trained on
    assert bconf["eagle_hidden_state_layers"] == list(done.hf_layers)
    assert (tmp_path / "base" / "llm" / "chat_template.jinja").is_file()
