"""Racy on purpose, in NVRTC: launched under a private stream that does not wait for the caller's stream (nor
the caller's for it). Must be rejected: unordered_stream."""

import torch
import torch.nn as nn

_SOURCE = r"""
extern "C" __global__ void leaky_scale(const float* __restrict__ x, float* __restrict__ out, int n,
                                       double slope, double scale) {
    const float sl = (float)slope, sc = (float)scale;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = x[i];
        out[i] = (v > 0.0f ? v : v * sl) * sc;
    }
}
"""

_side: list = []
_kernels = {}


def _kernel(name):
    if name not in _kernels:  # compiled once, on the first call
        _kernels[name] = torch.cuda._compile_kernel(_SOURCE, name)  # NVRTC optimises by default; it rejects -O3
    return _kernels[name]


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        threads = 256
        blocks = min((n + threads - 1) // threads, 65535)
        if n:
            if not _side:
                _side.append(torch.cuda.Stream())
            with torch.cuda.stream(_side[0]):  # not ordered with the current stream, either way
                _kernel("leaky_scale")(
                    grid=(blocks, 1, 1),
                    block=(threads, 1, 1),
                    args=[x, out, n, float(self.negative_slope), float(self.scale)],
                )
        return out
