"""Correct: affine, SiLU, clamp and gated residual in one NVRTC-compiled kernel."""

import torch
import torch.nn as nn

_SOURCE = r"""
extern "C" __global__ void swish_clamp(const float* __restrict__ x, const float* __restrict__ bias,
                                       float* __restrict__ out, int n, int features,
                                       double scale, double lo, double hi) {
    const float sc = (float)scale, l = (float)lo, h = (float)hi;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = x[i];
        const float y = v * sc + bias[i % features];
        const float s = y / (1.0f + expf(-y));  // SiLU
        out[i] = fminf(fmaxf(s, l), h) * v + v;
    }
}
"""

_kernels = {}


def _kernel(name):
    if name not in _kernels:  # compiled once, on the first call
        _kernels[name] = torch.cuda._compile_kernel(_SOURCE, name)  # NVRTC optimises by default; it rejects -O3
    return _kernels[name]


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float, lo: float, hi: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.size(-1) == self.bias.numel() and x.numel() < 2**31
        x = x.contiguous()
        bias = self.bias.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        threads = 256
        blocks = min((n + threads - 1) // threads, 65535)
        if n:
            _kernel("swish_clamp")(
                grid=(blocks, 1, 1),
                block=(threads, 1, 1),
                args=[x, bias, out, n, bias.numel(), float(self.scale), float(self.lo), float(self.hi)],
            )
        return out
