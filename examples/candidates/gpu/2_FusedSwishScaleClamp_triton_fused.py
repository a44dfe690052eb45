"""Correct: affine, SiLU, clamp and gated residual in one Triton kernel."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def swish_clamp_kernel(x_ptr, bias_ptr, out_ptr, n, features, scale, lo, hi, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(bias_ptr + offs % features, mask=mask)
    y = v * scale + b
    s = y * tl.sigmoid(y)  # SiLU
    c = tl.minimum(tl.maximum(s, lo), hi)
    tl.store(out_ptr + offs, c * v + v, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float, lo: float, hi: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.size(-1) == self.bias.numel()
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        block = 4096
        swish_clamp_kernel[(triton.cdiv(n, block),)](
            x, self.bias, out, n, self.bias.numel(), self.scale, self.lo, self.hi, BLOCK=block, num_warps=8
        )
        return out
