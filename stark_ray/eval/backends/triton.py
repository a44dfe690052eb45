"""triton: ``@triton.jit`` kernels. On a GPU they compile to PTX; without one, ``TRITON_INTERPRET=1`` runs the
same kernels on CPU tensors (slowly, but for real: CI checks Triton candidates this way)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from stark_ray.eval.backends import gpu
from stark_ray.eval.backends.base import Package
from stark_ray.eval.backends.requirements import GPU
from stark_ray.eval.hardware import describe_cpu

if TYPE_CHECKING:
    from stark_ray.eval.measure.timing import Timer
    from stark_ray.eval.worker.kernel_sources import KernelSources

INTERPRETER_NOTES = ("No GPU here: Triton kernels run in Triton's interpreter on CPU tensors "
                     "(TRITON_INTERPRET=1); timings are not representative of a GPU.")
TRITON = Package("triton", "Triton", "pip install triton")


class TritonBackend(gpu.CudaDeviceBackend):
    """On the GPU when there is one; otherwise the same kernels in Triton's interpreter on the CPU."""

    name: ClassVar[str] = "triton"
    target: ClassVar[str] = "Triton kernels"
    requirements: ClassVar[tuple[str, ...]] = (TRITON.check, GPU)
    env_prefixes: ClassVar[tuple[str, ...]] = ("TRITON_",)
    caches: ClassVar[tuple[tuple[str, str], ...]] = (("TRITON_CACHE_DIR", "triton"),)
    toolchain_vars: ClassVar[tuple[str, ...]] = ("TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH")
    kernel_definitions: ClassVar[tuple[str, ...]] = (r"@triton\.(?:jit|autotune|heuristics)[\s\S]*?\ndef\s+(\w+)\s*\(",)
    packages: ClassVar[tuple[Package, ...]] = (TRITON,)
    without_gpu: ClassVar[str] = "TRITON_INTERPRET=1 to run Triton on the CPU"
    notes = "Candidates are Triton kernels (@triton.jit), compiled at their first launch."

    def needs(self) -> tuple[str, ...]:
        """No GPU needed where TRITON_INTERPRET=1 runs the kernels on the CPU."""
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        return tuple(r for r in self.requirements if not (interpreted and r == GPU))

    @classmethod
    def package_line(cls, package: Package, version: str,
                     gpu_visible: bool) -> tuple[Literal["ok", "warn"], str, str]:
        """Without a GPU, ready where TRITON_INTERPRET=1 runs the kernels on the CPU."""
        if gpu_visible:
            return "ok", version, ""
        if os.environ.get("TRITON_INTERPRET") == "1":
            return "ok", f"{version}, no GPU: TRITON_INTERPRET=1 runs it on the CPU", ""
        return "warn", f"{version}, but no GPU to run it on", \
            "TRITON_INTERPRET=1 runs Triton kernels on the CPU (slow; for testing)"

    def record_kernels(self, sources: KernelSources) -> None:
        """Every ``@triton.jit`` function created from now on (``JITFunction(fn, ...)``; imports triton)."""
        from triton.runtime import jit

        sources.record_names(jit.JITFunction, "__init__", _function_name)

    def prepare_worker(self, build_dir: Path, threads: int) -> None:
        import torch

        os.environ.setdefault("TRITON_CACHE_DIR", str(build_dir / "triton"))
        if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            gpu.prepare_device()
            self.device = "cuda"
        else:
            os.environ["TRITON_INTERPRET"] = "1"  # before the candidate imports triton
            torch.set_num_threads(threads)
            self.device = "cpu"
        try:
            import triton  # noqa: F401  (import once here: a missing Triton is the host's problem)
        except ImportError as e:
            raise RuntimeError(f"triton is not installed ({e}); pip install triton") from None

    def prepare_judge(self, threads: int) -> None:
        import torch

        if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            gpu.prepare_device()
            self.device = "cuda"
        else:
            torch.set_num_threads(threads)
            self.device = "cpu"

    def default_timing_trials(self) -> int:
        return 100 if self.device == "cuda" else 10  # the interpreter is slow

    def hardware_info(self) -> dict[str, Any]:
        return super().hardware_info() if self.device == "cuda" else {"device": "cpu"}

    def synchronize(self) -> None:
        if self.device == "cuda":
            super().synchronize()

    def healthy(self) -> bool:
        return super().healthy() if self.device == "cuda" else True

    def timer(self, head_start: bool = True) -> Timer:
        if self.device == "cuda":
            return super().timer(head_start)
        from stark_ray.eval.measure.timing import CpuTimer

        return CpuTimer()

    def describe_hardware(self, info: dict[str, Any], threads: int) -> str:
        if info.get("device") == "cuda":
            return super().describe_hardware(info, threads)
        return f"{describe_cpu(threads)}\n{INTERPRETER_NOTES}"


def _function_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The name of the function ``JITFunction.__init__(self, fn, ...)`` is given."""
    return getattr(args[1] if len(args) > 1 else kwargs.get("fn"), "__name__", None)
