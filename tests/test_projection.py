"""The roofline projection (bench/roofline/projection.py, bench/common/costs.py), the devices table and the validation rows."""
import dataclasses

import pytest

from models.config import load_preset
from models.sizes import param_counts
from core.config import ConfigError
from bench.common.costs import Device, Shapes, Workload, prompt_tokens
from bench.roofline.projection import memory_report, project, remedies, stage_costs
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
    from bench.common.costs import image_block_rows
    from bench.roofline.projection import streamed_prefill

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


# --- token trees: verify widths, the tree's draft, the reasoning stage against the chain -------------
def _edge_2b(device: str, **changes):
    devices = load_devices()
    wl = devices.workloads["edge-2b"]
    w = Workload(**{**wl, "image_hw": tuple(wl["image_hw"])}, precision="int8", k=8, tau=4.0)
    return load_preset("edge-2b"), devices.devices[device], dataclasses.replace(w, **changes)


@pytest.mark.parametrize("device", ["orin-agx-64", "thor"])
def test_a_verify_costs_more_with_its_width_but_nearly_nothing_where_memory_bound(device):
    """edge-2b INT8 on Orin and Thor: verify ms never falls as the width grows (1..65), and a
    verify of 33 rows costs under 5 % more than one row (each weight is read once per pass);
    on a compute-starved device the same widths cost several times more."""
    from bench.roofline.projection import project_trees
    from runtime.tree import TreeShape

    cfg, dev, w = _edge_2b(device)
    trees = [(TreeShape(n, min(n, 8), 4), None) for n in range(1, 65)]
    verify = project_trees(cfg, dev, w, trees)["verify_ms"]
    ms = [verify[width] for width in sorted(verify)]
    assert list(verify) == list(range(1, 66)) and ms == sorted(ms)
    assert verify[33] / verify[1] < 1.05, (verify[1], verify[33])
    slow = dataclasses.replace(dev, fp16_tflops=0.5, int8_tops=1.0)
    starved = project_trees(cfg, slow, w, trees[31:32])["verify_ms"]     # 32 nodes: width 33
    assert starved[33] / starved[1] > 3


def test_a_tree_is_priced_as_depth_draft_calls_and_one_verify_of_its_width():
    """A tree's draft is d calls: the root's feed, then d - 1 calls of the K best candidates (K rows
    each: with top-K 1 exactly the k = d chain's draft, and in the memory-bound regime K rows cost
    under 2 % more); its step adds one verify of 1 + nodes and the path's row moves; the reasoning
    stage is ceil(N / tau) steps. A chain written as a tree (top-K 1) at the chain's tau prices
    within 1 % of the chain; at the tau it says it needs, a tree is exactly the goal below."""
    from bench.roofline.projection import project_trees, stage_costs, tree_step_costs
    from runtime.tree import TreeShape

    cfg, dev, w = _edge_2b("orin-agx-64")
    chain_draft = stage_costs(cfg, w, dev.impl)["draft_step"].ms(dev, "int8") * 8
    draft = {K: tree_step_costs(cfg, w, dev.impl, TreeShape(16, 8, K), 5.0)["draft"].ms(dev, "int8") for K in (1, 4)}
    assert draft[1] == pytest.approx(chain_draft) and 1 < draft[4] / draft[1] < 1.02
    out = project_trees(cfg, dev, w, [(TreeShape(8, 8, 1), 4.0), (TreeShape(16, 8, 4), 5.0), (TreeShape(32, 8, 8), None)])
    as_chain, t16, t32 = out["trees"]
    assert out["chain"]["reasoning_ms"] == pytest.approx(project(cfg, dev, w)["speculative"]["reasoning_ms"])
    assert 0 < -as_chain["below_chain"] < 0.01
    assert t16["width"] == 17 and t16["verify_ms"] == pytest.approx(out["verify_ms"][17])
    assert t16["reasoning_ms"] == pytest.approx(8 * t16["step_ms"])          # ceil(40 / 5) steps
    assert t16["below_chain"] == pytest.approx(1 - t16["reasoning_ms"] / out["chain"]["reasoning_ms"])
    assert t32["reasoning_ms"] is None and out["best"] == "16,8,4" and out["met"] == (t16["below_chain"] >= 0.15)
    need = t16["tau_needed"]                         # the fewest whole steps within 85 % of the chain
    steps = round(40 / need)
    assert steps == pytest.approx(40 / need) and steps * t16["step_ms"] <= 0.85 * out["chain"]["reasoning_ms"]
    assert (steps + 1) * t16["step_ms"] > 0.85 * out["chain"]["reasoning_ms"]
    with pytest.raises(ConfigError, match="tau"):
        project_trees(cfg, dev, w, [(TreeShape(16, 4, 4), 5.5)])           # a depth-4 tree gives at most 5


def test_the_roofline_command_takes_tree_taus_from_a_bench_record(tmp_path, capsys):
    """--bench: the trees the record ran and their tau, the k = 8 chain's tau of the same draft;
    --tree-tau must give one tau per tree; a bad --trees exits 2 naming what is allowed."""
    import json

    from bench.roofline.command import RooflineRun, tree_taus
    from tools.cli import main

    rec = {"modes": [{"name": "plain", "draft": "none", "k": 0, "tau": 1.0},
                     {"name": "flat k=8", "draft": "flat", "k": 8, "tau": 4.2},
                     {"name": "flat tree 16,8,4", "draft": "flat", "k": 8, "tau": 5.1, "tree": "16,8,4"},
                     {"name": "flat adaptive tree 16,8,4", "draft": "flat", "k": "adaptive", "tau": 4.9,
                      "tree": "16,8,4"}]}
    (tmp_path / "b.json").write_text(json.dumps(rec))
    trees, chain = tree_taus(RooflineRun(bench=tmp_path / "b.json"), 8)
    assert [(str(t), tau) for t, tau in trees] == [("16,8,4", 5.1)] and chain == 4.2
    trees, chain = tree_taus(RooflineRun(bench=tmp_path / "b.json", trees=("32,8,8",)), 4)
    assert [(str(t), tau) for t, tau in trees] == [("32,8,8", None)] and chain is None
    with pytest.raises(ConfigError, match="2 values for 1 --trees"):
        tree_taus(RooflineRun(trees=("16,8,4",), tree_tau=(4.0, 5.0)), 8)
    out = tmp_path / "r.json"
    assert main(["roofline", "--preset", "edge-2b", "--device", "orin-agx-64", "--k", "8",
                 "--bench", str(tmp_path / "b.json"), "--json", str(out)]) == 0
    t = json.loads(out.read_text())["token_trees"]
    assert t["chain"]["tau"] == 4.2 and t["trees"][0]["tau"] == 5.1 and "best tree 16,8,4" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["roofline", "--preset", "edge-2b", "--trees", "16,0,4"])
    assert e.value.code == 2 and "depth=0 is not allowed" in capsys.readouterr().err
