"""Guards inside the worker: a backstop against candidates that tamper, and checks of what a call returned.

The verdict itself is the judge's (:mod:`stark_ray.eval.judge.judge`): these only make the worker's own measurements
harder to fool and say when a worker must not serve another candidate.

- :class:`Fingerprint`: the identity of every callable of torch (its main namespaces, ``torch.Tensor`` with its
  dunders, ``nn.Module``, ``torch.cuda.Event``/``Stream``), of ``time`` and ``builtins``, of the profiler, and of
  every module of the evaluator loaded in the worker (every name it defines, constants included, and every
  attribute of the classes it defines), and which module object each name in ``sys.modules`` is; taken once,
  compared before and after each step of a candidate.
- :func:`output_problem`: outputs must be plain tensors on the reference's device that share no memory with
  the inputs.
- :func:`poison`: fills memory the allocator will hand out next with 0xFF bytes (NaN in every float format),
  so outputs that a kernel leaves partly unwritten fail the comparison.
- :func:`settle_torch`: the patches torch makes to itself (``torch._dynamo``'s, on its import and on the first
  ``torch.compile``), told from a candidate's: made before the fingerprint where dynamo is loaded already, else
  watched for (:class:`SettlesOnImport`; on the CPU): dynamo is imported only by a candidate that uses it (its import
  doubled a worker's start: 1.6-1.8 s of CPU for the host's imports, 3.4-3.8 s with it, on the dev box), and what
  its import changes to functions of torch's own files becomes the fingerprint's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

import torch

from stark_ray.eval.measure.inputs import map_tensors

_WATCHED_MODULES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special", "torch.cuda",
                    "torch.testing", "torch.profiler", "torch.autograd.profiler", "torch.utils.cpp_extension",
                    "time", "builtins", "gc", "os", "statistics", "math", "json")
_OURS = "stark_ray"  # every loaded module of the evaluator is watched, with the classes it defines
_WATCHED_CLASSES = (torch.Tensor, torch.nn.Module, torch.cuda.Event, torch.cuda.Stream)
_BUILTIN_DUNDERS = ("__import__", "__build_class__")
POISON_ALL_BELOW = 1 << 30  # outputs up to this size are poisoned in every block the allocator might hand out


_VOLATILE = {"__dict__", "__doc__", "__weakref__", "__module__", "__annotations__", "__qualname__",
             "__abstractmethods__", "__parameters__", "__orig_bases__"}


def _members(obj: Any) -> Iterable[tuple[str, Any]]:
    """A class's attributes along its MRO, dunders included (``Tensor.__add__`` can be patched too), read raw:
    getattr would bind a new method object each time. A module's public and private names, dunders excluded."""
    is_class = isinstance(obj, type)
    for name in dir(obj):
        if name in _VOLATILE or (not is_class and name.startswith("__")):
            continue
        try:
            yield name, inspect.getattr_static(obj, name) if is_class else getattr(obj, name)
        except Exception:
            continue


def _watched_modules() -> dict[str, ModuleType]:
    found = {}
    for name in (*_WATCHED_MODULES, *(n for n in list(sys.modules) if n == _OURS or n.startswith(_OURS + "."))):
        module = sys.modules.get(name)
        if isinstance(module, ModuleType):
            found[name] = module
    return found


