"""`specdrive train eval`: the MODEL_CARD numbers of a trained planner folder, per split.

Per scene the target writes its greedy CoC (batched, trajectory tokens masked); then one
teacher-forced target pass over prompt + CoC gives the KV cache the action expert reads and
the features the drafts read.

    target   commitment accuracy (cause and decision), ADE of the expert's trajectory after
             the full CoC, after a cut half-way through it and from the prefill alone
             (the fallback), and of a constant-velocity extrapolation
    drafts   greedy tau at k (tokens per target forward, bonus included) of the exact greedy
             speculative loop, replayed from the draft's chain predictions (models.chain, which
             equals the draft's cached chain), split by routine / commitment steps; and the
             draft's attention mass on history vs vision keys at the reasoning rows
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from models import io
from core.config import ConfigError
from models.chain import attention_probs, chain_forward
from runtime.backend import load_backend
from runtime.config import PlannerConfig, SpecConfig
from runtime.planner import Planner
from scenes import dataset
from train import aarl, claims, config, data, loop, metrics, reasoning
from train import claims_report
from train.card import write_card
from train.config import DataConfig, EvalConfig
from train.teachers import Teacher, build_teachers, draft_inputs


@torch.no_grad()
def expert_ades(expert, target, teachers: list[Teacher], examples, samples: int = 1) -> dict:
    """ADE of the expert after the full CoC, after CoC[:half] + a forced <|cot_end|> (a budget
    cut, as the runtime closes it), after the prefill only (the fallback); constant velocity.
    `samples` draws are averaged per trajectory, as the runtime's trajectory_samples does."""
    out = {"full": [], "half": [], "prefill": [], "const_vel": []}
    for t, e in zip(teachers, examples):
        dev = target.embed_tokens.weight.device
        ids = torch.from_numpy(t.ids)[None].to(dev)
        cache = target.new_cache(1, len(t.ids))
        target(ids, *target.rope(torch.from_numpy(t.positions)[:, None]), cache, 0, *data.vision_embeds(target, e))
        half = t.first + (t.cot_end - t.first) // 2
        for name, n in (("full", t.cot_end + 1), ("prefill", t.first), ("half", half + 1)):
            if name == "half":    # a budget cut: the runtime forces <|cot_end|> after CoC[:half]
                pos = torch.full((1, 1), half + e.rope_delta)
                target(torch.tensor([[tok_cot_end(t)]], device=dev), *target.rope(pos), cache, half)
            wp, _ = expert.sample(cache, n, torch.tensor([e.v0], device=dev), rope_delta=e.rope_delta,
                                  noise=data.expert_noise(expert, e.index, samples, dev), samples=samples)
            out[name].append(metrics.ade(wp[0].cpu().numpy(), e.future))
        out["const_vel"].append(metrics.ade(metrics.constant_velocity(e.v0), e.future))
    return {k: float(np.mean(v)) for k, v in out.items()}


def tok_cot_end(t: Teacher) -> int:
    """The <|cot_end|> id: the last token of the teacher's CoC."""
    return int(t.ids[t.cot_end])


TAU_KS = (4, 8, 16)              # tau is reported at these draft lengths
FREE_K = 16                      # the free-running accepted length is measured up to this many tokens


