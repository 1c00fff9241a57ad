"""Where the draft is accepted: who produced each reasoning token, split by routine vs commitment
words and by scenario family, and a picture of one scene's chain of causation.

The planner's step observer (runtime.step.StepRecord) gives, per decode step, the draft's
proposals d (k ids), the verify width and the time of both calls. The labels then follow from
the proposals and the final sequence alone:
greedy accepts d[i] iff it equals the target's choice, which is the emitted token, so

    n = number of leading d[i] equal to the generated tokens at the step's position
    d[:n] -> "draft";  the step's own token -> "corrected" (n < k), "bonus" (n == k > 0),
                                               "target" (k == 0, a plain step)

(this also holds for speculative sampling: a rejected x has p(x) < q(x), so the residual never
draws x again). The first reasoning token comes from the prefill ("prefill"); a <|cot_end|>
forced by the budget or the length limit is "forced".

Routine vs commitment (scenes/language.py): the routine clauses, read off the ego history, come
first; the commitment (cause, details, decision, <|cot_end|>) follows. The generated text is
parsed by the language's grammar; its leading routine clauses, encoded on their own, give the
number of routine tokens (a clause boundary is a word boundary, and no token spans two words).
"""
from __future__ import annotations


SOURCES = ("prefill", "draft", "corrected", "bonus", "target", "forced")
COLORS = {"draft": "#3a9a4a", "corrected": "#e07b22", "bonus": "#3b6fd4", "target": "#9a9a9a",
          "prefill": "#6b4fa8", "forced": "#c22"}
CLASSES = ("routine", "commitment")


def label_tokens(steps, generated, forced_end: bool) -> tuple[list[str], list[int]]:
    """Labels of `generated` (reasoning ids + the closing <|cot_end|>) and the step index of each
    token (-1: prefill / forced). `steps`: the reasoning phase's Steps, in order."""
    gen = [int(x) for x in generated]
    labels, owner, p = ["prefill"], [-1], 1
    for j, s in enumerate(steps):
        n = 0
        while n < s.k and p + n < len(gen) and int(s.draft[n]) == gen[p + n]:
            n += 1
        labels += ["draft"] * n
        owner += [j] * n
        p += n
        if p < len(gen) - (1 if forced_end else 0):
            labels.append("target" if s.k == 0 else "corrected" if n < s.k else "bonus")
            owner.append(j)
            p += 1
    if p != len(gen) - (1 if forced_end else 0):
        raise ValueError(f"the recorded steps explain {p} of {len(gen)} reasoning tokens: the "
                         "recording does not match this cycle")
    if forced_end:
        labels.append("forced")
        owner.append(-1)
    return labels, owner


def routine_tokens(tok, text: str) -> int:
    """Tokens of the routine clauses at the head of a reasoning text (module docstring)."""
    from scenes.language import routine_length

    words = text.split()
    n = routine_length(words)
    return len(tok.encode(" ".join(words[:n]))) if n else 0


def token_classes(n_tokens: int, n_routine: int) -> list[str]:
    """routine / commitment per generated token: the first n_routine tokens are routine."""
    return ["routine" if i < n_routine else "commitment" for i in range(n_tokens)]


def cycle_record(steps, generated, n_routine: int, forced_end: bool) -> dict:
    """Per-token labels and classes of one cycle, plus the judged proposals per class."""
    labels, owner = label_tokens(steps, generated, forced_end)
    classes = token_classes(len(labels), n_routine)
    judged = {c: 0 for c in CLASSES}
    for j, s in enumerate(steps):       # proposals judged: the accepted ones and the first rejection
        mine = [i for i, o in enumerate(owner) if o == j]
        if not mine or s.k == 0:
            continue
        n = sum(labels[i] == "draft" for i in mine)
        rejected = labels[mine[-1]] == "corrected"     # none after a bonus or an accepted stop
        for i in mine[:n + rejected]:
            judged[classes[i]] += 1
    return {"labels": labels, "owner": owner, "classes": classes, "judged": judged}


def result_record(res, steps, tok) -> dict:
    """cycle_record of one planner result (runtime.cycle.CycleResult): its reasoning ids and the
    closing <|cot_end|>, the routine clauses found in its own text."""
    gen = list(res.reasoning_ids) + [tok.cot_end]
    return cycle_record(steps, gen, routine_tokens(tok, res.reasoning), forced_end=res.stop_reason != "stop")


