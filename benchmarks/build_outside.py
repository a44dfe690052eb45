"""What a build made outside the candidate costs: a first evaluation (from an empty build cache) isolated, where the
worker asks its parent and a builder process makes the build (eval/build/builder.py), against the same unisolated, where
the worker builds in-process. ``cpu_cpp``, the candidates of examples/candidates, alternating the two modes.

    python benchmarks/build_outside.py [--repeat 2] [--only 1_LeakyReluScale_fast.py]

Each figure is ``EvalResult.eval_s`` (the service's wall time for the candidate, the build included) and
``compile_s``; the precompiled header is off (``STARK_RAY_PCH=0``) so that both sides build the same way from
the first build on. The ratio compares the same candidate, backend and machine, side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stark_ray.config import EvalConfig  # noqa: E402
from stark_ray.eval.service import EvalService  # noqa: E402
from stark_ray.eval.tasks import load_task  # noqa: E402

CANDIDATES = ROOT / "examples" / "candidates"
TASKS = ROOT / "examples" / "tasks"


def first_build(name: str, isolate: str) -> tuple[float, float]:
    task = load_task(TASKS / (name.split("_", 1)[0] + "_" + name.split("_")[1] + ".py"))
    with tempfile.TemporaryDirectory(prefix="stark-bench-build-") as cache:
        cfg = EvalConfig(backend="cpu_cpp", build_dir=cache, timing_trials=3, warmup=1, isolate=isolate)
        with EvalService(cfg) as service:
            service.reference(task)  # the worker started and the task set up: what is left is the candidate
            r = service.evaluate(task, (CANDIDATES / name).read_text())
    if not r.compiled:
        raise SystemExit(f"{name} ({isolate}) did not build: {r.error}")
    return r.eval_s or 0.0, r.compile_s or 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--only", default="1_LeakyReluScale_fast.py")
    args = p.parse_args()
    os.environ["STARK_RAY_PCH"] = "0"
    figures: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for i in range(args.repeat):
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            figures[mode].append(first_build(args.only, mode))
            print(f"pass {i + 1} {mode:>3}: eval {figures[mode][-1][0]:6.2f} s, build/import "
                  f"{figures[mode][-1][1]:6.2f} s", flush=True)
    off = statistics.median(f[0] for f in figures["off"])
    on = statistics.median(f[0] for f in figures["on"])
    print(f"{args.only}: first evaluation, median of {args.repeat}: in-process build {off:.2f} s, "
          f"builder {on:.2f} s, ratio {on / off:.2f} (+{on - off:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
