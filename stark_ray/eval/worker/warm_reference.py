"""A task's reference inside a warm worker: module, model, and the inputs every candidate is timed with."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.measure.inputs import clone_all, nbytes_of
from stark_ray.eval.measure.memory import LARGE_SET_BYTES, param_bytes
from stark_ray.eval.measure.timing import INPUT_SETS, make_input_sets
from stark_ray.eval.tasks import BuiltReference, TaskError
from stark_ray.eval.worker.reference_seal import Seal


def on_device(model: Any, device: str) -> Any:
    return model.to(device) if device != "cpu" and hasattr(model, "to") else model


@dataclass
class WarmReference(BuiltReference):
    """A task's reference inside the worker: module, model, the timing inputs (the judge holds the trials')."""

    input_sets: list[list[Any]] | None = None
    compiled_model: Any = None
    seal: Seal | None = None  # taken as it is built, before any candidate in its worker (eval/worker/reference_seal.py)
    # the timing sets' seed: drawn for this worker, never known ahead (outputs computed for known sets and replayed)
    timing_seed: int = field(default_factory=lambda: secrets.randbits(30))

    def __post_init__(self) -> None:
        if self.seal is None:
            self.seal = Seal(self.module, self.model)

    def held_bytes(self) -> int:
        """Device (or host) memory this state keeps alive: the parameters and the timing input sets."""
        return sum(sum(nbytes_of(s)) for s in self.input_sets or []) + param_bytes(self.model)

    def timing_sets(self, count: int | None = None) -> list[list[Any]]:
        """The rotating timing input sets: ``count`` of them (the task's memory plan), else 4, or 2 for a set
        larger than LARGE_SET_BYTES (far beyond any cache: two rotate as well as four)."""
        if self.input_sets is not None and count in (None, len(self.input_sets)):
            return self.input_sets
        self.release_sets()
        first = make_input_sets(self.get_inputs, self.timing_seed, self.device, count=1)
        if count is None:
            count = INPUT_SETS if sum(nbytes_of(first[0])) <= LARGE_SET_BYTES else 2
        self.input_sets = first + make_input_sets(self.get_inputs, self.timing_seed + 1, self.device, count=count - 1)
        if self.seal is not None:
            self.seal.seal_inputs(self.input_sets)
        return self.input_sets

    def release_sets(self) -> None:
        """Forget the timing sets (made again when next needed: milliseconds on a GPU)."""
        self.input_sets = None
        if self.seal is not None:
            self.seal.seal_inputs(None)

    def baseline_compiled(self) -> Any:
        """torch.compile of the reference, compiled and warmed on the timing inputs once."""
        if self.compiled_model is None:
            import torch

            compiled = torch.compile(self.model)
            try:
                with torch.no_grad():
                    sample = self.input_sets or make_input_sets(self.get_inputs, self.timing_seed, self.device,
                                                                count=1)
                    compiled(*clone_all(sample[0]))
            except Exception as e:
                raise TaskError(f"task {self.name}: torch.compile baseline failed: {describe_exception(e)}") \
                    from None
            self.compiled_model = compiled
        return self.compiled_model
