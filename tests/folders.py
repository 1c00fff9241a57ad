"""Tests that damage an artifact folder work on a copy of it (the session's export is shared)."""
import json
import shutil

from core.artifacts import stamp_facts


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


def set_layout(planner, image_attention: str) -> None:
    """Declare a planner folder's target (and what was trained for it) of image layout
    `image_attention` (llm.image_attention): the same weights under the other layout, a valid model
    for tests of exactness, formats and refusals, though not the one its training made."""
    from pathlib import Path

    for meta_file in Path(planner).glob("*/meta.json"):
        meta = json.loads(meta_file.read_text())
        if "target" in meta.get("config", {}):
            meta["config"]["target"]["llm"]["image_attention"] = image_attention
            meta_file.write_text(json.dumps(meta, indent=1) + "\n")


def layout_of(planner) -> str:
    """The image layout planner folder `planner`'s target/meta.json declares (what an export of it
    records as meta.json target.image_attention): for stand-in exports."""
    from pathlib import Path

    meta = json.loads((Path(planner) / "target" / "meta.json").read_text())
    return meta["config"]["target"]["llm"].get("image_attention", "causal")


def planner_copy(src, out, image_attention: str):
    """A copy of planner folder `src` at `out` declared of layout `image_attention`."""
    shutil.copytree(src, out)
    set_layout(out, image_attention)
    return out
