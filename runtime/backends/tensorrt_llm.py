"""The TensorRT-LLM backend: target and standalone draft engines through TensorRT-LLM's
`ModelRunnerCpp` in external-draft-token mode, driven by our loop and our budget; vision and the
action expert run on the TensorRT backend's engines beside it (runtime/backends/tensorrt/).

Only exact (greedy) acceptance: TensorRT-LLM accepts draft tokens inside its runtime (a request
with `draft_tokens_list` returns the accepted tokens and the next one), so the target's choices
are known up to the first mismatch and no probability rows come back. `exact_only = True`: the
planner refuses sampling and relaxed acceptance with a ConfigError; `verify` returns -1 where
the target's choice is unknown (the greedy rule never reads there).

Each call is one `generate` request over the whole sequence so far (the runner's KV-cache block
reuse keeps the shared prefix, so only the new rows are computed; the image tokens carry the cycle
number as `input_token_extra_ids`, so a block of one cycle's images is never reused for another's;
end_id -1: no end token, the loop decides where reasoning stops):

    prefill   input = the prompt, image tokens as prompt-table ids (vocab_size + i) with the
              image embeddings as `prompt_table`, M-RoPE through `mrope_params`; 1 new token
    draft     the draft runner: input = the sequence up to the fed tokens, k new tokens (top_k 1,
              no end token: the loop decides where reasoning stops)
    verify    the target runner: input = the sequence with the pending tokens,
              `draft_tokens_list` = [the k proposals], k + 1 new tokens at most
    mask      a (V,) mask as `bad_words_list` (every disallowed id a one-token bad word); a
              periodic (P, V) mask (trajectory tokens decoded by the LLM) has no such form: refused

The expert reads the TensorRT backend's cache: its prefill writes the prompt rows (the fallback
trajectory reads them), and before the final trajectory one TensorRT step writes the reasoning
rows (TensorRT-LLM's paged KV cache is not addressable from outside). That is one extra target
pass over the reasoning per cycle, and the prompt is prefilled twice (once per engine set).
DeepStack features (Qwen3-VL) have no slot in the runner's request: targets with DeepStack need
TensorRT-LLM's own Qwen3-VL support (not wired here).

Engines: trtllm/engines/{target,draft} (trtllm/BUILD.sh builds them on the device from the
checkpoints engines/trtllm.py writes; manifest "trtllm").

Documentation followed: TensorRT-LLM `ModelRunnerCpp.from_dir` / `generate` (draft_tokens_list,
prompt_table, mrope_params, bad_words_list, end_id, pad_id, return_dict, output_sequence_lengths;
docs "Speculative Sampling: Draft-Target-Model", examples/draft_target_model), release 1.0.0rc4 (engines/trtllm.py's TRTLLM_RELEASE).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core.artifacts import EnginesMeta, Manifest
from core.config import ConfigError
from core.graphs import VISION
from runtime.backend import Backend, BackendSpec, PrefillInputs, periodic_mask

INSTALL = ("TensorRT-LLM runs on x86 and Grace/Hopper GPUs and Thor (`pip install tensorrt_llm`, or NVIDIA's "
           "TensorRT-LLM container); its last Orin release (v0.12.0-jetson) predates M-RoPE: on Orin use "
           "--backend tensorrt")


def import_libraries():
    """(ModelRunnerCpp, MropeParams, torch), or a ConfigError naming the package and the route."""
    try:
        import torch
        from tensorrt_llm.layers import MropeParams
        from tensorrt_llm.runtime import ModelRunnerCpp
    except ImportError as e:
        raise ConfigError(f"--backend tensorrt-llm needs {e.name!r}, which is not installed here; "
                          f"install it: {INSTALL}") from None
    return ModelRunnerCpp, MropeParams, torch


class TrtLlmBackend(Backend):
    name = "tensorrt-llm"
    exact_only = True
    readouts = ("argmax",)          # token ids only (acceptance happens inside the runtime)

    def __init__(self, folder: Path, meta: EnginesMeta, manifest: Manifest, max_len: int | None = None,
                 k_max: int | None = None, eager: bool = False, libraries=None, tokenizer=None):
        from runtime.backends.tensorrt import TensorRTBackend
        Runner, self.MropeParams, self.torch = libraries or import_libraries()
        dirs = engine_dirs(Path(folder), manifest)
        if meta.draft_features == "fused":
            raise ConfigError(f"{folder}: the draft reads the target's features (an EAGLE-style draft); "
                              "TensorRT-LLM's external-draft mode needs a standalone draft (export with "
                              "--draft flat-standalone)")
        self.engines = TensorRTBackend(folder, meta, manifest, max_len, k_max, eager, tokenizer=tokenizer)
        self.meta, self.vocab_size, self.max_len = meta, self.engines.vocab_size, self.engines.max_len
        self.k_max = self.engines.k_max
        runner = dict(max_batch_size=1, max_input_len=self.max_len, max_output_len=self.k_max + 1,
                      kv_cache_enable_block_reuse=True, cuda_graph_mode=not eager)
        self.target = Runner.from_dir(engine_dir=str(dirs["target"]), **runner)
        self.drafter = Runner.from_dir(engine_dir=str(dirs["draft"]), **runner)
        self.seq = np.zeros(self.max_len + self.k_max + 1, np.int32)    # the ids of every cache row
        self.prompt_len, self.proposed, self.cycle = 0, None, 0
        self.set_mask(None)

    # --- vision and prefill --------------------------------------------------------------------
    def vision_grid(self, image_shape: tuple):
        return self.engines.vision_grid(image_shape)

    def vision(self, images: np.ndarray) -> None:
        self.engines.vision(images)
        e = self.engines.engines[VISION]
        table = np.zeros(self.engines.meta.graphs[VISION].outputs[0].shape, np.float32)
        self.engines.cuda.d2h(table, e.io.image_embeds.ptr, self.engines.stream)
        self.engines.cuda("cudaStreamSynchronize", self.engines.stream)
        self.prompt_table = self.torch.from_numpy(table)          # (N, D): one row per image token
        self.cycle += 1

    def prefill(self, inputs: PrefillInputs, readout: str) -> np.ndarray:
        self.check_readout(readout)
        self.engines.prefill(inputs, "argmax")                     # the expert's cache (fallback)
        ids = np.asarray(inputs.ids, np.int64)
        T = self.prompt_len = len(ids)
        self.seq[:T] = ids
        self.mrope = self._mrope(inputs)
        out = self._generate(self.target, ids, max_new_tokens=1)
        return out[:1].astype(np.int64)

    def set_mask(self, allowed: np.ndarray | None, first: int = 0) -> None:
        allowed = periodic_mask(allowed, self.vocab_size)     # checked before anything is kept
        if len(allowed) > 1:
            raise ConfigError("--backend tensorrt-llm: a periodic vocabulary mask (trajectory tokens decoded "
                              "by the LLM) cannot be given as bad words; use trajectory: expert")
        super().set_mask(allowed, first)
        self.bad_words = [[int(t)] for t in np.flatnonzero(~allowed[0])]
        # a reduced draft head (zero lm_head rows off the head, engines/trtllm.py): banned for the draft
        d2t = getattr(getattr(self, "engines", None), "d2t", None)
        off = np.ones(self.vocab_size, bool)
        if d2t is not None:
            off[d2t] = False
        self.draft_bad_words = self.bad_words if d2t is None else \
            [[int(t)] for t in np.flatnonzero(~allowed[0] | off)]

    # --- draft, verify, action --------------------------------------------------------------------
    def draft(self, tokens, start: int, k: int, sampling=None):
        if sampling is not None:
            raise ConfigError("--backend tensorrt-llm drafts greedily only (exact acceptance)")
        tokens = np.asarray(tokens, np.int64)
        self.check_rows(start, len(tokens) + k)
        self.seq[start:start + len(tokens)] = tokens
        out = self._generate(self.drafter, self.seq[:start + len(tokens)], max_new_tokens=k, top_k=1,
                             bad_words=self.draft_bad_words)
        if len(out) != k:
            raise RuntimeError(f"tensorrt-llm draft runner returned {len(out)} tokens, asked for {k}")
        self.proposed = out.astype(np.int64)
        return self.proposed.copy(), None

    def verify(self, tokens, start: int, readout: str) -> np.ndarray:
        """Target choices after each token: known up to the first rejected proposal, -1 beyond
        (and over forced pending tokens, whose choices the loop never reads)."""
        self.check_readout(readout)
        tokens = np.asarray(tokens, np.int64)
        n, proposed, self.proposed = len(tokens), self.proposed, None
        k = len(proposed) if proposed is not None and n > len(proposed) and \
            np.array_equal(tokens[n - len(proposed):], proposed) else 0
        p = n - k                                                   # pending tokens (>= 1)
        self.check_rows(start, n)
        self.seq[start:start + n] = tokens
        drafts = [tokens[p:].tolist()] if k else None
        out = self._generate(self.target, self.seq[:start + p], max_new_tokens=k + 1, draft_tokens_list=drafts)
        rows = np.full(n, -1, np.int64)
        rows[p - 1:p - 1 + len(out)] = out                        # accepted proposals, then the next token
        return rows

    def write(self, tokens, start: int) -> None:
        """Only into the sequence: `expert` writes the TensorRT cache's missing rows."""
        self.seq[start:start + len(tokens)] = tokens

    def expert(self, rows: int, v0: float, seed: int, request) -> np.ndarray:
        """The reasoning rows [prompt_len, rows) into the TensorRT cache (one step), then the
        expert there."""
        T = self.prompt_len
        return self.engines.action(self.seq[T:rows].astype(np.int64), T, v0, seed, request)

    def close(self) -> None:
        for runner in (getattr(self, "target", None), getattr(self, "drafter", None)):
            if runner is not None and hasattr(runner, "shutdown"):
                runner.shutdown()
        if hasattr(self, "engines"):
            self.engines.close()

    # --- requests ---------------------------------------------------------------------------------
    def _generate(self, runner, ids: np.ndarray, max_new_tokens: int, bad_words=None, **extra) -> np.ndarray:
        """One ModelRunnerCpp.generate request (batch of one) -> the new tokens (bad_words: the
        banned ids, default the mask's)."""
        bad = self.bad_words if bad_words is None else bad_words
        ids = np.asarray(ids, np.int32).copy()
        image = ids == self.meta.target.image_token_id
        ids[image] = self.vocab_size + np.arange(int(image.sum()), dtype=np.int32)   # prompt-table rows
        extra_ids = np.where(image, self.cycle, 0).astype(np.int64)             # KV reuse never mixes images
        out = runner.generate(
            batch_input_ids=[self.torch.from_numpy(ids)], max_new_tokens=max_new_tokens, end_id=-1, pad_id=0,
            prompt_table=self.prompt_table, input_token_extra_ids=[extra_ids.tolist()],
            mrope_params=self.mrope if runner is self.target else None,
            bad_words_list=[bad] if bad else None,
            return_dict=True, output_sequence_lengths=True, **extra)
        length = int(out["sequence_lengths"][0][0])
        return np.asarray(out["output_ids"][0][0][len(ids):length].tolist(), np.int64)

    def _mrope(self, inputs: PrefillInputs):
        """MropeParams: cos and sin of every row (the prompt's M-RoPE positions, then row + delta)
        as one (1, max_len * 2 * head_dim) table, and the position delta."""
        e, T = self.engines, len(inputs.ids)
        prompt = e.target_rope(np.asarray(inputs.positions)[:, None])
        decode = e.target_rope(np.arange(T, self.max_len)[None] + int(inputs.rope_delta))
        cos = np.concatenate([prompt[0][0], decode[0][0]])
        sin = np.concatenate([prompt[1][0], decode[1][0]])
        table = np.concatenate([cos, sin], -1).reshape(1, -1).astype(np.float32)
        return self.MropeParams(mrope_rotary_cos_sin=self.torch.from_numpy(table),
                                mrope_position_deltas=self.torch.tensor([[int(inputs.rope_delta)]]))


