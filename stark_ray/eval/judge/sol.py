"""Speed of light: the least time a task's computation can take on a device, and how close a runtime comes to it.

A task must at least move its bytes — its inputs, its outputs and its parameters, each once: nothing is computed
without reading them, no output exists without being written — and do its arithmetic: the FLOPs of the
reference's forward, counted per dtype by torch's own formulas (``torch.utils.flop_counter``'s registry, what
``FlopCounterMode`` counts: matrix products, convolutions, attention) on the ``meta`` device, from shapes alone
(nothing allocated, nothing computed: a 6 GB task is counted in milliseconds). On a device that moves
``bandwidth`` bytes per second and does ``peak[dtype]`` FLOP/s, the memory floor is bytes / bandwidth and the
compute floor is the sum over dtypes of FLOPs / peak; the speed of light (SOL) is the larger of the two, and the
task is *memory-bound* or *compute-bound* by which. A runtime's SOL fraction is SOL / runtime: 1.0 is at the
limit, 0.1 leaves 10x on the table.

What the figures mean, and do not:
- Elementwise arithmetic and reductions are not counted (torch has no formula for them): on these devices they
  cost far less than moving their operands, so such tasks come out memory-bound, as they are.
- The peaks are the dense (no sparsity) datasheet figures of known GPUs (:data:`KNOWN`); a float32 matrix product
  is counted at the float32 (CUDA core) peak, torch's default for matmul (TF32 off). A kernel that computes in
  TF32 or a lower precision can show a fraction above 1: a reason to look at its precision, not a win.
- The bandwidth is measured on the device (a large copy), not taken from the datasheet; a short matrix-product
  probe checks the table's peak (:func:`probe_peaks`) and stands in for it on a GPU the table does not know, and on
  the CPU (the ``cpu_cpp`` backend), where no table could know the host.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

GB = 1e9
TFLOPS = 1e12

# dense peaks, TFLOP/s, by dtype class; datasheet memory bandwidth (GB/s), for reference only (the measured one
# is used). The first entry whose every word is a word of the device's name wins (the more specific ones come
# first; "GH200" is not "H200", nor "RTX A1000" an A100).
KNOWN: list[tuple[tuple[str, ...], dict[str, float], float]] = [
    (("h100", "pcie"), {"fp64": 51.0, "fp32": 51.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}, 2000.0),
    (("h100", "nvl"), {"fp64": 60.0, "fp32": 60.0, "bf16": 835.0, "fp16": 835.0, "fp8": 1670.0}, 3900.0),
    (("h100",), {"fp64": 67.0, "fp32": 67.0, "bf16": 989.0, "fp16": 989.0, "fp8": 1979.0}, 3350.0),
    (("h200", "nvl"), {"fp64": 60.0, "fp32": 60.0, "bf16": 835.0, "fp16": 835.0, "fp8": 1670.0}, 4800.0),
    (("h200",), {"fp64": 67.0, "fp32": 67.0, "bf16": 989.0, "fp16": 989.0, "fp8": 1979.0}, 4800.0),
    (("a100", "40gb"), {"fp64": 19.5, "fp32": 19.5, "bf16": 312.0, "fp16": 312.0}, 1555.0),
    (("a100", "pcie"), {"fp64": 19.5, "fp32": 19.5, "bf16": 312.0, "fp16": 312.0}, 1935.0),
    (("a100",), {"fp64": 19.5, "fp32": 19.5, "bf16": 312.0, "fp16": 312.0}, 2039.0),
    (("l40s",), {"fp32": 91.6, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0}, 864.0),
    (("b200",), {"fp64": 40.0, "fp32": 80.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}, 8000.0),
]
# a runtime must be below a floor by more than this factor to be said beyond it: the model's own error (the measured
# bandwidth is a large copy's, within a few % of what a kernel reaches; the datasheet's peaks are at boost clock)
LIGHT_MARGIN = 1.25
PROBE_DISAGREES = 0.5  # a probe below this share of the table's peak is said (a throttled, shared or mislabelled GPU)


def dtype_class(dtype: Any) -> str:
    """``fp32``, ``bf16``, ``fp16``, ``fp8``, ``fp64``, or the dtype's own name (an integer type, ...)."""
    name = str(dtype).removeprefix("torch.")
    if name.startswith("float8"):
        return "fp8"
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}.get(name, name)


