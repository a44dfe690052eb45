"""The output of a candidate's import (its build) in the worker's log, and the failed result it makes."""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

from stark_ray.eval.diagnostics import compiler_log, describe_exception, first_compiler_error
from stark_ray.records import STAGE_COMPILE, EvalResult, excerpt


class LogTail:
    """What was written to the worker's log (fd 2, a file) since a mark: the build output of one import."""

    def __init__(self) -> None:
        self.offset = 0

    def mark(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            self.offset = os.fstat(2).st_size
        except OSError:
            self.offset = 0

    def since_mark(self) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        try:  # fd 2 is open for writing only: read the same file through /proc
            with open("/proc/self/fd/2", "rb") as f:
                f.seek(self.offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""


def candidate_frame(tb: Any) -> str:
    """`` (candidate.py:LINE)`` for the innermost frame of the candidate in a traceback, if any."""
    where = ""
    for frame in traceback.extract_tb(tb):
        if frame.filename.endswith("candidate.py"):
            where = f" (candidate.py:{frame.lineno})"
    return where


def compile_failure(exc: BaseException, output: str, started: float) -> EvalResult:
    tb = traceback.format_exc()
    compiler_error = first_compiler_error(output)
    if compiler_error and "Error building extension" in str(exc):
        result = EvalResult.failed(STAGE_COMPILE, compiler_error, compiler_log(output))
        result.flags.append("build_error")
    else:
        error = describe_exception(exc) + candidate_frame(exc.__traceback__)
        result = EvalResult.failed(STAGE_COMPILE, error, excerpt(f"{compiler_log(output)}\n{tb}".strip()))
    result.compile_s = time.perf_counter() - started
    return result
