"""Whether CudaTimer's persisting-L2 reset defeats the access-policy-window cheat (data kept in the L2 across a flush).

A candidate can keep its data in the L2 across the timer's flush: it reserves the L2's persisting set-aside
(``cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, max)``) and gives its weight a persisting access-policy window
on the stream it runs on (``cudaStreamSetAttribute(..., cudaStreamAttributeAccessPolicyWindow, ...)``, hitRatio 1,
hitProp persisting, missProp streaming). The flush's normal writes cannot evict persisting lines, so every timed
call but the first reads its weight from the L2 instead of DRAM. Before its flush :class:`CudaTimer` puts the
set-aside back as the process had it and calls ``cudaCtxResetPersistingL2Cache`` (``timer.reset_l2``, a
:class:`~stark_ray.eval.measure.timing.PersistingL2`), which turns those lines back to normal so the flush evicts
them; the cheat here sets its set-aside again before each call, as a candidate would.

One memory-bound call whose operand fits in the persisting set-aside (by default ``torch.mv`` over a 24 MB float32
weight; the L2 of an H100/H200 is 50 MB), timed by ``CudaTimer(L2 size)`` as the evaluator times (one call per
sample, the median of ``--trials`` samples), in three variants, interleaved round by round (the order rotating):

  (a) plain: no access-policy window, timed with the reset (the timer as made);
  (b) the cheat: set-aside at the device's maximum and a persisting window over the weight, timed with the reset;
  (c) the same cheat timed with ``timer.reset_l2 = None`` (the defence off).

Before each timed call the variant's call runs once untimed from a clean L2 (persisting lines reset, flushed): its
"previous call", which reads the weight from DRAM and marks it persisting in (b) and (c). Each sample then sees what a
candidate's call sees after its own previous call and the timer's (reset and) flush, whatever variant ran before.

The ratios compare medians: (c)/(a) well below 1 means the persisting set-aside survives the flush without the reset;
(b)/(a) near 1 means the reset defeats it. For scale, the call's time with its weight hot in the L2 (back to back, no
flush) is printed too.

    python benchmarks/l2_persisting.py [--mb 24] [--op mv|sum] [--trials 200] [--default-stream] [--json F]

The CUDA runtime calls go through ctypes to the libcudart this process loaded (found as
``stark_ray.eval.measure.timing.persisting_l2_reset`` finds it). The runtime's ids and struct layout are those of
CUDA 12/13's driver_types.h: cudaLimitPersistingL2CacheSize 0x06, cudaDevAttrMaxPersistingL2CacheSize 108,
cudaDevAttrMaxAccessPolicyWindowSize 109, cudaStreamAttributeAccessPolicyWindow 1 (= cudaLaunchAttribute...), the
value a 64-byte union (``cudaLaunchAttributeValue``) whose accessPolicyWindow is {void*, size_t, float, enum, enum}.
On exit the window is cleared, persisting lines reset and the set-aside limit restored.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROG = "l2_persisting.py"

# CUDA runtime ids (driver_types.h, CUDA 12 and 13)
CUDA_SUCCESS = 0
LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06  # cudaLimitPersistingL2CacheSize
ATTR_MAX_PERSISTING_L2_CACHE_SIZE = 108  # cudaDevAttrMaxPersistingL2CacheSize
ATTR_MAX_ACCESS_POLICY_WINDOW_SIZE = 109  # cudaDevAttrMaxAccessPolicyWindowSize
STREAM_ATTR_ACCESS_POLICY_WINDOW = 1  # cudaStreamAttributeAccessPolicyWindow = cudaLaunchAttributeAccessPolicyWindow
ACCESS_NORMAL = 0  # cudaAccessPropertyNormal
ACCESS_STREAMING = 1  # cudaAccessPropertyStreaming
ACCESS_PERSISTING = 2  # cudaAccessPropertyPersisting
ATTR_VALUE_BYTES = 64  # sizeof(cudaLaunchAttributeValue): the union is padded to 64 bytes

NEEDED = ("cudaCtxResetPersistingL2Cache", "cudaStreamSetAttribute", "cudaDeviceSetLimit", "cudaDeviceGetLimit",
          "cudaDeviceGetAttribute", "cudaGetErrorName", "cudaGetErrorString", "cudaGetLastError")

COLS = 4096  # the weight is (rows, COLS) float32
CHEAT_PAYS_BELOW = 0.9  # verdict: (c)/(a) below this, the set-aside survived the flush without the reset ...
RESET_HOLDS_WITHIN = 0.05  # ... and (b)/(a) within this of 1, the reset defeated it


class AccessPolicyWindow(ctypes.Structure):
    """struct cudaAccessPolicyWindow (32 bytes: 8 + 8 + 4 + 4 + 4, padded to 8)."""

    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hit_ratio", ctypes.c_float),
        ("hit_prop", ctypes.c_int),  # enum cudaAccessProperty
        ("miss_prop", ctypes.c_int),
    ]


class StreamAttrValue(ctypes.Union):
    """cudaStreamAttrValue (= union cudaLaunchAttributeValue), of which only accessPolicyWindow is used here."""

    _fields_ = [
        ("pad", ctypes.c_char * ATTR_VALUE_BYTES),
        ("access_policy_window", AccessPolicyWindow),
    ]


class CudaError(RuntimeError):
    """A CUDA runtime call returned an error."""


def find_cudart() -> tuple[ctypes.CDLL, str] | None:
    """The libcudart this process loaded (its path in /proc/self/maps), else the one the linker finds: the same search
    as the timer's (``cudart_paths``), so the calls here act on the runtime (and context) the timer resets."""
    from stark_ray.eval.measure.timing import cudart_paths

    for path in cudart_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if all(hasattr(lib, name) for name in NEEDED):
            return lib, path
    return None


