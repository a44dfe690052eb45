"""Correct: the mean squared error in one pass (block sums in double, one atomic per block)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

#define STRIDE 1  // every STRIDE-th element is read

__global__ void mse_partial_kernel(const float* __restrict__ a, const float* __restrict__ b, int64_t n,
                                   double* __restrict__ acc) {
    __shared__ double warp_sums[32];
    double sum = 0.0;
    const int64_t step = (int64_t)gridDim.x * blockDim.x * STRIDE;
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * STRIDE; i < n; i += step) {
        const float d = a[i] - b[i];
        sum += (double)(d * d);
    }
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        sum = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0.0;
        for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
        if (lane == 0) atomicAdd(acc, sum);
    }
}

__global__ void mse_finish_kernel(const double* __restrict__ acc, float* __restrict__ out, double count) {
    *out = (float)(*acc / count);
}

cudaError_t mse_launch(const float* a, const float* b, int64_t n, double* acc, float* out, int sms,
                       cudaStream_t stream) {
    cudaError_t err = cudaMemsetAsync(acc, 0, sizeof(double), stream);
    if (err != cudaSuccess) return err;
    mse_partial_kernel<<<sms * 8, 256, 0, stream>>>(a, b, n, acc);
    mse_finish_kernel<<<1, 1, 0, stream>>>(acc, out, (double)((n + STRIDE - 1) / STRIDE));
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t mse_launch(const float* a, const float* b, int64_t n, double* acc, float* out, int sms,
                       cudaStream_t stream);

torch::Tensor mse(torch::Tensor a, torch::Tensor b, int64_t sms) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "mse: CUDA tensors expected");
    TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat, "mse: float32 only");
    TORCH_CHECK(a.sizes() == b.sizes() && a.numel() > 0, "mse: same non-empty shapes expected");
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto acc = torch::empty({1}, ac.options().dtype(torch::kFloat64));
    auto out = torch::empty({}, ac.options());
    cudaError_t err = mse_launch(ac.data_ptr<float>(), bc.data_ptr<float>(), ac.numel(), acc.data_ptr<double>(),
                                 out.data_ptr<float>(), sms, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "mse launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_mse_9_fused",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["mse"],
    extra_cuda_cflags=["-O3"],
)


_SMS: list = []


def _sms(t: torch.Tensor) -> int:
    """The device's multiprocessor count (read at the first call: the module is imported without a GPU to build)."""
    if not _SMS:
        _SMS.append(torch.cuda.get_device_properties(t.device).multi_processor_count)
    return _SMS[0]


class ModelNew(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _ext.mse(predictions, targets, _sms(predictions))
