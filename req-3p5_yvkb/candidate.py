
import torch

CACHE = []


class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        CACHE.append(torch.ones(1 << 16))  # what a candidate keeps beside its model (an output cache, say)

    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, 0.2) * 1.5