class Cudart:
    """The few runtime calls the cheat needs, every return code checked."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        lib.cudaGetErrorName.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetLastError.restype = ctypes.c_int
        lib.cudaGetLastError.argtypes = []
        lib.cudaDeviceSetLimit.restype = ctypes.c_int
        lib.cudaDeviceSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
        lib.cudaDeviceGetLimit.restype = ctypes.c_int
        lib.cudaDeviceGetLimit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        lib.cudaDeviceGetAttribute.restype = ctypes.c_int
        lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        lib.cudaStreamSetAttribute.restype = ctypes.c_int
        lib.cudaStreamSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(StreamAttrValue)]
        lib.cudaCtxResetPersistingL2Cache.restype = ctypes.c_int
        lib.cudaCtxResetPersistingL2Cache.argtypes = []

    def check(self, what: str, rc: int) -> None:
        if rc == CUDA_SUCCESS:
            return
        name = (self.lib.cudaGetErrorName(rc) or b"?").decode(errors="replace")
        text = (self.lib.cudaGetErrorString(rc) or b"?").decode(errors="replace")
        self.lib.cudaGetLastError()  # clear it: torch's next launch check would raise it as its own
        raise CudaError(f"{what} failed: {name} ({rc}): {text}")

    def attribute(self, attr: int, device: int) -> int:
        value = ctypes.c_int(0)
        rc = self.lib.cudaDeviceGetAttribute(ctypes.byref(value), attr, device)
        self.check(f"cudaDeviceGetAttribute({attr}, device {device})", rc)
        return value.value

    def get_limit(self, limit: int) -> int:
        value = ctypes.c_size_t(0)
        self.check(f"cudaDeviceGetLimit({limit:#x})", self.lib.cudaDeviceGetLimit(ctypes.byref(value), limit))
        return value.value

    def set_limit(self, limit: int, value: int) -> None:
        self.check(f"cudaDeviceSetLimit({limit:#x}, {value})", self.lib.cudaDeviceSetLimit(limit, value))

    def set_window(self, stream: int, base: int, num_bytes: int, hit_ratio: float) -> None:
        """A persisting access-policy window over [base, base + num_bytes) on ``stream`` (num_bytes 0: none)."""
        value = StreamAttrValue()  # zeroed, padding included
        window = value.access_policy_window
        window.base_ptr = base or None
        window.num_bytes = num_bytes
        window.hit_ratio = hit_ratio if num_bytes else 0.0
        window.hit_prop = ACCESS_PERSISTING if num_bytes else ACCESS_NORMAL
        window.miss_prop = ACCESS_STREAMING if num_bytes else ACCESS_NORMAL
        rc = self.lib.cudaStreamSetAttribute(ctypes.c_void_p(stream or None), STREAM_ATTR_ACCESS_POLICY_WINDOW,
                                             ctypes.byref(value))
        self.check(f"cudaStreamSetAttribute(stream {stream:#x}, accessPolicyWindow, {num_bytes} bytes)", rc)

    def clear_window(self, stream: int) -> None:
        self.set_window(stream, 0, 0, 0.0)

    def reset_persisting(self) -> None:
        self.check("cudaCtxResetPersistingL2Cache", self.lib.cudaCtxResetPersistingL2Cache())


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    window: bool  # the persisting access-policy window over the weight on the stream
    reset: bool  # timed with the timer's persisting-L2 reset


VARIANTS = (
    Variant("a", "(a) plain, no window, with the reset", window=False, reset=True),
    Variant("b", "(b) persisting window, with the reset (defence on)", window=True, reset=True),
    Variant("c", "(c) persisting window, reset off (defence off)", window=True, reset=False),
)


@dataclass(frozen=True)
class Figures:
    median_us: float
    p10_us: float
    p90_us: float
    samples_us: list[float]

    @staticmethod
    def of(samples_ms: list[float]) -> Figures:
        us = [1e3 * s for s in samples_ms]
        deciles = statistics.quantiles(us, n=10, method="inclusive")
        return Figures(statistics.median(us), deciles[0], deciles[-1], us)


def hot_us(call: Callable[[], object], reps: int = 100) -> float:
    """The call's mean time back to back, no flush: its operand hot in the L2 (the floor the cheat aims at)."""
    import torch

    for _ in range(10):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        call()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / reps


