"""No kernel on purpose: defines a Triton kernel but never launches it; forward runs the reference's torch ops."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def swish_clamp_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # decoy: never launched
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float, lo: float, hi: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale + self.bias
        y = y * torch.sigmoid(y)
        y = torch.clamp(y, self.lo, self.hi)
        return y * x + x
