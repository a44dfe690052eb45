"""Correct control: the GEMM removed by algebra, sum_n (x W^T)[b, n] = x[b, :] . (sum_n W[n, :]).

The column sums of the weight are a weight-layout cache of its own kernel (double accumulation), kept while the
weight's data_ptr() and its ._version are those it was computed from (an in-place update, a new tensor or a
move recomputes it; the cache holds the weight's storage so its address cannot be reused meanwhile); each call is
then one matrix-vector product (one block per row, warp-shuffle reduction): ~32 MB read instead of 137 GFLOP.
Right for every input, far faster than the float32 compute bound of the reference's GEMM: accepted, flagged
faster_than_sol and large_speedup, both informational.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

// wsum[k] = sum_n w[n, k] for a row-major (rows x cols) w: 32 columns per block, 8 row phases summed in shared memory.
__global__ void column_sum_kernel(const float* __restrict__ w, double* __restrict__ wsum, int64_t rows,
                                  int64_t cols) {
    __shared__ double part[8][33];
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double s = 0.0;
    if (col < cols)
        for (int64_t r = threadIdx.y; r < rows; r += 8) s += (double)w[r * cols + col];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        double t = 0.0;
#pragma unroll
        for (int i = 0; i < 8; ++i) t += part[i][threadIdx.x];
        wsum[col] = t;
    }
}

constexpr int kThreads = 256;

// out[b] = x[b, :] . wsum: one block per row, double accumulation, warp shuffles then one value per warp.
__global__ void __launch_bounds__(kThreads) row_dot_kernel(const float* __restrict__ x,
                                                           const double* __restrict__ wsum,
                                                           float* __restrict__ out, int64_t cols) {
    __shared__ double warp_sums[kThreads / 32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) s += (double)row[c] * wsum[c];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) out[blockIdx.x] = (float)s;
    }
}

cudaError_t column_sum_launch(const float* w, double* wsum, int64_t rows, int64_t cols, cudaStream_t stream) {
    column_sum_kernel<<<(unsigned int)((cols + 31) / 32), dim3(32, 8), 0, stream>>>(w, wsum, rows, cols);
    return cudaGetLastError();
}

cudaError_t row_dot_launch(const float* x, const double* wsum, float* out, int64_t rows, int64_t cols,
                           cudaStream_t stream) {
    row_dot_kernel<<<(unsigned int)rows, kThreads, 0, stream>>>(x, wsum, out, cols);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t column_sum_launch(const float* w, double* wsum, int64_t rows, int64_t cols, cudaStream_t stream);
cudaError_t row_dot_launch(const float* x, const double* wsum, float* out, int64_t rows, int64_t cols,
                           cudaStream_t stream);

// (in_features,) float64: the sum of the weight's rows (out_features, in_features)
torch::Tensor column_sum(torch::Tensor weight) {
    TORCH_CHECK(weight.is_cuda() && weight.scalar_type() == torch::kFloat, "column_sum: float32 CUDA weight");
    TORCH_CHECK(weight.dim() == 2, "column_sum: 2-D weight expected");
    auto wc = weight.contiguous();
    auto wsum = torch::zeros({wc.size(1)}, wc.options().dtype(torch::kFloat64));
    if (wc.numel() == 0) return wsum;
    TORCH_CHECK((wc.size(1) + 31) / 32 < (1LL << 31), "column_sum: too many columns");
    cudaError_t err = column_sum_launch(wc.data_ptr<float>(), wsum.data_ptr<double>(), wc.size(0), wc.size(1),
                                        c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "column_sum launch failed: ", cudaGetErrorString(err));
    return wsum;
}

// (batch, 1) float32: x (batch, in_features) times the column sums
torch::Tensor row_dot(torch::Tensor x, torch::Tensor wsum) {
    TORCH_CHECK(x.is_cuda() && wsum.is_cuda(), "row_dot: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && wsum.scalar_type() == torch::kFloat64, "row_dot: dtypes");
    TORCH_CHECK(x.dim() == 2 && wsum.dim() == 1 && x.size(1) == wsum.size(0), "row_dot: x (batch, in) expected");
    auto xc = x.contiguous();
    auto out = torch::empty({xc.size(0), 1}, xc.options());
    if (xc.size(0) == 0) return out;
    if (xc.size(1) == 0) return out.zero_();
    TORCH_CHECK(xc.size(0) < (1LL << 31), "row_dot: too many rows for a 1-D grid");
    cudaError_t err = row_dot_launch(xc.data_ptr<float>(), wsum.data_ptr<double>(), out.data_ptr<float>(),
                                     xc.size(0), xc.size(1), c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "row_dot launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_gemm_sum_11_algebra",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["column_sum", "row_dot"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self._key = None  # (data_ptr, _version) of the weight the column sums were computed from
        self._held = None  # that weight's storage, held so that no other tensor takes its address
        self._wsum = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight
        key = (w.data_ptr(), w._version)
        if key != self._key or self._wsum is None or self._wsum.device != w.device:
            self._wsum = _ext.column_sum(w.detach())
            self._key, self._held = key, w.detach()
        return _ext.row_dot(x, self._wsum)
