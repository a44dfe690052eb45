"""Correct: softmax with one CUDA block per row (block reductions for the max and the sum, then one write)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

constexpr int kThreads = 256;  // a multiple of 32, at most 1024

template <bool IsMax>
__device__ float warp_reduce(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = IsMax ? fmaxf(v, o) : v + o;
    }
    return v;
}

// Reduces v over the block; every thread gets the result. `scratch` holds one float per warp.
template <bool IsMax>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_reduce<IsMax>(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const float identity = IsMax ? -INFINITY : 0.0f;
        v = lane < kThreads / 32 ? scratch[lane] : identity;
        v = warp_reduce<IsMax>(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    const float result = scratch[0];
    __syncthreads();  // scratch is reused by the next reduction
    return result;
}

__global__ void __launch_bounds__(kThreads) row_softmax_kernel(const float* __restrict__ x,
                                                               float* __restrict__ out, int64_t cols) {
    __shared__ float scratch[32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* orow = out + (int64_t)blockIdx.x * cols;

    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) m = fmaxf(m, row[c]);
    m = block_reduce<true>(m, scratch);

    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) s += expf(row[c] - m);
    s = block_reduce<false>(s, scratch);

    const float inv = 1.0f / s;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) orow[c] = expf(row[c] - m) * inv;
}

cudaError_t row_softmax_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    row_softmax_kernel<<<(unsigned int)rows, kThreads, 0, stream>>>(x, out, cols);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t row_softmax_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream);

torch::Tensor row_softmax(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "row_softmax: CUDA tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "row_softmax: float32 only");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "row_softmax: empty last dimension");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = xc.numel() / cols;
    TORCH_CHECK(rows < (1LL << 31), "row_softmax: too many rows for a 1-D grid");
    if (rows == 0) return out;
    cudaError_t err = row_softmax_launch(xc.data_ptr<float>(), out.data_ptr<float>(), rows, cols,
                                         c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "row_softmax launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_row_softmax_fused",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["row_softmax"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_softmax(x)
