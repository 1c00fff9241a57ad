"""`specdrive export onnx` and the ONNX Runtime backend (issue 12): every graph against the
PyTorch reference, the unchanged loop on the graphs (speculative = plain, token for token), the
same buffers bound across steps, the lean runtime (no torch), and every refusal."""
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from export import onnx as ex
from models import io
from core.config import ConfigError
from runtime.artifacts import ModelSource, open_backend
from runtime.config import PlannerConfig, SpecConfig
from runtime.planner import Planner
from scenes.world import make_scene
from tests.folders import copy_of, edit_meta
from core.config import file_sha256
from core.artifacts import read_meta, stamp_facts

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "tiny"


@pytest.fixture(scope="module")
def engines(tiny_onnx):
    """The shipped checkpoint exported once per session (tests/conftest.py)."""
    return tiny_onnx


@pytest.fixture(scope="module")
def ref():
    tok, cfg, target, expert = io.load_planner(SHIPPED)
    cfg, draft, _ = io.load_draft(io.scan_checkpoints(SHIPPED)[1]["flat"], cfg, target)
    return tok, cfg, target, expert, draft


def sessions(folder):
    from runtime.backends.onnxruntime import open_sessions
    return open_sessions(folder, read_meta(folder), "cpu")


def run(sess, **feed):
    return sess.run(None, {k: (v.numpy() if torch.is_tensor(v) else v) for k, v in feed.items()})


def close(name, got, want, tol=1e-4):
    """max |got - want| <= tol (relative to the largest |want| where that exceeds 1); printed."""
    want = want.detach().numpy() if torch.is_tensor(want) else want
    fin = np.isfinite(want)
    diff = float(np.abs(np.where(fin, got, 0) - np.where(fin, want, 0)).max()) if want.size else 0.0
    scale = max(1.0, float(np.abs(np.where(fin, want, 0)).max()) if want.size else 1.0)
    print(f"{name}: max abs diff {diff:.2e} (scale {scale:.1f})")
    assert (np.isfinite(got) == fin).all() and diff <= tol * scale, name


@torch.no_grad()
def test_every_graph_matches_the_pytorch_reference(engines, ref):
    tok, cfg, target, expert, draft = ref
    s = sessions(engines)
    g = torch.Generator().manual_seed(0)
    V, hd, L = cfg.target.llm.vocab_size, cfg.target.llm.head_dim, 512
    meta = read_meta(engines)
    # vision
    patches = torch.randn(*meta.graphs["vision"].inputs[0].shape, generator=g)
    want = ex.VisionGraph(target, meta.prompt.grid_thw)(patches)
    for name, got, w in zip(("image_embeds", "deepstack"), run(s["vision"], patches=patches), want):
        close(f"vision.{name}", got, w)
    N, D = want[0].shape
    # prefill at three prompt lengths
    layers = tuple(cfg.draft.feature_layers)
    for extra in (3, 40, 120):
        T = N + extra
        ids = torch.randint(10, V, (1, T), generator=g)
        ids[0, 1:N + 1] = cfg.target.image_token_id
        ids[ids == cfg.target.image_token_id] = 9
        ids[0, 1:N + 1] = cfg.target.image_token_id
        cos, sin = target.rope(torch.arange(T)[None])
        allowed = torch.rand(T, V, generator=g) > 0.1
        args = (ids, cos, sin, want[0], want[1], allowed)
        w = ex.PrefillGraph(target, layers)(*args)
        got = run(s["prefill"], ids=ids, cos=cos, sin=sin, image_embeds=want[0], deepstack=want[1], allowed=allowed.numpy())
        for name, a, b in zip(("logits", "argmax", "feats", "kv"), got, w):
            close(f"prefill T={T}.{name}", a, b)
    # step and draft feed at every verify width 1..k_max+1
    cache = torch.randn(*target.new_cache(1, L).shape, generator=g)
    dcache = torch.randn(*draft.new_cache(1, L).shape, generator=g)
    for w_ in range(1, 10):
        start = torch.tensor([200 + w_])
        ids = torch.randint(10, V, (1, w_), generator=g)
        cos, sin = target.rope(torch.arange(200, 200 + w_)[None])
        allowed = torch.rand(w_, V, generator=g) > 0.1
        want_s = ex.StepGraph(target, layers)(ids, cos, sin, cache, start, allowed)
        got = run(s["step"], ids=ids, cos=cos, sin=sin, cache=cache, start=start, allowed=allowed.numpy())
        for name, a, b in zip(("logits", "argmax", "feats", "new_kv"), got, want_s):
            close(f"step w={w_}.{name}", a, b)
        feats = torch.randn(1, w_, 3 * D, generator=g)
        dcos, dsin = draft.rope(torch.arange(200, 200 + w_)[None])
        want_d = ex.DraftFeedGraph(draft, True)(ids, dcos, dsin, dcache, start, allowed, feats)
        got = run(s["draft_feed"], ids=ids, cos=dcos, sin=dsin, cache=dcache, start=start,
                  allowed=allowed.numpy(), feats=feats)
        for name, a, b in zip(("logits", "argmax", "hidden", "new_kv"), got, want_d):
            close(f"draft_feed w={w_}.{name}", a, b)
    # the action expert: velocity over a context of R rows, then the combined output
    for R in (17, 260):
        x, t = torch.randn(8, 64, 2, generator=g), torch.rand(8, generator=g)
        ctx = torch.randn(12, 2, 1, 2, R, hd, generator=g)
        cos, sin = expert.rope(R, 0, 8)
        close(f"action_velocity R={R}", run(s["action_velocity"], x=x, t=t, context=ctx, cos=cos, sin=sin)[0],
              expert.velocity(x, t, ctx, R, cos, sin))
    x = torch.randn(8, 64, 2, generator=g)
    close("action_output", run(s["action_output"], x=x, v0=np.array([7.5], np.float32))[0],
          expert.finish(x, torch.tensor([7.5]), 8, "mean")[0])


