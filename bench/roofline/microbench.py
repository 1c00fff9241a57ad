"""This CPU's peaks, measured apart from any planner run (the roofline's validation device).

    matmul_gflops(n, threads)  best of a few fp32 (n x n) @ (n x n) matmuls in torch: 2 n^3 / t
    copy_gbps(mb)              best of a few numpy copies of an mb-MiB array: 2 x size / t
                               (one read and one write per byte; write-allocate traffic not counted)

Both run at the thread count of the run they validate (the tools default to one torch thread).
"""
from __future__ import annotations

import time

import numpy as np

from bench.common.costs import Device


def matmul_gflops(n: int = 1024, repeats: int = 5, threads: int = 1) -> float:
    import torch

    from bench.common.threads import torch_threads

    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    with torch_threads(threads), torch.inference_mode():
        torch.mm(a, b)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def copy_gbps(mb: int = 256, repeats: int = 5) -> float:
    src = np.ones(mb * 2 ** 20 // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def measure_cpu(threads: int = 1) -> dict:
    return {"matmul_gflops": round(matmul_gflops(threads=threads), 2), "copy_gbps": round(copy_gbps(), 2),
            "threads": threads, "how": "bench/roofline/microbench.py: fp32 torch.mm 1024^3 (best of 5), "
                                      "numpy copy of 256 MiB (best of 5, read + write bytes)"}


def cpu_device(peaks: dict) -> Device:
    """The measured CPU as a Device: the peaks are what was reached, so the efficiencies are 1;
    it runs the torch reference (attention over all cache rows, logits of every row)."""
    tf = peaks["matmul_gflops"] / 1e3
    return Device(title=f"this CPU ({peaks['threads']} thread, measured)", dram_gbps=peaks["copy_gbps"],
                  memory_gb=1.0, fp32_tflops=tf, fp16_tflops=tf, compute_efficiency=1.0,
                  memory_efficiency=1.0, impl="reference")
