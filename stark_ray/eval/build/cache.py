"""A persistent build cache for ``torch.utils.cpp_extension`` builds, keyed by a hash of the sources.

Installed inside the worker process before a candidate is imported, it wraps ``load_inline`` and ``load`` so
that the extension's build directory becomes ``<cache>/<hash16>`` and its name ``<name>_<hash16>``, where the
hash covers everything that shapes the binary (sources, functions, flags, torch and Python versions). An
identical candidate then loads in well under a second (ninja finds nothing to do), and two candidates that
reuse the same ``name`` never collide. Builds are verbose so that the compiler's output lands in the worker's
log. Concurrent builds of one key are serialized with a kernel lock (released if the holder is killed).
A load_inline ``.cu`` that names nothing of torch is built without the ``torch/types.h`` load_inline puts
first (most of a build's time), falling back to load_inline's own headers when it does not build so.

A cache entry cannot be poisoned for the candidates after the one that wrote it: the library is never loaded from
the cache itself but from a private copy, whose SHA-256 must be the one recorded for the entry (``stark_digest``).
A copy that differs means the entry was changed since: it is wiped and built again, and the log says so; a worker
that had loaded the old one is not disturbed (its copy is another file: rewriting the cached library in place once
killed such a worker with SIGBUS).

Isolated, no process that runs generated code can write the cache (eval/proc/jail.py): where an entry is missing, the
wrapper asks its parent for the build (:func:`set_requester`: the worker's ``--ask-builds``), which has it made by a
*builder* (eval/build/builder.py): a process of its own that runs no candidate code, only torch's build of the arguments
sent, and writes only a directory of its own. It names the key of those arguments before a compiler runs (a flag
can make the compiler run anything: ``-wrapper``), so a build can land only under the key of its own arguments;
the parent then publishes the library into the cache and records its digest (eval/build/publish.py). A candidate
can thus spoil only the entry of arguments no honest candidate sends, and never a precompiled header (built by the
trusted side alone, for flags that cannot run a program).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stark_ray.eval.build.locks import file_lock
from stark_ray.eval.build.pch import ensure_pch, note_build
from stark_ray.eval.hardware import cpu_signature

DEFAULT_BUILD_DIR = Path("~/.cache/stark-ray/build")

DIGEST_FILE = "stark_digest"  # in an entry's directory: the SHA-256 of its library as first loaded
_IMPORT_LOCK = threading.RLock()  # cpp_extension's loader is swapped for the copying one during a load
LIB_EXT = ".so"  # cpp_extension's on Linux, the only system the evaluator runs on

# asks the parent for a build, given {"key", "inline", "arguments", "files", "arch"}; answers {"built", "log",
# "error"}: set in an isolated worker, which cannot write the cache
BuildRequester = Callable[[dict[str, Any]], dict[str, Any]]
_requester: BuildRequester | None = None


def set_requester(requester: BuildRequester | None) -> None:
    """From now on, caches made in this process have their missing entries built by ``requester``."""
    global _requester
    _requester = requester


class PoisonedBuild(RuntimeError):
    """A cached library is not the one recorded for its entry."""


# arguments that do not change the binary: left out of the key (build_directory is ours to choose)
_NOT_HASHED = {"build_directory", "verbose", "keep_intermediates", "use_pch"}


def cache_root(build_dir: str | None) -> Path:
    return Path(build_dir).expanduser() if build_dir else DEFAULT_BUILD_DIR.expanduser()


def open_to_readers(root: Path) -> None:
    """The cache readable by isolated workers, which run as nobody where the evaluator is root (eval/proc/jail.py):
    what the trusted side writes there is made with the caller's umask."""
    root.mkdir(parents=True, exist_ok=True)
    for path in (root, root / "pch"):
        if path.is_dir():
            path.chmod(path.stat().st_mode | 0o055)


