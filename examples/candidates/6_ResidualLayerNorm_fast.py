"""Correct: residual add and layer norm fused per row (one read of each input, one write), rows in parallel."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

torch::Tensor residual_layer_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                  torch::Tensor bias, double eps) {
    TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual must have the same shape");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "float32 expected");
    auto xc = x.contiguous();
    auto rc = residual.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t n = wc.numel();
    const int64_t rows = xc.numel() / n;
    auto out = torch::empty_like(xc);
    const float* xp = xc.data_ptr<float>();
    const float* rp = rc.data_ptr<float>();
    const float* wp = wc.data_ptr<float>();
    const float* bp = bc.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
        std::vector<float> h(n);
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = xp + r * n;
            const float* rr = rp + r * n;
            float sum = 0.0f;
            #pragma omp simd reduction(+:sum)
            for (int64_t c = 0; c < n; ++c) {
                h[c] = xr[c] + rr[c];
                sum += h[c];
            }
            const float mean = sum / n;
            float sq = 0.0f;
            #pragma omp simd reduction(+:sq)
            for (int64_t c = 0; c < n; ++c) {
                const float d = h[c] - mean;
                sq += d * d;
            }
            const float inv = 1.0f / std::sqrt(sq / n + static_cast<float>(eps));
            float* orow = op + r * n;
            #pragma omp simd
            for (int64_t c = 0; c < n; ++c) {
                orow[c] = (h[c] - mean) * inv * wp[c] + bp[c];
            }
        }
    });
    return out;
}
"""

ext = load_inline(
    name="residual_layer_norm",
    cpp_sources=cpp_source,
    functions=["residual_layer_norm"],
    extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        with torch.no_grad():  # the same parameters, drawn in the same order as the reference's
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return ext.residual_layer_norm(x, residual, self.norm.weight, self.norm.bias, self.norm.eps)
