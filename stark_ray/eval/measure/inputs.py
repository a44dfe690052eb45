"""Inputs for correctness and timing trials: seeded, per-trial distributions, private clones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# A trial may draw its floating inputs from a scaled distribution, so that constant outputs, outputs that
# ignore part of the computation, and kernels tuned to one input range fail. The last trial scales up, the
# one before it down; shorter runs keep what fits (one trial: plain inputs).
SCALE_UP = 4.0
SCALE_DOWN = 0.125


def trial_scale(trial: int, trials: int) -> float:
    if trials >= 2 and trial == trials - 1:
        return SCALE_UP
    if trials >= 4 and trial == trials - 2:
        return SCALE_DOWN
    return 1.0


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor in a (nested) list/tuple/dict; other values are kept as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple: its fields by position
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def scale_floats(values: list[Any], factor: float, in_place: bool = False) -> list[Any]:
    """Floating tensors of ``values`` times ``factor``: ``in_place`` where they are the caller's own (a scaled copy
    of an 8 GB input holds the original beside it), as far as each is a plain contiguous tensor of its own storage
    (an alias scaled twice, an expanded view or a leaf that requires grad: scaled on a copy)."""
    if factor == 1.0:
        return values
    if not in_place:
        return list(map_tensors(values, lambda t: t * factor if t.is_floating_point() else t))
    tensors: list[torch.Tensor] = []
    map_tensors(values, tensors.append)
    storages = [t.untyped_storage().data_ptr() for t in tensors if t.untyped_storage().nbytes()]
    alone = len(storages) == len(set(storages))

    def scale(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        if alone and t.is_contiguous() and not t.requires_grad:
            with torch.no_grad():
                return t.mul_(factor)
        return t * factor

    del tensors
    return list(map_tensors(values, scale))


def nbytes_of(value: Any) -> list[int]:
    """The size in bytes of each tensor in a structure of values."""
    found: list[torch.Tensor] = []
    map_tensors(value, found.append)
    return [t.numel() * t.element_size() for t in found]


def snapshot(value: Any) -> Any:
    """A copy of the outputs taken right away on the current stream (a race with other streams shows)."""
    return map_tensors(value, lambda t: t.detach().clone())


def clone_all(values: list[Any]) -> list[Any]:
    return list(map_tensors(values, lambda t: t.detach().clone()))


def to_device(values: list[Any], device: str) -> list[Any]:
    if device == "cpu":
        return values
    return list(map_tensors(values, lambda t: t.to(device)))


def make_inputs(get_inputs: Callable[[], Any], seed: int, scale: float = 1.0,
                device: str = "cpu", fresh: bool = False) -> list[Any]:
    """``get_inputs()`` with the RNG seeded, floating inputs scaled, on ``device``. On a GPU the task's tensors are
    made there (torch's default device set to it: a 6 GB input takes milliseconds, not a CPU draw and a copy); a
    ``get_inputs`` that fails so is run again on the CPU and its tensors moved. The values differ from a CPU draw
    of the same seed (the distributions do not); every process of the evaluator draws them the same way. ``fresh``:
    ``get_inputs`` makes new tensors on every call (as the judge checks once per task), so they are scaled in place;
    else on a copy (they may be the task's own)."""
    if device != "cpu":
        torch.manual_seed(seed)
        try:
            with torch.device(device):
                return to_device(scale_floats(list(get_inputs()), scale, fresh), device)
        except torch.OutOfMemoryError:
            raise  # the device is full: made on the CPU, the values would differ from those made here before
        except Exception as e:  # made on the CPU instead (its error, if any, comes again below)
            if isinstance(e.__cause__, torch.OutOfMemoryError) or "out of memory" in str(e):
                raise
    torch.manual_seed(seed)
    return to_device(scale_floats(list(get_inputs()), scale, fresh), device)


SAME_CHUNK = 1 << 26  # elements compared at a time: the comparison's temporaries stay small beside a 6 GB input


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return bool(torch.equal(x, y)) or (x.is_floating_point() and bool(torch.allclose(x, y, 0, 0, True)))


def share_storage(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Whether a tensor of ``a`` and one of ``b`` share memory (a ``get_inputs`` that hands out its own tensors)."""
    def storages(ts: list[torch.Tensor]) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in ts if t.untyped_storage().nbytes()}

    return bool(storages(a) & storages(b))


def same_values(a: Any, b: Any) -> bool:
    """Exact equality of two (nested) inputs, NaNs equal to NaNs: was an input modified? Compared in chunks."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dim() == 0 or a.numel() == 0:
            return _equal(a, b)
        rows = max(1, SAME_CHUNK // max(1, a.numel() // a.shape[0]))  # slices of the first dimension: views
        return all(_equal(a[i:i + rows], b[i:i + rows]) for i in range(0, a.shape[0], rows))
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same_values, a, b))
    return True  # non-tensor inputs are passed by value
