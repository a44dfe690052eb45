"""How well the judge's bandwidth probe bounds what kernels reach (issue 20): the speed of light's memory floor is
bytes / the probe's bandwidth, so a kernel that moves its bytes faster than the probe shows a fraction above 1.

Side by side on one GPU, in one process: the probe as the judge runs it (``measured_bandwidth_gbs``), the probe of
sessions 19-26 (one 256 MiB uint8 copy, the mean of 10), and the bandwidth that torch's own elementwise kernels reach
on KernelBench's largest level-1 sizes (4096 x 393216 float32: 6.4 GB in, 6.4 GB out), each the best of 5 rounds.

    python benchmarks/bandwidth_probe.py          # the GPU machine
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def best_gbs(call: Callable[[], object], nbytes: int) -> float:
    """GB/s of ``call`` moving ``nbytes``, timed as the judge's probe is (its fastest round)."""
    from stark_ray.eval.backends.gpu import best_rate

    return nbytes * best_rate(call) / 1e9


def old_probe() -> float:
    import torch

    n = 256 << 20
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * n * 10 / (start.elapsed_time(end) / 1e3) / 1e9


def main() -> None:
    import torch

    from stark_ray.eval.backends.gpu import measured_bandwidth_gbs

    if not torch.cuda.is_available():
        raise SystemExit("bandwidth_probe.py needs a CUDA GPU (run it on the GPU machine)")
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    rows = [("the judge's probe (measured_bandwidth_gbs)", measured_bandwidth_gbs()),
            ("sessions 19-26's probe (256 MiB uint8 copy, mean of 10)", old_probe())]
    x = torch.randn(4096, 393216, device="cuda")
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()
    rows += [("relu(x, out=y), 6.4 GB float32", best_gbs(lambda: torch.relu(x, out=y), nbytes)),
             ("y.copy_(x), 6.4 GB float32", best_gbs(lambda: y.copy_(x), nbytes)),
             ("torch.mul(x, 2, out=y), 6.4 GB float32", best_gbs(lambda: torch.mul(x, 2.0, out=y), nbytes)),
             ("x.sum() (read only), 6.4 GB float32", best_gbs(lambda: x.sum(), nbytes // 2))]
    probe = rows[0][1]
    for name, gbs in rows:
        print(f"{name:58s} {gbs:8.0f} GB/s  {gbs / probe:6.3f} of the judge's probe")


if __name__ == "__main__":
    main()
