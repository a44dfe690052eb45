"""A precompiled ``torch/extension.h`` per set of compiler flags, kept in the build cache.

Every load_inline C++ source starts with ``#include <torch/extension.h>``; parsing it dominates a build
(about 30 s of a 30 s build on a 2-core CPU; 14 s with the header precompiled). torch's own ``use_pch`` keeps
one ``.gch`` inside the torch installation, rebuilt whenever the flags change and deleted by every build that
does not ask for it; here each flag set gets its own ``<cache>/pch/<key>/torch/extension.h.gch`` and the build
adds ``-I<cache>/pch/<key>``: gcc looks for ``torch/extension.h.gch`` in that directory first and uses it when
it is valid for the build's flags (``-Winvalid-pch`` reports otherwise; a rejected header only costs time).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from stark_ray.eval.build.locks import try_file_lock
from stark_ray.eval.hardware import cpu_signature

HEADER = Path("torch") / "extension.h"
# Not printed: the worker's output is the candidate's log, which the debug agent reads.
log = logging.getLogger("stark_ray.eval.build.pch")


def _cxx_std() -> str:
    """The -std= flag torch passes to C++ extension builds (c++17 in older releases, c++20 in newer)."""
    from torch.utils import cpp_extension

    try:
        src = inspect.getsource(cpp_extension._write_ninja_file_to_build_library)
    except (AttributeError, OSError, TypeError):
        return "-std=c++17"
    m = re.search(r"['\"](-std=c\+\+\d+)['\"]", src)
    return m.group(1) if m else "-std=c++17"


def pch_command(output: Path, extra_cflags: list[str], extra_include_paths: list[str]) -> list[str]:
    from torch.utils import cpp_extension

    header = Path(cpp_extension.include_paths()[0]) / HEADER
    abi: list[str] = list(getattr(cpp_extension, "_get_pybind11_abi_build_flags", lambda: [])())
    includes = [f for p in cpp_extension.include_paths() for f in ("-isystem", p)]
    includes += ["-isystem", sysconfig.get_path("include")]
    compiler: str = cpp_extension.get_cxx_compiler()  # type: ignore[no-untyped-call]
    return [compiler, "-x", "c++-header", str(header), "-o", str(output),
            "-DTORCH_API_INCLUDE_EXTENSION_H", *abi, *[f"-I{p}" for p in extra_include_paths], *includes,
            "-fPIC", _cxx_std(), *extra_cflags]


def pch_key(extra_cflags: list[str], extra_include_paths: list[str]) -> str:
    import torch

    blob = json.dumps([torch.__version__, sys.version, cpu_signature(), extra_cflags, extra_include_paths,
                       pch_command(Path("out"), extra_cflags, extra_include_paths)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Building the header costs about three plain builds (60-70 s against 25 s on 2 cores) and saves about 40% of
# every build after it, so it pays from about the fourth build of a flag set on. The first three builds of a flag set go
# without it; a short run never pays for a header it would hardly use. STARK_RAY_PCH_AFTER overrides.
PCH_AFTER_BUILDS = 3
PCH_TIMEOUT_S = 1800.0  # the header's build (60-70 s on 2 cores; niced, in the background, no candidate waits on it:
# beside a loaded suite it ran past 600 s)


def ensure_pch(root: Path, extra_cflags: list[str], extra_include_paths: list[str],
               after_builds: int | None = None, build: bool = True) -> Path | None:
    """The include directory holding a precompiled torch/extension.h for these flags, or None: for the first
    ``after_builds`` builds of a flag set (counted in the cache), while another process is building the header
    (a build never waits for it), and when it cannot be built (non-gcc compiler, bad flags); the build then
    goes on without it. ``build=False``: only a header that is there, whole — what a candidate's build uses (the
    header is built outside any candidate's time: :func:`note_build`, :func:`due_headers`)."""
    if not sys.platform.startswith("linux"):
        return None
    include_dir = root / "pch" / pch_key(extra_cflags, extra_include_paths)
    if not build:
        whole = (include_dir / HEADER.with_suffix(".h.gch")).is_file() and (include_dir / HEADER).is_file()
        return include_dir if whole else None
    if after_builds is None:
        after_builds = int(os.environ.get("STARK_RAY_PCH_AFTER", PCH_AFTER_BUILDS))
    if (include_dir / HEADER.with_suffix(".h.gch")).exists():
        return _with_stub(include_dir)
    if (include_dir / "FAILED").exists():
        return None
    if note_build(root, extra_cflags, extra_include_paths) <= after_builds:
        return None
    return build_header(root, extra_cflags, extra_include_paths)


def note_build(root: Path, extra_cflags: list[str], extra_include_paths: list[str]) -> int:
    """Count one more build of this flag set in the cache, and record its flags (for :func:`due_headers`); how many
    builds of it there have been, this one included (0 where the cache cannot be written)."""
    key = pch_key(extra_cflags, extra_include_paths)
    try:
        (root / "pch").mkdir(parents=True, exist_ok=True)
        wanted = root / "pch" / f"{key}.flags"
        if not wanted.exists():
            tmp = wanted.with_name(f"{wanted.name}.tmp{os.getpid()}")
            tmp.write_text(json.dumps({"cflags": extra_cflags, "includes": extra_include_paths}))
            os.replace(tmp, wanted)
        with open(root / "pch" / f"{key}.builds", "a") as f:
            f.write(".")
        return len((root / "pch" / f"{key}.builds").read_text())
    except OSError:
        return 0