class Fingerprint:
    """The identity of what candidates could monkeypatch. Taken once; compared after each step of a candidate.

    Take it after the worker's own hooks (the build cache, :mod:`stark_ray.eval.worker.kernel_sources`) are
    installed, and after torch's own patches (:func:`settle_torch`); where torch patches itself later (a candidate's
    first ``torch.compile`` imports ``torch._dynamo``, which replaces ``torch.manual_seed``), :meth:`settled` takes its
    new functions as torch's.
    """

    def __init__(self) -> None:
        self.carried: list[str] = []  # what had changed as torch settled itself later (:meth:`settled`): still said
        self.modules = _watched_modules()
        # (name, owner, attribute, how to read it, the object): the object itself, held and compared by identity (an
        # id could be reused by a replacement once the original is freed)
        self.entries = self._entries(self.modules)
        # a Python function's code can be swapped in place (``f.__code__ = ...``: the function, and its id, stay),
        # and so can what it runs with: its defaults, and (the evaluator's own) the values its closure holds
        self.codes = [(label, fn, fn.__code__, _defaults(fn), _closure(fn, label))
                      for name, _, _, _, seen in self.entries for label, fn in _functions(name, seen)]
        self.hooks = {attr: _hook_ids(table) for attr, table in _global_hooks()}  # torch's hooks on every module

    def settled(self, before: list[str]) -> None:
        """Torch has just patched itself (``torch._dynamo`` imported after the fingerprint was taken): each name whose
        object changed since is taken to be torch's own where it is one torch patches so (:data:`SELF_PATCHED`) and
        its new object is a function of torch's own files (:func:`_torchs`), and only those; ``before``, what
        :meth:`changed` said as that import began (a candidate's own changes), is still said, and so is every other
        change (code of the candidate's that ran meanwhile: a finder of its own, a thread — even one whose function
        claims a torch file as its own). A name deleted stays watched: an object put back under it is a change."""
        taken: set[str] = set()
        for i, (name, owner, attr, how, seen) in enumerate(self.entries):
            now = _read(owner, attr, how)
            if (name in SELF_PATCHED and name not in before and now is not _MISSING and now is not seen
                    and _torchs(now)):
                self.entries[i] = (name, owner, attr, how, now)
                taken.add(name)
        self.codes = [c for c in self.codes if not any(c[0] == n or c[0].startswith(n + ".") for n in taken)] + [
            (label, fn, fn.__code__, _defaults(fn), _closure(fn, label))
            for name, _, _, _, seen in self.entries if name in taken for label, fn in _functions(name, seen)]
        self.carried = sorted(set(self.carried) | set(before))

    @staticmethod
    def _entries(modules: dict[str, ModuleType]) -> list[tuple[str, Any, str, str, Any]]:
        entries: list[tuple[str, Any, str, str, Any]] = []
        classes: list[type] = list(_WATCHED_CLASSES)
        for modname, module in modules.items():
            ours = modname.startswith(_OURS)
            for name, value in _members(module):
                # the evaluator's constants too (HEAD_START_US = 0 changes how the worker times): every name of ours
                if (callable(value) or ours) and not isinstance(value, ModuleType):
                    entries.append((f"{modname}.{name}", module, name, "attr", value))
                    if (modname.startswith(_OURS) and isinstance(value, type)
                            and getattr(value, "__module__", None) == modname):
                        classes.append(value)
            if modname == "builtins":
                for name in _BUILTIN_DUNDERS:
                    entries.append((f"builtins.{name}", module, name, "attr", getattr(module, name, None)))
        for cls in classes:
            mro = cls in _WATCHED_CLASSES  # torch's classes: along the MRO (a patch may land on a subclass)
            members = _members(cls) if mro else [(n, v) for n, v in vars(cls).items() if n not in _VOLATILE]
            for name, value in members:  # our classes' attributes all (a class constant is read as it runs)
                if callable(value) or isinstance(value, property | staticmethod | classmethod) or not mro:
                    entries.append((f"{cls.__module__}.{cls.__qualname__}.{name}", cls, name,
                                    "static" if mro else "own", value))
        return entries

    def changed(self) -> list[str]:
        """Names whose object is no longer the one seen at the fingerprint (new names do not count), functions whose
        code was swapped in place, torch's global module hooks added, and modules replaced in ``sys.modules``.
        Reads only what was seen (no listing again)."""
        swapped = [f"sys.modules[{n!r}]" for n, m in self.modules.items() if sys.modules.get(n) is not m]
        for name, fn, code, defaults, closure in self.codes:
            swapped += [f"{name}.{what}" for what, changed in (
                ("__code__", fn.__code__ is not code), ("__defaults__", not _same(_defaults(fn), defaults)),
                ("__closure__", not _same(_closure(fn, name), closure))) if changed]
        from torch.nn.modules import module

        swapped += [f"torch.nn.modules.module.{attr}" for attr, ids in self.hooks.items()
                    if _hook_ids(getattr(module, attr, None)) != ids]
        changed = [name for name, owner, attr, how, seen in self.entries
                   if (now := _read(owner, attr, how)) is not _MISSING and now is not seen]
        found = swapped + sorted(changed)
        return [n for n in self.carried if n not in found] + found


