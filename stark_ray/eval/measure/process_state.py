"""The process's global state, as the worker times the reference in it.

The worker times the reference beside the candidate, in its process, and a forward can leave global state behind
that slows the reference's next call without patching anything the fingerprint watches
(:mod:`stark_ray.eval.worker.guards`): ``torch.set_num_threads(1)`` in a ``finally``, grad mode or the garbage
collector switched back on, a torch function or dispatch mode left on the stack, a Python profile or trace function,
oneDNN or cuDNN switched off, deterministic algorithms, an attention kernel disabled, the default dtype changed (not
TF32: it only makes the reference faster). The drift check (:mod:`stark_ray.eval.judge.drift`) sees a reference more
than 15 % slower than alone where the host is quiet; these it need not see.

The worker takes its state once it is set up, before any candidate is loaded (:meth:`ProcessState.taken`). Each
timed call of the reference runs in that state (:meth:`ProcessState.around`) and the candidate's own is put back
after it (a candidate may set for itself what it likes: that is its own speed); which settings differed is said in
the timing's notes. Every setting is read and written through functions taken when this module was imported, in a
worker before any candidate ran: a candidate that replaces ``torch.set_num_threads`` changes nothing here.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

_C = torch._C


@dataclass(frozen=True)
class Setting:
    """One piece of global state: how it is read and written."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], Any]


def _setting(name: str, get: Callable[[], Any] | None, set_: Callable[[Any], Any] | None) -> Setting | None:
    return Setting(name, get, set_) if get is not None and set_ is not None else None


def _c(name: str) -> Any:
    """A function of torch's C module, where this torch has it (None: the setting is left out)."""
    return getattr(_C, name, None)


def _deterministic() -> Setting | None:
    get, warn, set_ = _c("_get_deterministic_algorithms"), _c("_get_deterministic_algorithms_warn_only"), \
        _c("_set_deterministic_algorithms")
    if get is None or warn is None or set_ is None:
        return None
    return Setting("deterministic_algorithms", lambda: (get(), warn()), lambda v: set_(v[0], warn_only=v[1]))


def _autocast(device: str) -> Setting | None:
    is_on, set_ = getattr(torch, "is_autocast_enabled", None), getattr(torch, "set_autocast_enabled", None)
    if is_on is None or set_ is None:
        return None
    return Setting(f"autocast_{device}", lambda: is_on(device), lambda v: set_(device, v))


_SETTINGS: tuple[Setting, ...] = tuple(s for s in (
    _setting("threads", torch.get_num_threads, torch.set_num_threads),
    _setting("grad", torch.is_grad_enabled, _c("_set_grad_enabled")),
    _setting("gc", gc.isenabled, lambda on: gc.enable() if on else gc.disable()),
    _setting("default_dtype", torch.get_default_dtype, torch.set_default_dtype),
    _setting("onednn", _c("_get_mkldnn_enabled"), _c("_set_mkldnn_enabled")),
    _deterministic(),
    _setting("cudnn", _c("_get_cudnn_enabled"), _c("_set_cudnn_enabled")),
    _setting("cudnn_benchmark", _c("_get_cudnn_benchmark"), _c("_set_cudnn_benchmark")),
    _setting("cudnn_deterministic", _c("_get_cudnn_deterministic"), _c("_set_cudnn_deterministic")),
    # not TF32 and the float32 precisions: on, they make the reference faster, never slower, and torch 2.9+'s two
    # APIs for them do not mix (one written back made the other raise when read: a reviewer's finding)
    _setting("flash_attention", _c("_get_flash_sdp_enabled"), _c("_set_sdp_use_flash")),
    _setting("mem_efficient_attention", _c("_get_mem_efficient_sdp_enabled"), _c("_set_sdp_use_mem_efficient")),
    _setting("math_attention", _c("_get_math_sdp_enabled"), _c("_set_sdp_use_math")),
    _setting("cudnn_attention", _c("_get_cudnn_sdp_enabled"), _c("_set_sdp_use_cudnn")),
    _autocast("cpu"),
    _autocast("cuda"),
    _setting("profile_function", sys.getprofile, sys.setprofile),
    _setting("trace_function", sys.gettrace, sys.settrace),
    _setting("switch_interval", sys.getswitchinterval, sys.setswitchinterval),
) if s is not None)

