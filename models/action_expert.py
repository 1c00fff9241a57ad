"""Flow-matching action expert (Alpamayo-R1 style): 64 waypoints x (acceleration, curvature),
denoised in parallel by a narrow decoder whose layer i reads the target's layer-i KV cache.

    expert = ActionExpert(cfg.expert, cfg.target.llm)
    waypoints, actions = expert.sample(target_cache, cache_len, v0, generator=g)
    loss = expert.loss(actions_gt, target_cache, cache_len)         # flow-matching MSE
    actions_gt = waypoints_to_actions(future (B, 64, 3), v0)        # training targets

Flow matching (upstream alpamayo_r1/diffusion/flow_matching.py): x_t = t x1 + (1 - t) x0 with
x0 ~ N(0, I) noise and x1 the normalised actions; the network predicts the velocity x1 - x0;
sampling integrates dx/dt = v(x_t, t) from t = 0 (noise) to 1 with `euler_steps` Euler steps.

Attention: the 64 action tokens are non-causal among themselves (ExpertConfig.non_causal, upstream
expert_non_causal_attention; False: causal among them) and see the target's cache
rows [0, cache_len) in every layer (rows past cache_len are never read). cache_len is host
data (an int, or host lengths): the number of rows to read is known before the call, so
nothing is read back from the device (a graph or an export takes it as its bucket size). The expert projects
its queries, keys and values into the target's kv_heads x head_dim; its own K/V are joined to
the cache rows per call and never written into the target's cache, which the reasoning may
still be writing (the fallback trajectory runs beside it). Positions continue the target's
text positions: action token i sits at cache_len + rope_delta + i on all M-RoPE axes. Scenes of
different lengths batch together with (B,) cache_len / rope_delta (rows past each one's length
are masked out).

Unicycle (upstream alpamayo_r1/action_space/unicycle_accel_curvature.py), dt = 0.1 s, step k:
    v[k+1] = v[k] + a[k] dt
    th[k+1] = th[k] + kappa[k] (v[k] + v[k+1]) dt / 2
    p[k+1] = p[k] + (v[k] u(th[k]) + v[k+1] u(th[k+1])) dt / 2,   u(th) = (cos th, sin th)
from p[0] = (0, 0), th[0] = 0, v[0] = v0 (the ego speed at t0, from the history).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from models.config import ExpertConfig, LLMConfig
from models.layers import DecoderBlock, RMSNorm, attend
from models.rope import rope_cos_sin
from core.config import ConfigError
from prompt.trajectory import DT   # s between waypoints (10 Hz), as the scenes' futures and Alpamayo-R1

MAX_FREQ = 100.0         # Fourier features of the action input projection (upstream defaults)
BETA_T_SCALE = 0.999     # training t = 0.999 (1 - Beta(1.5, 1)): more weight near the noise
COMBINES = ("mean", "medoid")   # how sample() turns several draws into one trajectory


def in_proj_shape(cfg: ExpertConfig) -> tuple[int, int, int]:
    """(fourier_feats, mlp_layers, mlp_hidden) of the action input projection."""
    return cfg.fourier_feats, cfg.in_proj_layers, cfg.in_proj_hidden


def expert_llm(cfg: ExpertConfig, llm: LLMConfig) -> LLMConfig:
    """The expert decoder's shapes: its own width/heads/MLP, the target's depth, kv_heads,
    head_dim, q/k norm and rotary settings (it attends to the target's K/V)."""
    if cfg.heads % llm.kv_heads:
        raise ConfigError(f"expert.heads={cfg.heads} must be a multiple of the target's "
                          f"kv_heads={llm.kv_heads} (its queries read the target's K/V heads)")
    return dataclasses.replace(llm, hidden=cfg.hidden, heads=cfg.heads, intermediate=cfg.intermediate)


class Fourier(nn.Module):
    """x (...) -> sqrt(2) [sin(2 pi f x), cos(2 pi f x)] (..., dim), f log-spaced in [1, max_freq]."""

    def __init__(self, dim: int, max_freq: float = MAX_FREQ):
        super().__init__()
        self.register_buffer("freqs", torch.logspace(0, math.log10(max_freq), dim // 2)[None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        arg = x[..., None] * self.freqs * 2 * math.pi
        return torch.cat([arg.sin(), arg.cos()], -1) * math.sqrt(2)


class ActionInProj(nn.Module):
    """Per waypoint: [Fourier(a), Fourier(kappa), Fourier(t)] -> MLP -> LayerNorm (hidden).
    Names and layout follow upstream PerWaypointActionInProjV2 (trunk = Linear, SiLU, then
    (RMSNorm, Linear, SiLU) x (layers - 1) with the last SiLU dropped)."""

    def __init__(self, action_dim: int, out: int, feats: int, layers: int, hidden: int):
        super().__init__()
        self.sinus = nn.ModuleList(Fourier(feats) for _ in range(action_dim))
        self.timestep_fourier_encoder = Fourier(feats)
        trunk = [nn.Linear(feats * (action_dim + 1), hidden), nn.SiLU()]
        for i in range(layers):
            last = i == layers - 1
            trunk += [RMSNorm(hidden, 1e-5), nn.Linear(hidden, out if last else hidden)]
            trunk += [] if last else [nn.SiLU()]
        self.encoder = nn.Module()
        self.encoder.trunk = nn.Sequential(*trunk)
        self.norm = nn.LayerNorm(out)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x (B, W, action_dim), t (B,) -> (B, W, out), in the module's dtype."""
        dtype = self.norm.weight.dtype
        x, t = x.to(dtype), t.to(dtype)
        feats = [s(x[..., i]) for i, s in enumerate(self.sinus)]
        feats.append(self.timestep_fourier_encoder(t)[:, None].expand(-1, x.shape[1], -1))
        return self.norm(self.encoder.trunk(torch.cat(feats, -1)))


class ActionExpert(nn.Module):
    def __init__(self, cfg: ExpertConfig, llm: LLMConfig):
        super().__init__()
        self.cfg, self.llm = cfg, llm
        layer_cfg = expert_llm(cfg, llm)
        self.action_in_proj = ActionInProj(cfg.action_dim, cfg.hidden, *in_proj_shape(cfg))
        self.layers = nn.ModuleList(DecoderBlock(layer_cfg) for _ in range(llm.layers))
        self.norm = RMSNorm(cfg.hidden, llm.norm_eps)
        self.action_out_proj = nn.Linear(cfg.hidden, cfg.action_dim)
        # normalisation of (accel, curvature): the network sees (a - mean) / std (set by training)
        self.register_buffer("action_mean", torch.zeros(cfg.action_dim))
        self.register_buffer("action_std", torch.ones(cfg.action_dim))

    def rope(self, cache_len, rope_delta=0, batch: int = 1):
        """cos, sin (B, W, head_dim) of the action tokens: positions cache_len + rope_delta + i
        (cache_len, rope_delta: ints, or (B,) tensors for scenes of different lengths)."""
        dev = self.action_std.device
        start = torch.as_tensor(cache_len, device=dev) + torch.as_tensor(rope_delta, device=dev)
        pos = start.reshape(-1, 1) + torch.arange(self.cfg.n_waypoints, device=dev)
        llm = self.llm
        return rope_cos_sin(pos.expand(batch, -1), llm.head_dim, llm.rope_theta,
                            llm.mrope_section, llm.interleaved)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, target_cache: torch.Tensor,
                 cache_len, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, W, action_dim) noisy normalised actions at times t (B,) -> velocity (B, W, A).

        target_cache (layers, 2, Bc, kv_heads, max_len, head_dim), Bc = B or 1 (shared prompt);
        cache_len: a host int, or (B,) host lengths (row j of scene b is read iff j < cache_len[b]).
        The keys are the first max(cache_len) cache rows (a count known on the host, so nothing
        is read back from the device), then the W action rows.
        """
        B = x.shape[0]
        rows, mask = self._cache_keys(target_cache, cache_len, B)
        return self._flow(x, t, target_cache[:, :, :, :, :rows].expand(-1, -1, B, -1, -1, -1), mask, cos, sin)

    def _flow(self, x, t, ctx, mask, cos, sin) -> torch.Tensor:
        """The velocity network over context K/V rows `ctx` (layers, 2, B, KVH, rows, D), keys masked by
        `mask` (None or bool, broadcast to (B, 1, W, rows + W))."""
        h = self.action_in_proj(x, t)
        for blk, layer_ctx in zip(self.layers, ctx):
            q, k, v = blk.qkv(h, cos, sin)
            k, v = torch.cat([layer_ctx[0].to(k.dtype), k], 2), torch.cat([layer_ctx[1].to(v.dtype), v], 2)
            h = blk.finish(h, attend(q, k, v, mask))
        return self.action_out_proj(self.norm(h))

    def _cache_keys(self, cache: torch.Tensor, cache_len, batch: int):
        """Validate on the host; -> (cache rows to read = max(cache_len), bool mask (B, 1, 1,
        rows + W) hiding each scene's rows past its own length, or None when all are equal)."""
        llm = self.llm
        want = (llm.layers, 2, llm.kv_heads, llm.head_dim)
        got = (cache.shape[0], cache.shape[1], cache.shape[3], cache.shape[5]) if cache.dim() == 6 else None
        if got != want:
            raise ValueError(f"target_cache shape {tuple(cache.shape)}: expected (layers={want[0]}, "
                             f"2, B, kv_heads={want[2]}, max_len, head_dim={want[3]})")
        if cache.shape[2] not in (1, batch):
            raise ValueError(f"target_cache batch {cache.shape[2]} must be 1 or the expert batch {batch}")
        if isinstance(cache_len, torch.SymInt):    # traced for export: the context's own length
            return cache_len, None
        lens = torch.as_tensor(cache_len).reshape(-1)
        if lens.device.type != "cpu" or lens.numel() not in (1, batch) or lens.min() < 0 \
                or lens.max() > cache.shape[4]:
            raise ValueError(f"cache_len={cache_len} must be a host int or ({batch},) host lengths in "
                             f"[0, max_len={cache.shape[4]}]")
        rows, W = int(lens.max()), self.cfg.n_waypoints    # host lengths: no device read-back
        keys = torch.arange(rows + W)
        if self.cfg.non_causal and bool((lens == rows).all()):
            return rows, None
        mask = ((keys < lens[:, None]) | (keys >= rows))[:, None, None]          # (B|1, 1, 1, rows+W)
        if not self.cfg.non_causal:   # action token i sees cache rows and action tokens <= i
            mask = mask & (keys[None, :] < rows + 1 + torch.arange(W)[:, None])  # (B|1, 1, W, rows+W)
        return rows, mask.to(cache.device)

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        return (actions - self.action_mean) / self.action_std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.action_std + self.action_mean

    def loss(self, actions_gt: torch.Tensor, target_cache: torch.Tensor, cache_len, *,
             rope_delta=0, t: torch.Tensor | None = None, noise: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Flow-matching loss: mean over (B, W, A) of (v(x_t, t) - (x1 - x0))^2.

        actions_gt (B, W, A) physical (accel m/s^2, curvature 1/m), e.g. from
        `waypoints_to_actions`. t (B,) and noise (B, W, A) are drawn from `generator` if not given.
        cache_len / rope_delta: ints, or (B,) tensors to batch scenes of different prompt lengths.
        """
        x1 = self.normalize(actions_gt.float())
        B = x1.shape[0]
        self._check_actions(x1)
        if t is None:  # Beta(1.5, 1) by its inverse CDF u^(2/3), then t = 0.999 (1 - b)
            u = torch.rand(B, generator=generator, device=x1.device)
            t = BETA_T_SCALE * (1 - u.pow(2.0 / 3.0))
        if noise is None:
            noise = torch.randn(x1.shape, generator=generator, device=x1.device)
        x_t = t[:, None, None] * x1 + (1 - t[:, None, None]) * noise
        cos, sin = self.rope(cache_len, rope_delta, B)
        pred = self.velocity(x_t, t, target_cache, cache_len, cos, sin)
        return F.mse_loss(pred.float(), x1 - noise)

    @torch.no_grad()
    def sample(self, target_cache: torch.Tensor, cache_len, v0: torch.Tensor,
               steps: int | None = None, *, rope_delta=0, noise: torch.Tensor | None = None,
               generator: torch.Generator | None = None, samples: int = 1,
               combine: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
        """Euler-integrate the flow from noise: returns (waypoints (B, W, 3) x, y, heading in the
        ego frame at t0, actions (B, W, A) physical). v0 (B,) m/s; B = len(v0).

        noise (B, W, A) gives the starting point explicitly; otherwise it is drawn from
        `generator` (same seed -> same trajectory).

        samples > 1 integrates that many draws per scene as one batch and combines them:
        combine="mean" averages their actions (an estimate of the conditional mean, which is what
        displacement error rewards, but two modes average into a path nobody drew);
        combine="medoid" returns the draw whose waypoints are nearest (summed L2) to the others'.
        """
        v0 = torch.as_tensor(v0, dtype=torch.float32, device=self.action_std.device).reshape(-1)
        if combine not in COMBINES:
            raise ValueError(f"combine={combine!r}; choose one of {list(COMBINES)}")
        if samples > 1:
            return self._sample_many(target_cache, cache_len, v0, steps, rope_delta, noise, generator,
                                     samples, combine)
        B, steps = v0.shape[0], steps or self.cfg.euler_steps
        shape = (B, self.cfg.n_waypoints, self.cfg.action_dim)
        x = torch.randn(shape, generator=generator, device=v0.device) if noise is None else noise.float()
        self._check_actions(x)
        cos, sin = self.rope(cache_len, rope_delta, B)
        for i in range(steps):  # x <- x + dt v(x, t), t = i / steps
            t = torch.full((B,), i / steps, device=x.device)
            x = x + self.velocity(x, t, target_cache, cache_len, cos, sin).float() / steps
        return self.finish(x, v0)

    def sample_bucketed(self, target_cache: torch.Tensor, kv_len: int, cache_len: torch.Tensor, v0: torch.Tensor,
                        steps: int, *, rope_delta: torch.Tensor, noise: torch.Tensor, samples: int = 1,
                        combine: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
        """`sample` of one scene (cache batch 1, noise (samples, W, A)) with static shapes, for a CUDA
        graph: the keys are the first `kv_len` cache rows (a static bucket, >= the context), and
        the rows at or past `cache_len` (a (1,) device tensor, with rope_delta) are masked on the
        device. Nothing is read back or checked on the host: the caller checks cache_len <= kv_len.
        Equal to sample(target_cache, int(cache_len), ...) up to float rounding (masked rows weigh 0)."""
        if combine not in COMBINES:
            raise ValueError(f"combine={combine!r}; choose one of {list(COMBINES)}")
        S, W, dev = samples, self.cfg.n_waypoints, noise.device
        x = noise.float()
        keys = torch.arange(kv_len + W, device=dev)
        mask = ((keys < cache_len) | (keys >= kv_len))[None, None, None]            # (1, 1, 1, kv_len + W)
        if not self.cfg.non_causal:   # action token i sees cache rows and action tokens <= i
            mask = mask & (keys[None, :] < kv_len + 1 + torch.arange(W, device=dev)[:, None])
        cos, sin = self.rope(cache_len, rope_delta, S)
        ctx = target_cache[:, :, :, :, :kv_len].expand(-1, -1, S, -1, -1, -1)
        for i in range(steps):  # x <- x + dt v(x, t), t = i / steps
            t = torch.full((S,), i / steps, device=dev)
            x = x + self._flow(x, t, ctx, mask, cos, sin).float() / steps
        return self.finish(x, v0, S, combine)

    def finish(self, x: torch.Tensor, v0: torch.Tensor, samples: int = 1,
               combine: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
        """Integrated flow x (B*S, W, A) (normalised; scene-major draws) and v0 (B,) ->
        (waypoints (B, W, 3), actions (B, W, A)): denormalised, the S draws of each scene
        combined (mean in action space, or the medoid: the draw whose waypoints are nearest,
        summed L2, to the others'), integrated by the unicycle model."""
        actions, S = self.denormalize(x), samples
        if S == 1:
            return actions_to_waypoints(actions, v0), actions
        B = v0.shape[0]
        draws = actions.view(B, S, *actions.shape[1:])                     # (B, S, W, A)
        if combine == "mean":
            pick = draws.mean(1)
        else:
            xy = actions_to_waypoints(actions, v0.repeat_interleave(S))[..., :2].reshape(B, S, -1)
            pick = draws[torch.arange(B, device=draws.device), torch.cdist(xy, xy).sum(-1).argmin(-1)]
        return actions_to_waypoints(pick, v0), pick

    def _sample_many(self, cache, cache_len, v0, steps, rope_delta, noise, generator, samples: int,
                     combine: str):
        """`samples` draws per scene (scene-major: rows b*S .. b*S+S-1; noise (B*S, W, A) fixes
        them), integrated as one batch and combined by `finish`."""
        B, S = v0.shape[0], samples
        steps = steps or self.cfg.euler_steps

        def per_draw(x):   # a (B,) tensor of cache lengths / rope deltas -> (B*S,); ints stay
            return x.repeat_interleave(S) if torch.is_tensor(x) and x.numel() > 1 else x
        if cache.shape[2] > 1:
            cache = cache.repeat_interleave(S, dim=2)
        shape = (B * S, self.cfg.n_waypoints, self.cfg.action_dim)
        x = torch.randn(shape, generator=generator, device=v0.device) if noise is None else noise.float()
        self._check_actions(x)
        if x.shape[0] != B * S:
            raise ValueError(f"noise batch {x.shape[0]}: expected scenes x samples = {B * S}")
        cache_len, rope_delta = per_draw(cache_len), per_draw(rope_delta)
        cos, sin = self.rope(cache_len, rope_delta, B * S)
        for i in range(steps):  # x <- x + dt v(x, t), t = i / steps
            t = torch.full((B * S,), i / steps, device=x.device)
            x = x + self.velocity(x, t, cache, cache_len, cos, sin).float() / steps
        return self.finish(x, v0, S, combine)

    def _check_actions(self, x: torch.Tensor) -> None:
        want = (self.cfg.n_waypoints, self.cfg.action_dim)
        if x.dim() != 3 or tuple(x.shape[1:]) != want:
            raise ValueError(f"actions/noise shape {tuple(x.shape)}: expected (B, {want[0]}, {want[1]})")


def actions_to_waypoints(actions: torch.Tensor, v0: torch.Tensor, dt: float = DT) -> torch.Tensor:
    """Unicycle integration: actions (..., N, 2) (accel, curvature), v0 (...) -> (..., N, 3)
    waypoints (x, y, heading) at t = dt, 2 dt, ..., N dt (the trapezoid rule of the module doc)."""
    a, kappa = actions[..., 0], actions[..., 1]
    v0 = torch.as_tensor(v0, dtype=a.dtype, device=a.device)[..., None]
    v = torch.cat([v0, v0 + torch.cumsum(a * dt, -1)], -1)                  # (..., N+1)
    dth = kappa * (v[..., :-1] + v[..., 1:]) * dt / 2
    th = torch.cat([torch.zeros_like(v0), torch.cumsum(dth, -1)], -1)       # (..., N+1)
    vx, vy = v * th.cos(), v * th.sin()
    x = torch.cumsum((vx[..., :-1] + vx[..., 1:]) * dt / 2, -1)
    y = torch.cumsum((vy[..., :-1] + vy[..., 1:]) * dt / 2, -1)
    return torch.stack([x, y, th[..., 1:]], -1)


def waypoints_to_actions(waypoints: torch.Tensor, v0: torch.Tensor, dt: float = DT,
                         smooth: float = 1e-6, eps: float = 1e-4) -> torch.Tensor:
    """Inverse of `actions_to_waypoints`: (..., N, 3) waypoints, v0 (...) -> (..., N, 2).

    Speeds v[1..N] solve min sum_k |p[k+1] - p[k] - (v[k] u[k] + v[k+1] u[k+1]) dt/2|^2
    + smooth |second difference of v|^2 (headings from the waypoints); then
    a[k] = (v[k+1] - v[k]) / dt and kappa[k] = dth[k] s / (s^2 + eps^2), s = (v[k] + v[k+1]) dt / 2
    (the arc length; eps keeps a standing car's curvature finite). Exact on integrated actions
    up to the smoothing and eps terms.
    """
    wp = waypoints.double()
    N = wp.shape[-2]
    v0 = torch.as_tensor(v0, dtype=wp.dtype, device=wp.device)
    zero = torch.zeros_like(wp[..., :1, :])
    p = torch.cat([zero, wp], -2)                                            # (..., N+1, 3)
    th, d = p[..., 2], (p[..., 1:, :2] - p[..., :-1, :2])                    # (..., N+1), (..., N, 2)
    # A (..., 2N, N+1): rows (x, y) of step k hold u(th[k]) dt/2 at column k, u(th[k+1]) dt/2 at k+1
    A = torch.stack([_bidiagonal(c * dt / 2, N) for c in (th.cos(), th.sin())], -2)
    A = A.reshape(*wp.shape[:-2], 2 * N, N + 1)
    D = torch.zeros(max(N - 1, 0), N + 1, dtype=wp.dtype, device=wp.device)
    rows = torch.arange(N - 1, device=wp.device)
    D[rows, rows], D[rows, rows + 1], D[rows, rows + 2] = 1.0, -2.0, 1.0
    # normal equations for v[1..N] with v[0] = v0 moved to the right-hand side
    rhs = d.reshape(*wp.shape[:-2], 2 * N) - A[..., 0] * v0[..., None]
    lhs = A[..., 1:].mT @ A[..., 1:] + smooth * D[:, 1:].mT @ D[:, 1:]
    b = (A[..., 1:].mT @ rhs[..., None])[..., 0] - smooth * (D[:, 1:].mT @ D[:, 0]) * v0[..., None]
    v = torch.cat([v0[..., None], torch.linalg.solve(lhs, b[..., None])[..., 0]], -1)
    accel = (v[..., 1:] - v[..., :-1]) / dt
    dth = torch.atan2(torch.sin(th[..., 1:] - th[..., :-1]), torch.cos(th[..., 1:] - th[..., :-1]))
    s = (v[..., :-1] + v[..., 1:]) * dt / 2
    kappa = dth * s / (s * s + eps * eps)
    return torch.stack([accel, kappa], -1).to(waypoints.dtype)


def _bidiagonal(c: torch.Tensor, N: int) -> torch.Tensor:
    """c (..., N+1) -> (..., N, N+1) with c[k] at (k, k) and c[k+1] at (k, k+1)."""
    return F.pad(torch.diag_embed(c[..., :-1]), (0, 1)) + torch.diag_embed(c[..., 1:], offset=1)[..., :N, :]


def v0_from_history(history: torch.Tensor, dt: float = DT) -> torch.Tensor:
    """Ego speed at t0 from history (..., T, 3) (x, y, heading; history[-1] = (0, 0, 0)):
    second-order backward difference (3 p[-1] - 4 p[-2] + p[-3]) / (2 dt) along the t0 heading
    (x axis). Exact for constant acceleration on a straight line."""
    history = torch.as_tensor(history)
    if history.shape[-2] < 3 or history.shape[-1] < 2:
        raise ValueError(f"history shape {tuple(history.shape)}: need (..., T >= 3, 3) poses")
    x = history[..., 0]
    return (3 * x[..., -1] - 4 * x[..., -2] + x[..., -3]) / (2 * dt)
