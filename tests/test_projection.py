"""The roofline projection (bench/common/projection.py), the devices table and the validation rows."""
import dataclasses

import pytest

from models.config import load_preset
from models.sizes import param_counts
from prompt.config import ConfigError
from bench.common.projection import Device, Shapes, Workload, memory_report, project, prompt_tokens, remedies, stage_costs
from bench.common.devices import load_devices
from bench.roofline.command import validate

DEV = Device(title="test", dram_gbps=100.0, memory_gb=8, fp32_tflops=1.0, fp16_tflops=10.0, int8_tops=20.0,
             compute_efficiency=1.0, memory_efficiency=1.0)


def test_a_decode_step_reads_every_target_weight_once():
    cfg = load_preset("tiny")
    c = Shapes(cfg, "fp16", "engine").target(1, 100, 512, 1)
    weights = sum(o.flops for o in c.ops if o.name in ("qkv", "o", "mlp_in", "mlp_out", "lm_head"))  # 2 per weight
    llm = param_counts(cfg)["llm"]
    embed = cfg.target.llm.vocab_size * cfg.target.llm.hidden        # an embedding is not a matmul
    norms = cfg.target.llm.layers * (2 * 128 + 2 * 32) + 128
    assert weights == pytest.approx(2 * (llm - embed - norms), rel=0.01)


def test_memory_bound_step_time_is_bytes_over_bandwidth():
    cfg = load_preset("edge-2b")
    c = Shapes(cfg, "int8", "engine").target(1, 3000, 4096, 1)
    assert c.ms(DEV, "int8") == pytest.approx(c.bytes / 100e9 * 1e3, rel=0.02)   # every op memory bound
    assert c.bytes > param_counts(cfg)["llm"] * 0.8


def test_reference_attends_over_all_cache_rows():
    cfg = load_preset("tiny")
    ref = Shapes(cfg, "fp32", "reference").target(1, 10, 512, 1)
    eng = Shapes(cfg, "fp32", "engine").target(1, 10, 512, 1)
    assert ref.flops > eng.flops and ref.bytes > eng.bytes


def test_speculation_shortens_the_reasoning_and_the_verdict_follows_the_budget():
    cfg = load_preset("tiny")
    w = Workload(images=8, image_hw=(64, 96), reasoning_tokens=40, k=4, tau=4.0, precision="fp16", budget_ms=1e6)
    r = project(cfg, DEV, w)
    assert r["speculative"]["reasoning_ms"] < r["plain"]["reasoning_ms"]
    assert r["speculative"]["fits"] and r["premise_ok"]
    tight = project(cfg, DEV, dataclasses.replace(w, budget_ms=1e-3))
    assert not tight["plain"]["fits"] and not tight["premise_ok"]
    assert tight["tokens_in_budget"] == {"plain": 0, "speculative": 0}


def test_prompt_length_is_the_real_layout():
    assert prompt_tokens(load_preset("tiny"), 8, (64, 96)) == 8 * (24 + 2) + 56


def test_orin_has_no_fp8_and_devices_load():
    devices = load_devices().devices
    assert {"orin-agx-64", "orin-nx-16", "drive-orin", "thor", "h100", "h200"} <= set(devices)
    with pytest.raises(ConfigError, match="no fp8"):
        devices["orin-agx-64"].peak_flops("fp8")
    assert devices["thor"].peak_flops("fp4") > devices["thor"].peak_flops("fp8")


def test_workload_is_checked():
    with pytest.raises(ConfigError, match="tau"):
        Workload(k=2, tau=4.0)
    with pytest.raises(ConfigError, match="precision"):
        Workload(precision="int3")


def test_remedies_only_keep_what_helps():
    cfg = load_preset("edge-2b")
    w = Workload(images=16, image_hw=(320, 576), reasoning_tokens=40, max_len=4096, precision="int8", budget_ms=1.0)
    rows, best = remedies(cfg, load_devices().devices["orin-agx-64"], w, cameras=4)
    assert rows and all(r["cumulative_ms"] <= r["alone_ms"] or not r["kept"] for r in rows)
    assert best.samples == 1 and best.euler_steps == 2 and best.images == 4


def test_memory_report_scales_with_precision_and_rows():
    cfg = load_preset("alpamayo-r1-10b")
    m8, m16 = (memory_report(cfg, p, [3000], 4096, [1, 5], 8) for p in ("int8", "fp16"))
    assert m16["weights"]["total"] == 2 * m8["weights"]["total"]
    assert m8["kv_cache"]["4096"]["target"] > m8["kv_cache"]["3000"]["target"]
    assert m8["kv_per_token"]["target"] == 36 * 2 * 8 * 128 * 2


def test_validation_rows_are_measured_over_projected():
    cfg = load_preset("tiny")
    w = Workload(images=8, image_hw=(64, 96), max_len=512, k=4, tau=3.0, precision="fp32", samples=8, euler_steps=2)
    dev = dataclasses.replace(DEV, impl="reference")
    proj = stage_costs(cfg, dataclasses.replace(w, prompt_len=264, reasoning_tokens=30), "reference")
    stats = {"prompt_len": 264, "reasoning_tokens": 30,
             "calls": {"vision": 2 * proj["vision"].ms(dev, "fp32"), "prefill": 1.0, "draft_step": None,
                       "verify": {"5": 1.0}, "action": 3.0}}
    rows = {r["stage"]: r for r in validate(cfg, dev, w, stats)}
    assert rows["vision"]["ratio"] == pytest.approx(2.0)
    assert "draft per proposal (call / k)" not in rows and "verify width 5" in rows


