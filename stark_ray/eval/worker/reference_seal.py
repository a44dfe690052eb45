"""The seal on a task's reference inside a worker: what a candidate could change of it without patching torch.

The fingerprint (:mod:`stark_ray.eval.worker.guards`) watches torch's functions and the evaluator's own. The reference
the worker times beside a candidate is neither: it is the task's module, its classes and its model, all reachable from
the candidate's process (``gc.get_objects()``). Changed, it runs slower (a hook that sleeps, ``Model.forward``
wrapped, ``F`` rebound in the task's module, a parameter swapped for a strided copy of itself) or differently (its
outputs in the worker are what the timing checks the candidate's against). The worker seals each reference as it
builds it — before any candidate is loaded in a worker that serves one — and its timing input sets as it makes them,
and breaks off a candidate whose step broke the seal, as it does one that tampered with torch.

What it reads: each submodule of the model (its class, every attribute of its instance dictionary, and the entries of
the dictionaries there: parameters, buffers, submodules, every kind of hook), each parameter's and buffer's and
timing input's storage address, strides and version counter (an in-place write counts), the task module's globals,
and the attributes of every class of its submodules (torch's too, but ``nn.Module``: the fingerprint's), with their
functions' code and defaults and any method added — by identity, taken once. A write through
``tensor.data`` bumps no version counter and is not seen here: where it changes the reference's outputs the timing's
check fails; where it only slows it, the drift check remains (:mod:`stark_ray.eval.judge.drift`).
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

import torch

# what torch.compile sets on the module it compiles, and what Python makes on a class when first asked
_NOT_SEALED = frozenset({"_is_torch_compile", "__annotations__", "__annotations_cache__", "__slotnames__"})
_DATA = (int, float, complex, str, bytes, bool, type(None), torch.Size, torch.dtype, torch.device)
Entry = tuple[str, Any, Any]  # (what it is, how to read it now, what it was: compared by identity or equality)


def _tensor_marks(t: torch.Tensor) -> tuple[Any, ...]:
    try:
        return (t.data_ptr(), t.stride(), t.shape, t._version)
    except Exception:  # a tensor without storage (meta): its identity is all there is
        return ()


def _data(value: Any) -> bool:
    """A plain value (a number, a size, a tuple of them): what it is, not what code it runs."""
    return isinstance(value, _DATA) or (type(value) is tuple and all(_data(v) for v in value))


def _layout(t: Any) -> tuple[Any, ...]:
    """A buffer's kind and layout (not its address: the forward may replace it with a new one like it)."""
    if not isinstance(t, torch.Tensor):
        return (type(t),)
    return (type(t), t.dtype, t.device, tuple(t.shape), t.stride())


def _items(obj: Any) -> list[tuple[str, Any]]:
    try:
        return list(dict.items(obj))
    except TypeError:
        return []


