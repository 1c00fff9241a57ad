"""`specdrive bench` end to end on the PyTorch reference backend with micro models (2 layers,
hidden 32): a checkpoint folder with two drafts found by their meta.json, and random weights
with the target drafting for itself (tau = k + 1) and a noised copy. Output must equal plain
decoding on every scene, the JSON must carry the machine and setup, the PNGs must be written;
bad arguments exit with status 2 and a message naming the value."""
import dataclasses
import json

import pytest
import torch

from models import io
from models.action_expert import ActionExpert
from models.config import DraftConfig, load_preset
from models.draft import Draft
from models.target import Target
from models.io import with_tokenizer
from bench.common.sources import default_tokenizer
from tools import bench

FAST = ["--scenes", "2", "--repeats", "2", "--warmup", "1", "--ks", "2", "--max-reasoning", "6"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, preset):
    """tokenizer.json, target/, expert/, draft-flat/, draft-flat-standalone/ (random weights)."""
    folder = tmp_path_factory.mktemp("ckpt")
    tok = default_tokenizer()
    tok.save(folder / "tokenizer.json")
    cfg = with_tokenizer(load_preset(preset), tok)
    torch.manual_seed(0)
    target, expert = Target(cfg.target), ActionExpert(cfg.expert, cfg.target.llm)
    io.save(folder / "target", {"target": target}, cfg, {"kind": "target"})
    io.save(folder / "expert", {"expert": expert}, cfg, {"kind": "expert"})
    for variant, features in (("flat", "fused"), ("flat-standalone", "none")):
        dcfg = dataclasses.replace(cfg, draft=DraftConfig(layers=1, rope="flat", features=features,
                                                          feature_layers=(0, 1, 1)))
        draft = Draft(dcfg, target.embed_tokens, target.lm_head)
        io.save(folder / f"draft-{variant}", {"draft": draft}, dcfg, {"kind": "draft", "variant": variant})
    return folder


