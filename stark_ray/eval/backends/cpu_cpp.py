"""cpu_cpp: candidates build C++ with ``torch.utils.cpp_extension.load_inline`` and run on the CPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from stark_ray.eval.backends.base import Backend
from stark_ray.eval.backends.requirements import CXX, NINJA
from stark_ray.eval.build.cache import BuildCache
from stark_ray.eval.hardware import compiler_version, describe_cpu

if TYPE_CHECKING:
    from stark_ray.eval.measure.timing import Timer

PROMPT_NOTES = ("Candidates are C++ built at import with torch.utils.cpp_extension.load_inline "
                "(cpp_sources, functions, extra_cflags); compile with -O3, and with -fopenmp for "
                "at::parallel_for to run in parallel.")


def install_build_cache(build_dir: Path) -> BuildCache:
    # STARK_RAY_PCH=0 turns the precompiled header off (to compare, or where gcc rejects it)
    cache = BuildCache(build_dir, use_pch=os.environ.get("STARK_RAY_PCH", "1") != "0")
    cache.install()
    return cache


class CpuCppBackend(Backend):
    name: ClassVar[str] = "cpu_cpp"
    target: ClassVar[str] = "C++ on the CPU, built with torch.utils.cpp_extension.load_inline"
    requirements: ClassVar[tuple[str, ...]] = (CXX, NINJA)
    # builds stay in the worker, one at a time: on a CPU target a parallel build would disturb the timing
    precompile: ClassVar[bool] = False
    importing: ClassVar[str] = "building (g++) and importing"  # load_inline builds in the worker's import

    def __init__(self) -> None:
        self.device = "cpu"
        self.cache: BuildCache | None = None

    def prepare_worker(self, build_dir: Path, threads: int) -> None:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        self.cache = install_build_cache(build_dir)

    def timer(self, head_start: bool = True) -> Timer:
        from stark_ray.eval.measure.timing import CpuTimer

        return CpuTimer()

    def describe_hardware(self, info: dict[str, Any], threads: int) -> str:
        compiler = compiler_version()
        built = f"Builds: {compiler}; -march=native builds for this CPU." if compiler else ""
        return "\n".join(line for line in (describe_cpu(threads), built, PROMPT_NOTES) if line)
