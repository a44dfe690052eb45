"""A cheat on purpose: float16 tensor cores on a float32 task (reduced precision, faster than float32's speed of light).

What real systems' inflated scores are made of: two cast kernels of its own (A and B to float16), torch.mm on the
half tensors (cuBLAS on tensor cores, float16 output), and its own cast back to float32. Its normalized error,
~3.6e-4 (float16 keeps 11 significant bits), is within the float32 tolerance (the task's inputs are small enough
for atol=1e-2) but over a thousand times the reference's own float32 error against float64 (~2.6e-7 on a CPU), and
it should run in well under half a millisecond on an H100, several times under the float32 CUDA-core bound of its
137 GFLOP (2.05 ms at 67 TFLOP/s): accepted, flagged reduced_precision and faster_than_sol (large_speedup too
where cuBLAS's float32 reference takes over 10x as long).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cstdint>

__global__ void f32_to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = __float2half_rn(x[i]);
}

__global__ void f16_to_f32_kernel(const __half* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = __half2float(x[i]);
}

static unsigned int grid_for(int64_t n, int threads) {
    const int64_t blocks = (n + threads - 1) / threads;
    return (unsigned int)(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

cudaError_t to_half_launch(const float* x, void* y, int64_t n, cudaStream_t stream) {
    f32_to_f16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, static_cast<__half*>(y), n);
    return cudaGetLastError();
}

cudaError_t to_float_launch(const void* x, float* y, int64_t n, cudaStream_t stream) {
    f16_to_f32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const __half*>(x), y, n);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t to_half_launch(const float* x, void* y, int64_t n, cudaStream_t stream);
cudaError_t to_float_launch(const void* x, float* y, int64_t n, cudaStream_t stream);

static torch::Tensor to_half(const torch::Tensor& x) {
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options().dtype(torch::kHalf));
    if (xc.numel() == 0) return y;
    cudaError_t err = to_half_launch(xc.data_ptr<float>(), y.data_ptr(), xc.numel(),
                                     c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "to_half launch failed: ", cudaGetErrorString(err));
    return y;
}

torch::Tensor half_matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "half_matmul: CUDA tensors expected");
    TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat, "half_matmul: float32 only");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "half_matmul: (M, K) @ (K, N) expected");
    auto c_half = torch::mm(to_half(a), to_half(b));  // cuBLAS, float16 tensor cores, on the current stream
    auto out = torch::empty(c_half.sizes(), c_half.options().dtype(torch::kFloat));
    if (out.numel() == 0) return out;
    cudaError_t err = to_float_launch(c_half.data_ptr(), out.data_ptr<float>(), out.numel(),
                                      c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "to_float launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_matmul_10_half_tensor_cores",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["half_matmul"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return _ext.half_matmul(A, B)