def run_cli(args, tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main([*args, *FAST, "--json", str(out)]) == 0
    return json.loads(out.read_text()), out


def is_png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checkpoint_folder_every_draft_same_output(checkpoint, tmp_path, capsys):
    rec, out = run_cli(["--checkpoint", str(checkpoint)], tmp_path)
    names = [m["name"] for m in rec["modes"]]
    assert names == ["plain", "flat k=2", "flat adaptive", "flat-standalone k=2", "flat-standalone adaptive"]
    for m in rec["modes"]:
        assert m["identical"]["fraction"] == 1.0, m["name"]
        assert len(m["decode_speedup"]["values"]) == 2          # one per repeat
    assert rec["machine"]["cpu"] and rec["machine"]["torch_threads"] == 1
    assert rec["setup"]["repeats"] == 2 and rec["setup"]["backend"] == "torch"
    from core.artifacts import folder_fingerprint      # the stamp `specdrive report` renders from
    stamp = rec["stamp"]
    assert stamp["fingerprint"] == folder_fingerprint(checkpoint) == rec["setup"]["fingerprints"][str(checkpoint)]
    assert stamp["command"].startswith(f"specdrive bench --checkpoint {checkpoint}") and stamp["date"].endswith("Z")
    assert is_png(out.with_suffix(".png")) and is_png(tmp_path / "bench_accept.png")
    assert "flat k=2" in capsys.readouterr().out


def test_checkpoint_drafts_chosen_by_name_plus_a_noised_target(checkpoint, tmp_path):
    rec, _ = run_cli(["--checkpoint", str(checkpoint), "--drafts", "flat-standalone,noised:0.1",
                      "--no-adaptive"], tmp_path)
    assert [m["name"] for m in rec["modes"]] == ["plain", "flat-standalone k=2", "noised:0.1 k=2"]
    assert all(m["identical"]["fraction"] == 1.0 for m in rec["modes"])


def test_self_draft_accepts_everything(preset, tmp_path):
    rec, _ = run_cli(["--preset", str(preset), "--random-init", "0", "--drafts", "self,noised:0.5"], tmp_path)
    modes = {m["name"]: m for m in rec["modes"]}
    assert all(m["identical"]["fraction"] == 1.0 for m in modes.values())
    assert rec["where_accepted"]["self k=2"]["all"]["accept_rate"] == 1.0
    assert modes["self k=2"]["c"] > 0.3        # the target as its own draft costs a target step


@pytest.mark.parametrize("args, message", [
    (["--preset", "tiny"], "--random-init"),
    (["--preset", "tiny", "--random-init", "0", "--drafts", "mine"], "'mine'"),
    (["--preset", "tiny", "--random-init", "0", "--ks", "4,x"], "'4,x'"),
    (["--preset", "tiny", "--random-init", "0", "--scenes", "0"], "scenes=0"),
    (["--checkpoint", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
    (["--preset", "tiny", "--random-init", "0", "--drafts", "noised:x"], "'noised:x'"),
    (["--preset", "tiny", "--random-init", "0", "--trees", "16,8,4;8,0,2"], "depth=0 is not allowed"),
    (["--preset", "tiny", "--random-init", "0", "--trees", "99,8,4"], "allowed 1..64"),
    (["--preset", "tiny", "--random-init", "0", "--trees", "16,8"], "expected N,d,K"),
    # issue 50, 5: a drives pin without a drives folder was ignored
    (["--preset", "tiny", "--random-init", "0", "--expect-drives-fingerprint", "0" * 64],
     "--expect-drives-fingerprint pins the --drives folder, and no --drives was given"),
    # int() reads other scripts' digits: "٤,٨" was (4, 8), "１６" started a whole run
    (["--preset", "tiny", "--random-init", "0", "--ks", "٤,٨"], "ASCII integers"),
    (["--preset", "tiny", "--random-init", "0", "--scenes", "１６"], "not an integer in ASCII digits"),
])
def test_bad_arguments_exit_2_naming_the_value(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main([*args, "--json", str(tmp_path / "x.json")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_checkpoint_without_expert_is_refused(checkpoint, tmp_path, capsys):
    only = tmp_path / "only"
    only.mkdir()
    (only / "tokenizer.json").write_bytes((checkpoint / "tokenizer.json").read_bytes())
    (only / "target").symlink_to(checkpoint / "target")
    with pytest.raises(SystemExit):
        bench.main(["--checkpoint", str(only), "--json", str(tmp_path / "x.json")])
    assert "expert" in capsys.readouterr().err


def test_add_parser_registers_the_bench_subcommand():
    import argparse

    parser = argparse.ArgumentParser(prog="specdrive")
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--checkpoint", "ckpt", "--json", "out.json"])
    assert (args.run.__module__, args.run.__name__) == ("tools.bench", "run")
    assert (args.ks, args.repeats, args.scenes, args.threads) == ((4, 8), 3, 16, 1)


def test_tree_modes_beside_the_chains_report_tau_speedups_identity_and_alpha_by_class(preset, tmp_path):
    """--trees adds a fixed-tree mode and an adaptive tree-or-chain mode per shape: the reasoning
    equals plain decoding's on both scenes, the tree steps ran, and each mode reports tau, the
    decode and cycle speedups and alpha by token class, judged along the path the target took
    (accepted nodes, then the best-scored child where the path stopped: the step's recorded k).
    The target drafting for itself is accepted everywhere: alpha 1 in each class it judged."""
    rec, _ = run_cli(["--preset", str(preset), "--random-init", "0", "--drafts", "self", "--trees", "6,3,2"], tmp_path)
    modes = {m["name"]: m for m in rec["modes"]}
    assert list(modes) == ["plain", "self k=2", "self adaptive", "self tree 6,3,2", "self adaptive tree 6,3,2"]
    tree = modes["self tree 6,3,2"]
    assert all(m["identical"]["fraction"] == 1.0 for m in modes.values())
    assert tree["tree"] == "6,3,2" and tree["tree_steps"] > 0 and 1 <= tree["tree_nodes_mean"] <= 6
    assert 1 <= tree["k_mean"] <= 3 and tree["tau"] > 1.5 and tree["ideal_speedup"] > 0
    assert tree["decode_speedup"]["all"] > 0 and tree["cycle_speedup"]["p50"] > 0
    where = rec["where_accepted"]["self tree 6,3,2"]
    rates = {c: where["by_class"][c]["accept_rate"] for c in ("routine", "commitment")}
    assert set(rates.values()) <= {1.0, None} and 1.0 in rates.values(), rates
    cycles = [c for c in rec["cycles"] if c["mode"] == "self tree 6,3,2"]       # repeat 0
    accepted = sum(c["decode"]["accepted"] for c in cycles)
    assert sum(c["labels"].count("draft") for c in cycles) == accepted > 0
