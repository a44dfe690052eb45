"""A short description of the host CPU for the agents' prompts (no torch import needed)."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path


def usable_cpus() -> int:
    """CPUs this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def host_memory_bytes(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory this process's host gives it (bytes): the physical memory, or its control group's limit where
    that is less (a container's 24 GiB on a larger machine). None where neither is known."""
    try:
        physical: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        physical = None
    known = [b for b in (physical, cgroup_memory_limit(cgroup_root)) if b]
    return min(known) if known else None


def memory_group_files(v2_name: str, v1_name: str, root: Path = Path("/sys/fs/cgroup"),
                       own: Path = Path("/proc/self/cgroup")) -> list[Path]:
    """Where a memory control-group file of this process's group may be, its own group first, then the groups
    above it: cgroup v2's ``v2_name``, or v1's ``v1_name`` (in a container v1's mount shows its own group as the
    root, so each suffix of the group's path is tried too)."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return []
    places: list[Path] = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        parts = Path(path.strip("/")).parts
        if controllers == "" and (root / "cgroup.controllers").exists():  # v2, unified
            places += [root / Path(*parts[:i]) / v2_name for i in range(len(parts), 0, -1)] + [root / v2_name]
        elif "memory" in controllers.split(","):
            places += [root / "memory" / Path(*parts[i:]) / v1_name for i in range(len(parts))]
            places.append(root / "memory" / v1_name)
    return places


def cgroup_memory_limit(root: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")) -> int | None:
    """The least memory limit (bytes) on this process's control group and the groups above it: cgroup v2's
    ``memory.max``, or v1's ``memory.limit_in_bytes``; None where there is none."""
    limits = []
    for place in memory_group_files("memory.max", "memory.limit_in_bytes", root, own):
        try:
            text = place.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # "max", or v1's "no limit" (a page short of 2^63)
            limits.append(int(text))
    return min(limits) if limits else None


def host_memory_cap(worker_memory_gb: float | None, device: str) -> int:
    """The host memory a candidate's process may hold (bytes; 0: no cap), as ``EvalConfig.worker_memory_gb`` says:
    None is half the host's memory on a CPU backend and no cap on a GPU one."""
    if worker_memory_gb is not None:
        return int(worker_memory_gb * (1 << 30))
    total = host_memory_bytes()
    return total // 2 if device == "cpu" and total else 0


def oom_kills(root: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")) -> int | None:
    """How many processes of this process's control group the kernel's out-of-memory killer has killed (cgroup v2's
    ``memory.events``, v1's ``memory.oom_control``: ``oom_kill N``); None where the kernel does not say."""
    for place in memory_group_files("memory.events", "memory.oom_control", root, own):
        try:
            m = re.search(r"^oom_kill (\d+)$", place.read_text(), re.MULTILINE)
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


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


# the ISA features a kernel's author chooses between (x86's flags, Arm's Features), in the order they are shown
SIMD = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
        "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "asimdhp", "asimddp",
        "sve", "sve2", "bf16", "i8mm", "sme")


def simd_flags(flags: list[str] | None = None) -> list[str]:
    have = set(_cpu_flags() if flags is None else flags)
    return [f for f in SIMD if f in have]


def _cpuinfo_field(name: str, text: str | None = None) -> str | None:
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    m = re.search(rf"^{re.escape(name)}\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


# (vendor, family, models) -> the micro-architecture's name (ZEN4_NOTE: one fact about it that a kernel's author needs)
MICROARCHITECTURES: tuple[tuple[str, int, range, str], ...] = (
    ("AuthenticAMD", 23, range(0x30, 0x80), "AMD Zen 2"),
    ("AuthenticAMD", 25, range(0x00, 0x10), "AMD Zen 3"),
    ("AuthenticAMD", 25, range(0x20, 0x60), "AMD Zen 3"),
    ("AuthenticAMD", 25, range(0x10, 0x20), "AMD Zen 4"),
    ("AuthenticAMD", 25, range(0x60, 0x80), "AMD Zen 4"),
    ("AuthenticAMD", 25, range(0xa0, 0xb0), "AMD Zen 4c"),
    ("AuthenticAMD", 26, range(0x00, 0x100), "AMD Zen 5"),
    ("GenuineIntel", 6, range(85, 86), "Intel Skylake-SP / Cascade Lake"),
    ("GenuineIntel", 6, range(106, 107), "Intel Ice Lake-SP"),
    ("GenuineIntel", 6, range(143, 144), "Intel Sapphire Rapids"),
    ("GenuineIntel", 6, range(207, 208), "Intel Emerald Rapids"),
    ("GenuineIntel", 6, range(173, 174), "Intel Granite Rapids"),
)


ZEN4_NOTE = "Zen 4 runs each 512-bit AVX-512 instruction on 256-bit datapaths, in two passes."


def microarchitecture(cpuinfo: str | None = None) -> str | None:
    """The CPU's family and model as /proc/cpuinfo tells them, named where the table knows them."""
    vendor, family, model = (_cpuinfo_field(k, cpuinfo) for k in ("vendor_id", "cpu family", "model"))
    if family is None or model is None or not family.isdigit() or not model.isdigit():
        return None
    name = next((n for v, f, models, n in MICROARCHITECTURES
                 if v == vendor and f == int(family) and int(model) in models), None)
    return f"family {family} model {model}" + (f": {name}" if name else "")


@dataclass(frozen=True)
class Cache:
    level: int
    kind: str  # Data, Instruction, Unified
    size_bytes: int
    shared_by: int  # logical CPUs


def cpu_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> list[Cache]:
    """cpu0's caches as sysfs tells them (none where it does not)."""
    found = []
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if m is None:
            continue
        size_bytes = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]
        found.append(Cache(level, kind, size_bytes, _count_cpus(shared)))
    return found


def _count_cpus(cpu_list: str) -> int:
    n = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return max(1, n)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"


def describe_caches(caches: list[Cache]) -> str | None:
    shown = [c for c in caches if c.kind != "Instruction"]
    if not shown:
        return None
    parts = []
    for c in shown:
        name = f"L{c.level}{'d' if c.kind == 'Data' else ''}"
        where = "per core" if c.level < 3 else f"shared by {c.shared_by} logical CPU{'s' if c.shared_by > 1 else ''}"
        parts.append(f"{name} {_size(c.size_bytes)} {where}")
    return "Caches: " + ", ".join(parts) + "."


def cpu_clock_told() -> str:
    """The clock the host tells, in words (its maximum, else the current one), or that it tells none."""
    try:
        ghz = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e6
        return f"Clock: up to {ghz:.2f} GHz."
    except (OSError, ValueError):
        pass
    mhz = _cpuinfo_field("cpu MHz")
    try:
        return f"Clock: {float(mhz) / 1e3:.2f} GHz now (no maximum told)." if mhz else "Clock: not told by the host."
    except ValueError:
        return "Clock: not told by the host."


AMX_NOTE = ("AMX tiles need the OS's permission first: call arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, "
            "XFEATURE_XTILEDATA = 18) once in the process before the first tile instruction (else SIGILL).")


def describe_cpu(threads: int) -> str:
    """What a kernel author needs of the host CPU, a few lines: model and micro-architecture, cores, clock, caches,
    the ISA features that matter, and what AMX needs of the OS where it is there."""
    simd = simd_flags()
    arch = microarchitecture()
    lines = [f"CPU: {cpu_model()} ({platform.machine()}{'; ' + arch if arch else ''}), {os.cpu_count()} logical "
             f"cores, {threads} usable; torch and OpenMP use {threads} threads.",
             cpu_clock_told()]
    caches = describe_caches(cpu_caches())
    if caches:
        lines.append(caches)
    lines.append(f"SIMD: {', '.join(simd) or 'unknown'}." + (f" {ZEN4_NOTE}" if arch and "Zen 4" in arch else ""))
    if "amx_tile" in simd:
        lines.append(AMX_NOTE)
    return "\n".join(lines)


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


@functools.cache
def compiler_version(compiler: str | None = None) -> str | None:
    """The host C++ compiler's first ``--version`` line (``CXX``, else c++), or None where it does not answer."""
    compiler = compiler or os.environ.get("CXX") or "c++"
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return first[0].strip() if out.returncode == 0 and first else None
