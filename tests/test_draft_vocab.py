"""The reduced draft head (issue 24): the d2t map from a corpus, the head's logits scattered to the
target vocabulary (q exactly zero outside it), checkpoints that carry the map and refuse one that
does not fit the tokenizer, greedy speculative == plain with a reduced head on the torch backend."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import safetensors.torch
import torch

from models import io
from models.draft import Draft
from core.artifacts import DraftVocab
from core.config import ConfigError, file_sha256
from prompt.draft_vocab import build_d2t, check_d2t, coverage, d2t_sha256, kept_ids, token_counts
from prompt.tokenizer import load_tokenizer
from train import ckpt

ROOT = Path(__file__).resolve().parent.parent
TOK = load_tokenizer(ROOT / "checkpoints" / "tiny")
TEXTS = ["the lead vehicle brakes ahead so slow down", "keep the lane at steady speed",
         "a pedestrian crosses ahead so stop", "keep the lane"]


def counts():
    return token_counts(TEXTS, TOK)


def test_d2t_keeps_the_specials_and_the_most_frequent_text_tokens():
    c = counts()
    n = len(kept_ids(TOK)) + 5
    d2t = build_d2t(c, TOK, n)
    assert len(d2t) == n and np.all(np.diff(d2t) > 0)
    assert set(kept_ids(TOK)) <= set(d2t.tolist()) and TOK.cot_end in d2t
    text = sorted(set(d2t.tolist()) - set(kept_ids(TOK).tolist()))
    rest = np.setdiff1d(np.flatnonzero(TOK.text_mask()), d2t)
    assert c[text].min() >= c[rest].max(), "a less frequent token was kept over a more frequent one"
    assert np.array_equal(d2t, build_d2t(c, TOK, n))
    full = build_d2t(c, TOK, len(kept_ids(TOK)) + int((c > 0).sum()))
    assert coverage(c, full) == 1.0 > coverage(c, d2t) > 0


@pytest.mark.parametrize("n", [0, len(kept_ids(TOK)), 10 ** 6, 2.5])
def test_d2t_of_an_impossible_size_is_refused(n):
    with pytest.raises(ConfigError, match="draft vocabulary n"):
        build_d2t(counts(), TOK, n)


@pytest.mark.parametrize("edit,match", [
    (lambda d: np.append(d, len(TOK)), "outside the tokenizer"),
    (lambda d: np.append(d, d[-1]), "repeats target ids"),
    (lambda d: d[1:], "lacks the special tokens"),
    (lambda d: np.append(d, TOK.hist_ids[0]), "trajectory tokens"),
])
def test_a_map_that_does_not_fit_the_tokenizer_is_refused(edit, match):
    d2t = build_d2t(counts(), TOK, 40)
    check_d2t(d2t, TOK, "here", d2t_sha256(d2t))
    with pytest.raises(ConfigError, match=match):
        check_d2t(edit(d2t), TOK, "here")
    with pytest.raises(ConfigError, match=r"d2t is not ascending \(index 0 holds id \d+, index 1 id \d+\)"):
        check_d2t(d2t[::-1].copy(), TOK, "here", d2t_sha256(d2t))
    free = [i for i in range(int(d2t[-2]) + 1, len(TOK)) if i not in d2t and not TOK.traj_mask()[i]]
    other = d2t.copy()
    other[-1] = free[0]                         # ascending, fits the tokenizer, another map
    check_d2t(other, TOK, "here")
    with pytest.raises(ConfigError, match="does not match"):
        check_d2t(other, TOK, "here", d2t_sha256(d2t))


def reduced(cfg, target, n=40, seed=1):
    torch.manual_seed(seed)
    d = Draft(ckpt.draft_config(cfg, "flat", n), target.embed_tokens, target.lm_head).eval()
    d.set_vocab(build_d2t(counts(), TOK, n))
    return d


def test_reduced_logits_are_the_head_rows_scattered_and_minus_inf_elsewhere(tiny_models):
    cfg, target, _ = tiny_models
    d = reduced(cfg, target)
    torch.manual_seed(1)
    full = Draft(ckpt.draft_config(cfg, "flat"), target.embed_tokens, target.lm_head).eval()
    full.load_state_dict({k: v for k, v in d.state_dict().items() if k in full.state_dict()})
    ids, pos = torch.tensor([[5, 300, 301, 7]]), torch.arange(4)[None]
    feats = torch.randn(1, 4, 3 * cfg.target.llm.hidden)
    with torch.no_grad():
        lr, hr = d(ids, *d.rope(pos), None, 0, feats)
        head, _ = d(ids, *d.rope(pos), None, 0, feats, head_only=True)
        lf, hf = full(ids, *full.rope(pos), None, 0, feats)
    outside = np.setdiff1d(np.arange(len(TOK)), d.d2t.numpy())
    assert head.shape[-1] == 40 and torch.equal(lr[..., d.d2t], head)
    assert torch.isneginf(lr[..., outside]).all()
    # initialised from the target head's rows: inside the head the logits are the full draft's
    diff = (lr[..., d.d2t] - lf[..., d.d2t]).abs().max().item()
    assert diff < 1e-5 and torch.allclose(hr, hf), f"max diff {diff}"
    q = torch.softmax(lr, -1)
    assert float(q[..., outside].max()) == 0.0 and torch.allclose(q.sum(-1), torch.ones(1, 4))


def save_reduced(folder, cfg, target, d2t=None):
    d = reduced(cfg, target)
    if d2t is not None:                       # a map set by hand (no checks on the way in)
        d.d2t = torch.as_tensor(d2t)
    return ckpt.save_draft(folder, "flat", cfg, d, {"stage": "test"})


def test_checkpoint_round_trip_keeps_the_map_and_its_hash(tiny_models, tmp_path):
    cfg, target, _ = tiny_models
    folder = save_reduced(tmp_path, cfg, target)
    meta = io.read_meta(folder)
    assert folder.name == "draft-flat-v40" and meta.variant == "flat-v40" and meta.draft_vocab == 40
    lcfg, d, _ = io.load_draft(folder, cfg, target, TOK)
    assert lcfg.draft.vocab == 40 and meta.d2t_sha256 == d2t_sha256(d.d2t.numpy())
    assert torch.equal(d.d2t, reduced(cfg, target).d2t)


def rehash(folder: Path, key: str, value) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    meta[key] = value
    (folder / "meta.json").write_text(json.dumps(meta))


def test_tampered_or_mismatched_maps_are_refused(tiny_models, tmp_path):
    cfg, target, _ = tiny_models
    good = build_d2t(counts(), TOK, 40)
    no_special = np.append(good[1:], good[-1] + 1)            # <|pad|> dropped, one more text token
    folder = save_reduced(tmp_path / "a", cfg, target, no_special)
    with pytest.raises(ConfigError, match="lacks the special tokens"):
        io.load_draft(folder, cfg, target, TOK)
    folder = save_reduced(tmp_path / "b", cfg, target)
    rehash(folder, "d2t_sha256", d2t_sha256(good[::-1].copy()))
    with pytest.raises(ConfigError, match="d2t sha256"):
        io.load_draft(folder, cfg, target, TOK)
    # the map rewritten inside the safetensors file (still ascending: its last row points at the
    # next token id), its file hash updated: d2t_sha256 still catches it
    folder = save_reduced(tmp_path / "c", cfg, target)
    file = folder / "draft.safetensors"
    state = safetensors.torch.load_file(str(file))
    state["d2t"] = state["d2t"].clone()
    state["d2t"][-1] += 1
    assert int(state["d2t"][-1]) < len(TOK) and bool((state["d2t"][1:] > state["d2t"][:-1]).all())
    safetensors.torch.save_file(state, str(file))
    meta = json.loads((folder / "meta.json").read_text())
    meta["modules"]["draft"].update(sha256=file_sha256(file), bytes=file.stat().st_size)
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="does not match meta.json's d2t_sha256"):
        io.load_draft(folder, cfg, target, TOK)


def test_the_cli_exits_2_on_a_tampered_map(tiny_models, tmp_path):
    cfg, target, expert = tiny_models
    folder = tmp_path / "planner"
    io.save(folder / "target", {"target": target}, cfg, {"kind": "target"})
    io.save(folder / "expert", {"expert": expert}, cfg, {"kind": "expert"})
    (folder / "tokenizer.json").write_bytes((ROOT / "checkpoints" / "tiny" / "tokenizer.json").read_bytes())
    draft = save_reduced(folder, cfg, target)
    rehash(draft, "d2t_sha256", "0" * 64)
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "--checkpoint", str(folder),
                           "--scenes", "1", "--repeats", "1", "--ks", "2", "--no-adaptive",
                           "--json", str(tmp_path / "b.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "d2t sha256" in proc.stderr, proc.stderr[-500:]
    assert "Traceback" not in proc.stderr


def test_torch_backend_greedy_speculative_equals_plain_and_q_is_zero_outside_the_head(tiny_models):
    from runtime.backend import DraftSampling, PrefillInputs
    from runtime.backends.torch import TorchBackend
    from runtime.loop import GreedyRule, generate
    from policies import FixedK

    cfg, target, expert = tiny_models
    d = reduced(cfg, target)
    rcfg = ckpt.draft_config(cfg, "flat", 40)
    be = TorchBackend(rcfg, target, expert, d, max_len=128)
    rng = np.random.default_rng(0)
    for _ in range(3):
        prompt = rng.integers(20, 300, 12)
        plain, _, _ = generate(be, prompt, GreedyRule(), FixedK(0), max_new=24)
        for k in (2, 5):
            spec, _, _ = generate(be, prompt, GreedyRule(), FixedK(k), max_new=24)
            assert spec == plain, f"k={k}: speculative {spec} != plain {plain}"
    be.prefill(PrefillInputs(prompt, np.tile(np.arange(12), (3, 1)), 0), "argmax")
    props, q = be.draft(prompt[-1:], 12, 4, DraftSampling(1.0, 1.0, rng.random(4)))
    outside = np.setdiff1d(np.arange(len(TOK)), d.d2t.numpy())
    assert np.isin(props, d.d2t.numpy()).all() and q[:, outside].max() == 0.0
    assert np.allclose(q.sum(-1), 1.0)


@pytest.mark.parametrize("draft_map", ["graph", "host"])
def test_the_onnx_draft_chain_of_a_reduced_head_matches_torch(tiny_models, tmp_path, draft_map):
    """The exported draft_chain graph (d2t in the graph, or head logits + host map) gives the
    torch draft's masked logits and arg-max target id."""
    ort = pytest.importorskip("onnxruntime")
    from export import onnx as ex

    cfg, target, expert = tiny_models
    d = reduced(cfg, target)
    host, V, D, L = draft_map == "host", len(TOK), cfg.target.llm.hidden, 64
    shapes = {"vocab": V, "hidden": D, "head_dim": 32, "image_tokens": 4, "layers": 12, "kv_heads": 2,
              "grid": [[1, 8, 12]], "patches": [96, 384], "frame_patches": [96, 384]}
    graphs = ex._graphs(target, expert, d, True, tuple(cfg.draft.feature_layers), shapes,
                        ex.ExportConfig(max_len=L), host)
    _, module, args, names, dyn = next(g for g in graphs if g[0] == "draft_chain")
    ex._export(module.eval(), args, names, dyn, tmp_path / "chain.onnx")
    sess = ort.InferenceSession(str(tmp_path / "chain.onnx"), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(1, 2, 1, 2, L, 32, generator=g)
    ids, feats, start = torch.tensor([[int(d.d2t[30])]]), torch.randn(1, 1, D, generator=g), 20
    cos, sin = d.rope(torch.tensor([[start]]))
    allowed = ~torch.from_numpy(TOK.traj_mask())[None]
    with torch.no_grad():
        want, _ = d(ids, cos, sin, [[c.clone() for c in layer] for layer in cache], start, feats)
    want = want[0, -1].masked_fill(~allowed[0], float("-inf")).numpy()
    d2t = d.d2t.numpy()
    logits, top, _, _ = sess.run(None, {"ids": ids.numpy(), "cos": cos.numpy(), "sin": sin.numpy(),
                                        "cache": cache.numpy(), "start": np.array([start]),
                                        "allowed": (allowed[:, d2t] if host else allowed).numpy(), "feats": feats.numpy()})
    got, tid = logits[0, -1], int(top[0, -1])
    if host:
        full = np.full(V, -np.inf, np.float32)
        full[d2t] = got
        got, tid = full, int(d2t[tid])
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)) and fin.sum() <= 40
    diff = float(np.abs(got[fin] - want[fin]).max())
    assert diff < 1e-4 and tid == int(np.argmax(want)), f"max diff {diff}, ids {tid} vs {int(np.argmax(want))}"