_MISSING = object()
# what torch patches in itself as ``torch._dynamo`` is imported and torch.compile first used (torch 2.13, the CPU's:
# a GPU worker imports dynamo ahead, before the fingerprint). A code object's file name is the candidate's to choose
# (compile(src, "<torch>/_dynamo/eval_frame.py", ...)): a function "of torch's files" alone laundered a candidate's
# own torch.nn.functional.gelu, put in place by a finder of its own during that import. A torch that patches more
# names is said as tampering with them (seen, never silent)
SELF_PATCHED = frozenset({"torch.manual_seed", "torch.nn.modules.module.Module.__init__",
                          "torch.nn.modules.module.Module.__setstate__"})
_TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep


def _torchs(obj: Any) -> bool:
    """Whether ``obj`` is a function of torch's own files (what dynamo's import puts in place: ``torch.manual_seed``
    wrapped, ``nn.Module.__init__`` tagged), read from its code, not from a name it could be given."""
    fn = getattr(obj, "__func__", obj)
    code = getattr(fn, "__code__", None) if isinstance(fn, types.FunctionType) else None
    filename = getattr(code, "co_filename", None)
    return isinstance(filename, str) and os.path.realpath(filename).startswith(_TORCH_DIR)


def _functions(name: str, obj: Any) -> Iterator[tuple[str, types.FunctionType]]:
    """The Python functions an entry stands for: itself, the one a staticmethod or classmethod wraps, a property's
    accessors; and for the evaluator's own, the functions their closures hold (the generator behind a
    ``@contextmanager``), and theirs."""
    seen: set[int] = set()
    todo = [(name, obj)]
    while todo:
        label, o = todo.pop()
        if isinstance(o, staticmethod | classmethod):
            todo.append((label, o.__func__))
        elif isinstance(o, property):
            todo += [(f"{label}.{a}", f) for a in ("fget", "fset", "fdel") if (f := getattr(o, a)) is not None]
        elif isinstance(o, types.FunctionType) and id(o) not in seen:
            seen.add(id(o))
            yield label, o
            if label.startswith(_OURS):
                todo += [(f"{label}.<closure>", c) for c in map(_cell, o.__closure__ or ())]


def _defaults(fn: types.FunctionType) -> tuple[Any, ...]:
    """What a function runs with besides its code: ``__defaults__`` and ``__kwdefaults__`` (a dict: it can change
    in place, so its values too)."""
    kw = fn.__kwdefaults__
    return (fn.__defaults__, kw, *(kw or {}).values())