@torch.no_grad()
def draft_numbers(draft, teachers: list[Teacher], tok, k: int, routine_ends: list[int], families=None,
                  gap: int = 0) -> dict:
    """Greedy tau at k (all, routine, commitment steps) and at TAU_KS; per-token acceptance alpha
    (the draft's next token equals the target's after the exact prefix) over routine and
    commitment tokens and per family; the free-running accepted length (drafted tokens accepted
    per step when k does not stop the draft, capped at FREE_K, with the share of steps that hit
    the cap); attention mass on history / vision keys. `gap`: the draft's positions as it was
    distilled with them (train.teachers, DistillConfig.position_gap)."""
    text = torch.from_numpy(tok.text_mask()).to(draft.norm.weight.device)
    K = max(k, FREE_K, *TAU_KS)
    tot = {"all": [0, 0], "routine": [0, 0], "commitment": [0, 0]}
    at_k = {kk: [0, 0] for kk in TAU_KS}
    alpha = {"routine": [], "commitment": []}
    fam_alpha, free, capped, per_scene = {}, [], [], []
    mass = {kind: [] for kind in KEY_KINDS}
    for b0 in range(0, len(teachers), 8):
        chunk = teachers[b0:b0 + 8]
        ids, cos, sin, features, image_embeds = draft_inputs(chunk, draft, tok.pad, gap)
        first = chunk[0].first
        passes = chain_forward(draft, ids, cos, sin, features, image_embeds, first, K)
        for b, t in enumerate(chunk):
            acc = np.zeros((K, ids.shape[1] + K), bool)
            for p in range(K):          # a standalone draft has one pass: every chain step reads it
                logits, _, rows = passes[min(p, len(passes) - 1)]
                pred = draft.to_target(logits[b]).masked_fill(~text, float("-inf")).argmax(-1)   # a reduced head: its rows
                nxt = ids[b, rows[0] + 1:].tolist() + [-1]
                acc[p, rows[0] - p:rows[0] - p + len(rows)] = pred.cpu().numpy() == np.array(nxt[:len(rows)])
            r_end = routine_ends[b0 + b]
            n, f, parts = metrics.greedy_tau(acc[:k], t.first, t.cot_end, k, r_end)
            rec = {"n": n, "f": f, "cut": [metrics.emitted_within(acc[:k], t.first, t.cot_end, k, p)
                                           for p in BUDGET_PASSES]}
            tot["all"][0] += n
            tot["all"][1] += f
            for name, (pn, pf) in parts.items():
                tot[name][0] += pn
                tot[name][1] += pf
            for kk in TAU_KS:
                n2, f2, _ = metrics.greedy_tau(acc[:kk], t.first, t.cot_end, kk)
                at_k[kk][0] += n2
                at_k[kk][1] += f2
            rows = np.arange(t.first, t.cot_end)             # token at row r + 1, proposed from row r
            hits = acc[0, rows]
            alpha["routine"] += hits[rows + 1 < r_end].tolist()
            alpha["commitment"] += hits[rows + 1 >= r_end].tolist()
            rec["routine"] = [int(hits[rows + 1 < r_end].sum()), int((rows + 1 < r_end).sum())]
            rec["commitment"] = [int(hits[rows + 1 >= r_end].sum()), int((rows + 1 >= r_end).sum())]
            rec["hits"] = hits.astype(int).tolist()     # alpha by position within the CoC
            if families is not None:
                fam_alpha.setdefault(families[b0 + b], []).extend(hits.tolist())
            run, cap = metrics.free_running(acc, t.first, t.cot_end, K)
            free += run
            capped += cap
            rec["free"] = [int(sum(run)), len(run)]
            per_scene.append(rec)
        for rec, layers in zip(per_scene[b0:], attention_mass(draft, ids, cos, sin, features, image_embeds, chunk, tok)):
            rec["attn"] = layers                        # {kind: [mass per layer]}
            for kind in KEY_KINDS:
                mass[kind].append(float(np.mean(layers[kind])))
    out = {f"tau_{name}" if name != "all" else "tau": n / max(f, 1) for name, (n, f) in tot.items()}
    out.update({f"tau_k{kk}": n / max(f, 1) for kk, (n, f) in at_k.items()})
    out.update({f"alpha_{name}": float(np.mean(v)) if v else float("nan") for name, v in alpha.items()})
    out["alpha"] = float(np.mean(alpha["routine"] + alpha["commitment"]))
    out["free_running"] = float(np.mean(free)) if free else 0.0
    out["free_running_capped"] = float(np.mean(capped)) if capped else 0.0
    if families is not None:
        out["alpha_families"] = {f: float(np.mean(v)) for f, v in sorted(fam_alpha.items())}
    out.update({f"attn_{name}": float(np.mean(v)) for name, v in mass.items()})
    out["attn_layers"] = {kind: np.mean([r["attn"][kind] for r in per_scene], 0).tolist() for kind in KEY_KINDS}
    out["intervals"] = claims.intervals(per_scene)
    out["per_scene"] = per_scene
    return out