def engine_dirs(folder: Path, manifest: Manifest) -> dict:
    """{target, draft}: the engines trtllm/BUILD.sh builds from the checkpoints engines/trtllm.py
    writes (manifest "trtllm"), at trtllm/engines/ROLE, each with trtllm-build's config.json."""
    entry = manifest.trtllm
    if entry is None:
        raise ConfigError(f"{folder}/manifest.json has no TensorRT-LLM checkpoints (its profile {manifest.profile!r} "
                          "has trtllm disabled); use a Thor / Hopper profile, or --backend tensorrt")
    dirs = {role: folder / "trtllm" / "engines" / role for role in ("target", "draft")}
    missing = [r for r, d in dirs.items() if not (d / "config.json").is_file()]
    if missing:
        blockers = entry.blockers()
        raise ConfigError(f"{folder}: no TensorRT-LLM engines for {missing} (trtllm/engines/ROLE/config.json); "
                          f"build them on the device: sh {folder / entry.build_script}"
                          + (f" (the checkpoints say what blocks the build at TensorRT-LLM "
                             f"{entry.release}: {blockers})" if blockers else ""))
    return dirs


def create(spec: BackendSpec) -> TrtLlmBackend:
    return TrtLlmBackend(spec.engines, spec.meta, spec.manifest, spec.max_len, spec.k_max, spec.eager,
                         tokenizer=spec.tokenizer)
