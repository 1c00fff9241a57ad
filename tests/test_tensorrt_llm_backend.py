"""The TensorRT-LLM backend (issue 14) against a double of ModelRunnerCpp (tests/trtllm_doubles.py)
and the TensorRT doubles (vision, expert): its requests are the ones TensorRT-LLM's generate()
documents, and the unchanged loop on it gives speculative == plain, token for token; only exact
acceptance is offered."""
import json
from collections import Counter

import numpy as np
import pytest
import torch

from export import onnx as ex
from core.config import ConfigError
from runtime.artifacts import ModelSource, open_backend
from runtime.config import PlannerConfig, SpecConfig, load_planner_config
from runtime.planner import Planner
from scenes.world import make_scene
from tests import trtllm_doubles
from tests.fake_engines import SHIPPED, TRT, build_fake_engines
from tests.trt_doubles import FakeCudaRuntime, FakeTensorRT, install


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The shipped checkpoint with its standalone draft, exported once (about a minute), TensorRT
    engines by the double, and the TensorRT-LLM engine folders the manifest names."""
    out = tmp_path_factory.mktemp("engines") / "tiny-trtllm"
    prof = load_planner_config("cpu")
    ex.export_onnx(SHIPPED, out, "flat-standalone", ex.ExportConfig(max_len=prof.max_len, k_max=8,
                   samples=prof.trajectory_samples), progress=lambda *_: None)
    manifest = build_fake_engines(out)
    for role in ("target", "draft"):                   # what trtllm/BUILD.sh leaves on a device
        (out / "trtllm" / "engines" / role).mkdir(parents=True)
        (out / "trtllm" / "engines" / role / "config.json").write_text("{}")
    manifest["trtllm"] = {"release": "1.0.0rc4", "build_script": "trtllm/BUILD.sh",
                          "checkpoints": {r: {"dir": f"trtllm/{r}"} for r in ("target", "draft")}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture
def doubles(monkeypatch):
    cuda = FakeCudaRuntime(sm=87)
    install(monkeypatch, FakeTensorRT(cuda, TRT), cuda)
    trtllm_doubles.install(monkeypatch)
    return trtllm_doubles.FakeModelRunnerCpp


def planner(engines, **cfg):
    be, tok = open_backend(ModelSource(engines=engines, backend="tensorrt-llm"), 512, k_max=8)
    return Planner(be, tok, PlannerConfig(fallback="on_failure", euler_steps=2, trajectory_samples=8,
                                          max_len=512, **cfg)), be


def test_speculative_equals_plain(engines, doubles):
    """8 scenes x k in {1, 4, 8, adaptive}: the same reasoning and trajectory as plain decoding
    through the same runner; proposals are accepted and rejected (both branches hit)."""
    plain = planner(engines, spec=SpecConfig(k=0, adaptive=False))[0]
    spec = [planner(engines, spec=SpecConfig(k=k, adaptive=k == 0 or None is k))[0] for k in (1, 4, 8)]
    spec.append(planner(engines, spec=SpecConfig(k=4, adaptive=True))[0])
    branches = Counter()
    for i in range(8):
        s = make_scene(100 + i, split="test")
        ref = plain.plan(s.images, s.history)
        assert ref.reasoning_ids, i
        for p in spec:
            r = p.plan(s.images, s.history)
            assert r.reasoning_ids == ref.reasoning_ids, (i, p.cfg.spec)
            assert np.array_equal(r.trajectory, ref.trajectory), (i, p.cfg.spec)
            branches.update(r.decode["branches"])
    print(dict(branches))
    for b in ("all_accepted", "first_rejected"):
        assert branches[b] > 0, (b, dict(branches))


def test_requests_match_the_documented_generate_api(engines, doubles):
    p, be = planner(engines, spec=SpecConfig(k=4, adaptive=False))
    s = make_scene(3, split="test")
    p.plan(s.images, s.history)
    reqs = doubles.requests
    target = [r for r in reqs if r["role"] == "target"]
    draft = [r for r in reqs if r["role"] == "draft"]
    assert target and draft
    first = target[0]
    V = be.vocab_size
    ids = first["ids"][0]
    assert ids.dtype == torch.int32 and ids.ndim == 1 and first["max_new_tokens"] == 1 and first["drafts"] is None
    n_img = int((ids >= V).sum())
    assert n_img == be.prompt_table.shape[0]                        # one prompt-table row per image token
    assert sorted(ids[ids >= V].tolist()) == list(range(V, V + n_img))
    assert first["extra"][0] == [be.cycle if t >= V else 0 for t in ids.tolist()]
    verify = [r for r in target if r["drafts"]]
    assert verify and all(r["max_new_tokens"] == len(r["drafts"][0]) + 1 for r in verify)
    assert all(len(r["drafts"][0]) == 4 for r in verify if len(r["ids"][0]) + 4 < 500)
    bad = {w[0] for w in first["bad"][0]}
    assert bad == set(np.flatnonzero(~p.tok.text_mask()).tolist())  # trajectory tokens masked
    before = len(doubles.requests)
    p.plan(s.images, s.history)                                      # a second cycle: new extra ids
    assert doubles.requests[before]["extra"][0] != first["extra"][0]


def test_only_exact_acceptance(engines, doubles):
    with pytest.raises(ConfigError, match="exact|greedy"):
        planner(engines, spec=SpecConfig(k=4, adaptive=False, decoding="sample"))
    _, be = planner(engines)
    assert be.exact_only
    with pytest.raises(ConfigError, match="periodic"):
        be.set_mask(np.ones((2, be.vocab_size), bool))
    with pytest.raises(ConfigError, match="token ids only"):
        be.verify(np.array([1]), 0, "logits")


def test_unbuilt_tensorrt_llm_engines_are_refused_with_the_build_script(engines, doubles, tmp_path):
    import shutil
    e = tmp_path / "e"
    shutil.copytree(engines, e)
    shutil.rmtree(e / "trtllm" / "engines" / "draft")
    with pytest.raises(ConfigError, match=r"no TensorRT-LLM engines for \['draft'\].*BUILD.sh"):
        open_backend(ModelSource(engines=e, backend="tensorrt-llm"), 512)


def test_without_tensorrt_llm_the_message_names_the_package(engines):
    with pytest.raises(ConfigError, match="needs 'torch'|needs 'tensorrt_llm'"):
        open_backend(ModelSource(engines=engines, backend="tensorrt-llm"), 512)
