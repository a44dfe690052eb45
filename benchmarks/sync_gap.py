"""What the `extra_stream` check's gap measures on a real GPU, for functions that leave nothing running.

The worker flagged a candidate whose shortest gap (its call's end on the current stream to the device idle, read by
the host's device-wide sync) exceeded the reference's by more than a margin (`leaves_work_behind`): two fused
single-kernel candidates were flagged on an H100 although they use one stream (sessions 39 and 40). This times, beside
each other with the worker's own timer, functions that differ only in how long the host waits inside the sync
(one kernel launched at once; the same kernel after the host spent 300 us; eight small kernels) and one that really
leaves work behind (a side stream, ~30 us after the call's end), and says what the rule before (shortest gaps) and
the rule now (round by round, `gap_over_reference`) decide of each against the launch-bound one as the reference.

    python3 benchmarks/sync_gap.py [--rounds 100] [--repeat 3] [--busy 8]

--busy N keeps N processes spinning on the host's cores meanwhile (the noisy runs where the flags were seen).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from stark_ray.eval.backends.gpu import cuda_timer
from stark_ray.eval.measure.timing import gap_over_reference, leaves_work_behind, time_interleaved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0, help="processes spinning on the host meanwhile")
    ap.add_argument("--numel", type=int, default=8 << 20, help="elements of the one kernel's tensor (float32)")
    args = ap.parse_args()
    side = torch.cuda.Stream()

    def one(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0

    def one_late_host(x: torch.Tensor) -> torch.Tensor:
        y = x * 2.0
        t = time.perf_counter()
        while time.perf_counter() - t < 300e-6:
            pass
        return y

    def eight(x: torch.Tensor) -> torch.Tensor:
        y = x[:4096] * 2.0
        for _ in range(7):
            y = y + 1.0
        return x * 2.0

    def left_behind(x: torch.Tensor) -> torch.Tensor:
        y = x * 2.0
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                torch.cuda._sleep(20_000)  # ~10 us each, after the call's end
        return y

    fns: dict[str, Callable[..., Any]] = {"eight": eight, "one": one, "one_late_host": one_late_host,
                                          "left_behind": left_behind}
    x = torch.randn(args.numel, device="cuda")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        _measure(fns, x, args.rounds, args.repeat, args.busy)
    finally:
        for p in spinners:
            p.kill()


def _measure(fns: dict[str, Callable[..., Any]], x: torch.Tensor, rounds: int, repeat: int, busy: int) -> None:
    print(f"reference: `eight` (a launch-bound chain, as a KernelBench reference); gaps in us; {busy} busy")
    for rep in range(repeat):
        timer = cuda_timer(True)
        got = time_interleaved(list(fns.values()), [[x]], timer, 5, rounds)
        print(f"repeat {rep + 1}: head start {timer.head_us:.0f} us, {rounds} rounds")
        for f, t in zip(fns, got, strict=True):
            gaps = sorted(1e3 * (s - m) for s, m in zip(t.synced.samples, t.stats.samples, strict=True))
            host = 1e3 * statistics.median(t.hosts)
            line = (f"  {f:14s} call {t.stats.median * 1e3:7.1f}  host {host:6.1f}  gap min {gaps[0]:5.1f}  "
                    f"p10 {gaps[len(gaps) // 10]:5.1f}  median {gaps[len(gaps) // 2]:5.1f}")
            if f != "eight":
                shortest = t.gap_ms > got[0].gap_ms + max(0.004, 0.02 * t.stats.median)  # the rule before
                line += (f"  | shortest gaps {1e3 * (t.gap_ms - got[0].gap_ms):+5.1f} -> {'flag' if shortest else '-'}"
                         f"; round by round {1e3 * gap_over_reference(t, got[0]):+5.1f} -> "
                         f"{'flag' if leaves_work_behind(t, got[0]) else '-'}")
            print(line)


if __name__ == "__main__":
    main()
