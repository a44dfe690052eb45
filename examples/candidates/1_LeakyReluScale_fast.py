"""Correct: leaky ReLU and scale in one parallel pass (the slope and scale folded into one multiplier)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <ATen/Parallel.h>

torch::Tensor leaky_relu_scale(torch::Tensor x, double negative_slope, double scale) {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "float32 expected");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* xp = xc.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float pos = static_cast<float>(scale);
    const float neg = static_cast<float>(negative_slope * scale);
    at::parallel_for(0, xc.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
        #pragma omp simd
        for (int64_t i = begin; i < end; ++i) {
            const float v = xp[i];
            op[i] = v * (v > 0.0f ? pos : neg);
        }
    });
    return out;
}
"""

ext = load_inline(
    name="leaky_relu_scale",
    cpp_sources=cpp_source,
    functions=["leaky_relu_scale"],
    extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.leaky_relu_scale(x, self.negative_slope, self.scale)
