"""Roofline projection of one planning cycle from a model preset's shapes and a device's peaks.

Each engine call is priced by bench/common/costs.py (the roofline model: max of compute and
memory time per operation); a cycle sums them. Batch 1, one cycle:

    vision      the ViT over every encoded image (attention inside each image), patch embed, mergers
    prefill     the target over the prompt, then the draft over it (its cache is written too)
    draft call  one per speculative step: a feed step (one row of the target's features through
                the draft's fc fusion, then its layers and head) and k - 1 chain steps (the
                draft's own hidden: no fc); "draft_step" is the call / k, the cost per proposal
                (the c of tools.measure_c)
    verify(w)   one target forward of w = k + 1 tokens (w = 1: a plain decode step)
    reasoning   plain: N verify(1); speculative: ceil(N / tau) steps of k draft steps + verify(k+1);
                on drives a share of the steps is proposed by lookup (the last cycles' reasoning):
                those cost no draft step (lookup_share)
    trajectory  the target rewrites the N reasoning rows, then `euler_steps` expert forwards over
                samples x 64 action tokens reading the target's cache (shared by the draws)
    tree step   a token tree (runtime/tree.py) of N nodes, depth d, top-K, drafted EAGLE-2 style
                as the torch backend drafts it (whose tau `specdrive bench --trees` measures): a
                feed of the root, then d - 1 calls of the K best candidates of a depth (K rows
                under a tree mask, top-K on the device); one verify of w = 1 + N (the tree mask
                costs what a causal one does: a dense kernel computes every score); then the
                accepted path's K/V rows moved where a chain has them (tau - 1 rows of every
                layer, read and written): `tree_step_costs`. The graph backends' draft graphs take
                no tree mask: they feed one node per depth (the same d calls, of one row each, and
                a logits row back to the host per call), so their trees are narrower
"""
from __future__ import annotations

import math

from bench.common.costs import (PRECISIONS, Cost, Device, Shapes, Workload, act_bytes,
                                image_blocks_cost, kv_bytes, prompt_tokens, streamed_rest)
from core.config import check_range
from core.graphs import DRAFT_CHAIN, DRAFT_FEED
from models.config import ModelConfig
from models.sizes import param_counts


def streamed_prefill(s: "Shapes", cfg: ModelConfig, w: Workload, T: int) -> Cost:
    """Streaming prefill (runtime/reuse.py): the new frames' image blocks in one call, each block
    attending to itself alone (L keys); the kept blocks' keys rotated to their rows (read and
    written once); the rows outside the images in one call over the whole prompt (the text
    before the images, a few rows, priced with them); the draft's prompt rows as before."""
    c = image_blocks_cost(s, cfg, w.streamed_images, w.image_hw)
    c.extend(streamed_rest(s, cfg, w, T))
    return c


def stage_costs(cfg: ModelConfig, w: Workload, impl: str) -> dict:
    """{call: Cost} of every engine call of one cycle (the draft's feed and chain steps and their
    mean per proposal, one verify per width)."""
    s = Shapes(cfg, w.precision, impl)
    T = w.prompt_len or prompt_tokens(cfg, w.images, w.image_hw)
    N, ref = w.reasoning_tokens, impl == "reference"
    ctx = T + N / 2                                     # mean valid rows while reasoning
    if w.streamed_images is None:
        prefill = s.target(T, T, w.max_len, T if ref else 1)
        prefill.extend(s.draft(T, T, w.max_len, T if ref else 1))
    else:
        prefill = streamed_prefill(s, cfg, w, T)
    traj = s.target(N + 1, T + N + 1, w.max_len, N + 1 if ref else 0)   # rewrite of the reasoning rows
    traj.extend(s.expert(w.samples, T + N + 1), w.euler_steps)
    enc = w.images if w.encoded_images is None else w.encoded_images
    feed, chain, step = s.draft(1, ctx, w.max_len, 1), s.draft(1, ctx, w.max_len, 1, fc=False), Cost()
    k = max(w.k, 1)
    step.extend(feed, 1 / k)                            # one feed + (k - 1) chain steps per call
    step.extend(chain, (k - 1) / k)
    return {"prompt_len": T, "vision": s.vision(enc, w.image_hw), "prefill": prefill,
            DRAFT_FEED: feed, DRAFT_CHAIN: chain, "draft_step": step,
            "verify": {width: s.target(width, ctx, w.max_len, width) for width in {1, w.k + 1}},
            "trajectory": traj}