def ort_planner(engines, **cfg):
    be, tok = open_backend(ModelSource(engines=engines), 512)
    return Planner(be, tok, PlannerConfig(fallback="on_failure", euler_steps=2, trajectory_samples=8,
                                          max_len=512, **cfg)), be


def test_speculative_equals_plain_on_the_graphs(engines):
    """20 scenes x k in {1, 4, 8, adaptive} (and a length limit of 13 reasoning tokens): the same
    reasoning and trajectory as plain decoding of the same graphs; every loop branch is hit
    (k = 8 also under the length limit: blocks that end at max_length)."""
    limits = (64, 13)
    plain = {m: ort_planner(engines, spec=SpecConfig(k=0, adaptive=False), max_reasoning_tokens=m)[0]
             for m in limits}
    modes = [SpecConfig(k=1, adaptive=False), SpecConfig(k=4, adaptive=False),
             SpecConfig(k=8, adaptive=False), SpecConfig(k=4, adaptive=True)]
    spec = [(64, ort_planner(engines, spec=s)[0]) for s in modes]
    spec.append((13, ort_planner(engines, spec=modes[2], max_reasoning_tokens=13)[0]))
    branches = Counter()
    for i in range(20):
        s = make_scene(100 + i, split="test")
        ref = {m: plain[m].plan(s.images, s.history) for m in limits}
        for m, p in spec:
            r = p.plan(s.images, s.history)
            assert r.reasoning_ids == ref[m].reasoning_ids, (i, m, p.cfg.spec)
            assert np.array_equal(r.trajectory, ref[m].trajectory), (i, m, p.cfg.spec)
            branches.update(r.decode["branches"])
    print(dict(branches))
    for b in ("all_accepted", "partial", "first_rejected", "stop_in_block", "max_length"):
        assert branches[b] > 0, (b, dict(branches))


def test_the_same_buffers_are_bound_across_steps(engines):
    p, be = ort_planner(engines, spec=SpecConfig(k=4, adaptive=False))
    value, ptr = be.bound["cache"], be.cache.ctypes.data
    s = make_scene(7, split="test")
    p.plan(s.images, s.history)
    p.plan(s.images, s.history)
    assert be.bound["cache"] is value and be.cache.ctypes.data == ptr
    assert value.data_ptr() == ptr                      # the OrtValue is the numpy memory
    graph, binding = be.last_binding
    assert graph == "action_output"


