"""cuda: KernelBench's format — CUDA C++ built with ``load_inline`` (cpp_sources + cuda_sources)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from stark_ray.eval.backends import gpu
from stark_ray.eval.backends.cpu_cpp import install_build_cache


class CudaBackend(gpu.CudaDeviceBackend):
    name: ClassVar[str] = "cuda"
    precompile: ClassVar[bool] = True
    notes = ("Candidates are CUDA C++ built at import with torch.utils.cpp_extension.load_inline "
             "(kernels and raw-pointer launchers in cuda_sources without torch headers; the torch wrapper "
             "in cpp_sources).")

    def prepare_worker(self, build_dir: Path, threads: int) -> None:
        gpu.prepare_device()
        # the same arch list the compile pool builds with: ninja then finds those builds up to date
        os.environ["TORCH_CUDA_ARCH_LIST"] = gpu.arch_list()
        os.environ.setdefault("MAX_JOBS", str(max(1, threads)))
        install_build_cache(build_dir)

    def prepare_compiler(self, build_dir: Path, threads: int, arch: str | None) -> None:
        if arch:
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch
        os.environ.setdefault("MAX_JOBS", "2")  # the .cpp and the .cu of one extension, side by side
        install_build_cache(build_dir)
