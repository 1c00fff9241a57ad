"""Is a draft current? The sha256 of the target weights each trained draft's meta.json records
(`target_sha256`) against a planner folder's target, read from meta.json files alone (no torch:
configs/train/claims.sh asks this once per draft before training it again).
"""
from __future__ import annotations

from pathlib import Path

from core.artifacts import read_meta, scan_checkpoints


def target_sha256(folder) -> str:
    """The sha256 of the target weights in planner folder `folder` (its target/ meta.json)."""
    return read_meta(scan_checkpoints(folder)[0]["target"]).modules["target"].sha256


def trained_for(draft, target) -> bool:
    """Whether the draft folder `draft` exists and its meta.json records the target weights of
    planner folder `target` (a draft from before the record, or for other weights: False)."""
    meta_file = Path(draft) / "meta.json"
    if not meta_file.is_file():
        return False
    return read_meta(draft).extra.get("target_sha256") == target_sha256(target)


def main(argv=None) -> int:
    """python -m train.current DRAFT TARGET: exit 0 when DRAFT was trained for TARGET's weights, 1
    (saying why) when it must be trained again (configs/train/claims.sh)."""
    import sys

    draft, target = argv if argv is not None else sys.argv[1:]
    if trained_for(draft, target):
        return 0
    print(f"{draft}: missing, or not trained for the weights of {target}; training it again")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
