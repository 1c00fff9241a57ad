"""The EAGLE-3 draft architecture (issue 38): EAGLE-3's midlayer written out independently here
against models/eagle3.py, the layers it reads, the config refusals, greedy speculative == plain on
the torch backend, and its exported ONNX draft graphs against the torch draft."""
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models.config import DraftConfig, ModelConfig, eagle3_feature_layers, load_preset
from models.draft import Draft
from core.config import ConfigError
from prompt.draft_vocab import build_d2t, token_counts
from prompt.tokenizer import load_tokenizer
from train import ckpt

pytestmark = pytest.mark.usefixtures("one_thread")   # tiny models: one torch thread

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["the lead vehicle brakes ahead so slow down", "keep the lane at steady speed",
         "a pedestrian crosses ahead so stop", "keep the lane"]
TOK = load_tokenizer(ROOT / "checkpoints" / "tiny")


def eagle3(cfg, target, n=48, seed=3):
    torch.manual_seed(seed)
    dcfg = ckpt.draft_config(cfg, "eagle3", n)
    d = Draft(dcfg, target.embed_tokens, target.lm_head).eval()
    if n:
        d.set_vocab(build_d2t(token_counts(TEXTS, TOK), TOK, n))
    with torch.no_grad():       # norms away from 1, so a swapped or missing norm shows
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn(p.shape))
    return dcfg, d


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference_midlayer(sd, emb, hidden, cos, sin, heads, kv_heads, hd, eps):
    """EAGLE-3's LlamaDecoderLayer (the `midlayer` of its drafts) from its checkpoint tensors."""
    p = "layers.0."
    B, T, _ = emb.shape
    x = torch.cat([rms(emb, sd[p + "input_layernorm.weight"], eps), rms(hidden, sd[p + "hidden_norm.weight"], eps)], -1)
    q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(B, T, heads, hd).transpose(1, 2)
    k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(B, T, kv_heads, hd).transpose(1, 2)
    v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(B, T, kv_heads, hd).transpose(1, 2)

    def rot(t):   # rotate_half rope
        h = t.shape[-1] // 2
        return t * cos[:, None] + torch.cat([-t[..., h:], t[..., :h]], -1) * sin[:, None]
    q, k = rot(q), rot(k)
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    a = (att @ v).transpose(1, 2).reshape(B, T, heads * hd) @ sd[p + "self_attn.o_proj.weight"].T
    h = hidden + a
    m = rms(h, sd[p + "post_attention_layernorm.weight"], eps)
    m = (F.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)) @ sd[p + "mlp.down_proj.weight"].T
    return h + m


def test_the_draft_is_eagle3s_midlayer_over_fc_of_the_target_features(tiny_models):
    cfg, target, _ = tiny_models
    dcfg, d = eagle3(cfg, target)
    llm, sd = d.llm, {k: v.float() for k, v in d.state_dict().items()}
    assert "in_proj.weight" not in sd and not llm.qk_norm
    assert tuple(sd["layers.0.self_attn.q_proj.weight"].shape) == (llm.heads * llm.head_dim, 2 * llm.hidden)
    g = torch.Generator().manual_seed(0)
    T = 9
    ids = torch.randint(20, 300, (2, T), generator=g)
    feats = torch.randn(2, T, 3 * llm.hidden, generator=g)
    cos, sin = d.rope(torch.arange(T)[None].expand(2, T))
    with torch.no_grad():
        logits, hidden = d(ids, cos, sin, None, 0, feats)
        emb = target.embed_tokens(ids)
        want = reference_midlayer(sd, emb, feats @ sd["fc.weight"].T, cos, sin, llm.heads, llm.kv_heads,
                                  llm.head_dim, llm.norm_eps)
        head = rms(want, sd["norm.weight"], llm.norm_eps) @ sd["vocab_head.weight"].T
        # the chain's own hidden (B, T, D) goes in as the hidden stream without fc
        _, chained = d(ids, cos, sin, None, 0, hidden)
        want_chained = reference_midlayer(sd, emb, hidden, cos, sin, llm.heads, llm.kv_heads, llm.head_dim,
                                          llm.norm_eps)
    assert torch.allclose(hidden, want, atol=1e-5), float((hidden - want).abs().max())
    assert torch.allclose(chained, want_chained, atol=1e-5)
    full = torch.full_like(logits, float("-inf"))
    full[..., d.d2t] = head
    assert torch.equal(torch.isinf(logits), torch.isinf(full))
    assert torch.allclose(logits[..., d.d2t], head, atol=1e-5)


