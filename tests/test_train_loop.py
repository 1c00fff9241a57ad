"""The shared training loop: a resumed run ends exactly where an uninterrupted one does; the
schedule and the configs refuse nonsense with a message naming the value."""
import pytest
import torch

from core.config import ConfigError, from_dict
from train import config, data, dist, loop
from train.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")


class Interrupt(Exception):
    pass


def _toy_run(out, stop_at=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
    g = torch.Generator().manual_seed(3)
    X, Y = torch.randn(30, 5, generator=g), torch.randn(30, 1, generator=g)
    run = RunConfig(out=str(out), steps=8, batch_size=4, lr=2e-2, warmup=2, ckpt_every_s=1e-9, log_every=1)

    def step_fn(step):
        if step == stop_at:
            raise Interrupt
        idx = torch.from_numpy(data.batch_indices(30, 4, step, 0))
        noise = torch.randn(4, 1, generator=data.sample_rng(0, step, 0))
        return ((model(X[idx]) - Y[idx] - 0.1 * noise) ** 2).mean(), {}

    loop.fit(run, {"model": model}, step_fn, dist.World())
    return model.state_dict()


def test_resume_matches_uninterrupted(tmp_path):
    whole = _toy_run(tmp_path / "whole")
    with pytest.raises(Interrupt):
        _toy_run(tmp_path / "cut", stop_at=5)
    resumed = _toy_run(tmp_path / "cut")
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), f"{k}: max diff {(whole[k] - resumed[k]).abs().max():.3g}"
    fresh = _toy_run(tmp_path / "other", stop_at=None)
    assert torch.equal(fresh["0.weight"], whole["0.weight"])
    log = (tmp_path / "cut" / "log.jsonl").read_text().splitlines()
    assert len(log) == 8, "one log row per step across the interruption"


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    run = RunConfig(steps=100, lr=1e-3, warmup=10, min_lr_ratio=0.1)
    lrs = [loop.lr_at(s, run) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_batches_cover_each_epoch_and_split_across_ranks():
    one = [data.batch_indices(12, 4, s, seed=7) for s in range(3)]
    assert sorted(i for b in one for i in b) == list(range(12))
    two = [data.batch_indices(12, 2, 0, seed=7, rank=r, world=2) for r in range(2)]
    assert list(two[0]) + list(two[1]) == list(one[0])


def test_configs_refuse_bad_values(tmp_path):
    with pytest.raises(ConfigError, match="run.batch_size=0"):
        RunConfig(batch_size=0)
    with pytest.raises(ConfigError, match="drafts"):
        from_dict(config.DistillConfig, {"drafts": ["flat", "eagle"]})
    with pytest.raises(ConfigError, match="unknown key"):
        from_dict(config.SFTConfig, {"stepz": 3})
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: {steps: -1}\n")
    with pytest.raises(ConfigError, match="run.steps=-1"):
        config.load("sft", bad)
    with pytest.raises(ConfigError, match="stage='rl'"):
        config.load("rl", bad)
