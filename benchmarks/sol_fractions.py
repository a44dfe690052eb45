"""How far from the speed of light: each task's reference and each correct candidate of a candidate set, with where
one call's GPU time goes (issue 20).

The GPU candidate set (``examples/candidates/gpu``: every candidate whose expected verdict is ``ok``; those of
KernelBench tasks where ``--kernelbench`` holds the data) through one service per backend: per task, the reference
(its speed of light, which floor sets it, the reference's share of it, its kernels), then each candidate (its share,
its speedup, its kernels). ``--cpu``: the ``cpu_cpp`` backend on ``examples/candidates/*_fast.py`` instead (the
CPU's bandwidth and peak are probed in 0.1 s: a rough guide).

    python benchmarks/sol_fractions.py --kernelbench .kb/KernelBench --json $OUT/sol.json   # the GPU machine
    python benchmarks/sol_fractions.py --cpu

KernelBench's own references: ``benchmarks/kernelbench_sweep.py`` records the same figures for every task it runs
(``sol_ms``, ``sol_bound``, ``ref_sol_fraction``, ``ref_kernels``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository: stark_ray without installing it
TASKS = ROOT / "examples" / "tasks"
CANDIDATES = ROOT / "examples" / "candidates"
GPU = CANDIDATES / "gpu"


def task_path(name: str, kernelbench: Path | None) -> Path | None:
    if name.startswith("kernelbench:"):
        return kernelbench / f"{name.removeprefix('kernelbench:')}.py" if kernelbench else None
    return TASKS / f"{name}.py"


def gpu_set(kernelbench: Path | None) -> dict[str, dict[str, list[str]]]:
    """backend -> task file -> the candidates expected to be accepted."""
    expected = json.loads((GPU / "expected.json").read_text())
    out: dict[str, dict[str, list[str]]] = {}
    for name, e in sorted(expected.items()):
        path = task_path(e["task"], kernelbench)
        if e["expect"].startswith("ok") and path is not None and path.exists():
            out.setdefault(e["backend"], {}).setdefault(str(path), []).append(str(GPU / name))
    return out


def cpu_set() -> dict[str, dict[str, list[str]]]:
    tasks: dict[str, list[str]] = {}
    for f in sorted(CANDIDATES.glob("*_fast.py")):
        tasks.setdefault(str(TASKS / f"{f.stem.removesuffix('_fast')}.py"), []).append(str(f))
    return {"cpu_cpp": tasks}


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def measure(plan: dict[str, dict[str, list[str]]], build_dir: str) -> list[dict[str, Any]]:
    from stark_ray.config import EvalConfig
    from stark_ray.eval.service import EvalService
    from stark_ray.eval.tasks import load_task

    rows: list[dict[str, Any]] = []
    for backend, tasks in plan.items():
        cfg = EvalConfig(backend=backend, build_dir=build_dir, compile_timeout_s=900)
        with EvalService(cfg) as service:
            print(f"{backend}: the device's limits: {service.hello().get('peaks')}", flush=True)
            loaded = {task_file: load_task(Path(task_file)) for task_file in tasks}
            for task in loaded.values():
                ref = service.reference(task)
                rows.append({"backend": backend, "task": task.name, "what": "reference", "runtime_ms": ref.runtime_ms,
                             "sol_ms": ref.sol_ms, "sol_bound": ref.sol_bound, "sol_fraction": ref.sol_fraction,
                             "speedup": 1.0, "kernels": ref.kernels})
                print(f"{backend:10s} {task.name:28s} reference {ref.runtime_ms or 0:9.4f} ms   speed of light "
                      f"{ref.sol_ms or 0:.4f} ms ({ref.sol_bound}), {_share(ref.sol_fraction)} of it\n"
                      f"{'':40s}kernels: {ref.kernels or '-'}", flush=True)
            items = [(loaded[task_file], f) for task_file, files in tasks.items() for f in files]
            # all at once: the builds run in parallel (the compile pool), the device takes each when it is built
            results = service.evaluate_batch([(task, Path(f).read_text()) for task, f in items])
            for (task, f), r in zip(items, results, strict=True):
                rows.append({"backend": backend, "task": task.name, "what": Path(f).name,
                             "runtime_ms": r.runtime_ms, "sol_ms": r.sol_ms, "sol_bound": r.sol_bound,
                             "sol_fraction": r.sol_fraction, "speedup": r.speedup, "accepted": r.accepted,
                             "flags": r.flags, "kernels": r.kernels})
                verdict = "accepted" if r.accepted else f"NOT accepted ({r.stage}, {', '.join(r.flags)})"
                print(f"{backend:10s} {task.name:28s} {Path(f).name}: {r.runtime_ms or 0:.4f} ms, speedup "
                      f"{r.speedup or 0:.2f}x, {_share(r.sol_fraction)} of the speed of light, {verdict}\n"
                      f"{'':44s}kernels: {r.kernels or '-'}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="cpu_cpp on examples/candidates/*_fast.py")
    p.add_argument("--kernelbench", type=Path, default=None, help="KernelBench's data (its tasks' candidates)")
    p.add_argument("--build-dir", default="/tmp/stark-bench-build")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args()
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA GPU visible (run this on the GPU machine, or with --cpu)", file=sys.stderr)
            return 2
    rows = measure(cpu_set() if args.cpu else gpu_set(args.kernelbench), args.build_dir)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