def test_it_reads_the_layers_edgellm_feeds():
    # Edge-LLM 0.11: all_hidden_states[2, N//2, N-3], index i the input of layer i
    for n in (6, 12, 28, 36):
        hf = (2, n // 2, n - 3)
        assert eagle3_feature_layers(n) == tuple(i - 1 for i in hf)
    assert eagle3_feature_layers(12) == (1, 5, 8)
    cfg = load_preset("tiny")
    e3 = ckpt.draft_config(cfg, "eagle3", 0)
    assert e3.draft.feature_layers == (1, 5, 8) != ckpt.draft_config(cfg, "flat").draft.feature_layers


@pytest.mark.parametrize("draft,match", [
    (dict(arch="eagle3", layers=2), "layers=1"),
    (dict(arch="eagle3", features="none"), "features='fused'"),
    (dict(arch="eagle2"), "draft.arch"),
])
def test_impossible_eagle3_configs_are_refused(draft, match):
    with pytest.raises(ConfigError, match=match):
        DraftConfig(**draft)


def test_a_target_too_shallow_for_eagle3_is_refused():
    cfg = load_preset("tiny")
    llm = dataclasses.replace(cfg.target.llm, layers=4)
    with pytest.raises(ConfigError, match="at least 6 layers"):
        ModelConfig(dataclasses.replace(cfg.target, llm=llm), DraftConfig(arch="eagle3"), cfg.expert)


def test_torch_backend_greedy_speculative_equals_plain(tiny_models):
    from policies import FixedK
    from runtime.backends.torch import TorchBackend
    from runtime.loop import GreedyRule, generate

    cfg, target, expert = tiny_models
    dcfg, d = eagle3(cfg, target)
    be = TorchBackend(dcfg, target, expert, d, max_len=128)
    assert be.feature_layers == (1, 5, 8)
    rng = np.random.default_rng(0)
    for _ in range(3):
        prompt = rng.integers(20, 300, 12)
        plain, _, _ = generate(be, prompt, GreedyRule(), FixedK(0), max_new=24)
        for k in (2, 5):
            spec, _, stats = generate(be, prompt, GreedyRule(), FixedK(k), max_new=24)
            assert spec == plain, f"k={k}: speculative {spec} != plain {plain}"


@pytest.mark.parametrize("graph", ["draft_feed", "draft_chain"])
def test_the_onnx_draft_graphs_match_torch(tiny_models, tmp_path, graph):
    ort = pytest.importorskip("onnxruntime")
    from export import onnx as ex

    cfg, target, expert = tiny_models
    dcfg, d = eagle3(cfg, target)
    V, D, L = len(TOK), cfg.target.llm.hidden, 64
    shapes = {"vocab": V, "hidden": D, "head_dim": 32, "image_tokens": 4, "layers": 12, "kv_heads": 2,
              "grid": [[1, 8, 12]], "patches": [96, 384], "frame_patches": [96, 384]}
    graphs = ex._graphs(target, expert, d, True, dcfg.draft.feature_layers, shapes, ex.ExportConfig(max_len=L))
    _, module, args, names, dyn = next(g for g in graphs if g[0] == graph)
    ex._export(module.eval(), args, names, dyn, tmp_path / "g.onnx")
    sess = ort.InferenceSession(str(tmp_path / "g.onnx"), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(1)
    w = 3 if graph == "draft_feed" else 1
    F_in = 3 * D if graph == "draft_feed" else D
    cache = torch.randn(1, 2, 1, 2, L, 32, generator=g)
    ids = d.d2t[torch.randint(0, 40, (1, w), generator=g)]
    feats, start = torch.randn(1, w, F_in, generator=g), 20
    cos, sin = d.rope(torch.arange(start, start + w)[None])
    allowed = ~torch.from_numpy(np.tile(TOK.traj_mask(), (w, 1)))
    with torch.no_grad():
        want, _ = d(ids, cos, sin, [[c.clone() for c in layer] for layer in cache], start, feats)
    want = want[0].masked_fill(~allowed, float("-inf")).numpy()
    feed = {"ids": ids.numpy(), "cos": cos.numpy(), "sin": sin.numpy(), "cache": cache.numpy(),
            "start": np.array([start]), "allowed": allowed.numpy(), "feats": feats.numpy()}
    out = sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})
    got, top = out[0][0], out[1][0]
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)) and 0 < fin.sum(-1).max() <= 48
    assert float(np.abs(got[fin] - want[fin]).max()) < 1e-4
    assert np.array_equal(top, want.argmax(-1))


