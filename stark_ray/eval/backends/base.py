"""A backend: one candidate format, everything about it in one object — its name, what the agents are told about
it, what it needs from the machine and from the sandbox, how its kernels are recognised, and what it supplies to
the evaluator (where tensors live, how builds are hooked, how to time a call). docs/architecture.md, "Adding a
backend"."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:  # timing imports torch; the parent process only needs the backend's description
    from stark_ray.eval.measure.timing import Timer
    from stark_ray.eval.worker.kernel_sources import KernelSources


@dataclass(frozen=True)
class Package:
    """A Python package a backend's candidates import: ``stark doctor`` checks that it is importable."""

    module: str  # what the doctor's probe imports (``triton``)
    check: str  # the name of its line in the doctor's report; the backend lists it among its ``requirements``
    install: str  # the fix where it is not importable (``pip install triton``)


class Backend(ABC):
    """One candidate format, in a module of its own. Instances are cheap; each worker makes one.

    Described by its class (read in the parent without torch): ``name``, ``target`` and :meth:`prompt_section` for
    the agents' system prompts; ``requirements`` (:meth:`needs`), ``packages`` (:meth:`package_line`) and
    ``without_gpu`` for ``stark doctor``; ``device`` and ``precompile`` for placement; ``env_prefixes``,
    ``caches``, ``toolchain_vars`` and ``kernel_definitions`` for the evaluator's processes, which take those of
    every backend offered there (:func:`stark_ray.eval.backends.declared`). In the judge: ``prepare_judge`` once,
    then ``hardware_info`` (sent to the service as the judge's hello). In the worker: ``prepare_worker`` once,
    :meth:`record_kernels`, then any number of candidates. In a compile-pool worker: ``prepare_compiler`` only. In
    the service: ``describe_hardware`` turns the hello into the lines the agents' prompts show.
    """

    name: ClassVar[str]
    target: ClassVar[str]  # what a candidate is, in a few words (the agents' system prompts)
    requirements: ClassVar[tuple[str, ...]] = ()  # stark doctor's checks it needs (eval/backends/requirements.py)
    device: str = "cpu"  # where inputs and models live: "cpu" or "cuda" (set by prepare_worker)
    usual_device: ClassVar[str] = "cpu"  # where its candidates run where nothing else is known (the prompts' rules)
    precompile: ClassVar[bool] = False  # builds at import are done first in the CPU compile pool
    importing: ClassVar[str] = "importing"  # what the worker's import of a candidate is, in the live view's words
    # what the evaluator's processes need of it (of every backend offered, whichever one they run: a candidate of
    # one format may use another's toolchain, as torch.compile makes Triton kernels in a cuda candidate)
    env_prefixes: ClassVar[tuple[str, ...]] = ()  # the parent's variables so named pass to them (sandbox_env.py)
    # (variable, directory name): a cache its toolchain writes, in the evaluator's process its build directory's
    # (an isolated one's: its own directory's) subdirectory of that name, and a candidate's own directory while it
    # runs (eval/proc/launch.py, eval/worker/private_places.py)
    caches: ClassVar[tuple[tuple[str, str], ...]] = ()
    toolchain_vars: ClassVar[tuple[str, ...]] = ()  # variables naming its tools' paths: kept visible in the jail
    # regular expressions whose first group names a kernel that a candidate's Python text defines (read where
    # nothing reached a recorded compiler: eval/worker/kernel_sources.py)
    kernel_definitions: ClassVar[tuple[str, ...]] = ()
    packages: ClassVar[tuple[Package, ...]] = ()  # what stark doctor must find importable
    without_gpu: ClassVar[str] = ""  # how its kernels run where no GPU is visible (the doctor's GPU fix adds it)

    @classmethod
    def prompt_section(cls) -> str:
        """The format's rules and an example for the agents' system prompts: the text file beside the backend's
        module, with the module's name (``cuda.py`` -> ``cuda.txt``)."""
        module = sys.modules[cls.__module__].__file__
        assert module is not None
        return Path(module).with_suffix(".txt").read_text(encoding="utf-8").strip()

    def needs(self) -> tuple[str, ...]:
        """The doctor's checks this backend needs here (by default its ``requirements``; may depend on the
        environment, e.g. Triton's interpreter needs no GPU)."""
        return self.requirements

    @classmethod
    def package_line(cls, package: Package, version: str,
                     gpu_visible: bool) -> tuple[Literal["ok", "warn"], str, str]:
        """The doctor's line for ``package``, found importable at ``version``: (status, detail, fix)."""
        return "ok", version, ""

    def record_kernels(self, sources: KernelSources) -> None:
        """Have ``sources`` record the kernels candidates of this format define, beyond what every worker records
        (``load_inline``, ``load`` and NVRTC's sources): the kernel names ``no_kernel`` is judged against. A DSL
        whose kernels are Python functions wraps its decorator or kernel class (:meth:`KernelSources.record_names`)."""
        return None

    @abstractmethod
    def prepare_worker(self, build_dir: Path, threads: int) -> None:
        """Set up the worker process before any candidate is imported (threads, build hooks, device)."""

    def prepare_judge(self, threads: int) -> None:
        """Set up the judge process: the device and its threads. It runs the reference and compares outputs,
        never a candidate, so it installs no build hooks."""
        import torch

        torch.set_num_threads(threads)

    def prepare_compiler(self, build_dir: Path, threads: int, arch: str | None) -> None:
        """Set up a compile-only process (no device): by default the same build hooks as a worker."""
        self.prepare_worker(build_dir, threads)

    def build_arch(self, visible: str | None) -> str | None:
        """The architecture builds target, read without starting the device worker (None: ask the worker)."""
        return None

    def warm_toolchain(self, build_dir: Path) -> None:
        """Prepare what every build of this backend reuses (run once, in the background, at the first build)."""
        return None

    def hardware_info(self) -> dict[str, Any]:
        """Facts about the device, read in the worker (JSON-serializable)."""
        return {"device": self.device}

    def default_timing_trials(self) -> int:
        """Timed calls per function when the configuration leaves it open: GPU calls are cheap to repeat."""
        return 100 if self.device == "cuda" else 20

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""
        return None

    def healthy(self) -> bool:
        """Whether the worker can go on after a request (False after a sticky device error)."""
        return True

    @abstractmethod
    def timer(self, head_start: bool = True) -> Timer:
        """The timer for one call (``head_start=False``: no GPU time queued ahead of the call's start event, for a
        call that uses more streams than the current one)."""

    @abstractmethod
    def describe_hardware(self, info: dict[str, Any], threads: int) -> str:
        """A few lines on the target device for the agents' prompts, from ``hardware_info`` (in the parent)."""

    def hardware_class(self, info: dict[str, Any], threads: int) -> str:
        """What makes two devices interchangeable for timing (same model, same software): evaluators of one class
        may share a task's candidates. Measured figures (bandwidth) are left out; they differ a little per device."""
        return self.describe_hardware(info, threads)
