"""Correct: ReLU in one kernel on the current stream (a control at KernelBench's size: 4096 x 393216)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = fmaxf(x[i], 0.0f);
    }
}

cudaError_t relu_launch(const float* x, float* out, int64_t n, int sms, cudaStream_t stream) {
    relu_kernel<<<sms * 8, 256, 0, stream>>>(x, out, n);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t relu_launch(const float* x, float* out, int64_t n, int sms, cudaStream_t stream);

torch::Tensor relu(torch::Tensor x, int64_t sms) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "relu: float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    cudaError_t err = relu_launch(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), (int)sms,
                                  c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "relu launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_relu_plain",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["relu"],
    extra_cuda_cflags=["-O3"],
)


_SMS: list = []


def _sms(t: torch.Tensor) -> int:
    """The device's multiprocessor count (read at the first call: the module is imported without a GPU to build)."""
    if not _SMS:
        _SMS.append(torch.cuda.get_device_properties(t.device).multi_processor_count)
    return _SMS[0]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.relu(x, _sms(x))
