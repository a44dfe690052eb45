"""Correct, on two streams: each half of the tensor on a stream of its own; both wait for the caller's stream
(an event) and the caller's stream waits for both before returning. Must be accepted, with extra_stream only,
and timed without a head start (its speedup honest, about 1x)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

__global__ void relu_half_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = fmaxf(x[i], 0.0f);
    }
}

static cudaStream_t halves[2] = {nullptr, nullptr};
static cudaEvent_t ready = nullptr, done[2] = {nullptr, nullptr};

cudaError_t relu_two_launch(const float* x, float* out, int64_t n, int sms, cudaStream_t current) {
    cudaError_t err = cudaSuccess;
    if (ready == nullptr) {
        err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
        for (int k = 0; k < 2 && err == cudaSuccess; ++k) {
            err = cudaStreamCreateWithFlags(&halves[k], cudaStreamNonBlocking);
            if (err == cudaSuccess) err = cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming);
        }
        if (err != cudaSuccess) return err;
    }
    err = cudaEventRecord(ready, current);  // the halves start after what the caller queued
    const int64_t half = n / 2;
    for (int k = 0; k < 2 && err == cudaSuccess; ++k) {
        const int64_t begin = k * half, count = k == 0 ? half : n - half;
        err = cudaStreamWaitEvent(halves[k], ready, 0);
        if (err != cudaSuccess) break;
        relu_half_kernel<<<sms * 4, 256, 0, halves[k]>>>(x + begin, out + begin, count);
        err = cudaGetLastError();
        if (err == cudaSuccess) err = cudaEventRecord(done[k], halves[k]);
        if (err == cudaSuccess) err = cudaStreamWaitEvent(current, done[k], 0);  // the caller waits for both
    }
    return err;
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

cudaError_t relu_two_launch(const float* x, float* out, int64_t n, int sms, cudaStream_t current);

torch::Tensor relu(torch::Tensor x, int64_t sms) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "relu: float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    cudaError_t err = relu_two_launch(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), (int)sms,
                                      c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "relu launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="gpu_relu_two_streams",
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
