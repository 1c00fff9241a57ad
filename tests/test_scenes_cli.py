"""`specdrive scenes generate|show` through the real command line (exit status 2 on bad input)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "tools.cli", "scenes", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "data"
    r = _cli("generate", "--out", out, "--n", 12, "--seed", 3, "--workers", 2, "--shard-size", 4)
    assert r.returncode == 0, r.stderr
    assert "wrote 12 scenes" in r.stdout
    return out


def test_show_writes_a_png(dataset, tmp_path):
    png = tmp_path / "scene.png"
    r = _cli("show", dataset, "--index", 1, "--split", "train", "--out", png)
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000


@pytest.mark.parametrize("args, message", [
    (["generate", "--out", "{tmp}/x", "--n", "0"], r"n=0 is out of range; allowed \[1, 1000000\]"),
    (["generate", "--out", "{tmp}/x", "--n", "-3"], r"n=-3 is out of range; allowed \[1, "),
    (["generate", "--out", "{tmp}/x", "--drives", "10001"], r"drives=10001 is out of range; allowed \[1, 10000\]"),
    (["generate", "--out", "{tmp}/x", "--drives", "1", "--seconds", "0.05"], r"seconds=0.05 is out of range; "
     r"allowed \[0.1, 12.0\]"),
    (["generate", "--out", "{tmp}/x", "--drives", "1", "--seed", "-1"], r"seed=-1 is out of range; allowed "
     r"\[0, 4294967295\]"),
    (["generate", "--out", "{tmp}/x", "--n", "4", "--shard-size", "0"], r"shard_size=0 is out of range; allowed "
     r"\[1, 65536\]"),
    (["generate", "--out", "{data}/manifest.json", "--drives", "1"], "is a file; give a folder"),
    (["generate", "--out", "{data}", "--drives", "1"], "already holds a dataset of format 'specdrive-scenes-v2'; "
     "drives"),
    (["generate", "--out", "{tmp}/x", "--n", "4", "--families", "follow,drift"], "unknown family 'drift'; allowed: "),
    (["generate", "--out", "{tmp}/x", "--n", "4", "--workers", "0"], "workers=0"),
    (["show", "{tmp}/missing", "--out", "{tmp}/a.png"], "does not exist"),
    (["show", "{data}", "--index", "99", "--out", "{tmp}/a.png"], r"--index 99 is out of range .* allowed 0\.\.\d+"),
    (["show", "{data}", "--index", "-1", "--out", "{tmp}/a.png"], "--index -1 is out of range"),
    (["show", "{data}", "--split", "dev", "--out", "{tmp}/a.png"], "invalid choice: 'dev'"),
    (["generate", "--out", "{tmp}/x", "--n", "many"], "argument --n: 'many' is not an integer in ASCII digits"),
])
def test_bad_arguments_exit_2_and_say_why(args, message, dataset, tmp_path):
    r = _cli(*[a.format(tmp=tmp_path, data=dataset) for a in args], timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert re.search(message, r.stderr), r.stderr
