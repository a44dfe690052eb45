"""Correct and fast: the whole chain in one parallel C++ loop, one read and one write per element."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor fused_swish_scale_clamp(torch::Tensor x, torch::Tensor bias, double scale, double lo, double hi) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat, "float32 expected");
    auto xc = x.contiguous();
    auto bc = bias.contiguous();
    const int64_t features = bc.numel();
    TORCH_CHECK(features > 0 && xc.numel() % features == 0, "the last dimension must match bias");
    const int64_t rows = xc.numel() / features;
    auto out = torch::empty_like(xc);
    const float* xp = xc.data_ptr<float>();
    const float* bp = bc.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float s = static_cast<float>(scale), l = static_cast<float>(lo), h = static_cast<float>(hi);
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = xp + r * features;
            float* orow = op + r * features;
            #pragma omp simd
            for (int64_t c = 0; c < features; ++c) {
                const float v = xr[c];
                const float y = v * s + bp[c];
                float z = y / (1.0f + std::exp(-y));
                z = std::fmin(std::fmax(z, l), h);
                orow[c] = z * v + v;
            }
        }
    });
    return out;
}
"""

fused = load_inline(
    name="fused_swish_scale_clamp",
    cpp_sources=cpp_source,
    functions=["fused_swish_scale_clamp"],
    # -ffast-math lets gcc call the vectorized expf of glibc's libmvec in the simd loop
    extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float, lo: float, hi: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.fused_swish_scale_clamp(x, self.bias, self.scale, self.lo, self.hi)