def run(args: argparse.Namespace, cudart: Cudart) -> dict[str, Any]:
    import torch

    from stark_ray.eval.measure.timing import CudaTimer

    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    l2_bytes = int(props.L2_cache_size)
    max_persist = cudart.attribute(ATTR_MAX_PERSISTING_L2_CACHE_SIZE, device)
    max_window = cudart.attribute(ATTR_MAX_ACCESS_POLICY_WINDOW_SIZE, device)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, cudart {cudart.path}")
    print(f"L2 {l2_bytes / 1e6:.1f} MB, max persisting set-aside {max_persist / 1e6:.1f} MB, "
          f"max access-policy window {max_window / 1e6:.1f} MB")
    if max_persist <= 0 or max_window <= 0:
        raise SystemExit(f"{PROG}: error: this device has no persisting L2 set-aside (max {max_persist} bytes, window "
                         f"{max_window}): nothing to measure")

    rows = max(1, int(args.mb * 1e6) // (4 * COLS))
    weight = torch.randn(rows, COLS, device="cuda")
    weight_bytes = weight.numel() * weight.element_size()
    window_bytes = min(weight_bytes, max_window)
    hit_ratio = min(1.0, max_persist / window_bytes)
    if weight_bytes > l2_bytes // 2:
        print(f"note: the weight ({weight_bytes / 1e6:.1f} MB) is over half the L2: even hot it may not stay in it")
    if window_bytes < weight_bytes or hit_ratio < 1.0:
        print(f"note: window {window_bytes / 1e6:.1f} MB of the {weight_bytes / 1e6:.1f} MB weight, hitRatio "
              f"{hit_ratio:.3f} (the window or the set-aside is smaller than the weight)")
    if args.op == "mv":
        vec, out = torch.randn(COLS, device="cuda"), torch.empty(rows, device="cuda")

        def call() -> object:
            return torch.mv(weight, vec, out=out)
    else:
        flat, total = weight.view(-1), torch.empty((), device="cuda")

        def call() -> object:
            return torch.sum(flat, 0, out=total)

    stream = torch.cuda.current_stream()
    handle = int(stream.cuda_stream)
    print(f"op: {args.op} over a {rows} x {COLS} float32 weight ({weight_bytes / 1e6:.1f} MB), "
          f"{'the default stream' if args.default_stream else 'a side stream'} ({handle:#x}), {args.trials} samples "
          f"per variant after {args.warmup} warm-up rounds")

    old_limit = cudart.get_limit(LIMIT_PERSISTING_L2_CACHE_SIZE)
    timer = CudaTimer(l2_bytes)
    reset = timer.reset_l2
    if reset is None:
        raise SystemExit(f"{PROG}: error: CudaTimer found no cudaCtxResetPersistingL2Cache (timer.reset_l2 is None): "
                         "the defence is off in this process")
    samples: dict[str, list[float]] = {v.key: [] for v in VARIANTS}
    set_aside = 0
    try:
        cudart.set_limit(LIMIT_PERSISTING_L2_CACHE_SIZE, max_persist)
        set_aside = cudart.get_limit(LIMIT_PERSISTING_L2_CACHE_SIZE)
        print(f"persisting set-aside set to {set_aside / 1e6:.1f} MB (was {old_limit / 1e6:.1f} MB)")
        hot = hot_us(call)
        order = list(VARIANTS)
        with torch.no_grad():
            for r in range(args.warmup + args.trials):
                for v in order:
                    if v.window:  # as a cheat would in each call: the evaluator puts the set-aside back
                        cudart.set_limit(LIMIT_PERSISTING_L2_CACHE_SIZE, max_persist)
                        cudart.set_window(handle, weight.data_ptr(), window_bytes, hit_ratio)
                    else:
                        cudart.clear_window(handle)
                    # a clean L2 (no persisting lines, flushed), then the variant's previous call, untimed: it reads
                    # the weight from DRAM, marking it persisting in (b) and (c) ...
                    cudart.reset_persisting()
                    timer.flush.zero_()
                    call()
                    # ... then the timed call as the evaluator times it: (reset,) flush, call
                    timer.reset_l2 = reset if v.reset else None
                    sample = timer(call, [])
                    if r >= args.warmup:
                        samples[v.key].append(sample.ms)
                order = order[1:] + order[:1]
    finally:
        timer.reset_l2 = reset
        for what, undo in (("clearing the window", lambda: cudart.clear_window(handle)),
                           ("resetting persisting lines", cudart.reset_persisting),
                           ("restoring the set-aside limit",
                            lambda: cudart.set_limit(LIMIT_PERSISTING_L2_CACHE_SIZE, old_limit))):
            try:
                undo()
            except CudaError as e:
                print(f"warning: {what}: {e}", file=sys.stderr)

    figures = {v.key: Figures.of(samples[v.key]) for v in VARIANTS}
    a = figures["a"].median_us
    ratios = {"b/a": figures["b"].median_us / a, "c/a": figures["c"].median_us / a}
    print()
    print(f"{'variant (CudaTimer: flush before each call, median of ' + str(args.trials) + ')':58s} "
          f"{'median':>9s} {'p10':>9s} {'p90':>9s}")
    for v in VARIANTS:
        f = figures[v.key]
        print(f"{v.label:58s} {f.median_us:7.2f}us {f.p10_us:7.2f}us {f.p90_us:7.2f}us")
    print(f"{'for scale: hot in the L2 (back to back, no flush)':58s} {hot:7.2f}us")
    print()
    print(f"(b)/(a) = {ratios['b/a']:.3f}   (c)/(a) = {ratios['c/a']:.3f}")
    print("(c)/(a) well below 1 means the persisting set-aside survives the flush without the reset; "
          "(b)/(a) near 1 means the reset defeats it.")
    cheat_pays = ratios["c/a"] < CHEAT_PAYS_BELOW
    reset_holds = abs(ratios["b/a"] - 1.0) <= RESET_HOLDS_WITHIN
    if cheat_pays and reset_holds:
        verdict = "the cheat pays without the reset, and the reset defeats it: the defence works"
    elif not cheat_pays:
        verdict = (f"the cheat did not pay even without the reset ((c)/(a) >= {CHEAT_PAYS_BELOW}): this run shows "
                   "nothing about the defence")
    else:
        verdict = (f"the cheat pays without the reset but (b)/(a) is not within {RESET_HOLDS_WITHIN} of 1: the reset "
                   "does not (fully) defeat it")
    print(f"verdict: {verdict}")
    return {
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__, "cudart": cudart.path,
        "l2_bytes": l2_bytes, "max_persisting_bytes": max_persist, "set_aside_bytes": set_aside,
        "max_window_bytes": max_window, "op": args.op, "weight_bytes": weight_bytes, "window_bytes": window_bytes,
        "hit_ratio": hit_ratio, "stream": "default" if args.default_stream else "side", "trials": args.trials,
        "warmup": args.warmup, "head_start_us": timer.head_us, "hot_us": hot,
        "variants": {v.key: {"label": v.label, **vars(figures[v.key])} for v in VARIANTS},
        "ratios": ratios, "cheat_pays": cheat_pays, "reset_holds": reset_holds, "verdict": verdict,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mb", type=float, default=24.0, help="the weight's size in MB (default 24)")
    p.add_argument("--op", choices=("mv", "sum"), default="mv", help="torch.mv(weight, x) or weight's sum")
    p.add_argument("--trials", type=int, default=200, help="timed samples per variant (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed rounds first (default 20)")
    p.add_argument("--default-stream", action="store_true",
                   help="run on torch's default stream (the window set on it) instead of a side stream")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args()
    if args.trials < 2:
        p.error("--trials must be at least 2")

    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"{PROG}: error: no CUDA GPU visible (torch.cuda.is_available() is False); "
                         "run this on the GPU machine")
    torch.cuda.init()
    found = find_cudart()
    if found is None:
        raise SystemExit(f"{PROG}: error: no libcudart with cudaCtxResetPersistingL2Cache in this process "
                         "(torch linked statically?) nor on the linker's path")
    cudart = Cudart(*found)
    try:
        if args.default_stream:
            result = run(args, cudart)
        else:
            with torch.cuda.stream(torch.cuda.Stream()):
                result = run(args, cudart)
    except CudaError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
