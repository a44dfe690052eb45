"""A short description of the host CPU for the agents' prompts (no torch import needed)."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def usable_cpus() -> int:
    """CPUs this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else platform.machine()


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    m = re.search(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)
    return sorted(m.group(1).split()) if m else []


def cpu_signature() -> str:
    """Model and full feature list: what a ``-march=native`` binary depends on."""
    return f"{platform.machine()} {cpu_model()} {' '.join(_cpu_flags())}"


def simd_flags() -> list[str]:
    flags = set(_cpu_flags())
    wanted = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_tile")
    return [f for f in wanted if f in flags]


def describe_cpu(threads: int) -> str:
    simd = ", ".join(simd_flags()) or "unknown"
    return (f"CPU: {cpu_model()} ({platform.machine()}), {os.cpu_count()} logical cores, "
            f"{threads} usable; torch and OpenMP use {threads} threads.\nSIMD: {simd}.")