def build_key(arguments: dict[str, Any]) -> str:
    import torch

    blob = {k: v for k, v in arguments.items() if k not in _NOT_HASHED}
    # -march=native and friends make a binary CPU-specific: a shared cache must not hand it to another CPU
    # and a CUDA build is specific to the CUDA version and the architectures it was built for
    blob["__env__"] = [torch.__version__, sys.version, platform.machine(), cpu_signature(), torch.version.cuda,
                       os.environ.get("TORCH_CUDA_ARCH_LIST", "")]
    text = json.dumps(blob, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


HEADERS_LIGHT, HEADERS_FULL = "light", "full"
# what in a .cu needs torch's headers: its namespaces, macros, headers and tensor types
_TORCH_IN_CUDA = re.compile(r"\b(?:torch|at|c10|caffe2|pybind11)::|\b(?:TORCH|AT|C10)_[A-Z_]+|"
                            r"#\s*include\s*[<\"](?:torch|ATen|c10|caffe2|pybind11)/|\bTensor\b")


def light_cuda_candidate(arguments: dict[str, Any]) -> bool:
    """Whether a load_inline build may try its .cu without torch/types.h: it has CUDA sources that name
    nothing of torch, it leaves the implicit headers on, and builds no SYCL."""
    cuda = "\n".join(str(s) for s in _as_list(arguments.get("cuda_sources")))
    return bool(cuda.strip()) and not arguments.get("no_implicit_headers") and not arguments.get("sycl_sources") \
        and not _TORCH_IN_CUDA.search(cuda)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _file_contents(paths: Any) -> list[str]:
    out = []
    for p in _as_list(paths):
        try:
            out.append(Path(p).read_text(errors="replace"))
        except OSError:
            out.append(f"<missing {p}>")
    return out


class BuildCache:
    """Wraps cpp_extension.load_inline / load; ``install()`` patches them in this process."""

    def __init__(self, root: Path, use_pch: bool = True, light_cuda: bool = True,
                 requester: BuildRequester | None = None, on_key: Callable[[str], None] | None = None,
                 pch_root: Path | None = None) -> None:
        self.root = root
        self.use_pch = use_pch
        self.light_cuda = light_cuda
        # a builder's ``on_key``: told each key before its build starts; it builds itself, without loading the
        # result, and uses only the precompiled headers that already lie in ``pch_root`` (the shared cache)
        self.on_key = on_key
        self.requester = None if on_key is not None else requester or _requester  # None: builds in this process
        self.pch_root = pch_root
        self.builds: list[str] = []  # keys built or loaded through the cache, in order

    def install(self) -> None:
        from torch.utils import cpp_extension

        original_inline = cpp_extension.load_inline
        original_load = cpp_extension.load
        if getattr(original_inline, "__stark_cached__", False):
            return
        inline = self.wrap(original_inline, is_inline=True)
        load = self.wrap(original_load, is_inline=False)
        cpp_extension.load_inline = inline
        cpp_extension.load = load

    def wrap(self, original: Callable[..., Any], is_inline: bool) -> Callable[..., Any]:
        """``original`` (load_inline or load) building into this cache."""
        signature = inspect.signature(original)

        def cached(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            # plain data (a Path as its text; fresh lists, which load_inline mutates): what a builder gets is the
            # same, and so is the key it computes
            given = plain(dict(bound.arguments))
            arguments = dict(given)
            key_fields = dict(arguments)
            if not is_inline:
                key_fields["__source_contents__"] = _file_contents(arguments.get("sources"))
            key = build_key(key_fields)
            if self.on_key is not None:
                self.on_key(key)
            base = re.sub(r"\W", "_", str(arguments.get("name", "ext"))) or "ext"
            arguments["name"] = f"{base}_{key}"
            build_dir = self.root / key
            if self.pch_root is not None:  # a builder: what an earlier build of this key chose for its headers
                _seed_choice(self.pch_root / key / "stark_headers", build_dir)
            arguments["build_directory"] = str(build_dir)
            arguments["verbose"] = True
            self.builds.append(key)
            finished = _load_finished(arguments, build_dir)
            if finished is not None:
                return finished
            if self.requester is not None:
                return self._built_outside(key, given, arguments, build_dir, is_inline)
            build_dir.mkdir(parents=True, exist_ok=True)
            if is_inline:
                arguments["use_pch"] = False  # torch's own PCH lives in the torch install; ours is per flags
                self._add_pch(arguments, build_dir)
            with file_lock(self.root / f"{key}.lock"):
                for attempt in range(2):
                    (build_dir / "lock").unlink(missing_ok=True)  # torch's baton, stale if a build was killed
                    try:
                        with building_only() if self.on_key is not None else _loading_copies(build_dir):
                            if is_inline and self.light_cuda:
                                return self._inline_build(original, arguments, build_dir)
                            return original(**arguments)
                    except PoisonedBuild as e:
                        if attempt:
                            raise
                        print(f"stark: {e}; building it again", file=sys.stderr, flush=True)
                        shutil.rmtree(build_dir, ignore_errors=True)
                        build_dir.mkdir(parents=True, exist_ok=True)
                        _forget_build(arguments["name"])
            raise AssertionError("unreachable")

        cached.__stark_cached__ = True  # type: ignore[attr-defined]
        cached.__wrapped__ = original  # type: ignore[attr-defined]
        cached.__doc__ = original.__doc__
        return cached

    def _built_outside(self, key: str, given: dict[str, Any], arguments: dict[str, Any], build_dir: Path,
                       is_inline: bool) -> Any:
        """The module, built by the parent's builder into the cache (which this process cannot write)."""
        assert self.requester is not None
        sources = [] if is_inline else _as_list(given.get("sources"))
        files = {str(p): Path(p).read_text(errors="replace") for p in sources}
        answer = self.requester({"key": key, "inline": is_inline, "arguments": given, "files": files,
                                 "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", "")})
        if answer.get("log"):  # the compiler's output, for this candidate's log (and the debug agent)
            print(answer["log"], file=sys.stderr, flush=True)
        name = arguments["name"]
        if not answer.get("built"):
            why = f": {answer['error']}" if answer.get("error") else ""
            raise RuntimeError(f"Error building extension '{name}'{why}")
        module = _load_finished(arguments, build_dir)
        if module is None:
            raise RuntimeError(f"Error building extension '{name}': the build is not in the cache after it was made")
        return module

    def _inline_build(self, original: Callable[..., Any], arguments: dict[str, Any], build_dir: Path) -> Any:
        """load_inline, with the ``.cu`` built without the ``torch/types.h`` load_inline puts first when it can
        be: that one header is most of a build (nvcc: 30 s with it, 1 s without, for a kernel and its raw-pointer
        launcher). A build directory keeps the choice it was first built with (``stark_headers``); a ``.cu``
        that names torch, or fails without the header, is built as load_inline builds it."""
        choice = build_dir / "stark_headers"
        chosen = choice.read_text() if choice.exists() else None
        if chosen == HEADERS_FULL or not light_cuda_candidate(arguments):
            return original(**arguments)
        light = dict(arguments)
        light["no_implicit_headers"] = True
        light["cpp_sources"] = ["#include <torch/extension.h>", *_as_list(arguments.get("cpp_sources"))]
        light["cuda_sources"] = ["#include <cuda.h>", "#include <cuda_runtime.h>",
                                 *_as_list(arguments.get("cuda_sources"))]
        if chosen == HEADERS_LIGHT:
            return original(**light)
        light["verbose"] = False  # a failure here is ours, not the candidate's: its output stays out of the log
        try:
            module = original(**light)
        except PoisonedBuild:
            raise
        except Exception:
            choice.write_text(HEADERS_FULL)
            return original(**arguments)  # its own errors, if any, are what the log shows
        choice.write_text(HEADERS_LIGHT)
        return module

    def _add_pch(self, arguments: dict[str, Any], build_dir: Path) -> None:
        if not self.use_pch or arguments.get("no_implicit_headers"):
            return
        if arguments.get("sycl_sources"):
            return
        cflags = [str(f) for f in _as_list(arguments.get("extra_cflags"))]
        includes = [str(p) for p in _as_list(arguments.get("extra_include_paths"))]
        # A build directory keeps the choice it was first built with: ninja rebuilds when the flags change, so a
        # header that appeared since must not turn a cache hit into a rebuild.
        choice = build_dir / "stark_pch"
        if choice.exists():
            chosen = choice.read_text()
            include_dir = Path(chosen) if chosen and Path(chosen).exists() else None
        elif self.pch_root is not None:  # a builder: only a header the trusted side made
            include_dir = ensure_pch(self.pch_root, cflags, includes, build=False)
            choice.write_text(str(include_dir) if include_dir else "")
        else:  # the header for these flags where it is there; built outside any candidate's time (note_build)
            include_dir = ensure_pch(self.root, cflags, includes, build=False)
            if include_dir is None:
                note_build(self.root, cflags, includes)
            choice.write_text(str(include_dir) if include_dir else "")
        if include_dir is not None:
            arguments["extra_include_paths"] = [*includes, str(include_dir)]
            arguments["extra_cflags"] = [*cflags, "-Winvalid-pch"]


def _forget_build(name: str) -> None:
    """cpp_extension remembers what it built in this process by name and would not build it again."""
    from torch.utils import cpp_extension

    entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if isinstance(entries, dict):
        entries.pop(name, None)


def plain(value: Any) -> Any:
    """``value`` as JSON would carry it (lists, text; anything else by its ``str``)."""
    return json.loads(json.dumps(value, default=str))


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_finished(arguments: dict[str, Any], build_dir: Path) -> Any:
    """The module of an entry the compile pool finished (its library and digest recorded), imported from a
    verified private copy without torch's build machinery, which writes its lock and ninja files into the entry
    (an isolated device worker sees the cache read-only); None where the entry is not finished or its library
    changed (the caller's locked path then rebuilds it)."""
    from torch.utils import cpp_extension

    name = str(arguments["name"])
    if not (build_dir / DIGEST_FILE).exists() or not (build_dir / f"{name}{cpp_extension.LIB_EXT}").exists():
        return None
    try:
        with _loading_copies(build_dir):
            return cpp_extension._import_module_from_library(name, str(build_dir),
                                                             bool(arguments.get("is_python_module", True)))
    except (PoisonedBuild, PermissionError):  # changed since; or made unreadable to this worker (a umask of 077)
        return None


def _seed_choice(choice: Path, build_dir: Path) -> None:
    try:
        chosen = choice.read_text() if choice.is_file() else ""
    except OSError:
        return
    if chosen in (HEADERS_LIGHT, HEADERS_FULL):
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / choice.name).write_text(chosen)


