"""`specdrive report` on results JSON that is not what its run writes (issue 50, 4 and 5): each
malformed kind exits 2 naming the file, what is wrong and what is allowed, with no traceback and
nothing written; a stale or unstamped JSON is not rendered into the docs (exit 2, not 0)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.artifacts import folder_fingerprint

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = folder_fingerprint(ROOT / "checkpoints" / "tiny")
CMD = "specdrive roofline --preset edge-2b --device thor --precision fp8 --json out/r.json"


def _strings(x):
    """Every number of a JSON value written as a string."""
    if isinstance(x, dict):
        return {k: _strings(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_strings(v) for v in x]
    return str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """A copy of README.md and docs/ with the shipped checkpoints and a roofline JSON made by
    its command (seconds): a table (roofline-drive) renders from it."""
    from tools import cli

    root = tmp_path_factory.mktemp("report")
    (root / "docs").mkdir()
    shutil.copy(ROOT / "README.md", root / "README.md")
    for p in (ROOT / "docs").glob("*.md"):
        shutil.copy(p, root / "docs" / p.name)
    (root / "checkpoints").symlink_to(ROOT / "checkpoints")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        assert cli.main(["roofline", "--preset", "edge-2b", "--device", "thor", "--precision", "fp8",
                         "--json", "out/r.json"]) == 0
    rec = json.loads((root / "out" / "r.json").read_text())
    assert rec["stamp"]["fingerprint"] == SHIPPED
    return root, rec


def _report(root, monkeypatch, capsys, data: bytes):
    from bench.report import registry
    from tools import cli

    monkeypatch.chdir(root)
    monkeypatch.setitem(registry.RUNS, "roofline", registry.Run((CMD,), ("out/r.json",)))
    (root / "out" / "r.json").write_bytes(data)
    before = (root / "docs" / "profile.md").read_text()
    try:
        code = cli.main(["report", "--only", "roofline-drive"])
    except SystemExit as e:
        code = e.code
    if code != 0:
        assert (root / "docs" / "profile.md").read_text() == before      # refused: nothing written
    return code, capsys.readouterr().err


KINDS = {   # name -> the bytes in out/r.json's place (from the valid record), what the message says
    "a list": (lambda r: json.dumps([r]).encode(), "a JSON list, where a results object belongs"),
    "null": (lambda r: b"null", "a JSON NoneType, where a results object belongs"),
    "a string stamp": (lambda r: json.dumps({**r, "stamp": "x"}).encode(), "its stamp is a str"),
    "a field missing": (lambda r: json.dumps({k: v for k, v in r.items() if k != "drive"}).encode(),
                        "is not the results JSON its runs write (KeyError"),
    "another run's JSON": (lambda r: json.dumps({"schema": "specdrive-bench/1", "modes": [], "stamp": r["stamp"]})
                           .encode(), "is not the results JSON its runs write"),
    "not UTF-8": (lambda r: b"\xff\xfe{" + json.dumps(r).encode(), "not UTF-8 text"),
    "deep nesting": (lambda r: b"[" * 200_000 + b"]" * 200_000, "nested deeper than a results file is"),
    "numbers as strings": (lambda r: json.dumps({**_strings(r), "stamp": r["stamp"]}).encode(),
                           "is not the results JSON its runs write"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_malformed_results_json_exits_2_naming_what_is_wrong(docs, monkeypatch, capsys, kind):
    root, rec = docs
    make, says = KINDS[kind]
    code, err = _report(root, monkeypatch, capsys, make(rec))
    assert code == 2 and says in err and "out/r.json" in err and "Traceback" not in err, (code, err[-600:])
    assert "allowed" in err or "re-run" in err


def test_the_valid_json_renders_and_a_stale_or_unstamped_one_is_refused(docs, monkeypatch, capsys):
    root, rec = docs
    code, err = _report(root, monkeypatch, capsys, json.dumps(rec).encode())
    assert code == 0, err
    for stamp in ({**rec["stamp"], "fingerprint": "0123456789abcdef" * 4}, None):
        other = {**rec, "stamp": stamp} if stamp else {k: v for k, v in rec.items() if k != "stamp"}
        code, err = _report(root, monkeypatch, capsys, json.dumps(other).encode())
        assert code == 2 and "nothing was written" in err and "--run-stale" in err, (code, err[-600:])