def tree_step_costs(cfg: ModelConfig, w: Workload, impl: str, shape, tau: float) -> dict:
    """{draft, verify, moves} Cost of one token-tree step of `shape` (runtime.tree.TreeShape) that
    emits `tau` tokens (module docstring); the valid rows are the reasoning's mean, as a chain's."""
    s = Shapes(cfg, w.precision, impl)
    T = w.prompt_len or prompt_tokens(cfg, w.images, w.image_hw)
    ctx, llm, K = T + w.reasoning_tokens / 2, cfg.target.llm, shape.topk
    draft = s.draft(1, ctx, w.max_len, 1)
    draft.extend(s.draft(K, ctx, w.max_len, K, fc=False), shape.depth - 1)
    moves = Cost()
    moves.add("row_moves", 0, 2 * (tau - 1) * llm.layers * 2 * llm.kv_heads * llm.head_dim * s.kv)
    width = 1 + shape.nodes
    return {"draft": draft, "verify": s.target(width, ctx, w.max_len, width), "moves": moves}


def project_trees(cfg: ModelConfig, dev: Device, w: Workload, trees, goal: float = 0.15,
                  prices: dict | None = None) -> dict:
    """Token trees against the chain of `w` (k, tau): [(TreeShape, tau or None)] -> the verify ms
    of every width, and per tree its step's ms; with its tau, its reasoning stage (ceil(N / tau)
    steps) and how far below the chain's it is; always the tau it would need to be `goal` below
    (`tau_needed`: N over the most whole steps that fit, as the reasoning stage counts them; None
    when not even one step fits). `prices` (a measured floor, bench/roofline/measured.py
    measured_prices): every verify from its measured width curve, the chain's draft steps and a
    tree's first (feed) call from the measured draft steps; the rest as priced here."""
    N, widths = w.reasoning_tokens, sorted({1, w.k + 1, *(1 + t.nodes for t, _ in trees)})
    s = Shapes(cfg, w.precision, dev.impl)
    ctx = (w.prompt_len or prompt_tokens(cfg, w.images, w.image_hw)) + N / 2
    if prices is None:
        chain = project(cfg, dev, w)["speculative"]["reasoning_ms"]
        verify = {wd: s.target(wd, ctx, w.max_len, wd).ms(dev, w.precision) for wd in widths}
    else:
        verify = {wd: prices["verify"](wd) for wd in widths}
        steps = math.ceil(N / w.tau) if w.k else N
        chain = steps * ((1 - w.lookup_share) * w.k * prices["draft_step"] + verify[w.k + 1]) if w.k \
            else N * verify[1]
    rows = []
    for shape, tau in trees:
        if tau is not None:
            check_range(f"tree {shape} tau", tau, lo=1.0, hi=shape.depth + 1.0)
        ms = {k: c.ms(dev, w.precision) for k, c in tree_step_costs(cfg, w, dev.impl, shape, tau or 1.0).items()}
        if prices is not None:
            ms["verify"] = verify[1 + shape.nodes]
            wide = s.draft(shape.topk, ctx, w.max_len, shape.topk, fc=False).ms(dev, w.precision)
            one = s.draft(1, ctx, w.max_len, 1, fc=False).ms(dev, w.precision)
            ms["draft"] = prices[DRAFT_FEED] + (shape.depth - 1) * prices[DRAFT_CHAIN] * wide / one
        step = sum(ms.values())
        row = {"tree": str(shape), "width": 1 + shape.nodes, **{f"{k}_ms": v for k, v in ms.items()},
               "step_ms": step, "tau": tau, "reasoning_ms": None, "below_chain": None,
               "tau_needed": tau_for(N, step, (1 - goal) * chain)}
        if tau is not None:
            row["reasoning_ms"] = math.ceil(N / tau) * step
            row["below_chain"] = 1 - row["reasoning_ms"] / chain if chain else None
        rows.append(row)
    priced = [r for r in rows if r["reasoning_ms"] is not None]
    best = min(priced, key=lambda r: r["reasoning_ms"]) if priced else None
    return {"verify_ms": verify, "chain": {"k": w.k, "tau": w.tau, "reasoning_ms": chain}, "trees": rows,
            "best": best and best["tree"], "goal": goal,
            "met": None if best is None else bool(best["below_chain"] is not None and best["below_chain"] >= goal)}