def due_headers(root: Path, after_builds: int | None = None) -> list[tuple[list[str], list[str]]]:
    """The flag sets whose header is due (more than ``after_builds`` builds counted) and neither built nor failed:
    (cflags, include paths), as :func:`note_build` recorded them."""
    if after_builds is None:
        after_builds = int(os.environ.get("STARK_RAY_PCH_AFTER", PCH_AFTER_BUILDS))
    due = []
    for wanted in sorted((root / "pch").glob("*.flags")) if (root / "pch").is_dir() else []:
        key = wanted.name.removesuffix(".flags")
        builds = root / "pch" / f"{key}.builds"
        done = (root / "pch" / key / HEADER.with_suffix(".h.gch")).exists() or (root / "pch" / key / "FAILED").exists()
        try:
            counted = len(builds.read_text()) if builds.exists() else 0
            flags = json.loads(wanted.read_text())
            cflags, includes = flags["cflags"], flags["includes"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if done or counted <= after_builds:
            continue
        if all(isinstance(f, str) for f in [*cflags, *includes]):
            due.append((list(cflags), list(includes)))
    return due


def build_header(root: Path, extra_cflags: list[str], extra_include_paths: list[str]) -> Path | None:
    """Build the header for these flags now (None: another process is building it, or it failed: said in
    ``FAILED``, never tried again)."""
    key = pch_key(extra_cflags, extra_include_paths)
    include_dir = root / "pch" / key
    gch = include_dir / HEADER.with_suffix(".h.gch")
    failed = include_dir / "FAILED"
    (root / "pch").mkdir(parents=True, exist_ok=True)
    with try_file_lock(root / "pch" / f"{key}.lock") as mine:
        if not mine:
            return None  # being built by another process
        if gch.exists():
            return _with_stub(include_dir)
        if failed.exists():
            return None
        gch.parent.mkdir(parents=True, exist_ok=True)
        for stale in gch.parent.glob("*.tmp*"):  # left by a build killed mid-way
            stale.unlink(missing_ok=True)
        tmp = gch.with_name(f"{gch.name}.tmp{os.getpid()}")
        # niced, as the compile pool's builds are: made beside candidates' trials and timing, it must not slow them
        nice = ["nice", "-n", "10"] if shutil.which("nice") else []
        cmd = [*nice, *pch_command(tmp, extra_cflags, extra_include_paths)]
        log.info("precompiling torch/extension.h: %s", " ".join(cmd))
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
                                  timeout=PCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(cmd, -1, f"timed out after {PCH_TIMEOUT_S:.0f} s")
        if proc.returncode != 0:
            failed.parent.mkdir(parents=True, exist_ok=True)
            failed.write_text(proc.stdout)
            tmp.unlink(missing_ok=True)
            log.info("precompiled header failed (see %s); building without it", failed)
            return None
        os.replace(tmp, gch)
        _with_stub(include_dir)
        for path in (root / "pch", include_dir, gch.parent):  # a builder (nobody, under a root evaluator) reads it
            path.chmod(0o755)
        for path in (gch, include_dir / HEADER):
            path.chmod(0o644)
    return _with_stub(include_dir)


# flags the trusted side may precompile the header with (eval/build/builder.py): none of them can make gcc run a program
# or read a file it names (-wrapper, -fplugin=, -B, -specs=, @file, -include ... can)
SAFE_FLAG = re.compile(r"-(O[0-3sz]?|g[0-3]?|march=native|mtune=native|std=(c|gnu)\+\+\w+|fopenmp|ffast-math|"
                       r"funroll-loops|fPIC|fno-math-errno|w|Wall|Wextra|Wno-[\w-]+|D[A-Za-z_]\w*(=[\w.]*)?|"
                       r"U[A-Za-z_]\w*)")


def safe_flags(extra_cflags: list[str]) -> bool:
    """Whether a header precompiled with these flags, by a process outside the candidate's reach, is safe."""
    return all(isinstance(f, str) and SAFE_FLAG.fullmatch(f) for f in extra_cflags)


# A source that includes torch/extension.h itself (most do) includes it a second time after load_inline's own
# first line. gcc uses a .gch only for the first include; for the second it looks for the header beside the
# .gch, so one must be there. It forwards to the real header, which #pragma once then skips.
STUB = "// stark-ray: stands beside the precompiled header; forwards to torch's own.\n" \
       "#pragma once\n#include_next <torch/extension.h>\n"


def _with_stub(include_dir: Path) -> Path:
    stub = include_dir / HEADER
    if not stub.exists():
        tmp = stub.with_name(f"{stub.name}.tmp{os.getpid()}")
        tmp.write_text(STUB)
        os.replace(tmp, stub)
    return include_dir
