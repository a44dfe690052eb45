"""Correct: leaky ReLU and scale in one Triton kernel (one read, one write per element)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def leaky_scale_kernel(x_ptr, out_ptr, n, slope, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(v > 0, v, v * slope) * scale, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        block = 4096
        leaky_scale_kernel[(triton.cdiv(n, block),)](
            x, out, n, self.negative_slope, self.scale, BLOCK=block, num_warps=8
        )
        return out
