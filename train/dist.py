"""Data parallelism for torchrun (gloo on CPU, nccl on GPU), with no wrapper class.

Each rank reads its own slice of the global batch and computes the mean loss over its
slice; `average_gradients` all-reduces every gradient and divides by the world size, so with
equal slices the update equals one process on the combined batch:
    grad = (1/W) sum_r (1/B) sum_{i in slice r} dL_i = (1/(W B)) sum_i dL_i.
"""
from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init() -> World:
    """Join the process group torchrun describes (WORLD_SIZE > 1), else a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        atexit.register(_close)
    return World(dist.get_rank(), dist.get_world_size())


def _close() -> None:
    """Leave the group before the interpreter shuts down: a gloo group still alive at exit can
    abort the process ("terminate called without an active exception") after a finished run."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def average_gradients(params, world: World) -> None:
    """grad <- (1/W) sum over ranks of grad, in one flat all-reduce (a missing grad counts as 0)."""
    if world.size == 1:
        return
    params = [p for p in params if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world.size
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def broadcast_parameters(modules, world: World) -> None:
    """Start every rank from rank 0's weights (cheap insurance against a differing init)."""
    if world.size == 1:
        return
    for module in modules:
        for t in module.state_dict().values():
            dist.broadcast(t, src=0)


def mean_scalar(value: float, world: World) -> float:
    """Average a logged number over ranks (for logs only)."""
    if world.size == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / world.size


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()
