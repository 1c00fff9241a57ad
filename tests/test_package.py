"""The package: our top-level names are ours alone, the extras keep the two ONNX Runtimes apart,
the import contracts hold, and the command line exits 2 on bad arguments."""
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:                                   # Python 3.10 (JetPack 6): the backport, a dev dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
OURS = ["core", "prompt", "scenes", "models", "train", "export", "calibration", "engines", "runtime", "bench", "tools"]


def _top_level_names(dist) -> set[str]:
    top = dist.read_text("top_level.txt")
    if top:
        return {line.strip() for line in top.splitlines() if line.strip()}
    names = set()
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if parts and not parts[0].endswith((".dist-info", ".egg-info", ".data")) and parts[0] != "..":
            names.add(parts[0].removesuffix(".py"))
    return names


def test_no_other_distribution_provides_our_packages():
    clashes = []
    for dist in md.distributions():
        if dist.metadata["Name"] and dist.metadata["Name"].lower() == "specdrive":
            continue
        taken = _top_level_names(dist) & set(OURS)
        if taken:
            clashes.append(f"{dist.metadata['Name']} provides {sorted(taken)}")
    assert not clashes, "another installed distribution shadows our packages: " + "; ".join(clashes)


def test_our_packages_come_from_this_tree():
    for name in OURS:
        module = __import__(name)
        assert Path(module.__file__).resolve().parent == ROOT / name, f"{name} imported from {module.__file__}"


def test_extras_never_install_both_onnxruntimes():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, reqs in extras.items():
        cpu = any(r.startswith("onnxruntime") and not r.startswith("onnxruntime-gpu") for r in reqs)
        gpu = any(r.startswith("onnxruntime-gpu") for r in reqs)
        assert not (cpu and gpu), f"extra {name!r} lists both onnxruntime and onnxruntime-gpu"
    make = (ROOT / "Makefile").read_text()
    assert "EXTRAS     ?= torch,$(ORT),plots,quant,dev" in make, "the Makefile must install exactly one ORT extra"
    installed = {d.metadata["Name"].lower() for d in md.distributions() if d.metadata["Name"]}
    assert not {"onnxruntime", "onnxruntime-gpu"} <= installed, "both onnxruntime and onnxruntime-gpu are installed"


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_prompt_is_numpy_only():
    code = "import sys, prompt.vocab, prompt.layout, prompt.trajectory, core.config; " \
           "print(' '.join(m for m in ('torch', 'yaml', 'models', 'scenes') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing prompt loaded {out.stdout.strip()}"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], cwd=ROOT, capture_output=True, text=True)


def test_cli_unknown_command_exits_2():
    r = run_cli("fly")
    assert r.returncode == 2 and "invalid choice: 'fly'" in r.stderr


def test_cli_help_lists_commands():
    r = run_cli("--help")
    assert r.returncode == 0 and "COMMAND" in r.stdout


def test_demo_runs_and_leaves_its_outputs(tmp_path):
    r = run_cli("demo", "--out", str(tmp_path / "demo"), "--cycles", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = tmp_path / "demo"
    assert len(list((out / "scenes").glob("scene_*.png"))) == 3
    assert (out / "summary.json").is_file() and (out / "cycles.jsonl").read_text().count("\n") == 1
    assert list(out.glob("cycle_*.svg"))


def test_demo_refuses_bad_cycles(tmp_path):
    r = run_cli("demo", "--out", str(tmp_path), "--cycles", "0")
    assert r.returncode == 2 and "--cycles=0" in r.stderr
