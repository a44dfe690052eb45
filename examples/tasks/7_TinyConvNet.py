"""A small network: two conv-ReLU-pool stages and a two-layer classifier head on 32x32 RGB images."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_classes: int, width: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 8 * 8, 256),
            nn.ReLU(),
            nn.Linear(256, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def get_inputs():
    return [torch.randn(32, 3, 32, 32)]


def get_init_inputs():
    return [10, 16]
