"""Mean squared error between two tensors: one scalar from 2 x 1M floats (a reduction)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]


def get_init_inputs():
    return []