@dataclass(frozen=True)
class Demand:
    """What a task's forward must do at least: FLOPs by dtype class, and the bytes of its inputs, outputs and
    parameters (each once). ``outputs_known`` is False when the forward could not run on ``meta`` (a data-dependent
    shape, an ``.item()``): then its outputs and FLOPs are not counted and the SOL is a lower bound."""

    flops: dict[str, int]
    input_bytes: int
    output_bytes: int
    param_bytes: int
    outputs_known: bool = True

    @property
    def bytes(self) -> int:
        return self.input_bytes + self.output_bytes + self.param_bytes


@dataclass(frozen=True)
class Peaks:
    """A device's limits: FLOP/s by dtype class, and its memory bandwidth (bytes/s); ``source`` says where they
    came from (the table, a probe, or both)."""

    device: str
    flops: dict[str, float]
    bandwidth: float
    source: str = "table"
    notes: list[str] = field(default_factory=list)
    cache_bytes: int = 0  # its last-level cache (a GPU's L2): outputs up to this size can end a call still in it

    def describe(self) -> str:
        """``NVIDIA H200: bandwidth 4.1 TB/s; bf16 989 TFLOP/s, fp32 67 TFLOP/s (table, checked by a probe)``, with
        the probe's disagreements."""
        rates = ", ".join(f"{k} {v / TFLOPS:.3g} TFLOP/s" for k, v in sorted(self.flops.items()))
        said = "".join(f"; {note}" for note in self.notes)
        return f"{self.device}: bandwidth {self.bandwidth / 1e12:.3g} TB/s; {rates} ({self.source}{said})"

    def flop_rate(self, dtype: str) -> float:
        """The peak for ``dtype``; float16 without a figure of its own at the bfloat16 one (the same tensor cores),
        any other dtype without one at the float32 peak."""
        return (self.flops.get(dtype) or (self.flops.get("bf16") if dtype == "fp16" else None)
                or self.flops.get("fp32") or min(self.flops.values()))


@dataclass(frozen=True)
class SpeedOfLight:
    """The least time a task can take on a device (ms), and which floor sets it."""

    memory_ms: float
    compute_ms: float
    lower_bound_only: bool = False  # the forward's outputs and FLOPs could not be counted
    # the bytes no output exists without: its inputs read and its outputs written once, less the outputs the cache
    # can still hold at the call's end (the parameters left out: a candidate may fold them by algebra and keep the
    # result, as a layout cached by the weight's pointer and version)
    io_ms: float = 0.0

    @property
    def ms(self) -> float:
        return max(self.memory_ms, self.compute_ms)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms > self.memory_ms else "memory"

    def fraction(self, runtime_ms: float | None) -> float | None:
        """SOL / runtime (None for no runtime)."""
        if runtime_ms is None or not runtime_ms > 0 or not math.isfinite(runtime_ms):
            return None
        return self.ms / runtime_ms

    def describe(self) -> str:
        """``memory-bound: speed of light 0.42 ms (memory 0.42 ms, compute 0.01 ms)``."""
        more = "; at least (the forward's outputs could not be counted)" if self.lower_bound_only else ""
        return (f"{self.bound}-bound: speed of light {self.ms:.3g} ms (memory {self.memory_ms:.3g} ms, compute "
                f"{self.compute_ms:.3g} ms){more}")


def speed_of_light(demand: Demand, peaks: Peaks) -> SpeedOfLight:
    memory_s = demand.bytes / peaks.bandwidth
    compute_s = sum(n / peaks.flop_rate(dtype) for dtype, n in demand.flops.items())
    # the inputs are read from memory (the timer flushes the L2); the outputs, written last, may still sit in the L2
    # when the call ends: only what does not fit there must have reached memory
    io_s = (demand.input_bytes + max(0, demand.output_bytes - peaks.cache_bytes)) / peaks.bandwidth
    return SpeedOfLight(1e3 * memory_s, 1e3 * compute_s, not demand.outputs_known, 1e3 * io_s)


