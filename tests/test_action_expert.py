"""Flow-matching action expert: unicycle maths, attention wiring (non-causal, reads exactly the
target cache rows [0, cache_len)), determinism, and a training loss that trains."""
import dataclasses
import math

import pytest
import torch

from models.action_expert import (ActionExpert, actions_to_waypoints, v0_from_history,
                                  waypoints_to_actions)
from models.config import load_preset

CACHE_LEN, MAX_LEN = 40, 56


@pytest.fixture(scope="module")
def cfg():
    """The tiny preset cut to 4 layers (the expert has one layer per target layer): the same
    shapes per layer, a third of the CPU time."""
    tiny = load_preset("tiny")
    llm = dataclasses.replace(tiny.target.llm, layers=4)
    return dataclasses.replace(tiny, target=dataclasses.replace(tiny.target, llm=llm),
                               draft=dataclasses.replace(tiny.draft, feature_layers=()))


@pytest.fixture(scope="module")
def expert(cfg):
    torch.manual_seed(0)
    e = ActionExpert(cfg.expert, cfg.target.llm).eval()
    with torch.no_grad():  # perturb norms/biases so no parameter sits at a symmetric default
        for p in e.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return e


def target_cache(cfg, batch=1, seed=1):
    llm = cfg.target.llm
    g = torch.Generator().manual_seed(seed)
    return torch.randn(llm.layers, 2, batch, llm.kv_heads, MAX_LEN, llm.head_dim, generator=g)


