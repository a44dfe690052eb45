"""The builds a worker process makes: a candidate imported only to build its extension (the compile pool), and a
builder's one build for an isolated candidate (:mod:`stark_ray.eval.build.builder`), where nothing of the candidate runs
but its compiler."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stark_ray.eval.loader import import_source
from stark_ray.eval.wire.protocol import PHASE_COMPILE, WorkerRequest
from stark_ray.eval.worker.build_log import LogTail, compile_failure
from stark_ray.records import STAGE_OK, EvalResult

Send = Callable[[dict[str, Any]], None]


def build_only(req: WorkerRequest, send: Send, count: int) -> EvalResult:
    """Import the candidate so that its extension is built into the cache (compile pool, no device)."""
    send({"phase": PHASE_COMPILE})
    tail = LogTail()
    tail.mark()
    started = time.perf_counter()
    try:
        import_source(req.candidate_source or "", f"stark_candidate_{count}", Path.cwd(), "candidate.py")
    except BaseException as e:
        return compile_failure(e, tail.since_mark(), started)
    return EvalResult(compiled=True, stage=STAGE_OK, compile_s=time.perf_counter() - started)


def build_extension(req: WorkerRequest, send: Send, cache_dir: Path) -> EvalResult:
    """A builder's one build (eval/build/builder.py): the arguments a candidate's process sent, built into the directory
    named (its key's subdirectory), with the key said first; nothing of the candidate runs here but its compiler."""
    from torch.utils import cpp_extension

    from stark_ray.eval.build.cache import BuildCache

    send({"phase": PHASE_COMPILE})
    tail = LogTail()
    tail.mark()
    started = time.perf_counter()
    asked = req.build or {}
    try:
        if asked.get("arch"):
            os.environ["TORCH_CUDA_ARCH_LIST"] = str(asked["arch"])
        for path, text in dict(asked.get("files") or {}).items():  # a load's sources, where they were (its /tmp)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(str(text))
        inline = bool(asked.get("inline", True))
        installed = cpp_extension.load_inline if inline else cpp_extension.load
        original = inspect.unwrap(installed)  # torch's own, under every wrapper of ours
        cache = BuildCache(Path(str(asked["out"])), use_pch=os.environ.get("STARK_RAY_PCH", "1") != "0",
                           on_key=lambda key: send({"claim": key}), pch_root=cache_dir)
        cache.wrap(original, is_inline=inline)(**dict(asked.get("arguments") or {}))
    except BaseException as e:
        return compile_failure(e, tail.since_mark(), started)
    return EvalResult(compiled=True, stage=STAGE_OK, compile_s=time.perf_counter() - started)
