"""Single op: leaky ReLU followed by a scale, over 4M floats."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, negative_slope: float, scale: float):
        super().__init__()
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, self.negative_slope) * self.scale


def get_inputs():
    return [torch.randn(2048, 2048)]


def get_init_inputs():
    return [0.05, 2.0]
