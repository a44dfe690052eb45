"""cuda_nvrtc: CUDA kernels compiled in-process by NVRTC (``torch.cuda._compile_kernel``), no C++ build."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from stark_ray.eval.backends import gpu
from stark_ray.eval.backends.base import Backend

if TYPE_CHECKING:
    from stark_ray.eval.timing import Timer

PROMPT_NOTES = ("Candidates compile CUDA device code in-process with NVRTC (torch.cuda._compile_kernel, "
                "about 0.05 s per kernel) and launch it on torch's current stream.")


class CudaNvrtcBackend(Backend):
    name: ClassVar[str] = "cuda_nvrtc"

    def __init__(self) -> None:
        self.device = "cuda"

    def prepare_worker(self, build_dir: Path, threads: int) -> None:
        import torch

        gpu.prepare_device()
        if not hasattr(torch.cuda, "_compile_kernel"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC); "
                               "use torch >= 2.8 or --backend cuda")

    def hardware_info(self) -> dict[str, Any]:
        return gpu.device_info()

    def synchronize(self) -> None:
        gpu.synchronize()

    def healthy(self) -> bool:
        return gpu.device_healthy()

    def timer(self) -> Timer:
        return gpu.cuda_timer()

    def describe_hardware(self, info: dict[str, Any], threads: int) -> str:
        return f"{gpu.describe_device(info)}\n{PROMPT_NOTES}"
