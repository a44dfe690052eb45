"""Broken on purpose: the kernel uses an undeclared variable (`res`), so nvcc fails to compile the .cu."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

__global__ void swish_clamp_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                   float* __restrict__ out, int64_t n, int64_t features,
                                   float scale, float lo, float hi) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        const float y = v * scale + bias[i % features];
        const float s = y / (1.0f + expf(-y));  // SiLU
        out[i] = fminf(fmaxf(s, lo), hi) * v + res;  // nvcc: identifier "res" is undefined
    }
}

cudaError_t swish_clamp_launch(const float* x, const float* bias, float* out, int64_t n, int64_t features,
                               float scale, float lo, float hi, cudaStream_t stream) {
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    swish_clamp_kernel<<<(unsigned int)(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(
        x, bias, out, n, features, scale, lo, hi);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t swish_clamp_launch(const float* x, const float* bias, float* out, int64_t n, int64_t features,
                               float scale, float lo, float hi, cudaStream_t stream);

torch::Tensor swish_clamp(torch::Tensor x, torch::Tensor bias, double scale, double lo, double hi) {
    TORCH_CHECK(x.is_cuda() && bias.is_cuda(), "swish_clamp: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && bias.scalar_type() == torch::kFloat, "swish_clamp: float32 only");
    TORCH_CHECK(x.dim() >= 1 && bias.numel() > 0 && x.size(-1) == bias.numel(), "swish_clamp: last dim != bias");
    auto xc = x.contiguous();
    auto bc = bias.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    cudaError_t err = swish_clamp_launch(xc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(),
                                         xc.numel(), bc.numel(), (float)scale, (float)lo, (float)hi,
                                         c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "swish_clamp launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_swish_clamp_compile_error",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["swish_clamp"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float, lo: float, hi: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.swish_clamp(x, self.bias, self.scale, self.lo, self.hi)