def test_the_plan_command_runs_without_torch(engines, tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tools.cli import main\n"
            f"sys.exit(main(['plan', '--engines', {str(engines)!r}, '--scenes', '2', '--out', "
            f"{str(tmp_path / 'o')!r}, '--quiet', '--pictures', '1']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = (tmp_path / "o" / "cycles.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["trajectory"] for x in lines)


def test_a_command_that_needs_torch_says_so_without_it(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tools.cli import main\n"
            f"main(['export', 'onnx', '--checkpoint', {str(SHIPPED)!r}, '--out', {str(tmp_path / 'e')!r}])")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "needs 'torch'" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("how,word", [
    ("hash", "does not match meta.json"),
    ("missing", "missing (meta.json lists graph"),
    ("backend", "expected kind 'engines'"),
    ("format", "expected 'specdrive-onnx'"),
    ("names", "this runtime binds"),
    ("tokenizer", "is not the tokenizer"),
])
def test_a_mismatched_engines_folder_is_refused(engines, tmp_path, how, word):
    e = copy_of(engines, tmp_path)
    meta = json.loads((e / "meta.json").read_text())
    if how == "hash":
        b = bytearray((e / "step.onnx").read_bytes())
        b[-100] ^= 1
        (e / "step.onnx").write_bytes(bytes(b))
    elif how == "missing":
        (e / "vision.onnx").unlink()
    elif how == "backend":
        meta["backend"] = "tensorrt-nope"
    elif how == "format":
        meta["format"] = "other"
    elif how == "names":
        meta["graphs"]["step"]["inputs"][0]["name"] = "tokens"
    elif how == "tokenizer":
        tok = json.loads((e / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]                      # two learned tokens swap their ids
        a, b = sorted(vocab, key=vocab.get)[-2:]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        (e / "tokenizer.json").write_text(json.dumps(tok))
    (e / "meta.json").write_text(json.dumps(stamp_facts(meta)))   # edits that pass the facts hash
    with pytest.raises(ConfigError, match=word.replace("(", r"\(")):
        open_backend(ModelSource(engines=e), 512)


def test_max_len_and_image_shape_must_match_the_export(engines):
    with pytest.raises(ConfigError, match="max_len=512"):
        open_backend(ModelSource(engines=engines), 1024)
    be, _ = open_backend(ModelSource(engines=engines), 512)
    with pytest.raises(ConfigError, match="exported for"):
        be.vision_grid((4, 2, 32, 96, 3))


def _plan_exit(engines, tmp_path, capsys):
    """`specdrive plan --engines DIR` on one scene, unpinned -> (exit status, stderr lines but the
    one that says the folder is unverified)."""
    from tools.cli import main
    try:
        code = main(["plan", "--engines", str(engines), "--scenes", "1", "--out", str(tmp_path / "o"),
                     "--quiet", "--pictures", "0"])
    except SystemExit as e:
        code = e.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert sum("is unverified" in line for line in lines) == 1, lines
    return code, [line for line in lines if "is unverified" not in line]


def test_an_edited_meta_value_exits_2_naming_the_field(engines, tmp_path, capsys):
    """Issue 23.2: rope_theta 5e6 -> 1e4 in meta.json ran with other reasoning and ok: true."""
    e = copy_of(engines, tmp_path)
    edit_meta(e, lambda m: m["target"].update(rope_theta=1e4), restamp=False)
    code, err = _plan_exit(e, tmp_path, capsys)
    assert code == 2 and len(err) == 1 and "'target.rope_theta' = 10000.0 was edited" in err[0], err


def test_harmless_meta_edits_are_accepted(engines, tmp_path):
    """created_at, source and the JSON layout are not facts the runtime acts on."""
    e = copy_of(engines, tmp_path)
    meta = json.loads((e / "meta.json").read_text())
    meta["created_at"], meta["source"] = "yesterday", {"checkpoint": "/elsewhere"}
    (e / "meta.json").write_text(json.dumps(meta, indent=None))
    open_backend(ModelSource(engines=e), 512)


def _swap_feed_for_chain(e):
    def change(m):
        m["graphs"]["draft_feed"]["file"] = "draft_chain.onnx"
        m["graphs"]["draft_feed"]["sha256"] = file_sha256(e / "draft_chain.onnx")
    return change


DAMAGES = {     # name -> (change(meta) or a function of the folder giving it, words of the refusal)
    "graph entry missing": (lambda m: m["graphs"].pop("step"), "missing ['step']"),
    "no graphs key": (lambda m: m.pop("graphs"), "no 'graphs' table"),
    "input shape": (lambda m: m["graphs"]["step"]["inputs"][3]["shape"].__setitem__(4, 1024),
                    "declares tensor(float) [12, 2, 1, 2, 1024, 32]"),
    "input dtype": (lambda m: m["graphs"]["step"]["inputs"][0].update(dtype="int32"), "declares tensor(int32)"),
    "opset 17": (lambda m: m.update(opset=17), "opset 17; this runtime reads opset 18"),
    "opset eighteen": (lambda m: m.update(opset="eighteen"), "opset 'eighteen'"),
    "format_version 2": (lambda m: m.update(format_version=2), "format_version 2; this runtime reads"),
    "precision int8": (lambda m: m.update(precision={"*": "int8"}), "precision of graph"),
    "draft_feed swapped": (lambda e: _swap_feed_for_chain(e), "'feats' is tensor(float) [1, 'T', 128] in the graph"),
    "image_hw": (lambda m: m["prompt"].update(image_hw=[64, 64]), "exported for another image size"),
    "draft_features": (lambda m: m.update(draft_features="none"), "unknown ['draft_chain']"),
    "file ../": (lambda e: _outside(e, lambda f: "../" + f.name), "is outside the folder"),
    "file absolute": (lambda e: _outside(e, lambda f: str(f)), "is outside the folder"),
    "euler_steps 0": (lambda m: m["action"].update(euler_steps=0),
                      "field 'action.euler_steps' = 0 is out of range; allowed [1, 100]"),
}
NEEDS_FOLDER = ("draft_feed swapped", "file ../", "file absolute")


def _outside(e, name):
    """vision.onnx copied beside the folder (same bytes, same hash) and meta.json pointing there."""
    out = e.parent / "vision.onnx"
    out.write_bytes((e / "vision.onnx").read_bytes())
    return lambda m: m["graphs"]["vision"].update(file=name(out))


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("restamp", [False, True])
def test_an_engines_folder_is_checked_whole_when_it_opens(engines, tmp_path, damage, restamp):
    """Issue 23.5: each of these was accepted, or loaded and failed in every cycle, or gave a
    traceback. Now one ConfigError line: by the facts hash when the edit left it, else (the hash
    rewritten too) by the checks of meta.json against the graphs and itself."""
    e = copy_of(engines, tmp_path)
    change, word = DAMAGES[damage]
    if damage in NEEDS_FOLDER:
        change = change(e)
    edit_meta(e, change, restamp)
    with pytest.raises(ConfigError) as err:
        open_backend(ModelSource(engines=e), 512)
    msg = str(err.value)
    assert "\n" not in msg and (word in msg if restamp else "facts_sha256" in msg or "is missing" in msg), msg


@pytest.mark.parametrize("change,word", [({"trajectory_samples": 4}, "trajectory_samples=4"),
                                         ({"trajectory_combine": "medoid"}, "trajectory_combine='medoid'")])
def test_a_profile_whose_expert_draws_differ_from_the_export_is_refused(engines, change, word):
    """Issue 23.6: only max_len was checked; other draws or another combine ran and every cycle
    ended in a stop. Now the planner is refused when made, naming the field and the export's."""
    be, tok = open_backend(ModelSource(engines=engines), 512)
    cfg = dict(fallback="on_failure", euler_steps=2, trajectory_samples=8, max_len=512)
    with pytest.raises(ConfigError, match=word + ".*exported for 8 draws combined by 'mean'"):
        Planner(be, tok, PlannerConfig(**{**cfg, **change}))


def test_reuse_exports_only_the_drafts_graphs_and_refuses_other_facts(tiny_onnx, tmp_path, capsys):
    """`export onnx --reuse`: another draft of the same wiring (flat-v256 beside the shipped flat)
    gets the earlier export's target and expert graphs byte for byte and its own draft graphs, and
    plans speculative == plain; a draft whose target graphs differ (no features, another rope)
    and a tampered graph are refused, naming why."""
    from tools.cli import main

    said = []
    meta = ex.export_onnx(SHIPPED, tmp_path / "v256", "flat-v256", ex.ExportConfig(max_len=512, k_max=8, samples=8),
                          progress=said.append, reuse=tiny_onnx)
    base = json.loads((tiny_onnx / "meta.json").read_text())["graphs"]
    for name, g in meta.graphs.items():
        if name.startswith("draft_"):
            assert f"exported {name}.onnx" in " ".join(said) and g.sha256 != base[name]["sha256"], name
        else:
            assert g.sha256 == base[name]["sha256"] == file_sha256(tmp_path / "v256" / g.file), name
    assert meta.draft == "flat-v256" and meta.draft_vocab
    plain = ort_planner(tmp_path / "v256", spec=SpecConfig(k=0, adaptive=False))[0]
    spec = ort_planner(tmp_path / "v256", spec=SpecConfig(k=4, adaptive=False))[0]
    for i in range(3):
        s = make_scene(300 + i, split="test")
        ref, r = plain.plan(s.images, s.history), spec.plan(s.images, s.history)
        assert r.reasoning_ids == ref.reasoning_ids and np.array_equal(r.trajectory, ref.trajectory), i
        assert r.decode["accepted"] > 0, i
    for draft, says in (("flat-standalone", "draft features"), ("mrope", "other rotary facts")):
        with pytest.raises(ConfigError, match=says):
            ex.export_onnx(SHIPPED, tmp_path / draft, draft, ex.ExportConfig(max_len=512, k_max=8, samples=8),
                           progress=lambda *_: None, reuse=tiny_onnx)
    with pytest.raises(ConfigError, match="max_len"):
        ex.export_onnx(SHIPPED, tmp_path / "short", "flat-v256", ex.ExportConfig(max_len=256, k_max=8, samples=8),
                       progress=lambda *_: None, reuse=tiny_onnx)
    bad = copy_of(tiny_onnx, tmp_path)
    b = bytearray((bad / "step.onnx").read_bytes())
    b[-100] ^= 1
    (bad / "step.onnx").write_bytes(bytes(b))
    with pytest.raises(SystemExit) as stop:
        main(["export", "onnx", "--checkpoint", str(SHIPPED), "--out", str(tmp_path / "x"),
              "--draft", "flat-v256", "--reuse", str(bad)])
    assert stop.value.code == 2 and "step.onnx is not the file its meta.json records" in capsys.readouterr().err


def test_the_exporter_skips_only_rules_that_change_nothing(ref, tmp_path, monkeypatch):
    """export.onnx leaves SKIPPED_RULES out of the exporter's optimizer (most of its time, no
    rewrite on these graphs): a graph exported so is byte for byte the one the full rule set
    writes, and the rule list is the library's own again afterwards."""
    from onnxscript import rewriter

    tok, cfg, target, expert, draft = ref
    full = rewriter._DEFAULT_REWRITE_RULES
    with ex._without_slow_rules():
        inside = rewriter._DEFAULT_REWRITE_RULES
    assert rewriter._DEFAULT_REWRITE_RULES is full
    assert {ex._rule_name(r) for r in full} - {ex._rule_name(r) for r in inside} == set(ex.SKIPPED_RULES)
    shapes = ex._shapes(cfg, ex.ExportConfig(max_len=64), tok)
    graphs = ex._graphs(target, expert, draft, True, tuple(cfg.draft.feature_layers), shapes,
                        ex.ExportConfig(max_len=64))
    _, module, args, names, dyn = next(g for g in graphs if g[0] == "draft_chain")
    fast = ex._export(module.eval(), args, names, dyn, tmp_path / "fast.onnx")
    monkeypatch.setattr(ex, "SKIPPED_RULES", ())
    every = ex._export(module.eval(), args, names, dyn, tmp_path / "every.onnx")
    assert (tmp_path / "fast.onnx").read_bytes() == (tmp_path / "every.onnx").read_bytes()
    assert fast.sha256 == every.sha256
