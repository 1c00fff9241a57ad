"""Every rendered table of README.md and docs/ is rendered again from its committed summary
(results/RUN.json, bench/report/summary.py) and must equal the markdown (issue 51).

Cheap: no model runs. The tables are rendered in a copy of the markdown and results/ with no out/
or runs/ (as in a fresh clone) by `specdrive report --check`; an edited number inside a block, or
a summary stamped with another checkpoint, fails it.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench.report import registry, summary
from core.artifacts import folder_fingerprint
from core.config import ConfigError
from core.stamp import blocks

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = folder_fingerprint(ROOT / "checkpoints" / "tiny")
OTHER = "0123456789abcdef" * 4
KEPT = [r for r, run in registry.RUNS.items() if not run.unkept]
CHECKED = [t for t, e in registry.TABLES.items() if all(r in KEPT for r in e.runs)]


def _clone(tmp_path: Path) -> Path:
    """README.md, docs/*.md and results/ as a fresh clone has them (no out/, no runs/)."""
    (tmp_path / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for p in (ROOT / "docs").glob("*.md"):
        shutil.copy(p, tmp_path / "docs" / p.name)
    shutil.copytree(ROOT / "results", tmp_path / "results")
    (tmp_path / "checkpoints").symlink_to(ROOT / "checkpoints")
    return tmp_path


def _check(root: Path, monkeypatch, capsys) -> tuple[int, str]:
    from tools import cli

    monkeypatch.chdir(root)
    rc = cli.main(["report", "--check"])
    return rc, capsys.readouterr().out


def test_every_kept_run_has_its_summary_stamped_with_the_shipped_checkpoint():
    for run in registry.RUNS:
        have = summary.read(run, registry.RUNS[run].outputs, ROOT)
        if run not in KEPT:
            assert have is None, f"results/{run}.json is committed: drop the registry's `unkept` reason of {run!r}"
            continue
        assert have is not None, f"results/{run}.json is missing: run `specdrive report` after the run"
        for out, rec in zip(registry.RUNS[run].outputs, have):
            fp = (rec.get("stamp") or {}).get("fingerprint")
            assert fp == SHIPPED, f"results/{run}.json {out}: stamped {str(fp)[:12]}, not checkpoints/tiny's {SHIPPED[:12]}"


def test_the_unchecked_tables_are_only_those_of_unkept_runs():
    """A table left unchecked says why in the registry; the headline and the bench are checked."""
    assert {"headline", "bench", "drives", "bench-ort", "precision", "profile"} <= set(CHECKED)
    for t, e in registry.TABLES.items():
        if t not in CHECKED:
            assert any(registry.RUNS[r].unkept for r in e.runs), t


def test_a_fresh_clone_renders_every_checked_table_from_results(tmp_path, monkeypatch, capsys):
    root = _clone(tmp_path)
    rc, out = _check(root, monkeypatch, capsys)
    assert rc == 0, out
    for t in CHECKED:
        assert f"report: {t}: checked against" in out
    assert "would change" not in out and "stale" not in out


def _block_text(text: str, name: str) -> tuple[int, int]:
    b = next(b for b in blocks(text) if b.name == name)
    lines = text.split("\n")
    start = sum(len(x) + 1 for x in lines[: b.open_line + 1])
    return start, sum(len(x) + 1 for x in lines[: b.close_line])


def test_the_headline_edited_to_9_99x_fails(tmp_path, monkeypatch, capsys):
    root = _clone(tmp_path)
    readme = root / "README.md"
    text = readme.read_text()
    a, b = _block_text(text, "headline")
    shown = re.search(r"\*\*(\d\.\d\d)x\*\*", text[a:b])[1]
    edited = text[:a] + text[a:b].replace(f"**{shown}x**", "**9.99x**", 1) + text[b:]
    assert edited != text
    readme.write_text(edited)
    rc, out = _check(root, monkeypatch, capsys)
    assert rc == 1 and "report: README.md would change" in out


@pytest.mark.parametrize("table", CHECKED)
def test_any_digit_edited_inside_a_checked_block_fails(table, tmp_path, monkeypatch, capsys):
    """The last digit of the block's last table row, changed: `report --check` must fail."""
    root = _clone(tmp_path)
    f = root / registry.TABLES[table].files[0]
    text = f.read_text()
    a, b = _block_text(text, table)
    body = text[a:b]
    row = max(i for i, line in enumerate(body.split("\n")) if line.startswith("|") and re.search(r"\d", line))
    lines = body.split("\n")
    j = max(m.start() for m in re.finditer(r"\d", lines[row]))
    lines[row] = lines[row][:j] + str((int(lines[row][j]) + 1) % 10) + lines[row][j + 1:]
    f.write_text(text[:a] + "\n".join(lines) + text[b:])
    rc, out = _check(root, monkeypatch, capsys)
    assert rc == 1 and f"report: {registry.TABLES[table].files[0]} would change" in out


def test_a_summary_stamped_with_another_checkpoint_fails(tmp_path, monkeypatch, capsys):
    root = _clone(tmp_path)
    p = root / "results" / "bench.json"
    doc = json.loads(p.read_text())
    for rec in doc["outputs"].values():
        rec["stamp"]["fingerprint"] = OTHER
    p.write_text(json.dumps(doc, indent=1))
    rc, out = _check(root, monkeypatch, capsys)
    assert rc == 1 and f"report: stale: headline: stamped {OTHER[:12]}" in out


def test_a_summary_keeps_only_what_the_renderers_read_and_renders_the_same():
    rec = {"stamp": {"fingerprint": SHIPPED}, "modes": [{"name": "a", "x": 1.0, "log": [1, 2]},
                                                         {"name": "b", "x": 2.0, "log": [3]}],
           "cycles": [{"ms": 5}] * 3, "setup": {"seed": 0, "host": "h"}}
    tables = {"t": (("r",), lambda recs: "\n".join(f"{m['name']} {m.get('x')}" for m in recs[0]["modes"])
                    + f" seed {recs[0]['setup'].get('seed')}")}
    cut = summary.summarize({"r": [rec]}, tables)["r"][0]
    assert cut == {"stamp": {"fingerprint": SHIPPED}, "modes": [{"name": "a", "x": 1.0}, {"name": "b", "x": 2.0}],
                   "setup": {"seed": 0}}


def test_a_lookup_the_summary_cannot_see_is_refused_not_written():
    """A renderer reading past the noting (dict's own get): the summary would lose the field, so
    summarize refuses instead of writing a summary that renders otherwise."""
    rec = {"stamp": {}, "a": 1, "b": 2}
    tables = {"t": (("r",), lambda recs: f"{recs[0]['a']} {dict.get(recs[0], 'b')}")}
    with pytest.raises(ConfigError, match="table 't': its renderer reads a field the summary did not keep"):
        summary.summarize({"r": [rec]}, tables)


def test_iterating_a_dict_keeps_its_keys():
    """list(d), {**d} and `for k in d` read every key (the closed-loop renderer lists its modes)."""
    rec = {"stamp": {}, "modes": {"plain": {"x": 1}, "spec": {"x": 2}}, "other": 3}
    tables = {"t": (("r",), lambda recs: ",".join(list(recs[0]["modes"])) + str(len({**recs[0]["modes"]})))}
    cut = summary.summarize({"r": [rec]}, tables)["r"][0]
    assert cut == {"stamp": {}, "modes": {"plain": {}, "spec": {}}}


def test_a_summary_of_other_outputs_is_refused(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.json").write_text(json.dumps({"run": "x", "outputs": {"out/a.json": {}}}))
    with pytest.raises(ConfigError, match=r"must hold .* outputs \['out/b.json'\] in that order; it holds \['out/a.json'\]"):
        summary.read("x", ("out/b.json",), tmp_path)
    (tmp_path / "results" / "x.json").write_text("{")
    with pytest.raises(ConfigError, match="results/x.json: not JSON"):
        summary.read("x", ("out/b.json",), tmp_path)


def test_a_compact_summary_is_one_line_of_the_same_json():
    summaries = [{"stamp": {"fingerprint": SHIPPED}, "splits": {"test": {"per_scene": [{"n": 3, "f": 1}] * 3}}}]
    wide = summary.document("claims", ("runs/x.json",), summaries)
    narrow = summary.document("claims", ("runs/x.json",), summaries, compact=True)
    assert narrow.count("\n") == 1 and narrow.endswith("\n") and wide.count("\n") > 10
    assert json.loads(narrow) == json.loads(wide) and len(narrow) < len(wide)