def beyond_light(sol: SpeedOfLight, runtime_ms: float) -> str | None:
    """The line for a runtime below one of the task's floors by more than :data:`LIGHT_MARGIN` (None: within both).
    The memory floor (its inputs and outputs moved once at the measured bandwidth) is the hard one: an output not
    computed from all of its inputs, or work done outside the timed calls. The compute floor counts the
    reference's FLOPs at the peak of the task's dtype: beaten by arithmetic of less precision (TF32 or half-precision
    tensor cores on a float32 task) or by algebra that removes FLOPs."""
    if not runtime_ms > 0 or not math.isfinite(runtime_ms):
        return None
    if sol.io_ms > LIGHT_MARGIN * runtime_ms:
        return (f"ran in {runtime_ms:.4g} ms, {sol.io_ms / runtime_ms:.3g}x below the memory floor of its inputs and "
                f"outputs moved once at the measured bandwidth ({sol.io_ms:.4g} ms): an output not computed from all "
                "of its inputs, or work done outside the timed calls")
    if sol.compute_ms > LIGHT_MARGIN * runtime_ms:
        return (f"ran in {runtime_ms:.4g} ms, {sol.compute_ms / runtime_ms:.3g}x below the compute floor of the "
                f"reference's FLOPs at the peak of the task's dtypes ({sol.compute_ms:.4g} ms): arithmetic of less "
                "precision (TF32 or half-precision tensor cores on a float32 task) or algebra that removes FLOPs")
    return None


def count_demand(module: Any, init_inputs: list[Any], get_inputs: Callable[[], Any] | None = None) -> Demand:
    """The task's :class:`Demand`, its reference built and run on the ``meta`` device (shapes only)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    from stark_ray.eval.measure.memory import on_meta

    flops: dict[str, int] = {}

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                n = int(formula(*args, **(kwargs or {}), out_val=out))
                first = next((a for a in args if isinstance(a, torch.Tensor)), out)
                key = dtype_class(first.dtype) if isinstance(first, torch.Tensor) else "fp32"
                flops[key] = flops.get(key, 0) + n
            return out

    inputs, outputs, params, known = on_meta(module, init_inputs, get_inputs or module.get_inputs, Counting())
    if not known:  # a forward that needs values: its outputs and FLOPs are not known here
        flops.clear()
    return Demand(flops, inputs, outputs, params, known)


def known_peaks(device_name: str) -> tuple[dict[str, float], float] | None:
    """The table's (peaks in FLOP/s, datasheet bandwidth in bytes/s) for a device name, or None."""
    words = set(device_name.lower().replace("-", " ").split())
    for keys, tflops, gbs in KNOWN:
        if all(k in words for k in keys):
            return {k: v * TFLOPS for k, v in tflops.items()}, gbs * GB
    return None


def probe_peaks(device: str, bandwidth: float, name: str, size: int | None = None,
                seconds: float = 0.2) -> Peaks:
    """The device's :class:`Peaks`: the table's FLOP rates where it knows the device (checked against a
    matrix-product probe, a disagreement said in ``notes``), the probe's where it does not; ``bandwidth`` as
    measured (bytes/s: :func:`host_bandwidth` on the CPU, the device's facts on a GPU)."""
    probed: dict[str, float] = {}
    for dtype in ("fp32", "bf16") if device != "cpu" else ("fp32",):
        try:
            probed[dtype] = matmul_rate(device, dtype, size, seconds)
        except Exception:  # out of memory (a shared or partitioned GPU), no such dtype: the table's figure stands
            continue
    known = known_peaks(name) if device != "cpu" else None
    if known is None:
        if not probed:
            raise RuntimeError(f"{name}: no figure (not in the table, and the probe failed)")
        return Peaks(name, probed, bandwidth, "probe")
    table, notes = dict(known[0]), []
    for dtype, rate in probed.items():  # a throttled, shared or partitioned GPU: its own figure counts
        if dtype in table and rate < PROBE_DISAGREES * table[dtype]:
            notes.append(f"{dtype}: the probe's {rate / TFLOPS:.3g} TFLOP/s, under {PROBE_DISAGREES:.0%} of the "
                         f"table's {table[dtype] / TFLOPS:.3g}, is used")
            table[dtype] = rate
            if dtype == "bf16" and "fp16" in table:  # the same tensor cores, never probed apart
                table["fp16"] = min(table["fp16"], rate)
    return Peaks(name, table, bandwidth, "table, checked by a probe", notes)