def test_the_draft_head_bytes_and_flops_scale_with_the_draft_vocabulary():
    cfg = load_preset("edge-2b")
    steps = {}
    for n in (0, 32768, 4096):
        c = dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, vocab=n))
        steps[n] = Shapes(c, "fp16", "engine").draft(1, 400, 4096, 1)
    head = {n: next(o for o in s.ops if o.name == "lm_head") for n, s in steps.items()}
    D, V = cfg.target.llm.hidden, cfg.target.llm.vocab_size
    assert head[0].flops == 2 * D * V and head[4096].flops == 2 * D * 4096
    assert head[32768].bytes == pytest.approx(head[0].bytes * 32768 / V, rel=0.01)
    assert steps[0].ms(DEV, "fp16") > steps[32768].ms(DEV, "fp16") > steps[4096].ms(DEV, "fp16")


def test_the_draft_is_fused_once_per_draft_call_not_once_per_proposal():
    """A draft call = one feed step (fc 3D -> D over the target's features) + k - 1 chain steps
    (the draft's own hidden: no fc); the speculative reasoning prices k x draft_step = that call."""
    cfg = load_preset("edge-2b")
    w = Workload(prompt_len=600, reasoning_tokens=40, k=8, tau=5.0, precision="fp16")
    costs = stage_costs(cfg, w, "engine")
    names = {call: [o.name for o in costs[call].ops] for call in ("draft_feed", "draft_chain", "draft_step")}
    assert names["draft_feed"].count("fuse") == 1 and "fuse" not in names["draft_chain"]
    assert "in_proj" in names["draft_chain"]                      # in_proj([embed, hidden]) still runs
    D = cfg.target.llm.hidden
    fuse = sum(o.flops for o in costs["draft_step"].ops if o.name == "fuse")
    assert fuse * w.k == pytest.approx(2 * 3 * D * D)             # one fc per call of k proposals
    feed, chain, step = (costs[c].ms(DEV, "fp16") for c in ("draft_feed", "draft_chain", "draft_step"))
    assert feed > chain and step == pytest.approx((feed + 7 * chain) / 8)
    out = project(cfg, DEV, w)
    assert out["stages_ms"]["draft_step"] == pytest.approx(step)
    steps = -(-40 // 5)
    assert out["speculative"]["reasoning_ms"] == pytest.approx(steps * (feed + 7 * chain + out["stages_ms"]["verify_9"]))
    alone = dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, features="none"))
    c = stage_costs(alone, w, "engine")
    assert c["draft_feed"].ms(DEV, "fp16") == pytest.approx(c["draft_chain"].ms(DEV, "fp16"))


def test_streaming_prefill_prices_the_new_blocks_and_the_rows_outside_the_images():
    """Streaming prefill: the new frames' blocks (each over its own rows), the kept ones rotated,
    the rows after the images over the whole prompt; fewer new frames cost less, and its target
    rows are exactly the prompt's rows (new blocks + rows outside the images) plus nothing else."""
    from bench.common.projection import image_block_rows, streamed_prefill

    cfg = load_preset("edge-2b")
    w = Workload(images=16, precision="int8", max_len=4096)
    ms = [project(cfg, DEV, dataclasses.replace(w, streamed_images=n))["stages_ms"]["prefill"] for n in (0, 4, 8, 16)]
    assert ms == sorted(ms), ms
    # the blocks are a weight pass of their own: it pays where a prompt's prefill is compute-bound
    # (Orin, 16 images), not on this memory-starved test device
    devices = load_devices()
    real = Workload(**{**devices.workloads["edge-2b"], "image_hw": tuple(devices.workloads["edge-2b"]["image_hw"])},
                    precision="int8")
    orin = devices.devices["orin-agx-64"]
    assert project(cfg, orin, dataclasses.replace(real, streamed_images=4))["stages_ms"]["prefill"] < \
        project(cfg, orin, real)["stages_ms"]["prefill"]
    assert ms[1] > project(cfg, DEV, w)["stages_ms"]["prefill"]
    s = Shapes(cfg, "int8", "engine")
    T, L = prompt_tokens(cfg, 16, w.image_hw), image_block_rows(cfg, w.image_hw)
    c = streamed_prefill(s, cfg, dataclasses.replace(w, streamed_images=4), T)
    rows = {o.name: o.flops for o in c.ops if o.name == "qkv"}
    llm = cfg.target.llm
    per_row = 2 * llm.hidden * (llm.heads + 2 * llm.kv_heads) * llm.head_dim * llm.layers
    draft = s.draft(T, T, w.max_len, 1)
    draft_qkv = sum(o.flops for o in draft.ops if o.name == "qkv")
    assert sum(o.flops for o in c.ops if o.name == "qkv") - draft_qkv == pytest.approx(
        per_row * (4 * L + T - 16 * L), rel=1e-6), rows
    with pytest.raises(ConfigError, match="streamed_images"):
        Workload(images=8, streamed_images=9)