@contextlib.contextmanager
def building_only() -> Iterator[None]:
    """A builder's build: cpp_extension builds the library and does not load it (what a library runs as it loads
    is the candidate's, and the builder's word is trusted until its compiler runs)."""
    from torch.utils import cpp_extension

    with _IMPORT_LOCK:
        original = cpp_extension._import_module_from_library

        def built(module_name: str, path: str, is_python_module: bool) -> None:
            if not (Path(path) / f"{module_name}{LIB_EXT}").is_file():
                raise RuntimeError(f"Error building extension '{module_name}': no library was made")

        cpp_extension._import_module_from_library = built
        try:
            yield
        finally:
            cpp_extension._import_module_from_library = original


@contextlib.contextmanager
def _loading_copies(build_dir: Path) -> Iterator[None]:
    """While a cached build loads, cpp_extension imports a verified private copy of the library (see the
    module's doc) instead of the file in the cache."""
    from torch.utils import cpp_extension

    with _IMPORT_LOCK:
        original = cpp_extension._import_module_from_library

        def load_copy(module_name: str, path: str, is_python_module: bool) -> Any:
            library = Path(path) / f"{module_name}{cpp_extension.LIB_EXT}"
            private = Path(tempfile.mkdtemp(prefix="stark-ext-"))
            try:
                copy = private / library.name
                shutil.copyfile(library, copy)
                digest, record = file_digest(copy), build_dir / DIGEST_FILE
                recorded = record.read_text().strip() if record.exists() else ""
                if recorded and recorded != digest:
                    raise PoisonedBuild(f"the cached build {build_dir.name} changed since it was first loaded")
                if not recorded:
                    staged = build_dir / f".{DIGEST_FILE}.{os.getpid()}"
                    staged.write_text(digest)
                    staged.replace(record)
                return original(module_name, str(private), is_python_module)
            finally:  # once loaded, the mapping outlives the file
                shutil.rmtree(private, ignore_errors=True)

        cpp_extension._import_module_from_library = load_copy
        try:
            yield
        finally:
            cpp_extension._import_module_from_library = original
