"""Matmul then reduction: an 8192x8192 linear layer (no bias) on a 1024x8192 batch, summed over its outputs."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(self.linear(x), dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(1024, 8192)]


def get_init_inputs():
    return [8192, 8192]
