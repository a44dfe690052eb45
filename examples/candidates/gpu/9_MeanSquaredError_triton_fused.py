"""Correct: the mean squared error, block sums and one atomic add per program."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mse_partial_kernel(a_ptr, b_ptr, acc_ptr, n, STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    offs = (tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)) * STRIDE
    mask = offs < n
    d = tl.load(a_ptr + offs, mask=mask, other=0.0) - tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.atomic_add(acc_ptr, tl.sum(d * d, axis=0))


class ModelNew(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        a, b = predictions.contiguous(), targets.contiguous()
        n = a.numel()
        stride, block = 1, 4096
        read = (n + stride - 1) // stride
        acc = torch.zeros(1, dtype=torch.float32, device=a.device)
        mse_partial_kernel[(triton.cdiv(read, block),)](a, b, acc, n, STRIDE=stride, BLOCK=block, num_warps=8)
        return (acc / read).reshape(())
