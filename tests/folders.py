"""Tests that damage an artifact folder work on a copy of it (the session's export is shared)."""
import json
import shutil

from prompt.artifacts import stamp_facts


def copy_of(folder, tmp_path):
    dst = tmp_path / "e"
    shutil.copytree(folder, dst)
    return dst


def edit_meta(folder, change, restamp: bool) -> None:
    """change(meta) on FOLDER/meta.json; `restamp` also rewrites its facts_sha256 (an edit that
    passes the hash: what the checks behind the hash must still catch)."""
    meta = json.loads((folder / "meta.json").read_text())
    change(meta)
    (folder / "meta.json").write_text(json.dumps(stamp_facts(meta) if restamp else meta))
