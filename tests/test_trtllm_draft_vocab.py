"""The TensorRT-LLM backend with a reduced draft head (issue 24): engines/trtllm.py writes the
draft's head as a (V, D) lm_head with zero rows off the head, so the backend must ban every
off-head id from the draft's generation (bad words) and only the mask's ids from the target's.
TrtLlmBackend runs here on injected libraries: a recording ModelRunnerCpp and a stand-in for the
TensorRT engines beside it (vocabulary, cache size and the map d2t, what the backend reads of
them); the prompt table and M-RoPE parameters are set by hand instead of by vision / prefill."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from runtime.backends import tensorrt as trt_backend
from runtime.backends.tensorrt_llm import TrtLlmBackend

V = 48


class RecordingRunner:
    """ModelRunnerCpp.from_dir / generate: records each request; the draft answers the lowest id
    it may write (not a bad word), the target accepts every proposal and appends id 0."""
    requests: list = []

    @classmethod
    def from_dir(cls, engine_dir, **kwargs):
        return cls(engine_dir.rsplit("/", 1)[-1])

    def __init__(self, role):
        self.role = role

    def generate(self, batch_input_ids, max_new_tokens, bad_words_list=None, draft_tokens_list=None, **kw):
        bad = {w[0] for w in bad_words_list[0]} if bad_words_list else set()
        self.requests.append({"role": self.role, "bad": bad, "bad_list": bad_words_list})
        if self.role == "draft":
            new = [min(set(range(V)) - bad)] * max_new_tokens
        else:
            new = list(draft_tokens_list[0] if draft_tokens_list else []) + [0]
        out = torch.cat([batch_input_ids[0], torch.tensor(new, dtype=torch.int32)])
        return {"output_ids": out[None, None], "sequence_lengths": torch.tensor([[len(out)]])}


def backend(tmp_path, monkeypatch, d2t):
    class Engines:        # what TrtLlmBackend reads of the TensorRT backend beside it
        def __init__(self, folder, meta, manifest, max_len, k_max, eager, tokenizer=None):
            self.vocab_size, self.max_len, self.k_max, self.d2t = V, 64, 4, d2t

        def close(self):
            pass
    monkeypatch.setattr(trt_backend, "TensorRTBackend", Engines)
    for role in ("target", "draft"):
        (tmp_path / "trtllm" / "engines" / role).mkdir(parents=True, exist_ok=True)
        (tmp_path / "trtllm" / "engines" / role / "config.json").write_text("{}")
    RecordingRunner.requests = []
    meta = SimpleNamespace(draft_features="none", target=SimpleNamespace(image_token_id=V - 1))   # of EnginesMeta
    manifest = SimpleNamespace(trtllm=SimpleNamespace(release="1.0.0rc4"))                       # of Manifest
    be = TrtLlmBackend(tmp_path, meta, manifest, libraries=(RecordingRunner, SimpleNamespace, torch))
    be.prompt_table, be.mrope = torch.zeros(0, 8), SimpleNamespace()
    return be


def draft_then_verify(be, allowed):
    be.set_mask(allowed)
    RecordingRunner.requests = []
    proposed, _ = be.draft(np.array([3, 4]), 0, 3)
    be.verify(np.concatenate([[4], proposed]), 1, "argmax")
    (d,), (t,) = ([r for r in RecordingRunner.requests if r["role"] == role] for role in ("draft", "target"))
    return proposed, d, t


def test_the_draft_request_bans_every_off_head_id_and_the_target_request_does_not(tmp_path, monkeypatch):
    d2t = np.sort(np.random.default_rng(0).choice(np.arange(5, V), 12, replace=False))
    off_head = set(range(V)) - set(d2t.tolist())
    be = backend(tmp_path, monkeypatch, d2t)
    allowed = np.ones(V, bool)
    allowed[40:] = False                                   # e.g. the trajectory tokens: banned for both
    masked = set(range(40, V))
    proposed, d, t = draft_then_verify(be, allowed)
    assert d["bad"] == off_head | masked and t["bad"] == masked
    assert all(len(w) == 1 for w in d["bad_list"][0])      # one-token bad words
    assert set(proposed.tolist()) <= set(d2t.tolist()) - masked
    proposed, d, t = draft_then_verify(be, None)           # no mask: only the draft has bad words
    assert d["bad"] == off_head and t["bad_list"] is None
    assert set(proposed.tolist()) <= set(d2t.tolist())


def test_a_full_draft_head_gets_the_targets_bad_words(tmp_path, monkeypatch):
    be = backend(tmp_path, monkeypatch, None)
    allowed = np.ones(V, bool)
    allowed[40:] = False
    _, d, t = draft_then_verify(be, allowed)
    assert d["bad"] == t["bad"] == set(range(40, V))
    with pytest.raises(Exception, match="periodic"):
        be.set_mask(np.ones((2, V), bool))
