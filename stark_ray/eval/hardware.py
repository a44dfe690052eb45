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
    m = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.MULTILINE)  # x86's flags, Arm's Features
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


def cpu_clock_ghz() -> float | None:
    """The CPU's highest clock the host tells (its cpufreq maximum, else BOOST x the highest "cpu MHz" of
    /proc/cpuinfo, a current clock), in GHz; None where it tells none."""
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e6
    except (OSError, ValueError):
        pass  # then the current clock, with the most a turbo adds
    try:
        text = Path("/proc/cpuinfo").read_text()
        mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, re.MULTILINE)]
    except OSError:
        return None
    return BOOST * max(mhz) / 1e3 if mhz else None


# float32 FLOPs one core can do per cycle at most, by its widest vector FMA (two FMA units, as the largest cores of
# each ISA have): an upper bound, so that a speed of light made from it is a lower bound of the time
# (x86's flags; Arm's "Features": four 128-bit FMA pipes, or SVE's wider ones, at most 64)
FP32_FLOPS_PER_CYCLE = (("avx512f", 64), ("fma", 32), ("avx", 16), ("sse2", 8), ("sve", 64), ("asimd", 64))
BOOST = 1.5  # where only the current clock is told ("cpu MHz"), the most a turbo can add to it


def cpu_peak_flops(cores: int) -> float | None:
    """An upper bound of the CPU's float32 FLOP/s on ``cores`` cores: cores x clock x FLOPs per cycle of its ISA
    (None where the clock or the ISA is not told)."""
    clock = cpu_clock_ghz()
    flags = set(_cpu_flags())
    per_cycle = next((n for flag, n in FP32_FLOPS_PER_CYCLE if flag in flags), None)
    if clock is None or per_cycle is None:
        return None
    return cores * clock * 1e9 * per_cycle