KEY_KINDS = ("history", "vision", "text")   # every key is one: history bins, image pads, the rest
BUDGET_PASSES = (2, 4, 6)                   # target passes a budget allows (budgeted action quality)


def attention_mass(draft, ids, cos, sin, features, image_embeds, chunk, tok) -> list[dict]:
    """Per scene and layer: attention probability (mean over heads and reasoning rows) on the
    history-token keys, the vision-token keys and every other (text) key (pass 0: the draft's
    causal forward). The three add up to 1."""
    hist = ((ids >= tok.hist_ids.start) & (ids < tok.hist_ids.stop)).float()
    vis = (ids == tok.image_pad).float()
    kinds = {"history": hist, "vision": vis, "text": 1.0 - hist - vis}
    probs = attention_probs(draft, ids, cos, sin, features, image_embeds)      # (B, H, T, T) each
    per = {kind: torch.stack([(p * m[:, None, None]).sum(-1).mean(1) for p in probs])   # (L, B, T)
           for kind, m in kinds.items()}
    return [{kind: [float(v[layer, b, t.first:t.cot_end].mean()) for layer in range(v.shape[0])]
             for kind, v in per.items()} for b, t in enumerate(chunk)]


@torch.no_grad()
def evaluate_split(cfg, split: str, tok, model_cfg, target, expert, drafts: dict) -> dict:
    data_cfg = DataConfig(dir=cfg.data.dir, split=split, max_scenes=cfg.data.max_scenes)
    exs = data.load_examples(data_cfg, tok, model_cfg.target.vision)
    scenes = dataset.load(cfg.data.dir, split)
    toks = []
    for s in range(0, len(exs), cfg.batch):
        t, n = reasoning.greedy_reasoning(target, exs[s:s + cfg.batch], tok, cfg.max_new_tokens)
        toks += [t[i, :n[i]].numpy() for i in range(len(n))]
    words = [tok.decode(t[t != tok.cot_end]).split() for t in toks]
    right = [metrics.commitment_correct(w, scenes[e.index]) for w, e in zip(words, exs)]
    with_r = [reasoning.with_reasoning(e, t, tok) for e, t in zip(exs, toks)]
    teachers = build_teachers(target, with_r, tuple(model_cfg.draft.feature_layers), cfg.batch)
    out = {"scenes": len(exs),
           "cause_acc": float(np.mean([c for c, _ in right])),
           "decision_acc": float(np.mean([d for _, d in right])),
           "commitment_acc": float(np.mean([c and d for c, d in right])),
           "coc_tokens": float(np.mean([len(t) for t in toks])),
           "ended": float(np.mean([tok.cot_end in t for t in toks]))}
    fams = [scenes[e.index].family for e in exs]
    out["families"] = {f: {"scenes": fams.count(f),
                           "commitment_acc": float(np.mean([c and d for (c, d), g in zip(right, fams) if g == f]))}
                       for f in sorted(set(fams))}
    out["ade"] = expert_ades(expert, target, teachers, exs, cfg.trajectory_samples)
    routine_ends = [t.first + routine_tokens(tok, w) for t, w in zip(teachers, words)]
    by_layers = {tuple(model_cfg.draft.feature_layers): teachers}    # an EAGLE-3 draft reads other layers
    for d in drafts.values():
        layers = tuple(d.cfg.feature_layers)
        if d.cfg.features == "fused" and layers not in by_layers:
            by_layers[layers] = build_teachers(target, with_r, layers, cfg.batch)
    drafts_teachers = {name: by_layers.get(tuple(d.cfg.feature_layers), teachers) for name, d in drafts.items()}
    out["drafts"] = {name: draft_numbers(d, drafts_teachers[name], tok, cfg.k, routine_ends, fams)
                     for name, d in drafts.items()}
    if cfg.budget_action:
        out["budget_action"] = claims.budget_action(expert, target, teachers, exs, scenes, tok, out["drafts"],
                                                    BUDGET_PASSES, cfg.trajectory_samples)
    if split == "test" and cfg.runtime_scenes:
        shipped = [n for n in drafts if (Path(cfg.planner) / n).exists()]
        out["runtime_loop"] = runtime_check(cfg, tok, shipped, toks)
        n = min(cfg.runtime_scenes, len(teachers))
        for name in shipped:     # the replay on the same scenes, for a like-for-like comparison
            out["runtime_loop"][name]["replay_tau"] = draft_numbers(
                drafts[name], drafts_teachers[name][:n], tok, cfg.k, routine_ends[:n])["tau"]
    return out


