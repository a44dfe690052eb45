"""Single op: a float32 square matrix product C = A @ B of two 4096x4096 matrices (137 GFLOP)."""

import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    # entries of standard deviation 1/32: C's are about 1/16, so the absolute tolerance (1e-2) leaves room for
    # TF32 or half inputs (their errors near 1e-4 here, 0.025 at unit scale) on the trial scaled x4 as well
    return [torch.randn(N, N) / 32, torch.randn(N, N) / 32]


def get_init_inputs():
    return []
