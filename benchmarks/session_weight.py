"""What a spare's imports cost the worker that times beside it, and what a lower session weight would save.

Every evaluator process is a session of its own, and where Linux groups a session's threads for its scheduler
(autogroups) a nice value set per process or thread weighs only within its session: a spare importing torch (its
imports in a thread niced by 10) takes as much of the CPU as the worker timing beside it. A session's own weight
(``/proc/self/autogroup``) would make it yield; session 38 tried it for the spares and took it back (docs/evaluator.md,
Known limits: a spare left at the low weight when it came to serve starved under load).

Here, in one run: a timer (its own session, torch's threads, a 512x1024 by 1024x1024 linear layer and GELU, the
tests' ``3_LinearGelu``) times calls alone, then beside ``--importers`` processes that import torch over and over in
sessions of their own at nice 0 (what spares have) and at nice 10, the phases alternated ``--repeat`` times. It
prints the timer's median call in each phase and its ratio to alone.

    python benchmarks/session_weight.py --importers 1 --seconds 6 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TIMER = """
import json, os, sys, time
import torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[2]))
lin = torch.nn.Linear(1024, 1024)
x = torch.randn(512, 1024)
times = []
with torch.no_grad():
    for _ in range(5):
        F.gelu(lin(x))
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        t = time.perf_counter()
        F.gelu(lin(x))
        times.append(time.perf_counter() - t)
print(json.dumps(times))
"""

IMPORTER = """
import os, subprocess, sys
with open('/proc/self/autogroup', 'w') as f:
    f.write(sys.argv[1])
while True:
    subprocess.run([sys.executable, '-c', 'import torch'], check=False)
"""


def timed(seconds: float, threads: int) -> float:
    """The timer's median call (ms), in a session of its own."""
    out = subprocess.run([sys.executable, "-c", TIMER, str(seconds), str(threads)], capture_output=True, text=True,
                         check=True, start_new_session=True).stdout
    return 1e3 * statistics.median(json.loads(out))


def phase(nice: int | None, importers: int, seconds: float, threads: int) -> float:
    procs = [subprocess.Popen([sys.executable, "-c", IMPORTER, str(nice)], start_new_session=True)
             for _ in range(importers if nice is not None else 0)]
    try:
        time.sleep(1.0 if procs else 0.0)  # their first imports under way
        return timed(seconds, threads)
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--importers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = p.parse_args(argv)
    if not Path("/proc/self/autogroup").exists():
        print("this kernel groups no sessions for its scheduler (no /proc/self/autogroup): nothing to measure",
              file=sys.stderr)
        return 1
    rows: dict[str, list[float]] = {"alone": [], "beside nice 0": [], "beside nice 10": []}
    for _ in range(args.repeat):
        for name, nice in (("alone", None), ("beside nice 0", 0), ("beside nice 10", 10)):
            rows[name].append(phase(nice, args.importers, args.seconds, args.threads))
    alone = statistics.median(rows["alone"])
    print(f"timer: {args.threads} thread(s); {args.importers} importer(s) of torch, each a session of its own; "
          f"{args.repeat} round(s) of {args.seconds:g} s a phase")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"  {name:15s} median call {med:7.2f} ms ({', '.join(f'{v:.2f}' for v in values)})  "
              f"x{med / alone:.2f} of alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
