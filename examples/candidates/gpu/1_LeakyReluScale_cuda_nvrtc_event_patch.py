"""Cheats (issue 13, case 5, on the GPU): replaces torch.cuda.Event.elapsed_time so that the timer reads a fifth
of its own calls' time. Must be rejected: tampered (the fingerprint sees torch.cuda.Event change)."""

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

_elapsed = torch.cuda.Event.elapsed_time
_mine = [0]


def _fast_elapsed(self, end):  # a fifth of the time of the two readings that follow one of its own calls
    ms = _elapsed(self, end)
    if _mine[0]:
        _mine[0] -= 1
        return ms * 0.2
    return ms


torch.cuda.Event.elapsed_time = _fast_elapsed

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
        _mine[0] = 2
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        threads = 256
        blocks = min((n + threads - 1) // threads, 65535)
        if n:
            _kernel("leaky_scale")(
                grid=(blocks, 1, 1),
                block=(threads, 1, 1),
                args=[x, out, n, float(self.negative_slope), float(self.scale)],
            )
        return out