def test_the_trtllm_draft_checkpoint_of_a_reduced_head_sees_full_vocabulary_ids(tiny_models, tmp_path):
    """TensorRT-LLM's external draft returns full-vocabulary ids: the reduced head is written as a
    (V, D) lm_head, its rows at their target ids and zero rows elsewhere; with the off-head ids
    banned (the tensorrt-llm backend's bad words) its arg-max is the reduced draft's."""
    import dataclasses

    from engines import trtllm

    cfg, target, _ = tiny_models
    torch.manual_seed(2)
    scfg = ckpt.draft_config(cfg, "flat-standalone", 40)
    d = Draft(scfg, target.embed_tokens, target.lm_head).eval()
    d.set_vocab(build_d2t(counts(), TOK, 40))
    head = trtllm.full_vocab_head(d)
    assert head.shape == target.lm_head.weight.shape
    state = {**{k: v for k, v in d.state_dict().items() if k not in ("d2t", "vocab_head.weight")},
             "embed_tokens.weight": target.embed_tokens.weight, "lm_head.weight": head}
    llm = scfg.draft_llm()
    config = trtllm.trtllm_config(llm, "draft", "float32", 256, fp8=False)
    trtllm.write_checkpoint(tmp_path / "draft", config, trtllm.to_trtllm(state, llm, "float32"), role="draft")
    full_cfg = dataclasses.replace(scfg, draft=dataclasses.replace(scfg.draft, vocab=0))
    d2, _ = trtllm.read_draft(tmp_path / "draft", full_cfg)
    ids, pos = torch.randint(20, 300, (1, 9), generator=torch.Generator().manual_seed(0)), torch.arange(9)[None]
    with torch.no_grad():
        want, _ = d(ids, *d.rope(pos))
        got, _ = d2(ids, *d2.rope(pos))
    inside = d.d2t
    off = torch.ones(len(TOK), dtype=torch.bool)
    off[inside] = False
    assert torch.allclose(got[..., inside], want[..., inside], atol=1e-5) and torch.equal(got[..., off], torch.zeros_like(got[..., off]))
    assert torch.equal(got.masked_fill(off, float("-inf")).argmax(-1), want.argmax(-1))


