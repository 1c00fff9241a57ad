"""cuda-python's runtime API for the TensorRT backend: every call's (error, value...) result checked,
device and pinned host memory allocated once and freed by `close`. pycuda is not used: it cannot be
built without the CUDA headers, and NVIDIA maintains cuda-python.

Documentation followed: CUDA Runtime API 12.x ("Memory Management": cudaMalloc, cudaMallocHost,
cudaMemcpyAsync, cudaMemcpy2DAsync). cuda-python returns (error, value...) tuples from every call.
"""
from __future__ import annotations

import ctypes

import numpy as np


class Cuda:
    """cuda-python's runtime API with its (error, value...) results checked, and every allocation
    this backend made (freed by close)."""

    def __init__(self, rt):
        self.rt, self.ok = rt, rt.cudaError_t.cudaSuccess
        self.kind = rt.cudaMemcpyKind
        self.device, self.host = [], []

    def __call__(self, name: str, *args):
        err, *values = getattr(self.rt, name)(*args)
        if err != self.ok:
            raise RuntimeError(f"CUDA {name}: {err}")
        return values[0] if len(values) == 1 else (tuple(values) or None)

    def malloc(self, nbytes: int) -> int:
        ptr = int(self("cudaMalloc", max(int(nbytes), 1)))
        self.device.append(ptr)
        return ptr

    def pinned(self, shape, dtype) -> np.ndarray:
        """Page-locked host memory (cudaMallocHost) as a numpy array: async copies from it."""
        nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
        ptr = int(self("cudaMallocHost", nbytes))
        self.host.append(ptr)
        return np.frombuffer((ctypes.c_byte * nbytes).from_address(ptr), dtype).reshape(shape)

    def h2d(self, dst: int, host: np.ndarray, stream) -> None:
        self("cudaMemcpyAsync", dst, host.ctypes.data, host.nbytes, self.kind.cudaMemcpyHostToDevice, stream)

    def d2h(self, host: np.ndarray, src: int, stream) -> None:
        self("cudaMemcpyAsync", host.ctypes.data, src, host.nbytes, self.kind.cudaMemcpyDeviceToHost, stream)

    def d2d(self, dst: int, src: int, nbytes: int, stream) -> None:
        self("cudaMemcpyAsync", dst, src, nbytes, self.kind.cudaMemcpyDeviceToDevice, stream)

    def blocks(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, stream) -> None:
        """`height` blocks of `width` bytes, pitches in bytes (cudaMemcpy2DAsync, device to device)."""
        self("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height,
             self.kind.cudaMemcpyDeviceToDevice, stream)

    def close(self) -> None:
        for ptr in self.device:
            self("cudaFree", ptr)
        for ptr in self.host:
            self("cudaFreeHost", ptr)
        self.device, self.host = [], []

