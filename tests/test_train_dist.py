"""torchrun data parallelism really averages gradients: 2 gloo processes on different shards end
with the same weights as 1 process on the combined batch (and a run without averaging does not)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import safetensors.torch
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import os, sys
    import safetensors.torch, torch
    from train import data, dist, loop
    from train.config import RunConfig

    out, batch, average = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    torch.set_num_threads(1)
    if not average:                      # the negative control: ranks step on their own grads
        dist.average_gradients = lambda params, world: None
    world = dist.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(40, 6, generator=g), torch.randn(40, 2, generator=g)
    run = RunConfig(out=out, steps=6, batch_size=batch, lr=3e-2, warmup=0, ckpt_every_s=0,
                    log_every=1, grad_clip=1.0)

    def step_fn(step):
        idx = torch.from_numpy(data.batch_indices(40, batch, step, 0, world.rank, world.size))
        return ((model(X[idx]) - Y[idx]) ** 2).mean(), {}

    safetensors.torch.save_file(model.state_dict(), os.path.join(out, "init.safetensors"))
    loop.fit(run, {"model": model}, step_fn, world)
    safetensors.torch.save_file(model.state_dict(), os.path.join(out, f"rank{world.rank}.safetensors"))
''')


def _run(tmp_path: Path, name: str, nproc: int, batch: int, average: bool = True) -> list[dict]:
    script = tmp_path / "ddp_script.py"
    script.write_text(SCRIPT)
    out = tmp_path / name
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = [str(script), str(out), str(batch), "1" if average else "0"]
    if nproc == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_port", "0", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = [f"rank{r}" for r in range(nproc)] + ["init"]
    return [safetensors.torch.load_file(str(out / f"{n}.safetensors")) for n in names]


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_on_the_combined_batch(tmp_path):
    single, start = _run(tmp_path, "single", 1, 8)
    ranks = _run(tmp_path, "ddp", 2, 4)
    assert _max_diff(ranks[0], ranks[1]) == 0.0, "ranks ended with different weights"
    diff = _max_diff(ranks[0], single)
    assert diff < 1e-5, f"2 ranks x 4 vs 1 x 8: max weight difference {diff:.3g}"
    moved = _max_diff(single, start)
    assert moved > 1e-3, "training did not move the weights; the comparison would prove nothing"
    alone = _run(tmp_path, "no_average", 2, 4, average=False)
    assert _max_diff(alone[0], single) > 1e-4, "without gradient averaging the ranks still matched"


@pytest.mark.slow
def test_sft_on_two_gloo_ranks_matches_one_process(tmp_path):
    """The real SFT stage (micro preset, 8 scenes): torchrun 2 x batch 2 == 1 x batch 4."""
    import yaml
    from scenes.dataset import GenerateConfig, generate
    from train_inputs import micro_preset

    generate(GenerateConfig(out=str(tmp_path / "scenes"), n=12, seed=1), progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    finals = {}
    for name, nproc, batch in (("one", 1, 4), ("two", 2, 2)):
        cfg = {"preset": micro_preset(tmp_path), "data": {"dir": str(tmp_path / "scenes"), "max_scenes": 8},
               "run": {"out": str(tmp_path / name), "steps": 2, "batch_size": batch, "warmup": 0, "lr": 3e-3,
                       "ckpt_every_s": 0, "log_every": 1, "threads": 1}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        launch = [sys.executable] if nproc == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0"]
        proc = subprocess.run([*launch, "-m", "tools.train_cli", "sft", "--config", str(tmp_path / f"{name}.yaml")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        finals[name] = safetensors.torch.load_file(str(tmp_path / name / "ckpt" / "target" / "target.safetensors"))
    # AdamW moves each weight by about lr = 3e-3 per step, so a rank that stepped on its own
    # gradients would be off by ~1e-3; rounding (amplified by Adam on tiny gradients) stays ~1e-5
    diff = _max_diff(finals["one"], finals["two"])
    assert diff < 1e-4, f"SFT on 2 ranks x 2 vs 1 x 4 scenes: max weight difference {diff:.3g}"