def class_acceptance(record: dict) -> dict:
    """{class: [accepted, judged]} proposals of one cycle record."""
    accepted = {c: 0 for c in CLASSES}
    for lab, cls in zip(record["labels"], record["classes"]):
        accepted[cls] += lab == "draft"
    return {c: [accepted[c], record["judged"][c]] for c in CLASSES}


def split_stats(records) -> dict:
    """tau, acceptance rate and draft share per class over cycle records (module docstring).
    A step's tokens may span both classes: each token carries 1/e of its step (e = the step's
    emitted tokens), so tau_class = tokens / steps and the classes add up to the overall tau."""
    acc = {c: {"tokens": 0, "steps": 0.0, "draft": 0, "judged": 0} for c in CLASSES}
    for r in records:
        sizes: dict[int, int] = {}
        for o in r["owner"]:
            sizes[o] = sizes.get(o, 0) + 1
        for lab, o, cls in zip(r["labels"], r["owner"], r["classes"]):
            if o < 0:
                continue
            acc[cls]["tokens"] += 1
            acc[cls]["steps"] += 1.0 / sizes[o]
            acc[cls]["draft"] += lab == "draft"
        for cls, n in r["judged"].items():
            acc[cls]["judged"] += n
    return {c: _rates(a) for c, a in acc.items()}


def _rates(a: dict) -> dict:
    return {"tokens": a["tokens"], "steps": round(a["steps"], 3),
            "tau": round(a["tokens"] / a["steps"], 4) if a["steps"] else None,
            "accept_rate": round(a["draft"] / a["judged"], 4) if a["judged"] else None,
            "draft_share": round(a["draft"] / a["tokens"], 4) if a["tokens"] else None}


def where_accepted(records_by_family: dict) -> dict:
    """{family: [records]} -> by class overall, and per family (tau, acceptance, counts)."""
    every = [r for rs in records_by_family.values() for r in rs]
    families = {f: split_stats(rs) for f, rs in sorted(records_by_family.items())}
    for f, rs in sorted(records_by_family.items()):
        families[f]["all"] = _overall(rs)
    return {"by_class": split_stats(every), "all": _overall(every), "by_family": families}


def _overall(records) -> dict:
    s = split_stats(records)
    tot = {key: sum(s[c][key] or 0 for c in CLASSES) for key in ("tokens", "steps")}
    draft = sum(r["labels"].count("draft") for r in records)
    judged = sum(sum(r["judged"].values()) for r in records)
    return {"tokens": tot["tokens"], "tau": round(tot["tokens"] / tot["steps"], 4) if tot["steps"] else None,
            "accept_rate": round(draft / judged, 4) if judged else None}


def layout(words, width: float = 96.0) -> list[tuple[float, int]]:
    """(x centre, line) of each word: words flow left to right in character units, wrapping at
    `width` characters (one space between words)."""
    out, x, line = [], 0.0, 0
    for w in words:
        n = len(w) + 1.5
        if x + n > width and x > 0:
            x, line = 0.0, line + 1
        out.append((x + n / 2, line))
        x += n
    return out


def plot_scene(path, words, labels, classes, title: str, width: float = 96.0) -> None:
    """One scene's CoC, each word on a box colored by who produced it; routine words outlined."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = layout(words, width)
    rows = 1 + max((line for _, line in pos), default=0)
    fig, ax = plt.subplots(figsize=(12, 1.3 + 0.5 * rows))
    ax.set_xlim(0, width)
    ax.set_ylim(-rows - 1.0, 0.7)
    ax.axis("off")
    for (x, line), w, lab, cls in zip(pos, words, labels, classes):
        ax.text(x, -line, w, ha="center", va="center", fontsize=10, color="white", family="monospace",
                bbox={"boxstyle": "round,pad=0.3", "fc": COLORS[lab],
                      "ec": "black" if cls == "routine" else COLORS[lab], "lw": 1.4})
    x = 0.0
    for lab in (s for s in SOURCES if s in set(labels)):
        ax.text(x, -rows - 0.5, lab, fontsize=9, color="white",
                bbox={"boxstyle": "round,pad=0.25", "fc": COLORS[lab], "ec": COLORS[lab]})
        x += len(lab) + 4
    ax.text(width, -rows - 0.5, "black outline: routine words (read off the ego history)",
            ha="right", fontsize=8)
    ax.set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
