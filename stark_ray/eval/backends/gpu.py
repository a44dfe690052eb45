"""What the CUDA-device backends share: device set-up, its facts for the prompts, health, timing."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from stark_ray.eval.backends.base import Backend

if TYPE_CHECKING:
    from stark_ray.eval.measure.timing import Timer

_COPY_BYTES = 1 << 30  # a device-to-device copy this large measures the memory bandwidth


def prepare_device() -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible to the evaluator worker (torch.cuda.is_available() is "
                           "False); run on a GPU host or choose --backend cpu_cpp")
    torch.cuda.set_device(0)
    torch.empty(1, device="cuda")  # create the context now, not inside the first timed call
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference's float32 matmuls stay float32
    torch.backends.cudnn.allow_tf32 = False
    from stark_ray.eval.measure.timing import persisting_l2_reset

    persisting_l2_reset()  # the L2 set-aside as the process has it now, before any candidate (measure/timing.py)


def arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST for this device: its own architecture only (e.g. 9.0 builds sm_90)."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def smi_arch(visible: str | None) -> str | None:
    """The compute capability (e.g. "9.0", as :func:`arch_list` says it) of the first GPU in ``visible`` (a
    CUDA_VISIBLE_DEVICES value; None: any GPU), read by nvidia-smi without creating a CUDA context."""
    target = (visible or "").split(",")[0].strip()
    if visible is not None and not target:
        return None  # no GPU visible
    cmd = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", *(["-i", target] if target else [])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.splitlines()[0].strip() if out else ""
    return first if re.fullmatch(r"\d+\.\d+", first) else None


def measured_bandwidth_gbs() -> float:
    """Device-memory bandwidth of a large copy, counting bytes read plus bytes written: the best of a few rounds
    (the speed of light's memory floor is a bound, so the probe takes the device at its fastest; a mean over
    256 MiB came out 1.5% below what torch's own ReLU reached on 6.4 GB, a share of 101.6% on an H200). A device
    too full for the large buffers is probed with smaller ones."""
    import torch

    for nbytes in (_COPY_BYTES, _COPY_BYTES >> 2):
        try:
            return _copy_gbs(nbytes)
        except torch.cuda.OutOfMemoryError:
            pass
        finally:
            torch.cuda.empty_cache()  # the buffers, freed on leaving _copy_gbs
    raise torch.cuda.OutOfMemoryError("no room on the device for the bandwidth probe's buffers")


def _copy_gbs(nbytes: int) -> float:
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes * best_rate(lambda: dst.copy_(src)) / 1e9


def best_rate(call: Callable[[], object], rounds: int = 5, reps: int = 4) -> float:
    """Calls per second of ``call`` in its fastest round (CUDA events around ``reps`` calls)."""
    import torch

    for _ in range(3):
        call()
    best = 0.0
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        best = max(best, reps / (start.elapsed_time(end) / 1e3))
    return best


def device_info() -> dict[str, Any]:
    import torch

    p = torch.cuda.get_device_properties(0)
    return {
        "device": "cuda",
        "name": p.name,
        "capability": f"{p.major}.{p.minor}",
        "arch": f"sm_{p.major}{p.minor}",
        "sm_count": p.multi_processor_count,
        "memory_gb": round(p.total_memory / 2**30, 1),
        "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0),
        "shared_memory_per_block": int(getattr(p, "shared_memory_per_block", 48 << 10)),
        "shared_memory_per_block_optin": int(getattr(p, "shared_memory_per_block_optin", 0) or 0),
        "shared_memory_per_sm": int(getattr(p, "shared_memory_per_multiprocessor", 0) or 0),
        "registers_per_sm": int(getattr(p, "regs_per_multiprocessor", 0) or 0),
        "max_threads_per_sm": int(getattr(p, "max_threads_per_multi_processor", 0) or 0),
        "warp_size": int(getattr(p, "warp_size", 32) or 32),
        "bandwidth_gbs": round(measured_bandwidth_gbs(), 0),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "arch_list": arch_list(),
        "clock_mhz": round(int(getattr(p, "clock_rate", 0) or 0) / 1000),  # kHz where torch tells it
        "cutlass": cutlass_include(),
    }


def cutlass_include() -> str | None:
    """Where CUTLASS's headers are, for a build to include (``CUTLASS_PATH``, beside torch's or CUDA's headers), or
    None: not installed."""
    import torch.utils.cpp_extension as cpp_extension

    places = [os.environ.get("CUTLASS_PATH", ""), *cpp_extension.include_paths(),
              str(Path(cpp_extension.CUDA_HOME or "/usr/local/cuda") / "include")]
    for place in filter(None, places):
        for root in (Path(place), Path(place) / "include"):
            if (root / "cutlass" / "cutlass.h").is_file():
                return str(root)
    return None


# what a build for each compute capability can use, and what needs a target this build does not have
ARCH_FEATURES = {
    "8.0": "mma.sync tensor cores (fp16, bf16, tf32, int8) and cp.async",
    "8.6": "mma.sync tensor cores (fp16, bf16, tf32, int8) and cp.async",
    "8.9": "mma.sync tensor cores (fp16, bf16, tf32, int8, fp8) and cp.async",
    "9.0": "mma.sync tensor cores, cp.async, thread-block clusters, distributed shared memory and TMA "
           "(cp.async.bulk); wgmma and setmaxnreg are sm_90a features, which this build does not target",
    "10.0": "mma.sync tensor cores, clusters and TMA; tcgen05 and tensor memory are sm_100a features, which this build "
            "does not target",
}


def describe_build(info: dict[str, Any]) -> str:
    """One line: what the build targets and may call."""
    features = ARCH_FEATURES.get(str(info.get("capability")))
    target = f"Builds target {info['arch']} only (TORCH_CUDA_ARCH_LIST={info.get('arch_list') or info['capability']})"
    cutlass = info.get("cutlass")
    libraries = ("cuBLAS and cuDNN are reachable through torch ops and ATen (a call whose GPU time is mostly a "
                 "library's is flagged library_compute; one launching no kernel of its own is rejected, no_kernel); "
                 + (f"CUTLASS/CuTe headers at {cutlass} (add it to extra_include_paths)." if cutlass
                    else "CUTLASS/CuTe headers are not installed."))
    return f"{target}{': ' + features if features else ''}.\n{libraries}"


def describe_device(info: dict[str, Any]) -> str:
    if info.get("device") != "cuda":
        return "No GPU: kernels run on the CPU."
    kib = 1024
    smem_optin = info.get("shared_memory_per_block_optin") or info.get("shared_memory_per_block", 0)
    lines = [
        f"GPU: {info['name']} ({info['arch']}, compute capability {info['capability']}), "
        f"{info['sm_count']} SMs, {info['memory_gb']} GiB device memory.",
        f"L2 cache {info['l2_bytes'] / 2**20:.0f} MiB; shared memory per block "
        f"{info['shared_memory_per_block'] // kib} KiB by default, up to {smem_optin // kib} KiB opt-in; "
        f"{info['shared_memory_per_sm'] // kib} KiB per SM; {info['registers_per_sm']} registers and "
        f"{info['max_threads_per_sm']} threads per SM; warp size {info['warp_size']}.",
        f"Device-memory bandwidth measured on this GPU: {info['bandwidth_gbs']:.0f} GB/s (large copy)"
        + (f"; SM clock up to {info['clock_mhz']} MHz." if info.get("clock_mhz") else "."),
        f"torch {info['torch']} with CUDA {info['cuda_runtime']}.",
        describe_build(info),
    ]
    return "\n".join(lines)


def device_healthy() -> bool:
    """False when the CUDA context is poisoned (a sticky error from an illegal access, a trap, ...)."""
    import torch

    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception:
        return False
    return True


def cuda_timer(head_start: bool = True) -> Timer:
    import torch

    from stark_ray.eval.measure.timing import CudaTimer

    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return CudaTimer(l2) if head_start else CudaTimer(l2, head_start_us=0.0, fit=False)


def synchronize() -> None:
    import torch

    torch.cuda.synchronize()


class CudaDeviceBackend(Backend):
    """A backend whose candidates run on the CUDA device: its facts, sync, health and timer come from here."""

    notes = ""  # the format's line for the prompts
    usual_device: ClassVar[str] = "cuda"

    def __init__(self) -> None:
        self.device = "cuda"

    def hardware_info(self) -> dict[str, Any]:
        return device_info()

    def prepare_judge(self, threads: int) -> None:
        prepare_device()

    def build_arch(self, visible: str | None) -> str | None:
        return smi_arch(visible)

    def synchronize(self) -> None:
        synchronize()

    def healthy(self) -> bool:
        return device_healthy()

    def timer(self, head_start: bool = True) -> Timer:
        return cuda_timer(head_start)

    def describe_hardware(self, info: dict[str, Any], threads: int) -> str:
        return f"{describe_device(info)}\n{self.notes}"

    def hardware_class(self, info: dict[str, Any], threads: int) -> str:
        if info.get("device") != "cuda":
            return "no GPU"
        return " ".join(f"{k}={info.get(k)}" for k in ("name", "capability", "sm_count", "memory_gb", "l2_bytes",
                                                         "torch", "cuda_runtime"))
