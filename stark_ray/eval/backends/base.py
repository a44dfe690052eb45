"""What a backend supplies to the evaluator: where tensors live, how builds are hooked, how to time a call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # timing imports torch; the parent process only needs the backend's description
    from stark_ray.eval.timing import Timer


class Backend(ABC):
    """One candidate format (cpu_cpp, cuda, cuda_nvrtc, triton). Instances are cheap; the worker makes one."""

    name: ClassVar[str]
    device: ClassVar[str]  # where inputs and models live: "cpu" or "cuda"

    @abstractmethod
    def prepare_worker(self, build_dir: Path, threads: int) -> None:
        """Set up the worker process before any candidate is imported (threads, build hooks, device)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""

    @abstractmethod
    def timer(self) -> Timer:
        """The timer for one call."""

    @abstractmethod
    def describe_hardware(self, threads: int) -> str:
        """A few lines on the target device, for the agents' prompts (runs in the parent, cheaply)."""