def smooth_actions(batch, n=64, seed=0):
    """Low-frequency accel (m/s^2) and curvature (1/m) profiles, like a driven trajectory."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 6.4, n, dtype=torch.float64)
    f, ph = torch.rand(2, batch, 2, 1, generator=g, dtype=torch.float64)
    accel = 1.5 * torch.sin(t * (0.2 + f[:, 0]) + 6 * ph[:, 0])
    kappa = 0.03 * torch.cos(t * (0.2 + f[:, 1]) + 6 * ph[:, 1])
    return torch.stack([accel, kappa], -1)


def test_unicycle_straight_line_and_circle():
    t = 0.1 * torch.arange(1, 65, dtype=torch.float64)
    straight = actions_to_waypoints(torch.zeros(1, 64, 2, dtype=torch.float64), torch.tensor([8.0]))
    assert torch.allclose(straight[0, :, 0], 8.0 * t) and straight[0, :, 1:].abs().max() == 0
    R, v = 20.0, 5.0   # constant speed and curvature: a circle of radius R centred at (0, R)
    acts = torch.zeros(1, 64, 2, dtype=torch.float64)
    acts[..., 1] = 1 / R
    wp = actions_to_waypoints(acts, torch.tensor([v]))[0]
    assert torch.allclose(wp[:, 2], v * t / R)
    radius = torch.hypot(wp[:, 0], wp[:, 1] - R)
    # the trapezoid step v dt cos(dth/2) falls short of the chord 2R sin(dth/2) by ~v dt dth^2/12
    dth = v * 0.1 / R
    bound = 64 * v * 0.1 * dth ** 2 / 12
    assert (radius - R).abs().max() < bound, f"max radius error {(radius - R).abs().max():.2e} m"


def test_unicycle_round_trip():
    acts, v0 = smooth_actions(4), torch.tensor([10.0, 14.0, 18.0, 25.0], dtype=torch.float64)
    wp = actions_to_waypoints(acts, v0)
    exact = waypoints_to_actions(wp, v0, smooth=0.0)
    err = (exact - acts).abs().amax((0, 1))
    assert err[0] < 1e-6 and err[1] < 1e-6, f"exact inverse: max |d accel|, |d kappa| = {err.tolist()}"
    default = waypoints_to_actions(wp, v0)
    err = (default - acts).abs().amax((0, 1))
    assert err[0] < 1e-2 and err[1] < 1e-4, f"smoothed inverse: {err.tolist()}"
    back = actions_to_waypoints(default, v0)
    assert (back - wp).abs().max() < 1e-4, f"waypoint round trip {(back - wp).abs().max():.2e} m"


def test_inverse_of_a_standing_car_is_finite():
    wp = torch.zeros(2, 64, 3)
    acts = waypoints_to_actions(wp, torch.zeros(2))
    assert torch.isfinite(acts).all() and acts.abs().max() < 1e-6


def test_v0_from_history_constant_acceleration():
    t = 0.1 * torch.arange(-15, 1, dtype=torch.float64)
    v, a = 7.0, -1.2
    history = torch.stack([v * t + a * t * t / 2, torch.zeros_like(t), torch.zeros_like(t)], -1)
    assert abs(float(v0_from_history(history)) - v) < 1e-9
    with pytest.raises(ValueError, match="T >= 3"):
        v0_from_history(history[:2])


def velocity(expert, noise, cache, cache_len=CACHE_LEN):
    B = noise.shape[0]
    cos, sin = expert.rope(cache_len, 0, B)
    with torch.no_grad():
        return expert.velocity(noise, torch.full((B,), 0.3), cache, cache_len, cos, sin)


def test_non_causal_over_waypoints(expert, cfg):
    g = torch.Generator().manual_seed(3)
    noise = torch.randn(1, 64, 2, generator=g)
    later = noise.clone()
    later[0, 63] += 1.0   # change only the last waypoint's noise
    cache = target_cache(cfg)
    v1, v2 = velocity(expert, noise, cache), velocity(expert, later, cache)
    assert (v1[0, 0] - v2[0, 0]).abs().max() > 1e-6, "waypoint 0 ignores waypoint 63: causal?"
    w1, _ = expert.sample(cache, CACHE_LEN, torch.tensor([5.0]), steps=2, noise=noise)
    w2, _ = expert.sample(cache, CACHE_LEN, torch.tensor([5.0]), steps=2, noise=later)
    assert (w1[0, 0] - w2[0, 0]).abs().max() > 0


def test_reads_cache_rows_below_cache_len_only(expert, cfg):
    noise = torch.randn(1, 64, 2, generator=torch.Generator().manual_seed(4))
    cache = target_cache(cfg)
    base = velocity(expert, noise, cache)
    past = cache.clone()
    past[:, :, :, :, CACHE_LEN:] = 1e3   # stale rows past the length: never read
    assert torch.equal(velocity(expert, noise, past), base)
    for layer in (0, cfg.target.llm.layers - 1):
        for kv in (0, 1):
            inside = cache.clone()
            inside[layer, kv, :, :, 3] += 1.0
            diff = (velocity(expert, noise, inside) - base).abs().max()
            assert diff > 1e-6, f"layer {layer} {'KV'[kv]} row 3 has no effect"


def test_sample_is_deterministic_under_a_seed(expert, cfg):
    cache, v0 = target_cache(cfg), torch.tensor([3.0, 9.0])

    def run(seed):
        return expert.sample(cache, CACHE_LEN, v0, steps=3, generator=torch.Generator().manual_seed(seed))

    (w1, a1), (w2, a2), (w3, _) = run(7), run(7), run(8)
    assert w1.shape == (2, 64, 3) and a1.shape == (2, 64, 2)
    assert torch.equal(w1, w2) and torch.equal(a1, a2)
    assert not torch.equal(w1, w3)
    assert torch.allclose(w1, actions_to_waypoints(a1, v0))


def test_shared_prompt_cache_broadcasts_over_samples(expert, cfg):
    noise = torch.randn(3, 64, 2, generator=torch.Generator().manual_seed(5))
    cache = target_cache(cfg)
    together = velocity(expert, noise, cache)
    one = velocity(expert, noise[1:2], cache)
    assert torch.allclose(together[1:2], one, atol=1e-5), f"{(together[1:2] - one).abs().max():.2e}"


def test_batched_scenes_of_different_lengths(expert, cfg):
    """(B,) cache lengths and rope deltas in one call == one call per scene."""
    cache = target_cache(cfg, batch=3)
    noise = torch.randn(3, 64, 2, generator=torch.Generator().manual_seed(9))
    lens, deltas = torch.tensor([CACHE_LEN, 17, 30]), torch.tensor([-5, 0, -12])
    acts = torch.stack([torch.linspace(-1, 1, 64), torch.linspace(0.02, -0.02, 64)], -1).expand(3, -1, -1)
    t = torch.tensor([0.2, 0.5, 0.9])
    with torch.no_grad():
        cos, sin = expert.rope(lens, deltas, 3)
        together = expert.velocity(noise, t, cache, lens, cos, sin)
        loss = expert.loss(acts, cache, lens, rope_delta=deltas, t=t, noise=noise)
        per_scene, losses = [], []
        for b in range(3):
            cos, sin = expert.rope(int(lens[b]), int(deltas[b]), 1)
            one = slice(b, b + 1)
            per_scene.append(expert.velocity(noise[one], t[one], cache[:, :, one], int(lens[b]), cos, sin))
            losses.append(expert.loss(acts[one], cache[:, :, one], int(lens[b]),
                                      rope_delta=int(deltas[b]), t=t[one], noise=noise[one]))
    diff = (together - torch.cat(per_scene)).abs().max()
    assert diff < 1e-5, f"batched vs per-scene velocity: {diff:.2e}"
    assert abs(float(loss) - float(torch.stack(losses).mean())) < 1e-5


def test_mean_of_samples_averages_the_draws_in_action_space(expert, cfg):
    """samples=S: S draws per scene from one noise stream (scene-major), their actions averaged;
    equals drawing the same noise explicitly and averaging by hand, for a shared or per-scene cache."""
    S, v0 = 4, torch.tensor([3.0, 9.0])
    lens, deltas = torch.tensor([CACHE_LEN, 17]), torch.tensor([-5, 0])
    for cache in (target_cache(cfg), target_cache(cfg, batch=2)):
        wp, mean = expert.sample(cache, lens, v0, steps=3, rope_delta=deltas, samples=S,
                                 generator=torch.Generator().manual_seed(3))
        noise = torch.randn(2 * S, 64, 2, generator=torch.Generator().manual_seed(3))
        big = cache if cache.shape[2] == 1 else cache.repeat_interleave(S, dim=2)
        _, acts = expert.sample(big, lens.repeat_interleave(S), v0.repeat_interleave(S), steps=3,
                                rope_delta=deltas.repeat_interleave(S), noise=noise)
        by_hand = acts.view(2, S, 64, 2).mean(1)
        assert torch.allclose(mean, by_hand, atol=1e-6)
        assert torch.allclose(wp, actions_to_waypoints(by_hand, v0), atol=1e-5)
        assert acts.view(2, S, 64, 2).std(1).max() > 1e-3      # the draws really differ
        wp2, mean2 = expert.sample(cache, lens, v0, steps=3, rope_delta=deltas, samples=S, noise=noise)
        assert torch.equal(mean2, mean) and torch.equal(wp2, wp)    # explicit noise: the same draws
    with pytest.raises(ValueError, match="expected scenes x samples = 4"):
        expert.sample(target_cache(cfg), CACHE_LEN, v0, samples=2, noise=torch.zeros(2, 64, 2))


def test_euler_steps_and_normalisation(expert, cfg):
    cache, noise = target_cache(cfg), torch.randn(1, 64, 2, generator=torch.Generator().manual_seed(6))
    _, a10 = expert.sample(cache, CACHE_LEN, [4.0], noise=noise)
    _, a1 = expert.sample(cache, CACHE_LEN, [4.0], steps=1, noise=noise)
    assert not torch.allclose(a10, a1)
    # one Euler step from t = 0 is x1 = x0 + v(x0, 0); actions = x1 * std + mean
    cos, sin = expert.rope(CACHE_LEN, 0, 1)
    with torch.no_grad():
        v = expert.velocity(noise, torch.zeros(1), cache, CACHE_LEN, cos, sin)
    assert torch.allclose(a1, expert.denormalize(noise + v), atol=1e-6)


def test_loss_trains(cfg):
    torch.manual_seed(0)
    e = ActionExpert(cfg.expert, cfg.target.llm)
    cache = target_cache(cfg, batch=2)
    acts = smooth_actions(2).float()
    g = torch.Generator().manual_seed(0)
    t, noise = torch.rand(2, generator=g), torch.randn(2, 64, 2, generator=g)
    opt = torch.optim.Adam(e.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = e.loss(acts, cache, CACHE_LEN, t=t, noise=noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert math.isfinite(losses[0]) and losses[-1] < 0.5 * losses[0], f"losses {losses}"
    assert e.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_bad_inputs_are_named(expert, cfg):
    cache = target_cache(cfg)
    with pytest.raises(ValueError, match="target_cache shape"):
        expert.sample(cache[:, :, :, :1], CACHE_LEN, [1.0])
    with pytest.raises(ValueError, match="cache_len=99"):
        expert.sample(cache, 99, [1.0])
    with pytest.raises(ValueError, match=r"expected \(B, 64, 2\)"):
        expert.sample(cache, CACHE_LEN, [1.0], noise=torch.zeros(1, 32, 2))
    with pytest.raises(ValueError, match="batch 2 must be 1 or the expert batch 3"):
        expert.sample(target_cache(cfg, batch=2), CACHE_LEN, [1.0, 2.0, 3.0])
