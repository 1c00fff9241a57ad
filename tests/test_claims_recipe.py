"""configs/train/claims.sh (`make claims`) on a micro setting: its training commands are replaced by a
stand-in that records each call and writes the draft folders a real run would (meta.json with the
target weights it was trained for), so the script's own logic runs as shipped: run twice over the
same runs/ folder, the second run trains nothing; after a new target, it trains everything again."""
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from train.current import target_sha256

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "checkpoints" / "tiny"

STAND_IN = r'''#!{python}
"""python -m MODULE ARGS as claims.sh calls it: train.current runs for real; tools.cli train ... is
recorded in calls.log and leaves the draft folders the real command would."""
import json, runpy, sys
from pathlib import Path

import yaml

sys.path.insert(0, {repo!r})
from train.current import target_sha256

args = sys.argv[1:]
assert args[0] == "-m", args
if args[1] == "train.current":
    sys.argv = ["train.current", *args[2:]]
    runpy.run_module("train.current", run_name="__main__")
with open("calls.log", "a") as f:
    f.write(" ".join(args[2:4]) + "\n")
template = json.loads(Path({draft_meta!r}).read_text())


def trained(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(template | {{"target_sha256": target_sha256("checkpoints/tiny")}}))


sets = dict(a.split("=", 1) for a in args[args.index("--set") + 1::2]) if "--set" in args else {{}}
if args[3] == "distill":
    cfg = yaml.safe_load(Path({repo!r}, args[args.index("--config") + 1]).read_text())
    for d in cfg["drafts"]:
        for s in cfg["seeds"]:
            trained(Path(cfg["run"]["out"]) / f"{{d}}-s{{s}}" / "ckpt" / f"draft-{{d}}")
elif args[3] == "aarl":
    trained(Path(sets["run.out"]) / "ckpt" / "draft-flat-aarl")
'''


def run_claims(work: Path) -> list[str]:
    (work / "calls.log").unlink(missing_ok=True)
    env = {**os.environ, "PY": str(work / "py")}
    out = subprocess.run(["bash", str(REPO / "configs/train/claims.sh")], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return (work / "calls.log").read_text().split("\n")[:-1] if (work / "calls.log").exists() else []


def test_make_claims_retrains_nothing_twice_and_everything_after_a_new_target(tmp_path):
    target = tmp_path / "checkpoints/tiny/target"
    target.mkdir(parents=True)
    (target / "meta.json").write_text((TINY / "target/meta.json").read_text())
    py = tmp_path / "py"
    py.write_text(STAND_IN.format(python=sys.executable, repo=str(REPO),
                                  draft_meta=str(TINY / "draft-flat/meta.json")))
    py.chmod(py.stat().st_mode | stat.S_IEXEC)

    seeds = re.search(r"for s in ([\d ]+); do aarl rollout", (REPO / "configs/train/claims.sh").read_text())
    aarl_runs = len(seeds.group(1).split())
    distill_cfg = yaml.safe_load((REPO / "configs/train/distill-claims.yaml").read_text())
    assert len(distill_cfg["seeds"]) >= 5 and aarl_runs >= 5

    everything = ["train distill"] + ["train aarl"] * aarl_runs + ["train eval"]
    assert run_claims(tmp_path) == everything
    assert run_claims(tmp_path) == ["train eval"]            # nothing trained the second time

    meta = json.loads((target / "meta.json").read_text())   # new target weights
    meta["modules"]["target"]["sha256"] = "0" * 64
    (target / "meta.json").write_text(json.dumps(meta))
    assert target_sha256(tmp_path / "checkpoints/tiny") == "0" * 64
    assert run_claims(tmp_path) == everything
    assert run_claims(tmp_path) == ["train eval"]
