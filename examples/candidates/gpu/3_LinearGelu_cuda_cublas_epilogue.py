"""Correct control: the matrix product through torch (float32 cuBLAS), then bias and exact GELU in a kernel of its own.

x @ weight.t() runs in float32 (TF32 stays off, torch's default), so the error is the reference's own order:
accepted with no flag, neither reduced_precision nor faster_than_sol.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

// out = gelu(y + bias) in place on y (the product, a temporary of ours), exact GELU: 0.5 v (1 + erf(v / sqrt 2)).
__global__ void bias_gelu_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n,
                                 int64_t features) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = y[i] + bias[i % features];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

cudaError_t bias_gelu_launch(float* y, const float* bias, int64_t n, int64_t features, cudaStream_t stream) {
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    bias_gelu_kernel<<<(unsigned int)(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(y, bias, n, features);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t bias_gelu_launch(float* y, const float* bias, int64_t n, int64_t features, cudaStream_t stream);

torch::Tensor linear_gelu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "linear_gelu: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
                bias.scalar_type() == torch::kFloat, "linear_gelu: float32 only");
    TORCH_CHECK(weight.dim() == 2 && bias.dim() == 1 && bias.size(0) == weight.size(0),
                "linear_gelu: weight (out, in) and bias (out) expected");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear_gelu: last dim of x != in_features");
    // a fresh contiguous float32 product (cuBLAS on the current stream): the epilogue may overwrite it
    auto y = torch::matmul(x, weight.t()).contiguous();
    if (y.numel() == 0) return y;
    auto bc = bias.contiguous();
    cudaError_t err = bias_gelu_launch(y.data_ptr<float>(), bc.data_ptr<float>(), y.numel(), bc.numel(),
                                       c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "bias_gelu launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

_ext = load_inline(
    name="gpu_linear_gelu_3_cublas_epilogue",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["linear_gelu"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.linear_gelu(x, self.linear.weight, self.linear.bias)
