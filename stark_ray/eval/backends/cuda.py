"""cuda: KernelBench's format — CUDA C++ built with ``load_inline`` (cpp_sources + cuda_sources)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from stark_ray.eval.backends import gpu
from stark_ray.eval.backends.cpu_cpp import install_build_cache
from stark_ray.eval.backends.requirements import CUDA_MATCH, CXX, DRIVER, GPU, NINJA, NVCC, TORCH_CUDA
from stark_ray.eval.build.pch import ensure_pch


class CudaBackend(gpu.CudaDeviceBackend):
    name: ClassVar[str] = "cuda"
    target: ClassVar[str] = "CUDA C++, built with torch.utils.cpp_extension.load_inline"
    requirements: ClassVar[tuple[str, ...]] = (NVCC, NINJA, CXX, GPU, DRIVER, TORCH_CUDA, CUDA_MATCH)
    precompile: ClassVar[bool] = True
    notes = ("Candidates are CUDA C++ built at import with torch.utils.cpp_extension.load_inline "
             "(kernels and raw-pointer launchers in cuda_sources without torch headers; the torch wrapper "
             "in cpp_sources).")

    def warm_toolchain(self, build_dir: Path) -> None:
        # the precompiled torch/extension.h for the usual flags (none): builds that start before it is ready
        # go without it, later ones parse the header in a fraction of the time
        ensure_pch(build_dir, [], [], after_builds=0)

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