def _closure(fn: types.FunctionType, name: str) -> tuple[Any, ...]:
    """For the evaluator's own functions, the values their closure holds (a cell can be written:
    ``f.__closure__[0].cell_contents = ...``); torch's may hold state that changes as it runs."""
    return tuple(_cell(c) for c in fn.__closure__ or ()) if name.startswith(_OURS) else ()


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _cell(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # empty
        return _MISSING


def _read(owner: Any, attr: str, how: str) -> Any:
    """What an entry names now (_MISSING where it is gone or cannot be read): ``how`` "attr" by getattr, "own" from
    the class's own namespace, "static" from the first class along the MRO that has it (what getattr_static finds,
    faster)."""
    try:
        if how == "attr":
            return getattr(owner, attr, _MISSING)
        if how == "own":
            return vars(owner).get(attr, _MISSING)
        return next((k.__dict__[attr] for k in owner.__mro__ if attr in k.__dict__), _MISSING)
    except Exception:
        return _MISSING


def _hook_ids(table: Any) -> tuple[int, ...]:
    """A hook table's identity: the table's and each hook's (another table, or one hook for another, differs)."""
    try:
        return (id(table), *(id(v) for v in dict.values(table)))
    except TypeError:  # no longer a dict
        return (id(table), -1)


def _global_hooks() -> list[tuple[str, Any]]:
    """torch's tables of hooks that run for every module (``register_module_forward_hook`` and its kind)."""
    from torch.nn.modules import module

    return [(name, table) for name, table in vars(module).items()
            if name.startswith("_global_") and name.endswith("_hooks") and isinstance(table, dict)]


def _storage_span(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        storage = t.untyped_storage()
    except Exception:
        return None
    start = storage.data_ptr()
    return (start, start + storage.nbytes()) if storage.nbytes() else None


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(value, found.append)
    return found


def output_problem(out: Any, inputs: list[Any], device: torch.device | str) -> str | None:
    """Why an output cannot be accepted as it is (or None): a tensor subclass, the wrong device, or memory
    shared with an input."""
    spans = [s for t in _tensors(inputs) if (s := _storage_span(t)) is not None]
    for i, t in enumerate(_tensors(out)):
        name = "output" if i == 0 and isinstance(out, torch.Tensor) else f"output tensor {i}"
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            return f"{name} is a {type(t).__name__}, not a plain torch.Tensor"
        if t.device.type != torch.device(device).type:
            return f"{name} is on {t.device}, expected {torch.device(device).type}"
        span = _storage_span(t)
        if span is not None and any(span[0] < e and s < span[1] for s, e in spans):
            return f"{name} shares memory with an input (it must be a new tensor)"
    return None


PRINT_CHUNK = 1 << 26  # bytes summed at a time for an output's print


def output_print(out: Any) -> list[tuple[int, int]]:
    """A print of each output tensor's bytes (their sum, and the sum at even places): what the tensor held, without
    a copy of it."""
    prints = []
    for t in _tensors(out):
        total = even = 0
        for piece in _pieces(t.detach()):  # a view of a larger buffer is read in pieces, never copied whole
            flat = piece.contiguous().reshape(-1).view(torch.uint8)
            for i in range(0, flat.numel(), PRINT_CHUNK):
                part = flat[i:i + PRINT_CHUNK].to(torch.int64)
                total += int(part.sum())
                even += int(part[::2].sum())
        prints.append((total, even))
    return prints


def _pieces(t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` whole where it is contiguous, else in slices along its first dimension of at most PRINT_CHUNK bytes
    each (a transposed output's copy for its print costs one slice, not a second output)."""
    if t.is_contiguous() or t.dim() == 0 or t.shape[0] == 0:
        return [t]
    row = max(1, t[0].numel() * t.element_size())
    step = max(1, PRINT_CHUNK // row)
    return [t[i:i + step] for i in range(0, t.shape[0], step)]


def earlier_problem(earlier: Any, printed: list[tuple[int, int]], out: Any) -> str | None:
    """Why the previous call's outputs (``earlier``, ``printed`` when it returned) are not what they were after
    this call (``out``), or None: one output buffer handed out by every call (a caller keeping two outputs has the
    first overwritten), or an earlier output written later."""
    spans = [s for t in _tensors(out) if (s := _storage_span(t)) is not None]
    for t in _tensors(earlier):
        span = _storage_span(t)
        if span is not None and any(span[0] < e and s < span[1] for s, e in spans):
            return ("its output shares memory with its output of the previous call (one buffer returned by every "
                    "call: a caller keeping both has the first overwritten)")
    if output_print(earlier) != printed:
        return "its output of the previous call changed during this call (an earlier output written later)"
    return None


def poison(nbytes: Iterable[int], device: str) -> None:
    """Fill blocks the size of the expected outputs (and one block of their total) with 0xFF and free them:
    the caching allocator hands those blocks out next, so unwritten output elements read as NaN (or -1)."""
    sizes = [n for n in nbytes if n > 0]
    if not sizes:
        return
    every = [*sizes, *sizes, sum(sizes)] if sum(sizes) <= POISON_ALL_BELOW else sizes  # a large output: once
    blocks = [torch.empty(n, dtype=torch.uint8, device=device).fill_(255) for n in every]
    del blocks


DYNAMO = "torch._dynamo"


def _tag_module_inits() -> None:
    """What torch.compile's first use does to ``nn.Module.__init__`` (tags it), done now."""
    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init

        install_generation_tagging_init()
    except Exception:  # another torch version: a false alarm there shows as "tampered" in a test, not silently
        pass


def imports_dynamo_ahead(device: str) -> bool:
    """Whether a worker on ``device`` imports ``torch._dynamo`` before any candidate (its spares while they wait): on a
    GPU, where the spares hide its seconds and a ``torch.compile`` candidate's load would pay them."""
    return device == "cuda"


def settle_torch(fingerprint: Callable[[], Fingerprint | None], ahead: bool = False) -> SettlesOnImport | None:
    """Let torch's patches to itself not be taken for a candidate's. Where ``torch._dynamo`` is loaded already (or
    ``ahead``: imported now, :func:`imports_dynamo_ahead`), its
    patches are made now, before the fingerprint is taken; else a :class:`SettlesOnImport` is installed (and
    returned) that has ``fingerprint()`` settled once a candidate's import of it is done."""
    if ahead:
        import torch._dynamo  # noqa: F401
    if DYNAMO in sys.modules:
        _tag_module_inits()
        return None
    for finder in sys.meta_path:  # one watch a process: a later host (tests make several) takes it over
        if isinstance(finder, SettlesOnImport) and not finder.settled:
            finder.fingerprint = fingerprint
            return finder
    watcher = SettlesOnImport(fingerprint)
    sys.meta_path.insert(0, watcher)
    return watcher


class SettlesOnImport(importlib.abc.MetaPathFinder):
    """Watches for the first import of ``torch._dynamo`` (a candidate's ``torch.compile``, or the candidate itself),
    and around that import's own execution, no later: what the fingerprint says as it begins stays said
    (:meth:`Fingerprint.settled`); what that import and the tagging torch.compile does then change is torch's own.
    A candidate's change made after it, or before it, is seen as ever. (In the candidate's own process, as the
    fingerprint is: a backstop, the verdicts are the judge's.)"""

    def __init__(self, fingerprint: Callable[[], Fingerprint | None]) -> None:
        self.fingerprint = fingerprint
        self.finding = False
        self.settled = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != DYNAMO or self.finding or self.settled:
            return None
        self.finding = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        finally:
            self.finding = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _SettlingLoader(spec.loader, self)
        return spec

    def around(self, run: Callable[[], None]) -> None:
        fp = self.fingerprint()
        before = fp.changed() if fp is not None else []
        try:
            run()
            _tag_module_inits()
        finally:
            if DYNAMO in sys.modules:  # an import that failed leaves the watch on for the next try
                self.settled = True
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                if fp is not None:
                    fp.settled(before)


class _SettlingLoader(importlib.abc.Loader):
    """``torch._dynamo``'s own loader, its execution watched (:class:`SettlesOnImport`); anything else it is asked
    goes to that loader."""

    def __init__(self, loader: Any, watcher: SettlesOnImport) -> None:
        self.loader = loader
        self.watcher = watcher

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader  # as the module would have it
        try:
            self.watcher.around(lambda: self.loader.exec_module(module))
        finally:
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "watcher"):  # not set yet (a copy): never asked of itself
            raise AttributeError(name)
        return getattr(self.loader, name)
