"""Correct: softmax with one NVRTC-compiled block per row (block reductions for the max and the sum)."""

import torch
import torch.nn as nn

_THREADS = 256  # must match THREADS in the source

_SOURCE = r"""
#define THREADS 256

__device__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Block-wide max or sum; every thread gets the result. `scratch` holds one float per warp.
__device__ float block_reduce(float v, float* scratch, bool is_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < THREADS / 32 ? scratch[lane] : (is_max ? __int_as_float(0xff800000) : 0.0f);
        v = is_max ? warp_max(v) : warp_sum(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    const float result = scratch[0];
    __syncthreads();  // scratch is reused by the next reduction
    return result;
}

extern "C" __global__ void __launch_bounds__(THREADS) row_softmax(const float* __restrict__ x,
                                                                  float* __restrict__ out, int cols) {
    __shared__ float scratch[32];
    const float* row = x + (long long)blockIdx.x * cols;
    float* orow = out + (long long)blockIdx.x * cols;

    float m = __int_as_float(0xff800000);  // -inf
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, row[c]);
    m = block_reduce(m, scratch, true);

    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) s += expf(row[c] - m);
    s = block_reduce(s, scratch, false);

    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += THREADS) orow[c] = expf(row[c] - m) * inv;
}
"""

_kernels = {}


def _kernel(name):
    if name not in _kernels:  # compiled once, on the first call
        _kernels[name] = torch.cuda._compile_kernel(_SOURCE, name)  # NVRTC optimises by default; it rejects -O3
    return _kernels[name]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        cols = x.size(-1)
        rows = x.numel() // cols if cols else 0
        if rows:
            _kernel("row_softmax")(grid=(rows, 1, 1), block=(_THREADS, 1, 1), args=[x, out, cols])
        return out
