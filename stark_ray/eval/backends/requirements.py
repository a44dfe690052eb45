"""What a backend may need from the machine: the names of ``stark doctor``'s checks (:mod:`stark_ray.doctor`).

A backend lists the ones it needs in :attr:`Backend.requirements`, with the checks of its own packages
(:attr:`Backend.packages`, named where it is defined); ``stark doctor --backend NAME`` marks those as
needed and says ``backend NAME: ready`` when all of them pass.
"""

from __future__ import annotations

NVCC = "nvcc"
NINJA = "ninja"
CXX = "C++ compiler"
DRIVER = "driver"
TORCH_CUDA = "torch CUDA"
GPU = "GPU"
CUDA_MATCH = "CUDA match"
NVRTC = "NVRTC"
RAY = "Ray"
KEYS = "API keys"
WORKER_ENV = "worker env"
ISOLATION = "isolation"
