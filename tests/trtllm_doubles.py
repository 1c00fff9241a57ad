"""A test double of TensorRT-LLM's `ModelRunnerCpp` (from_dir, generate) for
runtime/backends/tensorrt_llm.py: it checks each request against the documented arguments of
`generate` (TensorRT-LLM 1.0.0rc4, tensorrt_llm/runtime/model_runner_cpp.py; docs "Speculative
Sampling: Draft-Target-Model") and answers it with the ONNX graphs of the engine's model run by
ONNX Runtime over its own KV cache, as the real runner answers with its engine:

    target  prefill / step graphs; M-RoPE from the request's mrope_params table; the image
            embeddings from prompt_table (DeepStack inputs zero: the request has no slot for them)
    draft   draft_prefill / draft_feed graphs (a standalone FlatRoPE draft), greedy (top_k 1)

KV-cache block reuse is modelled as the real one keys it: rows of the longest common prefix of
(token id, extra id) pairs with what the cache holds are kept, the rest recomputed. External
draft tokens: the target accepts the longest prefix of the proposals equal to its own greedy
choices and appends its next token (so at most len(draft) + 1 new tokens).
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import torch

from core.artifacts import read_engines_meta
from prompt.positions import rope_tables
from runtime.backends.onnxruntime import open_sessions
from tests.trt_doubles import ContractError


class MropeParams:
    def __init__(self, mrope_rotary_cos_sin=None, mrope_position_deltas=None):
        self.mrope_rotary_cos_sin, self.mrope_position_deltas = mrope_rotary_cos_sin, mrope_position_deltas


class FakeModelRunnerCpp:
    requests: list = []                      # every generate() call's arguments, both runners

    @classmethod
    def from_dir(cls, engine_dir, **kwargs):
        """ModelRunnerCpp.from_dir(engine_dir, *, max_batch_size, max_input_len, max_output_len,
        kv_cache_enable_block_reuse, cuda_graph_mode, ...): keyword arguments only after engine_dir."""
        known = {"max_batch_size", "max_input_len", "max_output_len", "kv_cache_enable_block_reuse",
                 "cuda_graph_mode", "max_beam_width", "kv_cache_free_gpu_memory_fraction"}
        if set(kwargs) - known:
            raise ContractError(f"from_dir: unknown arguments {sorted(set(kwargs) - known)}")
        if not kwargs.get("kv_cache_enable_block_reuse"):
            raise ContractError("from_dir: without kv_cache_enable_block_reuse every request recomputes its prefix")
        return cls(Path(engine_dir), kwargs)

    def __init__(self, engine_dir: Path, options: dict):
        self.role, self.options = engine_dir.name, options
        folder = engine_dir.parents[2]                   # FOLDER/trtllm/engines/ROLE
        self.meta = read_engines_meta(folder)
        self.sessions = open_sessions(folder, self.meta, "cpu", 1)
        m = self.meta.target if self.role == "target" else self.meta.draft_llm
        self.cache = np.zeros((m.layers, 2, 1, m.kv_heads, self.meta.max_len, m.head_dim), np.float32)
        self.keys: list = []

    def generate(self, batch_input_ids, max_new_tokens=1, end_id=None, pad_id=None, prompt_table=None,
                 input_token_extra_ids=None, mrope_params=None, bad_words_list=None, return_dict=False,
                 output_sequence_lengths=False, draft_tokens_list=None, top_k=None, **unknown):
        """generate(batch_input_ids: List[Tensor (len,)], ..., **kwargs): draft_tokens_list and
        sampling fields (top_k) travel in kwargs; we read output_ids (batch, beams, len) and
        sequence_lengths (batch, beams), present with return_dict and output_sequence_lengths."""
        if unknown:
            raise ContractError(f"generate: arguments it does not take: {sorted(unknown)}")
        self.requests.append(dict(role=self.role, ids=batch_input_ids, max_new_tokens=max_new_tokens,
                                  drafts=draft_tokens_list, bad=bad_words_list, extra=input_token_extra_ids))
        if not (isinstance(batch_input_ids, list) and len(batch_input_ids) == 1
                and torch.is_tensor(batch_input_ids[0]) and batch_input_ids[0].dtype == torch.int32
                and batch_input_ids[0].ndim == 1):
            raise ContractError("batch_input_ids: a list of 1-D int32 tensors, one per request")
        if not (return_dict and output_sequence_lengths):
            raise ContractError("return_dict and output_sequence_lengths are needed to read the new tokens")
        ids = batch_input_ids[0].numpy().astype(np.int64)
        V = self.meta.target.vocab_size
        table = None if prompt_table is None else prompt_table.numpy()
        if (ids >= V).any() and (table is None or ids.max() >= V + len(table)):
            raise ContractError("prompt-table ids (>= vocab_size) need a prompt_table with that many rows")
        extra = [0] * len(ids) if input_token_extra_ids is None else input_token_extra_ids[0]
        if len(extra) != len(ids):
            raise ContractError("input_token_extra_ids: one extra id per input token")
        allowed = np.ones(V, bool)
        for word in (bad_words_list or [[]])[0]:
            if len(word) != 1 or not 0 <= word[0] < V:
                raise ContractError(f"bad word {word}: one-token words of ids < vocab_size expected")
            allowed[word[0]] = False
        if draft_tokens_list is not None:
            drafts = draft_tokens_list[0]
            if self.role != "target" or not all(isinstance(t, int) for t in drafts):
                raise ContractError("draft_tokens_list: a list of int lists, given to the target runner")
            if max_new_tokens != len(drafts) + 1:
                raise ContractError(f"max_new_tokens {max_new_tokens} with {len(drafts)} draft tokens: "
                                    "the target emits at most len(draft) + 1")
        if self.role == "target" and mrope_params is None:
            raise ContractError("a Qwen-VL target needs mrope_params")
        if self.role == "draft" and top_k != 1:
            raise ContractError("the draft must be greedy (top_k=1) for exact acceptance")
        new = self._answer(ids, list(zip(ids.tolist(), extra)), table, allowed, mrope_params,
                           max_new_tokens, draft_tokens_list[0] if draft_tokens_list else None)
        out = np.concatenate([ids, new])[None, None]
        return {"output_ids": torch.from_numpy(out), "sequence_lengths": torch.tensor([[out.shape[-1]]])}

    # --- the model, through the graphs ----------------------------------------------------------
    def _answer(self, ids, keys, table, allowed, mrope, max_new, drafts):
        c = next((i for i, (a, b) in enumerate(zip(self.keys, keys)) if a != b), min(len(self.keys), len(keys)))
        V = self.meta.target.vocab_size
        reused = [i for i in range(c) if ids[i] >= V]
        if reused and not np.array_equal(self.table[ids[reused] - V], table[ids[reused] - V]):
            raise ContractError("KV-cache block reuse would keep another prompt table's image rows: "
                                "give input_token_extra_ids that differ per table (generate's docstring)")
        self.table = table
        if c < getattr(self, "prompt_len", 0) or not self.keys:
            self._prefill(ids, table, mrope)                        # a new prompt: every row recomputed
            self.keys, self.prompt_len, c = list(keys), len(ids), len(ids)
        start = min(c, len(ids) - 1)
        if self.role == "draft":
            seq, out = list(ids[start:]), []
            for _ in range(max_new):
                top = self._feed(np.asarray(seq), start, allowed)
                out.append(int(top[-1]))
                start, seq = start + len(seq), [out[-1]]
            self.keys = list(keys) + [(t, 0) for t in out[:-1]]
            return np.asarray(out, np.int64)
        drafts = list(drafts or [])
        top = self._step(np.concatenate([ids[start:], np.asarray(drafts, np.int64)]), start, allowed, mrope)
        choices = top[len(ids) - 1 - start:]
        m = next((i for i, d in enumerate(drafts) if d != choices[i]), len(drafts))
        self.keys = list(keys) + [(t, 0) for t in drafts]
        return np.asarray(drafts[:m] + [int(choices[m])], np.int64)

    def _rope(self, mrope, rows):
        hd = self.meta.target.head_dim
        t = mrope.mrope_rotary_cos_sin.numpy().reshape(-1, 2 * hd)[rows]
        return t[None, :, :hd], t[None, :, hd:]

    def _prefill(self, ids, table, mrope):
        T, V = len(ids), self.meta.target.vocab_size
        ids = np.where(ids >= V, self.meta.target.image_token_id, ids)[None]
        if self.role == "target":
            cos, sin = self._rope(mrope, np.arange(T))
            deep = np.zeros(self.meta.graphs["prefill"].inputs[4].shape, np.float32)
            _, _, _, kv = self.sessions["prefill"].run(None, dict(ids=ids, cos=cos, sin=sin, image_embeds=table,
                                                                   deepstack=deep, allowed=np.ones((T, V), bool)))
        else:
            d = self.meta.draft_llm
            cos, sin = rope_tables(np.arange(T)[None], d.head_dim, d.rope_theta)
            (kv,) = self.sessions["draft_prefill"].run(None, dict(ids=ids, cos=cos, sin=sin, image_embeds=table))
        self.cache[..., :T, :] = kv

    def _step(self, ids, start, allowed, mrope):
        n = len(ids)
        cos, sin = self._rope(mrope, np.arange(start, start + n))
        _, top, _, kv = self.sessions["step"].run(None, dict(ids=ids[None], cos=cos, sin=sin, cache=self.cache,
                                                              start=np.array([start]), allowed=np.tile(allowed, (n, 1))))
        self.cache[..., start:start + n, :] = kv
        return top[0]

    def _feed(self, ids, start, allowed):
        n, d = len(ids), self.meta.draft_llm
        cos, sin = rope_tables(np.arange(start, start + n)[None], d.head_dim, d.rope_theta)
        _, top, _, kv = self.sessions["draft_feed"].run(None, dict(ids=ids[None], cos=cos, sin=sin, cache=self.cache,
                                                                    start=np.array([start]),
                                                                    allowed=np.tile(allowed, (n, 1))))
        self.cache[..., start:start + n, :] = kv
        return top[0]


def install(monkeypatch) -> None:
    """`from tensorrt_llm.runtime import ModelRunnerCpp`, `from tensorrt_llm.layers import MropeParams`."""
    pkg = types.ModuleType("tensorrt_llm")
    pkg.runtime = types.SimpleNamespace(ModelRunnerCpp=FakeModelRunnerCpp)
    pkg.layers = types.SimpleNamespace(MropeParams=MropeParams)
    FakeModelRunnerCpp.requests = []
    for name, mod in (("tensorrt_llm", pkg), ("tensorrt_llm.runtime", pkg.runtime), ("tensorrt_llm.layers", pkg.layers)):
        monkeypatch.setitem(sys.modules, name, mod)
