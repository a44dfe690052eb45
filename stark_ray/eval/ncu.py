"""Nsight Compute on an accepted candidate's top kernel (``--profile ncu``): how much of the GPU it uses, and why.

After a candidate is accepted on a GPU, the service runs it once more in a process of its own under ``ncu``
(:mod:`stark_ray.eval.worker.ncu_target`: the task's inputs, one call of ModelNew, nothing else), isolated as the worker
is, while the device is the service's, and has ncu count the kernel that took most of its time in the worker's
profile (:mod:`stark_ray.eval.measure.kernel_times`): DRAM and SM throughput (% of the peak), achieved occupancy, and
which resource limits occupancy. The answer is one line in ``EvalResult.profile``, shown to the agents beside the
kernels — or, where ncu cannot, one line that says why (not installed, the counters not permitted to this user,
the profiler not loadable in this container, the kernel not seen, a timeout).

ncu runs with ``--clock-control none`` (the clocks as the timing saw them) and counts one launch. The process
that ran the candidate wrote what ncu read: like the kernel times, these figures are shown, never scored.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stark_ray.eval.backends import backend_path, declared
from stark_ray.eval.measure.kernel_times import top_kernel
from stark_ray.eval.proc.isolation import jailed
from stark_ray.eval.proc.launch import WorkerSpec, spec_env
from stark_ray.eval.proc.lifetime import spawn
from stark_ray.eval.proc.process_tree import kill_tree
from stark_ray.records import one_line

NCU_PLACES = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu")
METRICS = {
    "dram": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "duration": "gpu__time_duration.sum",
}
# the blocks per SM each resource allows: the least is what limits occupancy
LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared memory": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks per SM": "launch__occupancy_limit_blocks",
}
TIMEOUT_S = 300.0
REPORT_BYTES = 1 << 20  # read of ncu's log and of the processes' output, at most
UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6,
            "s": 1e6}  # a duration's unit as ncu writes it -> microseconds


def find_ncu() -> str | None:
    """The ncu executable: on PATH, else where Nsight Compute and the CUDA toolkit install it (newest first)."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in NCU_PLACES:
        for path in sorted(glob.glob(pattern), reverse=True):
            if os.access(path, os.X_OK):
                return path
    return None


def kernel_base_name(name: str) -> str:
    """A kernel's function name as ncu filters on it: ``void ns::(anonymous namespace)::k<float>(float*, int)``
    -> ``k``: no return type, namespaces, template arguments or parameters."""
    kept: list[str] = []
    depth = 0
    for ch in name.replace("(anonymous namespace)", ""):
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            if ch == "(":  # the parameter list
                break
            kept.append(ch)
    words = "".join(kept).split()
    return words[-1].split("::")[-1] if words else ""


def command(ncu: str, kernel: str, target: list[str], report: str) -> list[str]:
    """ncu counting the first launch of ``kernel`` in ``target``'s processes once it starts the profiler (after a
    first, unprofiled call: builds, caches and autotuning done), its CSV written to ``report``."""
    return [ncu, "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off",
            "--kernel-name-base", "function",
            "--kernel-name", f"regex:^{re.escape(kernel)}$", "--launch-count", "1",
            "--metrics", ",".join([*METRICS.values(), *LIMITS.values()]), "--csv", "--log-file", report, *target]


@dataclass(frozen=True)
class Counters:
    kernel: str
    dram_pct: float
    sm_pct: float
    occupancy_pct: float | None
    duration_us: float | None
    occupancy_limit: str | None  # the resource that allows the fewest blocks per SM

    def describe(self) -> str:
        bound = "memory" if self.dram_pct >= self.sm_pct else "compute"
        parts = [f"DRAM {self.dram_pct:.0f}% and SM {self.sm_pct:.0f}% of peak ({bound} side busier)"]
        if self.occupancy_pct is not None:
            limit = f", limited by {self.occupancy_limit}" if self.occupancy_limit else ""
            parts.append(f"achieved occupancy {self.occupancy_pct:.0f}%{limit}")
        if self.duration_us is not None:
            parts.append(f"{self.duration_us:.4g} us under ncu")
        return f"{self.kernel[:60]}: " + "; ".join(parts)