_function_modes: Callable[[], int] | None = _c("_len_torch_function_stack")
_pop_function_mode: Callable[[], Any] | None = _c("_pop_torch_function_stack")
_push_function_mode: Callable[[Any], None] | None = _c("_push_on_torch_function_stack")
_dispatch_modes: Callable[[], int] | None = _c("_len_torch_dispatch_stack")
_pop_dispatch_mode: Callable[[Any], Any] | None = _c("_pop_torch_dispatch_stack")
_push_dispatch_mode: Callable[[Any], None] | None = _c("_push_on_torch_dispatch_stack")

_UNREADABLE = object()  # a setting that raised when read: never written back


def _read(setting: Setting) -> Any:
    try:
        return setting.get()
    except Exception:
        return _UNREADABLE


def _stacks() -> tuple[int, int]:
    """How many torch function and dispatch modes are on their stacks."""
    return (_function_modes() if _function_modes is not None else 0,
            _dispatch_modes() if _dispatch_modes is not None else 0)


@dataclass(frozen=True)
class ProcessState:
    """The settings' values (by name) and the modes' stack depths, as taken."""

    values: tuple[tuple[str, Any], ...]
    stacks: tuple[int, int] = (0, 0)
    changed: set[str] = field(default_factory=set, compare=False)  # what a call found otherwise, said once

    @classmethod
    def taken(cls) -> ProcessState:
        """The process's state now (a worker: set up, no candidate loaded yet)."""
        return cls(tuple((s.name, _read(s)) for s in _SETTINGS), _stacks())

    def fresh(self) -> ProcessState:
        """This state with nothing yet found changed (one timing's)."""
        return ProcessState(self.values, self.stacks)

    def but(self, **values: Any) -> ProcessState:
        """This state with some settings otherwise (the timing loop's own: no grad, no collector); what its calls
        find changed is recorded on this one."""
        return ProcessState(tuple((n, values.get(n, v)) for n, v in self.values), self.stacks, self.changed)

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        """A call in this state: every setting that differs written, the modes above this state's stacks taken off;
        after it, what was there before put back. Outside the timed region; a setting that cannot be written is
        left as it is (the drift check remains)."""
        wanted = dict(self.values)
        saved: list[tuple[Setting, Any]] = []
        for s in _SETTINGS:
            value = wanted.get(s.name, _UNREADABLE)
            now = _read(s)
            if value is _UNREADABLE or now is _UNREADABLE or now == value:
                continue
            with contextlib.suppress(Exception):
                s.set(value)
                saved.append((s, now))
                self.changed.add(s.name)
        functions, dispatches = self._off()
        try:
            yield
        finally:
            self._on(functions, dispatches)
            for s, value in reversed(saved):
                with contextlib.suppress(Exception):
                    s.set(value)

    def _off(self) -> tuple[list[Any], list[Any]]:
        """The modes a candidate left above this state's stacks, taken off (top first)."""
        functions: list[Any] = []
        dispatches: list[Any] = []
        with contextlib.suppress(Exception):
            while _function_modes is not None and _pop_function_mode is not None \
                    and _function_modes() > self.stacks[0]:
                functions.append(_pop_function_mode())
            while _dispatch_modes is not None and _pop_dispatch_mode is not None \
                    and _dispatch_modes() > self.stacks[1]:
                dispatches.append(_pop_dispatch_mode(None))
        if functions:
            self.changed.add("torch_function_mode")
        if dispatches:
            self.changed.add("torch_dispatch_mode")
        return functions, dispatches

    @staticmethod
    def _on(functions: list[Any], dispatches: list[Any]) -> None:
        with contextlib.suppress(Exception):
            for mode in reversed(functions):
                if _push_function_mode is not None:
                    _push_function_mode(mode)
            for mode in reversed(dispatches):
                if _push_dispatch_mode is not None:
                    _push_dispatch_mode(mode)

    def note(self) -> str | None:
        """What calls found changed, said once (None: nothing)."""
        if not self.changed:
            return None
        return (f"the candidate left the process's state changed ({', '.join(sorted(self.changed))}): each timed "
                "call of the reference ran in the worker's own")
