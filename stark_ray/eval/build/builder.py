"""Builds made outside the candidate's reach: the trusted side of an isolated worker's ``--ask-builds``.

An isolated process that runs generated code (a compile-pool worker importing a candidate, a device worker) sees the
build cache read-only. Where an extension it loads is not in the cache, it sends the load_inline / load arguments
to its parent (the service or the judge), which serves the request here: a *builder* — a worker in a fresh
process, isolated too, started for this one build, that runs no code of the candidate, only torch's build of
those arguments — builds into a directory of its own, the only one it can write. It names the build's key (a hash
of the arguments and the toolchain) before its compiler runs, and from then on its word counts for nothing: a flag
can make the compiler run any program (``-wrapper``). What it made is published into the cache under the key it
named first, with the library's digest recorded here (:func:`stark_ray.eval.build.publish.publish`), so a candidate
can spoil only the entry of arguments no honest candidate sends.

The precompiled header the build uses is made here, by the trusted side, and only for flags that cannot run a
program (:func:`stark_ray.eval.build.pch.safe_flags`); the builder uses one only where it already lies whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from stark_ray.eval.build.pch import build_header, due_headers, ensure_pch, note_build, pch_key, safe_flags
from stark_ray.eval.build.publish import publish, publish_choice
from stark_ray.eval.proc.launch import WorkerSpec
from stark_ray.eval.proc.runner import run_once
from stark_ray.eval.wire.protocol import MODE_BUILD, PHASE_COMPILE, PHASE_SETUP, WorkerRequest
from stark_ray.records import STAGE_OK

KEY = re.compile(r"[0-9a-f]{16}")
MIN_BUILD_S = 1.0  # a build asked for with less time left is refused at once
MAX_HEADERS = 6  # precompiled headers (flag sets) the trusted side makes in one cache


def serve_build(request: dict[str, Any], spec: WorkerSpec, cache: Path, seconds: float) -> dict[str, Any]:
    """Build what an isolated worker asked for (``request``: its key, arguments and sources) in a builder made
    from ``spec`` (the asking worker's, as a compile worker), publish it into ``cache``; the answer it gets:
    ``built``, the builder's ``log`` (the compiler's output, for the candidate's log) and an ``error`` line."""
    key = str(request.get("key", ""))
    if not KEY.fullmatch(key) or not _buildable(request.get("arguments"), bool(request.get("inline", True))):
        return {"built": False, "error": "a malformed build request"}  # refused without starting a builder
    if seconds < MIN_BUILD_S:
        return {"built": False, "error": "no time left for the build"}
    files = request.get("files") or {}
    sources = request["arguments"].get("sources") or []
    sources = {str(x) for x in ([sources] if isinstance(sources, str) else sources)}
    if not isinstance(files, dict) or (request.get("inline", True) and files) or not set(files) <= sources:
        return {"built": False, "error": "a build request may carry a load's sources and nothing else"}
    out = Path(tempfile.mkdtemp(prefix="stark-build-"))
    try:
        builder = replace(spec, compile_only=True, writable=(str(out),), module="stark_ray.eval.worker.main",
                          extra=(), fd_channel=False, env=(), device=None)
        asked = {k: request.get(k) for k in ("key", "inline", "arguments", "files", "arch")}
        req = WorkerRequest(mode=MODE_BUILD, task_name="", task_source="", cfg={}, build={**asked, "out": str(out)})
        outcome = run_once(builder, req, {PHASE_SETUP: seconds, PHASE_COMPILE: seconds})
        claims = outcome.extra.get("claims") or []
        log = outcome.log
        if outcome.result is None or outcome.result.stage != STAGE_OK:
            error = outcome.result.error if outcome.result is not None else f"the builder ended in {outcome.phase}"
            if claims[:1] == [key]:
                with contextlib.suppress(OSError):
                    publish_choice(out / key, cache)
            return {"built": False, "log": log, "error": error}
        if claims[:1] != [key]:
            return {"built": False, "log": log,
                    "error": f"the builder built {claims[:1] or 'nothing'}, not the key asked for ({key})"}
        try:
            publish(out / key, cache)
        except (OSError, ValueError) as e:
            return {"built": False, "log": log, "error": f"the build could not be published: {e}"}
        _count_header(request, cache)  # counted for builds that were made: made later, outside any candidate's time
        return {"built": True, "log": log}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _buildable(arguments: Any, inline: bool) -> bool:
    """What a build needs before a builder is started for it: a name and sources (load_inline's C++ or CUDA
    sources, load's files). A flood of empty requests then costs no process each."""
    if not isinstance(arguments, dict) or not isinstance(arguments.get("name"), str) or not arguments["name"]:
        return False
    wanted = ("cpp_sources", "cuda_sources") if inline else ("sources",)
    return any(arguments.get(k) for k in wanted)


def _count_header(request: dict[str, Any], cache: Path) -> None:
    """One more build of a load_inline build's flags, counted for its precompiled torch/extension.h (eval/build/pch.py:
    the service makes due headers in the background, :func:`make_due_headers`), where the flags are safe and name no
    include directory."""
    arguments = request.get("arguments") or {}
    if os.environ.get("STARK_RAY_PCH", "1") == "0" or not request.get("inline", True):
        return
    if arguments.get("no_implicit_headers") or arguments.get("sycl_sources"):
        return
    cflags, includes = arguments.get("extra_cflags") or [], arguments.get("extra_include_paths") or []
    cflags = [cflags] if isinstance(cflags, str) else list(cflags)
    if includes or not safe_flags(cflags):
        return
    if ensure_pch(cache, cflags, [], build=False) is None:
        note_build(cache, cflags, [])


def make_due_headers(cache: Path) -> int:
    """Build the precompiled headers that are due (eval/build/pch.py: due_headers), one after another, in the calling
    thread — the service's background one, outside any candidate's time limit: a header built inside a candidate's
    build took 60-70 s of it on 2 cores (10 minutes on a loaded host: the candidate was recorded a timeout, and its
    killed build left every later one to try again). Only safe flags without include paths (the trusted side builds
    them), a few flag sets at most; how many were built."""
    if os.environ.get("STARK_RAY_PCH", "1") == "0":
        return 0
    built = 0
    for cflags, includes in due_headers(cache):
        if includes or not safe_flags(cflags):
            continue
        made = [d for d in (cache / "pch").glob("*") if d.is_dir()]
        if len(made) >= MAX_HEADERS and not any(d.name == pch_key(cflags, []) for d in made):
            continue  # each header is hundreds of MB
        with contextlib.suppress(OSError):
            built += build_header(cache, cflags, []) is not None
    return built