def matmul_rate(device: str, dtype: str, size: int | None = None, seconds: float = 0.2) -> float:
    """FLOP/s of square matrix products of ``dtype`` class on ``device`` (the best of several timed calls)."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    n = size or (8192 if device != "cpu" else 1024)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    try:
        a = torch.randn(n, n, device=device, dtype=torch_dtype)
        b = torch.randn(n, n, device=device, dtype=torch_dtype)
        return 2.0 * n ** 3 / _best_seconds(lambda: torch.mm(a, b), sync, seconds)
    finally:
        a = b = None
        if device != "cpu":
            torch.cuda.empty_cache()  # the probe's memory back to the device, whatever happened


def host_bandwidth(nbytes: int = 256 << 20, seconds: float = 0.2) -> float:
    """Bytes/s of a large copy in host memory (bytes read plus bytes written; the best of several): the CPU's
    figure (a GPU's is measured with its facts, ``backends/gpu.py``)."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), lambda: None, seconds)


def _best_seconds(call: Callable[[], Any], sync: Callable[[], Any], seconds: float) -> float:
    """The least wall time of ``call`` (``sync`` after each) over ``seconds`` of calls, after one warm-up call."""
    call()
    sync()
    best = math.inf
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or best == math.inf:
        t0 = time.perf_counter()
        call()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def task_sol(module: Any, init_inputs: list[Any], get_inputs: Callable[[], Any], peaks: Peaks | None
             ) -> SpeedOfLight | None:
    """A task's speed of light on the device of ``peaks``; None where it cannot be told (no peaks, a task that
    cannot be built on the meta device)."""
    if peaks is None:
        return None
    try:
        demand = count_demand(module, init_inputs, get_inputs)
    except Exception:  # a task whose Model cannot be made from shapes alone: no speed of light, nothing else lost
        return None
    # a forward that needs values (its outputs and FLOPs not counted) would give a floor too low to show or stop on
    return speed_of_light(demand, peaks) if demand.outputs_known else None


def device_peaks(device: str, hardware: dict[str, Any]) -> Peaks | None:
    """The evaluation device's :class:`Peaks`: a GPU's from its facts (its measured bandwidth, its name for the
    table) and the probe; the CPU's from the probes alone; None where they cannot be had."""
    try:
        if device == "cuda":
            probed = probe_peaks("cuda", float(hardware["bandwidth_gbs"]) * GB, str(hardware.get("name") or "cuda"))
            return replace(probed, cache_bytes=max(0, int(hardware.get("l2_bytes") or 0)))
        return cpu_peaks(probe_peaks("cpu", host_bandwidth(64 << 20, seconds=0.1), "cpu", seconds=0.1))
    except Exception:  # no figure: candidates go without a speed of light
        return None


def cpu_peaks(probed: Peaks) -> Peaks:
    """The CPU's limits: its float32 peak from its ISA, clock and cores (an upper bound: a probe on a busy host read
    31 GFLOP/s where torch alone reached 94, and an honest candidate then ran at 130% of the speed of light) where
    the host tells its clock, the probe's where that is higher or not told; the bandwidth as probed."""
    import torch

    from stark_ray.eval.hardware import cpu_peak_flops

    bound = cpu_peak_flops(torch.get_num_threads())
    if bound is None or bound <= probed.flops.get("fp32", 0.0):
        return probed
    return Peaks(probed.device, {**probed.flops, "fp32": bound}, probed.bandwidth,
                 "the ISA x clock x cores; bandwidth probed", [*probed.notes,
                 f"fp32: the probe's {probed.flops.get('fp32', 0.0) / TFLOPS:.3g} TFLOP/s, under the bound"])


def stamp(result: Any, sol: SpeedOfLight | None, alone_ms: float | None = None) -> None:
    """Set ``result``'s ``sol_ms``, ``sol_bound`` and (where it has a runtime) ``sol_fraction``. With ``alone_ms``
    (the reference's time alone, where the task knows it) a candidate's share comes from its paired ratio: SOL x
    speedup / the reference alone — its runtime beside the reference and the reference's alone were measured under
    different loads on a busy host, the speedup under one."""
    result.sol_ms = result.sol_bound = result.sol_fraction = None  # the judge's figures only, never a message's
    if sol is None:
        return
    result.sol_ms, result.sol_bound = float(f"{sol.ms:.6g}"), sol.bound
    runtime = result.runtime_ms
    speedup = result.speedup
    if isinstance(runtime, int | float) and not isinstance(runtime, bool):
        if alone_ms and isinstance(speedup, int | float) and speedup > 0 and math.isfinite(speedup):
            runtime = alone_ms / speedup
        fraction = sol.fraction(float(runtime))
        result.sol_fraction = None if fraction is None else float(f"{fraction:.4g}")


def light_line(result: Any) -> str:
    """The line the prompts show under the hardware for a task whose reference ``result`` has a speed of light
    ("" without one)."""
    if getattr(result, "sol_ms", None) is None:
        return ""
    return (f"Speed of light of this task on it: {result.sol_ms:.4f} ms, {result.sol_bound}-bound (the least time: "
            "its inputs, outputs and parameters moved once at the measured bandwidth, its matrix and convolution "
            "FLOPs at the peak; a runtime's share of it is how close it comes)")
