"""Correct, in Triton on two streams: each half on a stream that waits for the caller's stream; the caller's
stream waits for both. Must be accepted, with extra_stream only."""

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
        current = torch.cuda.current_stream()
        half = x.numel() // 2
        flat_x, flat_out = x.view(-1), out.view(-1)
        for k, stream in enumerate(_streams):
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                part = slice(0, half) if k == 0 else slice(half, None)
                _relu(flat_x[part], flat_out[part])
            out.record_stream(stream)
        for stream in _streams:
            current.wait_stream(stream)
        return out
