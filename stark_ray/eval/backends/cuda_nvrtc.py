"""cuda_nvrtc: CUDA kernels compiled in-process by NVRTC (``torch.cuda._compile_kernel``), no C++ build."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from stark_ray.eval.backends import gpu
from stark_ray.eval.backends.requirements import GPU, NVRTC, TORCH_CUDA


class CudaNvrtcBackend(gpu.CudaDeviceBackend):
    name: ClassVar[str] = "cuda_nvrtc"
    target: ClassVar[str] = "CUDA kernels compiled at run time by NVRTC"
    requirements: ClassVar[tuple[str, ...]] = (GPU, TORCH_CUDA, NVRTC)
    notes = ("Candidates compile CUDA device code in-process with NVRTC (torch.cuda._compile_kernel, "
             "about 0.05 s per kernel) and launch it on torch's current stream.")

    def prepare_worker(self, build_dir: Path, threads: int) -> None:
        import torch

        gpu.prepare_device()
        if not hasattr(torch.cuda, "_compile_kernel"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC); "
                               "use torch >= 2.8 or --backend cuda")
