"""Every table in README.md and docs/*.md is rendered on the shipped checkpoint (issue 39).

Cheap: no model runs. The fingerprint of checkpoints/tiny (core/artifacts.py
folder_fingerprint) must be the one every `<!-- results NAME fingerprint=... -->` marker carries,
and every markdown table must sit between results markers or be marked `<!-- reference table -->`
(no measured number). `specdrive report` (tools/report.py, bench/report/command.py) renders the tables; bench/report/registry.py
is the registry of what makes each one.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.artifacts import folder_fingerprint
from core.config import ConfigError
from core.stamp import (blocks, engines_checkpoint, published_problems, replace_block, results_stamp,
                          stamp_line)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = folder_fingerprint(ROOT / "checkpoints" / "tiny")
OTHER = "0123456789abcdef" * 4


def test_every_published_table_is_rendered_on_the_shipped_checkpoint():
    problems = published_problems(ROOT, SHIPPED)
    assert not problems, ("tables not rendered on checkpoints/tiny (fingerprint " + SHIPPED[:12] + "); run "
                          "`make results` (or mark a table with no measured number '<!-- reference table -->'):\n"
                          + "\n".join(problems))


def _copy(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for p in (ROOT / "docs").glob("*.md"):
        shutil.copy(p, tmp_path / "docs" / p.name)
    return tmp_path


def test_a_planted_stale_fingerprint_fails(tmp_path):
    root = _copy(tmp_path)
    text = (root / "README.md").read_text()
    b = blocks(text, "README.md")[0]
    planted = replace_block(text, b.name, OTHER, "| a | b |\n|---|---|\n| 1 | 2 |", "README.md")
    (root / "README.md").write_text(planted)
    before = set(published_problems(_copy(tmp_path / "clean"), SHIPPED))
    found = set(published_problems(root, SHIPPED)) - before
    assert found == {f"README.md:{b.open_line + 1}: {b.name} fingerprint={OTHER[:12]} "
                     f"(not the shipped checkpoint's {SHIPPED[:12]})"}


def test_a_planted_unmarked_table_fails_and_a_reference_mark_passes(tmp_path):
    root = _copy(tmp_path)
    before = set(published_problems(root, SHIPPED))
    doc = root / "docs" / "drive.md"
    doc.write_text(doc.read_text() + "\n\n| mode | ms |\n|---|---|\n| plain | 913 |\n")
    n = len(doc.read_text().split("\n")) - 3          # the header's line (1-based)
    found = set(published_problems(root, SHIPPED)) - before
    assert len(found) == 1 and next(iter(found)).startswith(f"docs/drive.md:{n}: | mode | ms |")
    doc.write_text(doc.read_text().replace("\n\n| mode | ms |", "\n\n<!-- reference table -->\n| mode | ms |"))
    assert set(published_problems(root, SHIPPED)) == before


def test_a_clean_tree_passes_and_each_fault_is_named(tmp_path):
    (tmp_path / "docs").mkdir()
    good = (f"# x\n\n<!-- reference table -->\n| flag | what |\n|---|---|\n| --a | b |\n\n"
            f"<!-- results t fingerprint={SHIPPED} -->\n| mode | ms |\n|---|---|\n| plain | 1 |\n<!-- /results t -->\n")
    (tmp_path / "README.md").write_text(good)
    assert published_problems(tmp_path, SHIPPED) == []
    (tmp_path / "docs" / "a.md").write_text(good.replace(SHIPPED, OTHER))
    assert published_problems(tmp_path, SHIPPED) == [f"docs/a.md:8: t fingerprint={OTHER[:12]} (not the shipped "
                                                     f"checkpoint's {SHIPPED[:12]})"]
    (tmp_path / "docs" / "a.md").write_text(good.replace("<!-- reference table -->\n", ""))
    assert [p.split(" (")[0] for p in published_problems(tmp_path, SHIPPED)] == ["docs/a.md:3: | flag | what |"]
    (tmp_path / "docs" / "a.md").write_text("```\n| in | code |\n|---|---|\n```\n")
    assert published_problems(tmp_path, SHIPPED) == []


TEXT = ("intro\n<!-- results a fingerprint=unknown -->\nold a\n<!-- /results a -->\nmiddle\n"
        f"<!-- results b fingerprint={OTHER} -->\nold b\n<!-- /results b -->\nend\n")


def test_replace_block_changes_only_its_block():
    out = replace_block(TEXT, "a", SHIPPED, "new a\nline 2", "t.md")
    assert out == TEXT.replace("fingerprint=unknown -->\nold a", f"fingerprint={SHIPPED} -->\nnew a\nline 2")
    again = replace_block(out, "a", SHIPPED, "new a\nline 2", "t.md")
    assert again == out
    assert [(b.name, b.fingerprint) for b in blocks(out)] == [("a", SHIPPED), ("b", OTHER)]


@pytest.mark.parametrize("text, says", [
    ("<!-- results a fingerprint=unknown -->\nx\n", "t.md:1: results marker 'a' is never closed"),
    ("x\n<!-- /results a -->\n", "t.md:2: closing marker of 'a', but nothing is open"),
    ("<!-- results a fingerprint=unknown -->\n<!-- results b fingerprint=unknown -->\n<!-- /results b -->\n"
     "<!-- /results a -->\n", "t.md:2: results marker 'b' opens inside 'a'"),
    ("<!-- results a fingerprint=unknown -->\n<!-- /results b -->\n", "closing marker of 'b', but 'a' is open"),
    ("<!-- results a fingerprint=12ab -->\n<!-- /results a -->\n", "t.md:1: malformed results marker"),
    (TEXT + TEXT, "appear more than once"),
])
def test_unbalanced_or_malformed_markers_are_refused(text, says):
    with pytest.raises(ConfigError, match=".*".join(map(__import__("re").escape, says.split("'")))):
        replace_block(text, "a", SHIPPED, "new", "t.md")


def test_replace_block_names_a_missing_block():
    with pytest.raises(ConfigError, match="no results block 'c'.*<!-- results c fingerprint=unknown -->"):
        replace_block(TEXT, "c", SHIPPED, "new", "t.md")


def test_the_stamp_names_checkpoint_command_date_and_commit(tmp_path):
    s = results_stamp(ROOT / "checkpoints" / "tiny", command="specdrive bench --x 1")
    assert s["fingerprint"] == SHIPPED and s["command"] == "specdrive bench --x 1"
    assert s["date"].endswith("Z") and len(s["date"]) == 20
    assert s["commit"] is None or len(s["commit"]) == 40
    given = results_stamp("some/folder", {"some/folder": OTHER}, "c")   # announce_fingerprints' dict: no re-hash
    assert given["fingerprint"] == OTHER
    line = stamp_line(s, "out/bench/bench.json")
    assert "`specdrive bench --x 1`" in line and SHIPPED[:12] in line and s["date"] in line


def test_an_export_of_another_checkpoint_is_not_stamped_with_this_one(tmp_path, tiny_onnx):
    """The export's card names its source checkpoint; a module hash that no longer matches, or a
    meta.json that is no export's card, stamps no checkpoint."""
    eng = tmp_path / "eng"
    eng.mkdir()
    meta = json.loads((tiny_onnx / "meta.json").read_text())
    (eng / "meta.json").write_text(json.dumps(meta))
    assert engines_checkpoint(eng) == (ROOT / "checkpoints" / "tiny", None)
    meta["source"]["models"]["target"]["modules"]["target"] = "b" * 64     # source: outside the facts hash
    (eng / "meta.json").write_text(json.dumps(meta))
    path, why = engines_checkpoint(eng)
    assert path is None and "module 'target' was exported from sha256 bbbbbbbbbbbb" in why
    (eng / "meta.json").write_text(json.dumps({"source": meta["source"]}))
    path, why = engines_checkpoint(eng)
    assert path is None and "not an export this code reads" in why


