"""Fusion with a reduction: add a residual, then layer-normalize each row (learned scale and shift)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        with torch.no_grad():  # non-trivial affine parameters, so that a kernel ignoring them fails
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


def get_inputs():
    return [torch.randn(4096, 1024), torch.randn(4096, 1024)]


def get_init_inputs():
    return [1024, 1e-5]