def tau_for(tokens: float, step_ms: float, within_ms: float) -> float | None:
    """The smallest tau whose ceil(tokens / tau) steps of step_ms fit within_ms (None: not one)."""
    steps = math.floor(within_ms / step_ms) if step_ms > 0 else 0
    return tokens / steps if steps >= 1 else None


def project(cfg: ModelConfig, dev: Device, w: Workload) -> dict:
    """Per-stage ms for plain and speculative decoding, and whether the cycle fits the budget."""
    costs = stage_costs(cfg, w, dev.impl)
    ms = {name: costs[name].ms(dev, w.precision)
          for name in ("vision", "prefill", DRAFT_FEED, DRAFT_CHAIN, "draft_step", "trajectory")}
    verify = {width: c.ms(dev, w.precision) for width, c in costs["verify"].items()}
    N = w.reasoning_tokens
    steps = math.ceil(N / w.tau) if w.k else N
    plain_reason = N * verify[1]
    spec_reason = steps * ((1 - w.lookup_share) * w.k * ms["draft_step"] + verify[w.k + 1]) if w.k else plain_reason
    fixed = ms["vision"] + ms["prefill"] + ms["trajectory"]
    out = {"prompt_len": costs["prompt_len"], "stages_ms": {**ms, "verify_1": verify[1],
                                                            f"verify_{w.k + 1}": verify[w.k + 1]},
           "plain": _cycle(fixed, plain_reason, w), "speculative": _cycle(fixed, spec_reason, w),
           "premise_ok": fixed + w.margin_ms <= w.budget_ms}
    left = w.budget_ms - w.margin_ms - fixed          # time the reasoning may take
    per_token = {"plain": verify[1], "speculative": spec_reason / N if N else 0.0}
    out["tokens_in_budget"] = {m: (max(int(left // t), 0) if t > 0 else N) for m, t in per_token.items()}
    return out


def drive_cycle(cfg: ModelConfig, dev: Device, w: Workload, new_images: int, lookup_share: float,
                streaming: bool = False) -> dict:
    """The cycle on a drive: the ViT encodes only the `new_images` frames not seen before (the
    others' features are reused: every frame time on the 10 Hz grid leaves one new frame per
    camera), and `lookup_share` of the speculative steps cost no draft step; `streaming`: the
    prefill computes the new frames' image blocks only (a frame_local target)."""
    import dataclasses

    new = min(new_images, w.images)
    return project(cfg, dev, dataclasses.replace(w, encoded_images=new, lookup_share=lookup_share,
                                                 streamed_images=new if streaming else None))


def _cycle(fixed: float, reasoning: float, w: Workload) -> dict:
    total = fixed + reasoning
    return {"reasoning_ms": reasoning, "cycle_ms": total, "fits": total + w.margin_ms <= w.budget_ms}


REMEDIES = (   # (label, changes to the Workload), tried one by one, kept when they help
    ("4-bit weights (INT4 AWQ; NVFP4 where the device has FP4)", {"precision": "4bit"}),
    ("vision features of older frames reused", {"encoded_images": "per_camera"}),
    ("2 Euler steps", {"euler_steps": 2}),
    ("1 expert draw", {"samples": 1}),
    ("1 frame per camera (shorter prompt)", {"images": "per_camera", "encoded_images": "per_camera"}),
)


def remedies(cfg: ModelConfig, dev: Device, w: Workload, cameras: int, smaller: tuple | None = None):
    """Each remedy alone, and accumulated (a remedy joins the set only when it shortens the
    speculative cycle): ms and whether it fits -> (rows, the workload with the kept remedies). `smaller` = (name, ModelConfig) of a smaller
    preset, tried first on the same workload."""
    import dataclasses

    out, acc = [], {}
    best = project(cfg, dev, w)["speculative"]["cycle_ms"]
    if smaller is not None:
        r = project(smaller[1], dev, w)
        out.append({"remedy": f"smaller preset {smaller[0]}", "alone_ms": r["speculative"]["cycle_ms"],
                    "alone_fits": r["speculative"]["fits"], "kept": False})
    for label, change in REMEDIES:
        fp4 = bool(dev.fp4_tflops)
        change = {k: (cameras if v == "per_camera" else ("fp4" if fp4 else "int4") if v == "4bit" else v)
                  for k, v in change.items()}
        if change.get("precision") == w.precision:
            continue
        alone = project(cfg, dev, dataclasses.replace(w, **change))["speculative"]
        trial = project(cfg, dev, dataclasses.replace(w, **{**acc, **change}))
        kept = trial["speculative"]["cycle_ms"] < best
        if kept:
            acc.update(change)
            best = trial["speculative"]["cycle_ms"]
        out.append({"remedy": label, "alone_ms": alone["cycle_ms"], "alone_fits": alone["fits"], "kept": kept,
                    "cumulative_ms": best, "cumulative_fits": best + w.margin_ms <= w.budget_ms})
    return out, dataclasses.replace(w, **acc)


def weights_bytes(cfg: ModelConfig, precision: str) -> dict:
    """Bytes of the weights per component (the draft shares the target's embedding and head)."""
    b = PRECISIONS[precision][0]
    return {k: v * b for k, v in param_counts(cfg).items()}


def memory_report(cfg: ModelConfig, precision: str, prompt_lens, max_len: int, widths, samples: int) -> dict:
    """Weights, K/V caches and activation estimates (bytes) of one preset at one precision.

    activations of a forward of T tokens: the residual, q/k/v, the MLP's gate and up (the
    largest live set of one layer, reused layer after layer) and the logits (T x V, fp32); a
    CUDA graph per verify width keeps such a pool each (upper bound: no sharing between graphs)."""
    llm, a, kv = cfg.target.llm, act_bytes(precision), kv_bytes(precision)
    per_row = lambda L: L.layers * 2 * L.kv_heads * L.head_dim * kv     # noqa: E731
    draft = cfg.draft_llm()

    def act(T: int) -> float:
        live = T * (2 * llm.hidden + (llm.heads + 2 * llm.kv_heads) * llm.head_dim + 2 * llm.intermediate)
        return live * a + T * llm.vocab_size * 4

    e = cfg.expert
    expert_act = samples * e.n_waypoints * (2 * e.hidden + 2 * e.intermediate) * a
    return {"precision": precision, "weights": weights_bytes(cfg, precision),
            "kv_per_token": {"target": per_row(llm), "draft": per_row(draft)},
            "kv_cache": {str(L): {"target": per_row(llm) * L, "draft": per_row(draft) * L}
                         for L in [*prompt_lens, max_len]},
            "activations": {str(wd): act(wd) for wd in widths},
            "graph_pools": sum(act(wd) for wd in widths),
            "prefill_activations": {str(L): act(L) for L in prompt_lens},
            "expert_activations": expert_act}

