"""The process state the worker times the reference in (eval/measure/process_state.py): what a candidate's forward
leaves behind is undone around each call of the reference, and put back for the candidate after it."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from stark_ray.eval.measure.process_state import ProcessState
from stark_ray.eval.measure.timing import CpuTimer, time_interleaved


class _Counting(TorchFunctionMode):
    calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        type(self).calls += 1
        return func(*args, **(kwargs or {}))


class _Dispatching(TorchDispatchMode):
    calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        type(self).calls += 1
        return func(*args, **(kwargs or {}))


def _profile(*args: Any) -> None:
    return None


@pytest.fixture
def process() -> Iterator[ProcessState]:
    """The state taken, and everything this test changes put back after it."""
    taken = ProcessState.taken()
    threads, dtype, grad = torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled()
    onednn, interval = torch.backends.mkldnn.enabled, sys.getswitchinterval()
    try:
        yield taken
    finally:
        sys.setprofile(None)
        while torch._C._len_torch_function_stack() > taken.stacks[0]:
            torch._C._pop_torch_function_stack()
        while torch._C._len_torch_dispatch_stack() > taken.stacks[1]:
            torch._C._pop_torch_dispatch_stack(None)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.backends.mkldnn.enabled = onednn
        sys.setswitchinterval(interval)


def _leave_behind() -> tuple[_Counting, _Dispatching]:
    """What a candidate's forward could leave set as it returns."""
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(not torch.is_grad_enabled())
    torch.backends.mkldnn.enabled = False
    sys.setswitchinterval(1e-5)
    sys.setprofile(_profile)
    modes = _Counting(), _Dispatching()
    for mode in modes:
        mode.__enter__()
    return modes


def test_a_call_runs_in_the_state_taken_and_the_candidates_is_put_back_after(process: ProcessState) -> None:
    threads = torch.get_num_threads()
    grad = torch.is_grad_enabled()
    _leave_behind()
    seen: dict[str, Any] = {}
    with process.around():
        seen = {"threads": torch.get_num_threads(), "dtype": torch.get_default_dtype(),
                "grad": torch.is_grad_enabled(), "onednn": torch.backends.mkldnn.enabled,
                "profile": sys.getprofile(), "interval": sys.getswitchinterval()}
        before = _Counting.calls, _Dispatching.calls
        torch.ones(3) + 1
        assert (_Counting.calls, _Dispatching.calls) == before  # neither mode saw the call
    assert seen == {"threads": threads, "dtype": torch.float32, "grad": grad, "onednn": True, "profile": None,
                    "interval": dict(process.values)["switch_interval"]}
    # the candidate's own, back
    assert torch.get_num_threads() == 1 and torch.get_default_dtype() == torch.float64
    assert torch.is_grad_enabled() is not grad and torch.backends.mkldnn.enabled is False
    assert sys.getprofile() is _profile and sys.getswitchinterval() == pytest.approx(1e-5)
    before = _Counting.calls, _Dispatching.calls
    torch.ones(3) + 1
    assert _Counting.calls > before[0] and _Dispatching.calls > before[1]
    note = process.note() or ""
    for name in ("threads", "default_dtype", "grad", "onednn", "switch_interval", "profile_function",
                 "torch_function_mode", "torch_dispatch_mode"):
        assert name in note, note


def test_nothing_changed_is_nothing_said(process: ProcessState) -> None:
    with process.around():
        torch.ones(3) + 1
    assert process.note() is None


def test_a_replaced_setter_does_not_keep_the_reference_on_one_thread(process: ProcessState,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The state is written through the functions taken at import: a candidate's stand-in for
    ``torch.set_num_threads`` is never what puts the worker's threads back."""
    threads = torch.get_num_threads()
    real = torch._C.get_num_threads  # torch.get_num_threads is this builtin
    torch.set_num_threads(1)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # and one that lies about it
    with process.around():
        assert real() == threads
    assert real() == 1


def test_the_timing_loop_runs_the_reference_as_taken_and_the_candidate_as_it_left_it(process: ProcessState) -> None:
    """time_interleaved with a state for the reference's side: each of its calls meets the worker's threads, no
    grad and no collector, while the candidate's calls meet what it left."""
    threads = torch.get_num_threads()
    seen: dict[str, set[Any]] = {"reference": set(), "candidate": set()}

    def reference(x: torch.Tensor) -> torch.Tensor:
        seen["reference"].add((torch.get_num_threads(), torch.is_grad_enabled(), gc.isenabled()))
        return x * 2

    def candidate(x: torch.Tensor) -> torch.Tensor:
        seen["candidate"].add(torch.get_num_threads())
        try:
            return x * 2
        finally:
            torch.set_num_threads(1)
            torch.set_grad_enabled(True)
            gc.enable()

    clean = process.fresh()
    time_interleaved([reference, candidate], [[torch.ones(4)]], CpuTimer(), warmup=1, trials=4, states=[clean])
    assert seen["reference"] == {(threads, False, False)}
    assert 1 in seen["candidate"]
    assert "threads" in (clean.note() or "") and process.note() is None  # a fresh state's own record