def aarl_reward(cfg: EvalConfig, tok, model_cfg, target, expert, drafts: dict) -> dict:
    """The AARL reward (train.aarl.score_draft, settings from cfg.aarl_config) of each draft on
    the first `aarl_scenes` heldout scenes, every draft on the same seeded rollouts."""
    acfg = config.load("aarl", cfg.aarl_config)
    exs = data.load_examples(DataConfig(dir=cfg.data.dir, split="heldout", max_scenes=cfg.aarl_scenes), tok,
                        model_cfg.target.vision)
    scenes = dataset.load(cfg.data.dir, "heldout")
    items = [(e, scenes[int(e.index)]) for e in exs]
    out = {name: aarl.score_draft(d, target, expert, items, tok, acfg) for name, d in drafts.items()}
    return {"split": "heldout", "config": cfg.aarl_config, **out}


def runtime_check(cfg: EvalConfig, tok, drafts: list[str], reasoning_ids: list) -> dict:
    """tau of the runtime's own loop (runtime.Planner, torch backend, greedy, fixed k) on the
    first test scenes, and whether its reasoning equals the batched greedy reasoning."""
    scenes = dataset.load(cfg.data.dir, "test")
    planner_dir, out = Path(cfg.planner), {}
    for name in drafts:
        be = load_backend("torch", tokenizer=tok, checkpoints={**io.scan_checkpoints(planner_dir)[0],
                          "draft": _draft_path(cfg.planner, name)})
        spec = SpecConfig(k=cfg.k, k_max=cfg.k, adaptive=False)
        planner = Planner(be, tok, PlannerConfig(spec=spec, fallback="inline",
                                                 max_reasoning_tokens=cfg.max_new_tokens,
                                                 trajectory_samples=cfg.trajectory_samples))
        emitted = steps = same = 0
        for i in range(min(cfg.runtime_scenes, len(reasoning_ids))):
            res = planner.plan(scenes[i].images, scenes[i].history)
            emitted, steps = emitted + res.decode["emitted"], steps + res.decode["steps"]
            mine = [int(x) for x in reasoning_ids[i]]
            same += [int(x) for x in res.reasoning_ids] == (mine[:-1] if mine[-1] == tok.cot_end else mine)
        out[name] = {"tau": emitted / max(steps, 1), "same_reasoning": same / max(cfg.runtime_scenes, 1)}
        planner.close()
    return out


def routine_tokens(tok, words: list[str]) -> int:
    """Tokens of the routine clauses at the head of a CoC's words (a clause boundary is a word
    boundary, and no subword token spans two words, so the prefix encodes on its own)."""
    n = metrics.routine_length(words)
    return len(tok.encode(" ".join(words[:n]))) if n else 0


def _draft_path(planner: str, name: str) -> Path:
    """A draft folder name inside the planner folder, or any other path (e.g. another seed's)."""
    inside = Path(planner) / name
    return inside if inside.exists() else Path(name)


