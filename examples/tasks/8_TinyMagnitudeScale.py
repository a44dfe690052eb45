"""Tiny outputs (~1e-5): tanh of a scaled input times 1e-5, so all-zeros passes a plain atol 1e-2 allclose."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, alpha: float, scale: float):
        super().__init__()
        self.alpha = alpha
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.alpha) * self.scale


def get_inputs():
    return [torch.randn(2048, 2048)]


def get_init_inputs():
    return [1.5, 1e-5]