def test_the_map_on_the_alpamayo_r1_special_token_layout():
    """An Alpamayo-R1-layout tokenizer (Qwen's added tokens, <i*> trajectory tokens, the release's
    specials after them; a merge-free byte-level stand-in for Qwen's BPE): the head keeps the
    planner's special ids wherever they sit and no trajectory token."""
    pytest.importorskip("tokenizers")
    from prompt.hf_tokenizer import AlpamayoTokenizer
    from alpamayo_tokenizer import TOKENS, qwen_alpamayo_tokenizer

    tok = AlpamayoTokenizer(qwen_alpamayo_tokenizer(), dict(TOKENS))
    c = token_counts(TEXTS, tok)
    d2t = build_d2t(c, tok, len(kept_ids(tok)) + 10)
    check_d2t(d2t, tok, "alpamayo layout")
    assert tok.cot_end in d2t and tok.cot_end > tok.traj_ids.start, "specials after the <i*> block are kept"
    assert not np.isin(d2t, np.arange(tok.traj_ids.start, tok.traj_ids.stop)).any()
    with pytest.raises(ConfigError, match="trajectory tokens"):
        check_d2t(np.append(d2t, tok.traj_ids.start), tok, "alpamayo layout")
    assert 0 < coverage(c, d2t) < 1


