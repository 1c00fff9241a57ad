"""Bad artifacts and arguments end `specdrive plan` with exit status 2 and one line naming what
is wrong, never a traceback (issue 16, defect 5), and a tokenizer.json that is not the one the
checkpoint was trained with is refused (defect 6). In-process: tools.cli.main."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "tiny"


@pytest.fixture
def ckpt(tmp_path):
    """A copy of the shipped planner folder (target, expert, the flat draft, tokenizer)."""
    dst = tmp_path / "tiny"
    dst.mkdir()
    shutil.copy(SHIPPED / "tokenizer.json", dst)
    for sub in ("target", "expert", "draft-flat"):
        shutil.copytree(SHIPPED / sub, dst / sub)
    return dst


def rewrite(folder: Path, module: str, data: bytes) -> None:
    """Replace a module file and make meta.json agree with it (size, sha256): only the content
    itself is then wrong."""
    file = folder / f"{module}.safetensors"
    file.write_bytes(data)
    meta = json.loads((folder / "meta.json").read_text())
    meta["modules"][module].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "meta.json").write_text(json.dumps(meta))


def resave(folder: Path, module: str, change) -> None:
    tensors = load_file(str(folder / f"{module}.safetensors"))
    change(tensors)
    tmp = folder / "tmp.safetensors"
    save_file(tensors, str(tmp))
    data = tmp.read_bytes()
    tmp.unlink()
    rewrite(folder, module, data)


def first_key(tensors, part="weight"):
    return next(k for k in sorted(tensors) if part in k and tensors[k].ndim == 2)


def corrupt(ckpt: Path, how: str) -> None:
    target = ckpt / "target"
    file = target / "target.safetensors"
    data = file.read_bytes()
    if how == "truncated":
        file.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "flipped":
        b = bytearray(data)
        b[len(b) // 2] ^= 0x40
        file.write_bytes(bytes(b))
    elif how == "pickle":
        rewrite(target, "target", b"\x80\x04\x95" + b"\x00" * 64 + b"cos\nsystem\n.")
    elif how == "shape":
        resave(target, "target", lambda t: t.__setitem__(first_key(t), t[first_key(t)][:, :-1].copy()))
    elif how == "fp16":
        resave(target, "target", lambda t: t.update({k: v.astype(np.float16) for k, v in t.items()}))
    elif how == "missing":
        resave(target, "target", lambda t: t.pop(first_key(t)))


def plan(*args):
    with pytest.raises(SystemExit) as e:
        main(["plan", *args])
    return e.value.code


@pytest.mark.parametrize("how,word", [
    ("truncated", "truncated"), ("empty", "truncated"), ("flipped", "sha256"),
    ("pickle", "target.safetensors"), ("shape", "shape"), ("fp16", "float16"), ("missing", "missing tensor"),
])
def test_a_corrupt_checkpoint_exits_2_naming_the_file(ckpt, tmp_path, capsys, how, word):
    corrupt(ckpt, how)
    code = plan("--checkpoint", str(ckpt), "--scenes", "1", "--out", str(tmp_path / "o"), "--quiet")
    err = capsys.readouterr().err
    assert code == 2 and word in err and "Traceback" not in err, err


def test_a_draft_that_is_not_a_draft_exits_2(ckpt, tmp_path, capsys):
    code = plan("--checkpoint", str(ckpt), "--draft", str(ckpt / "target"), "--out", str(tmp_path / "o"))
    assert code == 2 and "kind" in capsys.readouterr().err


def test_a_reordered_tokenizer_is_refused(ckpt, tmp_path, capsys):
    """Before: the same tokens in another order ran and reasoned gibberish."""
    data = json.loads((ckpt / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]            # two learned tokens swap their ids
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (ckpt / "tokenizer.json").write_text(json.dumps(data))
    code = plan("--checkpoint", str(ckpt), "--out", str(tmp_path / "o"))
    assert code == 2 and "is not the tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("yaml_text,word", [("budget: null", "expected a mapping"),
                                            ("spec: null", "expected a mapping")])
def test_null_sections_of_a_profile_exit_2(tmp_path, capsys, yaml_text, word):
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml_text + "\n")
    code = plan("--preset", "tiny", "--random-init", "0", "--profile", str(profile),
                "--out", str(tmp_path / "o"))
    assert code == 2 and word in capsys.readouterr().err


@pytest.mark.parametrize("args,word", [
    (["--seed", "-1"], "--seed=-1"),
    (["--device", "foo"], "not a torch device"),
    (["--device", "cuda:7"] if __import__("torch").cuda.is_available() else ["--device", "cuda"], "cuda"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, args, word):
    code = plan("--preset", "tiny", "--random-init", "0", *args, "--out", str(tmp_path / "o"))
    err = capsys.readouterr().err
    assert code == 2 and word in err and "Traceback" not in err, err


def test_out_pointing_at_a_file_exits_2(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code = plan("--preset", "tiny", "--random-init", "0", "--out", str(tmp_path / "f"))
    assert code == 2 and "is a file" in capsys.readouterr().err


# --- issue 23.9 / 23.10: tracebacks and silent acceptances of the other commands ---------------------

def exit_of(argv, capsys) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture
def files(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "garbage.jsonl").write_bytes(b"garbage\n\x00\xff\xfe binary\n{\"cycle\": 1, \"timi")
    (tmp_path / "empty.yaml").write_text("# nothing here\n")
    (tmp_path / "twice.yaml").write_text("max_len: 512\nmax_len: 1024\n")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    cpu = (ROOT / "configs" / "planner" / "cpu.yaml").read_text()
    (tmp_path / "three.yaml").write_text(cpu + "cameras: [front_wide, cross_left, cross_right]\n")
    (tmp_path / "small.yaml").write_text(cpu + "image_hw: [32, 48]\n")
    return tmp_path


PLAN = ["plan", "--checkpoint", str(SHIPPED), "--scenes", "1", "--quiet"]
CASES = {   # name -> (argv with {t} for the temporary folder, words of the one line)
    "timeline garbage": (["timeline", "{t}/garbage.jsonl", "--out", "{t}/pics"], "no cycle records"),
    "timeline missing": (["timeline", "{t}/nope.jsonl"], "does not exist"),
    "timeline folder": (["timeline", "{t}"], "is not a file"),
    "timeline --out FILE": (["timeline", "{t}/garbage.jsonl", "--out", "{t}/afile"], "is a file"),
    "roofline nan": (["roofline", "--budget-ms", "nan"], "allowed a finite number >= 0"),
    "roofline --validate bad": (["roofline", "--validate", "{t}/bad.json"], "is not valid JSON"),
    "roofline --validate list": (["roofline", "--validate", "{t}/list.json"], "not the stats.json"),
    "roofline --json DIR": (["roofline", "--json", "{t}"], "is a folder"),
    "profile --threads -1": (["profile", "--checkpoint", str(SHIPPED), "--threads", "-1", "--out", "{t}/p"],
                             "allowed >= 1"),
    "profile --out FILE": (["profile", "--checkpoint", str(SHIPPED), "--out", "{t}/afile"], "is a file"),
    "engines build --out FILE": (["engines", "build", "--profile", "orin-fp16", "--out", "{t}/afile"], "is a file"),
    "plan --backend table": (PLAN + ["--backend", "table", "--out", "{t}/o"], "invalid choice: 'table'"),
    "plan --warmup -1": (PLAN + ["--warmup", "-1", "--out", "{t}/o"], "allowed >= 0"),
    "plan --pictures -1": (PLAN + ["--pictures", "-1", "--out", "{t}/o"], "allowed >= 0"),
    "plan --random-init": (PLAN + ["--random-init", "3", "--out", "{t}/o"], "drop --random-init"),
    "plan empty profile": (PLAN + ["--profile", "{t}/empty.yaml", "--out", "{t}/o"], "the file is empty"),
    "plan duplicate key": (PLAN + ["--profile", "{t}/twice.yaml", "--out", "{t}/o"], "key 'max_len' is given twice"),
    "plan 3 cameras": (PLAN + ["--profile", "{t}/three.yaml", "--out", "{t}/o"],
                       "the planner profile's cameras ['front_wide', 'cross_left', 'cross_right'] are not the scenes' "
                       "cameras ['front_wide', 'front_tele', 'cross_left', 'cross_right']"),
    "plan other image size": (PLAN + ["--profile", "{t}/small.yaml", "--out", "{t}/o"],
                              "image_hw [32, 48] are not the scenes' image_hw [64, 96]"),
    "drive 3 cameras": (["drive", "--drives", "1", "--profile", "{t}/three.yaml", "--out", "{t}/o"],
                        "every cycle would be an input error"),
    "bench --drives 3 cameras": (["bench", "--checkpoint", str(SHIPPED), "--drives", "{t}", "--profile",
                                  "{t}/three.yaml", "--json", "{t}/r.json"], "every cycle would be an input error"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_arguments_and_files_exit_2_with_one_line(case, files, capsys):
    argv, word = CASES[case]
    code, err = exit_of([a.replace("{t}", str(files)) for a in argv], capsys)
    assert code == 2 and word in err[-1] and not any("Traceback" in e for e in err), (code, err)


def test_timeline_skips_bad_lines_with_a_count(tmp_path):
    from bench.profile.timeline import load_cycles
    good = json.dumps({"cycle": 1, "timing": {"stages_ms": {"vision": 1.0}}})
    f = tmp_path / "cycles.jsonl"
    f.write_bytes(b"\x00\xff binary\n" + good.encode() + b"\n[1]\n{\"cycle\": 2, \"tim")
    said = []
    assert load_cycles(f, warn=said.append) == [json.loads(good)]
    assert said == [f"{f}: skipped 3 lines that are not cycle records (first: line 1)"]


def test_train_card_without_its_metrics_file_exits_2(tmp_path, capsys):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"planner: checkpoints/tiny\nout: {tmp_path / 'none.json'}\ncard: {tmp_path / 'CARD.md'}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "card", "--config", str(cfg)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "none.json not found" in err and "specdrive train eval" in err
    assert not (tmp_path / "CARD.md").exists()