def test_report_without_its_json_exits_2_naming_the_table_and_command(tmp_path, monkeypatch, capsys):
    from bench.report import registry as results
    from tools import cli

    root = _copy(tmp_path)
    monkeypatch.chdir(root)
    (root / "checkpoints").symlink_to(ROOT / "checkpoints")
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--only", "roofline-snapshot"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "table 'roofline-snapshot'" in err and results.RUNS["roofline"].outputs[0] in err
    assert results.RUNS["roofline"].commands[0] in err


def test_every_marker_is_in_the_registry():
    from bench.report import registry as results

    known = set(results.TABLES)
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        names = {b.name for b in blocks(p.read_text(), p.name)}
        assert names <= known, f"{p.name}: markers {sorted(names - known)} are not in bench/report/registry.py"
    for name, t in results.TABLES.items():
        for f in t.files:
            assert name in {b.name for b in blocks((ROOT / f).read_text(), f)}, f"{f} has no marker for {name!r}"


def _bench_mode(name, speedup, cycle_p50, cycle_x, equal=16):
    return {"name": name, "decode_speedup": {"all": speedup, "min": speedup - 0.1, "max": speedup + 0.1},
            "cycle_ms": {"p50": cycle_p50}, "cycle_speedup": {"p50": cycle_x, "min": cycle_x - 0.05,
                                                              "max": cycle_x + 0.05},
            "identical": {"equal": equal, "scenes": 16}}


