"""Correct: the fused kernel, its CUDA source built from escaped one-line strings (`"__global__ void\\nname("`): a
regex over the Python text reads the kernel as `nleaky_scale_kernel` and took it for no kernel at all. Must be
accepted (its kernel names come from what load_inline is handed)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = (
    "#include <cuda_runtime.h>\n"
    "#include <cstdint>\n"
    "\n"
    "__global__ void\nleaky_scale_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n,\n"
    "                                   float slope, float scale) {\n"
    "    const int64_t stride = (int64_t)gridDim.x * blockDim.x;\n"
    "    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {\n"
    "        const float v = x[i];\n"
    "        out[i] = (v > 0.0f ? v : v * slope) * scale;\n"
    "    }\n"
    "}\n"
    "\n"
    "cudaError_t leaky_scale_launch(const float* x, float* out, int64_t n, float slope, float scale,\n"
    "                               cudaStream_t stream) {\n"
    "    const int threads = 256;\n"
    "    const int64_t blocks = (n + threads - 1) / threads;\n"
    "    leaky_scale_kernel<<<(unsigned int)(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(\n"
    "        x, out, n, slope, scale);\n"
    "    return cudaGetLastError();\n"
    "}\n"
)

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t leaky_scale_launch(const float* x, float* out, int64_t n, float slope, float scale,
                               cudaStream_t stream);

torch::Tensor leaky_scale(torch::Tensor x, double slope, double scale) {
    TORCH_CHECK(x.is_cuda(), "leaky_scale: CUDA tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "leaky_scale: float32 only");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    cudaError_t err = leaky_scale_launch(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(),
                                         (float)slope, (float)scale, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "leaky_scale launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_leaky_scale_escaped",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["leaky_scale"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.leaky_scale(x, self.negative_slope, self.scale)
