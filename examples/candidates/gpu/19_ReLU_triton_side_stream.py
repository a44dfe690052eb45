"""Racy on purpose, in Triton: the kernel launched under a private stream that does not wait for the caller's
stream (nor the caller's for it). Must be rejected: unordered_stream."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


_streams: list = []


def _relu(x: torch.Tensor, out: torch.Tensor) -> None:
    relu_kernel[(triton.cdiv(x.numel(), 8192),)](x, out, x.numel(), BLOCK=8192, num_warps=8)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        if not _streams:
            _streams.extend([torch.cuda.Stream(), torch.cuda.Stream()])
        with torch.cuda.stream(_streams[0]):  # nothing orders it with the current stream
            _relu(x, out)
        return out
