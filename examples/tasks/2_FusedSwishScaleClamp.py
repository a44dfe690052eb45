"""Demo task: an affine transform, SiLU, clamp and a gated residual, elementwise over 4M floats.

Eager PyTorch makes six passes over 16 MB and allocates a temporary for each; one fused loop makes one.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int, scale: float, lo: float, hi: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.1)
        self.scale = scale
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale + self.bias  # per-feature bias (last dimension)
        y = y * torch.sigmoid(y)  # SiLU
        y = torch.clamp(y, self.lo, self.hi)
        return y * x + x  # gated residual


batch = 4096
features = 1024


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return [features, 1.5, -0.25, 3.0]