def vocab_meta(draft_vocab: dict):
    """What init_draft_vocab reads of an EnginesMeta: meta.json's draft_vocab, parsed."""
    return SimpleNamespace(draft_vocab=DraftVocab.from_dict(draft_vocab, "F/meta.json"))


def test_graph_backends_check_the_exported_map_and_apply_a_host_map():
    """runtime/backends/graphs.py: meta.json's draft_vocab is checked when a folder opens (hash,
    tokenizer); with map "host" the mask rows are gathered to the head and the head's id and
    logits are mapped back (q zero outside the head)."""
    from runtime.backend import DraftSampling
    from runtime.backends.graphs import GraphBackend

    class Bare(GraphBackend):          # only the host logic under test
        vision = prefill = draft = verify = write = expert = None

    d2t = build_d2t(counts(), TOK, 40)
    be = Bare()
    be.vocab_size = len(TOK)
    good = {"n": 40, "map": "host", "d2t": d2t.tolist(), "d2t_sha256": d2t_sha256(d2t)}
    be.init_draft_vocab("F", vocab_meta(good), TOK)
    assert be.host_map and np.array_equal(be.d2t, d2t)
    for bad, match in (({**good, "d2t_sha256": "0" * 64}, "does not match"),
                       ({**good, "d2t": d2t[1:].tolist(), "n": 39}, "lacks the special tokens"),
                       ({**good, "map": "device"}, "map")):
        with pytest.raises(ConfigError, match=match):
            be.init_draft_vocab("F", vocab_meta(bad), TOK)
    be.init_draft_vocab("F", vocab_meta(good), TOK)
    be.set_mask(TOK.text_mask())
    assert be.draft_allowed(5, 2).shape == (2, 40)
    logits = np.linspace(-1, 1, 40).astype(np.float32)
    assert be.draft_pick(39, logits, None, 0) == (int(d2t[39]), None)
    tok, q = be.draft_pick(39, logits, DraftSampling(1.0, 1.0, np.array([0.5])), 0)
    outside = np.setdiff1d(np.arange(len(TOK)), d2t)
    assert tok in d2t and q[outside].max() == 0.0 and np.isclose(q.sum(), 1.0)
    be.init_draft_vocab("F", vocab_meta({}), TOK)
    assert be.d2t is None and not be.host_map