def _number(text: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def failure(text: str) -> str | None:
    """ncu's own reason for failing, one line (its ``==ERROR==`` lines), or None."""
    for line in text.splitlines():
        if line.startswith("==ERROR=="):
            reason = " ".join(line.removeprefix("==ERROR==").split())
            if "ERR_NVGPUCTRPERM" in reason:
                return ("the GPU's performance counters are not permitted to this user (ERR_NVGPUCTRPERM; an "
                        "isolated worker runs unprivileged: the driver's NVreg_RestrictProfilingToAdminUsers=0 lets "
                        "it count, or --isolate off as an administrator)")
            return one_line(reason, 300)
    return None


def out_of_memory(text: str) -> str | None:
    """Why there are no counters where the profiled process ran out of device memory (it runs beside the judge and
    its worker, which keep their task's state meanwhile: outside the memory budget's account), or None."""
    if "OutOfMemoryError" in text or "CUDA out of memory" in text:
        return ("the candidate ran out of device memory in ncu's process (beside the evaluator's kept state, "
                "outside the memory budget)")
    return None


def parse(text: str) -> Counters | None:
    """The counters of the one profiled launch in ncu's CSV (``--csv``: a row per metric), or None."""
    rows = [line for line in text.splitlines() if line.startswith('"')]
    values: dict[str, float] = {}
    kernel = ""
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        name, value = row.get("Metric Name"), _number(row.get("Metric Value") or "")
        if name and value is not None:
            unit = (row.get("Metric Unit") or "").strip()
            if name == METRICS["duration"]:
                value *= UNITS_US.get(unit, 1e-3)
            values[name] = value
            kernel = kernel or one_line(row.get("Kernel Name") or "", 200)
    if METRICS["dram"] not in values or METRICS["sm"] not in values:
        return None
    limits = {what: values[m] for what, m in LIMITS.items() if m in values}
    return Counters(kernel or "?", values[METRICS["dram"]], values[METRICS["sm"]], values.get(METRICS["occupancy"]),
                    values.get(METRICS["duration"]), min(limits, key=limits.__getitem__) if limits else None)


def reading(text: str, kernel: str, returncode: int | None, reason: str | None = None) -> str:
    """What a run of ncu says, one line: its counters, or why there are none (``returncode`` None: it timed out;
    ``reason``: ncu's error, where it wrote one elsewhere than ``text``)."""
    if returncode is None:
        return f"no Nsight Compute profile: ncu did not finish within {TIMEOUT_S:.0f} s"
    counted = parse(text)
    if counted is not None:
        return f"Nsight Compute, top kernel {counted.describe()}"
    reason = failure(text) or reason
    if reason:
        return f"no Nsight Compute profile: {reason}"
    if "No kernels were profiled" in text:
        return f"no Nsight Compute profile: kernel {kernel} was not launched in the profiled call"
    return f"no Nsight Compute profile: ncu exited with status {returncode} and no counters"


def profile(spec: WorkerSpec, task_name: str, task_source: str, source: str, kernels: str | None,
            seed: int) -> str:
    """Nsight Compute on the top kernel of ``kernels`` (the candidate's :func:`kernel_times.describe` line), the
    candidate ``source`` run as ``spec``'s worker would be (its device, build cache, isolation): one line."""
    kernel = kernel_base_name(top_kernel(kernels) or "")
    if not kernel:
        return "no Nsight Compute profile: no GPU profile of its kernels to choose the top one from"
    ncu = find_ncu()
    if ncu is None:
        return ("no Nsight Compute profile: ncu is not installed here (not on PATH, nor under "
                "/opt/nvidia/nsight-compute or /usr/local/cuda/bin)")
    workdir = Path(tempfile.mkdtemp(prefix="stark-ncu-"))
    try:
        (workdir / "task.py").write_text(task_source, encoding="utf-8")
        (workdir / "candidate.py").write_text(source, encoding="utf-8")
        report = workdir / "ncu.csv"
        target = [sys.executable, "-m", "stark_ray.eval.worker.ncu_target", "--backend", backend_path(spec.backend),
                  "--build-dir", spec.build_dir, "--task", str(workdir / "task.py"), "--name", task_name,
                  "--candidate", str(workdir / "candidate.py"), "--seed", str(seed)]
        argv = command(ncu, kernel, target, str(report))
        if spec.isolate:  # as the worker: a read-only world, the build cache readable, the user's things hidden
            argv = jailed(argv, readable=(spec.build_dir,), hidden=spec.hidden,
                          toolchain=declared(spec.backend).toolchain_vars)
        output = workdir / "output.txt"  # the processes' own output: a file (a pipe a stray could hold open)
        with output.open("wb") as sink:
            proc = spawn(argv, spec_env(spec, workdir), direct=False, cwd=workdir, stdin=subprocess.DEVNULL,
                         stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # whatever it left running goes (isolated: its namespace's processes die with it)
            kill_tree(proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        logged = _head(report, REPORT_BYTES)  # ncu's own output: the counters are read from it alone
        printed = _head(output, REPORT_BYTES)
        reason = failure(logged) or failure(printed) or out_of_memory(printed)
        return reading(logged, kernel, code, reason)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _head(path: Path, limit: int) -> str:
    try:
        with path.open("rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""