def split_key(cfg: EvalConfig, split: str, target_sha: str | None, drafts: list[str]) -> str:
    """What one split's numbers follow from: the target's weights, each draft's weights (by the
    sha256 of its files), the split's scenes and every setting evaluate_split reads. A finished
    split is kept under this key (`_part_path`), so an evaluation stopped part-way (hours on one
    core for `make claims`) goes on from the next split; any change to these recomputes it."""
    import hashlib

    from core.config import file_sha256

    scenes = Path(cfg.data.dir) / split
    listing = sorted((f.name, f.stat().st_size) for f in scenes.iterdir()) if scenes.is_dir() else []
    facts = {"split": split, "target": target_sha, "planner": cfg.planner,
             "drafts": {n: {f.name: file_sha256(f) for f in sorted(_draft_path(cfg.planner, n).iterdir())
                            if f.is_file()} for n in drafts},
             "scenes": [cfg.data.dir, cfg.data.max_scenes, listing],
             "settings": [cfg.device, cfg.k, cfg.max_new_tokens, cfg.batch, cfg.trajectory_samples, cfg.budget_action,
                          cfg.runtime_scenes if split == "test" else 0]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _part_path(cfg: EvalConfig, split: str) -> Path:
    out = Path(cfg.out)
    return out.parent / f"{out.stem}.parts" / f"{split}.json"


def _read_part(path: Path, key: str) -> dict | None:
    """A kept split's numbers when they were made under `key`; None otherwise (or unreadable)."""
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return kept.get("split") if isinstance(kept, dict) and kept.get("key") == key else None


def run(cfg: EvalConfig) -> str:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tok, model_cfg, target, expert = io.load_planner(cfg.planner)
    dev = loop.device(cfg.device)
    target.to(dev)
    expert.to(dev)
    sha = io.target_sha256(io.scan_checkpoints(cfg.planner)[0])
    drafts = {name: io.load_draft(_draft_path(cfg.planner, name), model_cfg, target, target_sha=sha)[1].to(dev)
              for name in cfg.drafts if (_draft_path(cfg.planner, name) / "meta.json").is_file()}
    from core.stamp import results_stamp

    results = {"stamp": results_stamp(cfg.planner), "planner": cfg.planner, "k": cfg.k,
               "image_attention": model_cfg.target.llm.image_attention, "splits": {}}
    for split in cfg.splits:
        key = split_key(cfg, split, sha, list(drafts))
        part = _part_path(cfg, split)
        done = _read_part(part, key)
        if done is not None:
            print(f"{split}: reusing {part} (same target, drafts, scenes and settings)", flush=True)
        else:
            done = evaluate_split(cfg, split, tok, model_cfg, target, expert, drafts)
            part.parent.mkdir(parents=True, exist_ok=True)
            tmp = part.with_suffix(".tmp")
            tmp.write_text(json.dumps({"key": key, "split": done}) + "\n")
            tmp.replace(part)
        results["splits"][split] = done
        print(split, json.dumps(done), flush=True)
    pair = [n for n in ("draft-flat", "draft-flat-aarl") if n in drafts]
    if cfg.aarl_scenes and len(pair) == 2:
        results["aarl_reward"] = aarl_reward(cfg, tok, model_cfg, target, expert, {n: drafts[n] for n in pair})
        print("aarl_reward", json.dumps(results["aarl_reward"]), flush=True)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(json.dumps(results, indent=1) + "\n")
    if cfg.claims:
        claims_report.write(cfg.out, cfg.claims, Path(cfg.claims).parent / "img")
    if cfg.card:
        card(cfg)
    return cfg.out


def card(cfg: EvalConfig) -> str:
    """The model card from the metrics file `cfg.out` that `run` wrote, with cfg's notes."""
    if not cfg.card:
        raise ConfigError("card: this eval config names no card file (card: path/MODEL_CARD.md)")
    if not Path(cfg.out).is_file():
        raise ConfigError(f"card: metrics file {cfg.out} not found; run `specdrive train eval` with this config first")
    write_card(cfg.out, cfg.card, {"vision": cfg.vision_run, "sft": cfg.sft_run, "distill": cfg.distill_run,
                                   "aarl": cfg.aarl_run}, cfg.notes,
               **({"commands": "\n".join(cfg.commands)} if cfg.commands else {}), compare=cfg.compare)
    return cfg.card