def _drive_mode(name, p50, speedup, equal=320):
    return {"name": name, "cycle_ms": {"p50": p50}, "cycle_speedup_p50": speedup,
            "identical": {"equal": equal, "cycles": 320}}


def test_the_headline_is_plain_against_the_best_mode_and_the_fastest_exact_drive_mode():
    from bench.report.registry import headline

    bench = {"best": "flat k=8", "modes": [_bench_mode("plain", 1.0, 266.0, 1.0), _bench_mode("flat k=4", 2.13, 178.0, 1.49),
                                           _bench_mode("flat k=8", 2.17, 177.6, 1.493)]}
    drives = {"modes": [_drive_mode("plain", 321.0, 1.0), _drive_mode("spec+vision+lookup", 167.0, 1.92),
                        _drive_mode("spec+vision+stream", 150.0, 2.14, equal=319),   # not exact: never the headline
                        _drive_mode("spec+vision+lookup+stream", 168.0, 1.91)]}
    rows = headline([bench, drives]).split("\n")
    assert len(rows) == 4 and rows[1] == "|---|---|---|---|---|---|"
    assert rows[2] == "| plain target | 1.00x | 266 ms | 1.00x | 321 ms, 1.00x | - |"
    assert rows[3] == ("| flat k=8 (best) | **2.17x** (2.07-2.27) | 178 ms | **1.49x** (1.44-1.54) "
                       "| spec+vision+lookup: 167 ms, **1.92x** | 16/16 scenes, 320/320 drive cycles |")


def test_claims_data_is_written_between_the_registry_markers_with_the_eval_stamp():
    """train.claims_report writes docs/claims-data.md whole; its tables carry the markers
    `specdrive report` re-renders, with the evaluation's stamp."""
    import inspect

    from bench.report import registry as results
    from train import claims_report

    stamp = {"fingerprint": SHIPPED, "checkpoint": "checkpoints/tiny", "date": "2026-12-02T10:00:00Z",
             "command": "specdrive train eval --config configs/train/eval-claims.yaml"}
    text = "\n".join(claims_report.marked("budget", ["| a |", "|---|", "| 1 |"], stamp, "metrics.json"))
    assert [(b.name, b.fingerprint) for b in blocks(text)] == [("claims-budget", SHIPPED)]
    assert "`specdrive train eval --config configs/train/eval-claims.yaml`" in text
    assert [(b.name, b.fingerprint) for b in blocks("\n".join(claims_report.marked("budget", [], None, "m")))] \
        == [("claims-budget", "unknown")]
    written = set(__import__("re").findall(r'block\("([a-z]+)"', inspect.getsource(claims_report.sections)))
    assert {f"claims-{n}" for n in written} == {n for n, t in results.TABLES.items() if "docs/claims-data.md" in t.files}


def test_run_stale_reruns_a_missing_or_stale_json_then_finds_it_fresh(tmp_path, monkeypatch, capsys):
    """--run-stale on a copy of the docs: a missing JSON is made by its command (a roofline
    projection, seconds), its table rendered with the shipped fingerprint; a second pass finds it
    fresh; a JSON stamped with another checkpoint runs again."""
    from bench.report import registry
    from bench.roofline.report import drive_table
    from tools import cli

    root = _copy(tmp_path)
    (root / "checkpoints").symlink_to(ROOT / "checkpoints")
    monkeypatch.chdir(root)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cmd = "specdrive roofline --preset edge-2b --device thor --precision fp8 --json out/r.json"
    monkeypatch.setitem(registry.RUNS, "roofline", registry.Run((cmd,), ("out/r.json",)))
    assert cli.main(["report", "--run-stale", "--only", "roofline-drive"]) == 0
    said = capsys.readouterr().out
    assert "report: [1/1] roofline: out/r.json is missing (and no results/roofline.json); running 1 command(s)" in said and f"$ {cmd}" in said
    rec = json.loads((root / "out" / "r.json").read_text())
    assert rec["stamp"]["fingerprint"] == SHIPPED and rec["stamp"]["command"] == cmd
    text = (root / "docs" / "profile.md").read_text()
    b = next(b for b in blocks(text) if b.name == "roofline-drive")
    assert b.fingerprint == SHIPPED
    assert drive_table([rec]) in "\n".join(text.split("\n")[b.open_line:b.close_line])
    assert cli.main(["report", "--run-stale", "--only", "roofline-drive"]) == 0
    assert "report: [1/1] roofline: fresh" in capsys.readouterr().out
    rec["stamp"]["fingerprint"] = OTHER
    (root / "out" / "r.json").write_text(json.dumps(rec))
    assert cli.main(["report", "--run-stale", "--only", "roofline-drive"]) == 0
    assert f"out/r.json is stamped {OTHER[:12]}, not {SHIPPED[:12]}; running" in capsys.readouterr().out
