"""The reduced draft head's two curves: coverage of the target's CoC tokens against N (our corpus,
our tokenizer) and the measured draft cost c against N (`python -m tools.measure_c --draft-vocab`
JSON lines: c per proposal at k, and the feed step's c_feed dotted), drawn side by side for
docs/bench.md.

    rows = coverage_rows(data_dir, tok, ns)     [{"n", "coverage", "text_slots"}]
    plot(coverage, measured {preset: [measure_c rows]}, out_png)
"""
from __future__ import annotations

import json
from pathlib import Path

from prompt import draft_vocab


def coverage_rows(data_dir, tok, ns) -> list[dict]:
    """Share of the train split's CoC tokens (each CoC closed by <|cot_end|>) inside the N-token head."""
    from train.vocab import dataset_corpus

    texts = dataset_corpus(data_dir)
    counts = draft_vocab.token_counts(texts, tok)
    counts[tok.cot_end] += len(texts)
    keep = len(draft_vocab.kept_ids(tok))
    return [{"n": n, "coverage": draft_vocab.coverage(counts, draft_vocab.build_d2t(counts, tok, n)),
             "text_slots": n - keep, "distinct_tokens": int((counts > 0).sum())} for n in ns]


def read_measured(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot(coverage: list[dict], measured: dict, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot([r["n"] for r in coverage], [100 * r["coverage"] for r in coverage], "o-")
    a.set_xscale("log", base=2)
    a.set(xlabel="draft head rows N", ylabel="CoC tokens inside the head (%)",
          title="coverage (tiny corpus, BPE 1,766)")
    a.set_xticks([r["n"] for r in coverage], [str(r["n"]) for r in coverage])
    a.minorticks_off()
    a.grid(alpha=0.3)
    for preset, rows in measured.items():
        line, = b.plot([r["draft_vocab"] for r in rows], [r["c"] for r in rows], "o-",
                       label=f"{preset}: c at k = {rows[0].get('k', 1)}")
        if "c_feed" in rows[0]:     # the feed step alone (the target's features through fc)
            b.plot([r["draft_vocab"] for r in rows], [r["c_feed"] for r in rows], ":", color=line.get_color(),
                   label=f"{preset}: c_feed")
    b.axhline(0.04, color="grey", ls="--", lw=1, label="c = 0.04")
    b.set(xscale="log", xlabel="draft head rows N (rightmost: the full head)",
          ylabel="c = draft per proposal / target step", title="measured c, CPU fp32, 1 thread")
    b.legend()
    b.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