class Seal:
    """Taken once; :meth:`broken` says what differs since."""

    def __init__(self, module: Any, model: Any) -> None:
        self.entries: list[Entry] = []
        self.inputs: list[Entry] = []  # the timing sets' (replaced when they are made again, dropped with them)
        self._take(module, model)

    def _add(self, name: str, read: Any, value: Any, into: list[Entry] | None = None) -> None:
        (self.entries if into is None else into).append((name, read, value))

    def _take(self, module: Any, model: Any) -> None:
        classes: list[type] = []
        modules = list(model.named_modules()) if isinstance(model, torch.nn.Module) else [("", model)]
        for path, m in modules:
            label = f"model{'.' if path else ''}{path}"
            self._add(f"{label}.__class__", lambda m=m: type(m), type(m))
            attrs = getattr(m, "__dict__", {})
            self._add(f"{label}.__dict__", lambda m=m: getattr(m, "__dict__", None), attrs)
            # an attribute that hides one of its class: a forward of the instance's own (one the forward adds itself,
            # a size it keeps, is none of the seal's business)
            shadow = (lambda m=m, a=attrs: tuple(k for k in a if not _data(a[k]) and hasattr(type(m), k)))  # noqa: E731
            self._add(f"{label}.__dict__ (what hides its class's)", shadow, shadow())
            for key, value in _items(attrs):
                if type(value) is torch.Tensor or _data(value):  # state the forward may replace itself (33_VanillaRNN's
                    continue  # hidden state, a size it keeps): a changed value changes its outputs, not its code
                self._add(f"{label}.{key}", lambda a=attrs, k=key: dict.get(a, k), value)
                if isinstance(value, dict):  # parameters, buffers, submodules, hooks: one added, or one replaced
                    self._keys(f"{label}.{key}", value)
                    for sub, inner in _items(value) if key != "_buffers" else ():  # a buffer the forward may
                        self._add(f"{label}.{key}[{sub!r}]", lambda d=value, s=sub: dict.get(d, s), inner)  # replace
            if isinstance(m, torch.nn.Module):
                for name, t in m.named_parameters(recurse=False):
                    self._tensor(f"{label}.{name}", t, self.entries)
                for name, t in m.named_buffers(recurse=False):  # written in place or replaced by the forward itself
                    self._add(f"{label}.{name} (layout)", lambda m=m, n=name: _layout(m._buffers.get(n)), _layout(t))
            # its classes, torch's too (nn.Linear.forward replaced slows every Linear of the reference, unseen by the
            # fingerprint); nn.Module itself is the fingerprint's (which lets torch.compile patch it first)
            classes += [c for c in type(m).__mro__ if c.__module__ != "builtins" and c is not torch.nn.Module]
        for key, value in _items(getattr(module, "__dict__", {})):
            if not key.startswith("__"):
                self._add(f"task module.{key}", lambda d=module.__dict__, k=key: dict.get(d, k), value)
        seen: set[tuple[int, str]] = set()
        for cls in dict.fromkeys(classes):
            self._keys(f"{cls.__qualname__}.__dict__", vars(cls))  # a method added: one an instance finds first
            for key, value in list(vars(cls).items()):
                if key in ("__dict__", "__weakref__", "__doc__") or key in _NOT_SEALED:
                    continue
                self._add(f"{cls.__qualname__}.{key}", lambda c=cls, k=key: vars(c).get(k), value)
                fn = value.__func__ if isinstance(value, staticmethod | classmethod) else value
                if isinstance(fn, types.FunctionType):
                    self._add(f"{cls.__qualname__}.{key}.__code__", lambda f=fn: f.__code__, fn.__code__)
                    self._add(f"{cls.__qualname__}.{key}.__defaults__", lambda f=fn: f.__defaults__, fn.__defaults__)
                    self._globals(fn, seen)

    def _globals(self, fn: types.FunctionType, seen: set[tuple[int, str]]) -> None:
        """What a function's code finds in its module by name (``F`` in torch.nn.modules.linear: rebound, it slows
        every Linear)."""
        space = fn.__globals__
        for name in fn.__code__.co_names:
            if name in space and (id(space), name) not in seen:
                seen.add((id(space), name))
                self._add(f"{space.get('__name__', '?')}.{name}", lambda g=space, n=name: dict.get(g, n), space[name])

    def _keys(self, name: str, table: Any) -> None:
        def keys() -> tuple[Any, ...]:
            return tuple(k for k in table if k not in _NOT_SEALED)

        self._add(f"{name} (keys)", keys, keys())

    def _tensor(self, name: str, t: torch.Tensor, into: list[Entry], versioned: bool = True) -> None:
        def marks() -> tuple[Any, ...]:
            m = _tensor_marks(t)
            return m if versioned else m[:-1]

        into.append((f"{name} (storage, strides, shape{', version' if versioned else ''})", marks, marks()))

    def seal_inputs(self, sets: Iterable[Iterable[Any]] | None) -> None:
        """The timing input sets, sealed as they are made (a candidate gets clones of them only); None: they are
        gone (their tensors are not kept alive here)."""
        self.inputs = []
        for i, inputs in enumerate(sets or []):
            for j, value in enumerate(inputs):
                if isinstance(value, torch.Tensor):
                    self._tensor(f"timing input set {i} [{j}]", value, self.inputs)

    def broken(self) -> list[str]:
        """What differs from the seal (by identity; equality for the tensors' marks)."""
        changed: list[str] = []
        for name, read, was in [*self.entries, *self.inputs]:
            try:
                now = read()
            except Exception:
                changed.append(f"the reference's {name}")
                continue
            if not (now == was if name.endswith(")") else now is was):
                changed.append(f"the reference's {name}")
        return changed
