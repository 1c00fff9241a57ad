"""`--device cuda` for the train stages (sft, distill, aarl, eval): refused with a clear error
where torch sees no GPU; on a GPU (tests marked gpu) the stages chain there and write what they
write on the cpu, and the losses that draw no randomness match the cpu's first step."""
import json
import subprocess
import sys

import pytest
import torch
import yaml

from core.config import ConfigError
from train import aarl, config, distill, evaluate, loop, sft
from train_inputs import stage_root

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_device_cuda_is_refused_by_name_where_torch_sees_no_gpu(tmp_path):
    with pytest.raises(ConfigError, match="device 'cuda': torch sees no CUDA GPU"):
        loop.device("cuda")
    with pytest.raises(ConfigError, match="run.device"):
        config.RunConfig(device="tpu")
    r = subprocess.run([sys.executable, "-m", "tools.cli", "train", "aarl", "--config", "configs/train/aarl.yaml",
                        "--set", "target=checkpoints/tiny", "--set", "draft=checkpoints/tiny/draft-flat",
                        "--device", "cuda"], capture_output=True, text=True)
    assert r.returncode == 2 and "torch sees no CUDA GPU" in r.stderr, r.stderr[-500:]


def _write(root, name, body) -> str:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def _run(root, out, steps, device):
    return {"out": str(root / out), "steps": steps, "batch_size": 2, "warmup": 1, "lr": 3e-3,
            "ckpt_every_s": 0, "log_every": 1, "threads": 0, "device": device}


def _first(root, path) -> dict:
    return json.loads((root / path).read_text().splitlines()[0])


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_the_stages_run_on_cuda_as_on_the_cpu(tmp_path):
    root = stage_root(tmp_path, seed=0)
    data_cfg = {"dir": str(root / "scenes"), "max_scenes": 4}
    out = {}
    for dev in ("cpu", "cuda"):
        target = sft.run(config.load("sft", _write(root, f"sft-{dev}", {
            "preset": str(root / "micro.yaml"), "data": data_cfg, "run": _run(root, f"sft-{dev}", 2, dev)})))
        drafts = distill.run(config.load("distill", _write(root, f"distill-{dev}", {
            "target": str(target), "data": data_cfg, "max_new_tokens": 6, "gen_batch": 4, "drafts": ["flat"],
            "run": _run(root, f"distill-{dev}", 2, dev)})))
        post = aarl.run(config.load("aarl", _write(root, f"aarl-{dev}", {
            "target": str(target), "draft": str(drafts[0]), "group": 2, "max_new_tokens": 5, "data": data_cfg,
            "run": _run(root, f"aarl-{dev}", 2, dev)})))
        metrics = evaluate.run(config.load("eval", _write(root, f"eval-{dev}", {
            "planner": str(target), "drafts": [str(drafts[0]), str(post)], "splits": ["test"], "max_new_tokens": 6,
            "k": 3, "data": {"dir": str(root / "scenes"), "max_scenes": 2}, "out": str(root / f"eval-{dev}.json"),
            "device": dev})))
        out[dev] = {"sft": _first(root, f"sft-{dev}/log.jsonl"), "distill": _first(root, f"distill-{dev}/flat-s0/log.jsonl"),
                    "aarl": _first(root, f"aarl-{dev}/log.jsonl"), "eval": json.loads(open(metrics).read())}
    cpu, gpu = out["cpu"], out["cuda"]
    for stage in ("sft", "distill", "aarl"):
        assert set(cpu[stage]) == set(gpu[stage]), stage
    assert gpu["sft"]["coc"] == pytest.approx(cpu["sft"]["coc"], rel=1e-3)          # no randomness in it
    assert gpu["sft"]["future"] == pytest.approx(cpu["sft"]["future"], rel=1e-3)
    assert gpu["distill"]["loss"] == pytest.approx(cpu["distill"]["loss"], rel=1e-2)
    for key in ("reward", "kl", "accepted"):
        assert torch.isfinite(torch.tensor(gpu["aarl"][key]))
    c, g = cpu["eval"]["splits"]["test"]["drafts"], gpu["eval"]["splits"]["test"]["drafts"]
    assert set(c) == set(g)
    for name in c:
        assert set(c[name]) == set(g[name]) and g[name]["tau"] == pytest.approx(c[name]["tau"], abs=0.2)