def test_the_training_chain_equals_the_drafting_chain(tiny_models):
    """models/chain.py's teacher-forced passes (what distillation trains) give the logits the
    draft gives when it drafts over its cache: the verified rows with target features, then its
    own hidden for each chained row."""
    from models.chain import chain_forward
    from models.draft import shift_features

    cfg, target, _ = tiny_models
    _, d = eagle3(cfg, target, n=0)
    B, T, first, P = 2, 20, 12, 4
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(20, 300, (B, T), generator=g)
    feats = shift_features(torch.randn(B, T, 3 * cfg.target.llm.hidden, generator=g))
    cos, sin = d.rope(torch.arange(T)[None].expand(B, T))
    with torch.no_grad():
        out = chain_forward(d, ids, cos, sin, feats, None, first, P)
        for p in range(P):
            for j in (first + p, T - 1):
                cache = d.new_cache(B, T)
                n = j - p + 1
                logits, h = d(ids[:, :n], cos[:, :n], sin[:, :n], cache, 0, feats[:, :n])
                h = h[:, -1:]
                for r in range(n, j + 1):
                    logits, h = d(ids[:, r:r + 1], cos[:, r:r + 1], sin[:, r:r + 1], cache, r, h)
                got = out[p][0][:, j - int(out[p][2][0])]
                err = (got - logits[:, -1]).abs().max().item()
                assert err < 1e-4, f"pass {p} row {j}: max diff {err}"


def test_sampled_speculative_output_with_an_eagle3_draft_follows_the_target():
    """Speculative sampling through the torch backend with an EAGLE-3 draft (random weights, so q
    is far from p): the 3-token outputs follow the target's exact joint (chi-square), vocab 6."""
    from collections import Counter

    from distribution import chi2_z, exact_joint
    from models.action_expert import ActionExpert
    from models.config import ExpertConfig, LLMConfig, TargetConfig, VisionConfig
    from models.target import Target
    from policies import FixedK
    from runtime.backends.torch import TorchBackend
    from runtime.loop import SamplingRule, generate

    vision = VisionConfig(depth=1, hidden=16, heads=2, intermediate=32, num_position_embeddings=16,
                          deepstack_layers=(0,))
    llm = LLMConfig(layers=8, hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=64, vocab_size=6,
                    mrope_section=(4, 2, 2))
    cfg = ModelConfig(TargetConfig(vision=vision, llm=llm), DraftConfig(arch="eagle3"),
                      ExpertConfig(hidden=32, heads=2, intermediate=32, euler_steps=2))
    assert cfg.draft.feature_layers == (1, 3, 4)
    torch.manual_seed(5)
    target = Target(cfg.target)
    draft = Draft(cfg, target.embed_tokens, target.lm_head)
    with torch.no_grad():     # a smooth target and a peaked draft: many rejections, residuals far from p
        for p in target.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
        for p in draft.parameters():
            if p.dim() == 2:
                p.normal_(0, 1.5)
    be = TorchBackend(cfg, target.eval(), ActionExpert(cfg.expert, llm).eval(), draft.eval(), max_len=32)
    prompt, n, temperature = np.array([1, 2, 0, 3]), 3, 0.9
    exact = exact_joint(be, prompt, n, temperature, 1.0)
    rng = np.random.default_rng(7)
    counts = Counter()
    for _ in range(3000):
        out, _, _ = generate(be, prompt, SamplingRule(temperature, 1.0, rng), FixedK(2), max_new=n)
        counts[tuple(out)] += 1
    assert set(counts) <= {k for k, v in exact.items() if v > 0}, "a zero-probability output"
    keys = sorted(exact)
    z = chi2_z(np.array([counts[k] for k in keys]), np.array([exact[k] for k in keys]))
    assert z < 4.0, f"sampled sequences do not follow the target with the EAGLE-3 draft (chi-square z={z:.1f})"
