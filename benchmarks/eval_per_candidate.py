"""The evaluator's time per candidate on the GPU candidate set (examples/candidates/gpu), for comparing versions.

Every candidate of the set (by default the 22 of the original set that neither hang nor crash the device: the
set before issue 13 had 24) is evaluated twice by one service per backend: the first pass builds (into a shared
build cache) and warms the workers, the second is the one reported (``EvalResult.eval_s``, the service's wall time
for the candidate). The version measured is whichever ``stark_ray`` is first on PYTHONPATH, so the same command
with PYTHONPATH at an older tree (``git archive <commit> stark_ray | tar -x -C DIR``) measures the older code on
the same machine, candidates and build cache:

    PYTHONPATH=$PWD python benchmarks/eval_per_candidate.py --build-dir /tmp/b --json new.json
    PYTHONPATH=OLD_TREE python benchmarks/eval_per_candidate.py --build-dir /tmp/b --json old.json
    python benchmarks/eval_per_candidate.py --compare old.json new.json

``--isolate on`` measures with isolated workers (against ``off`` on the same tree: what isolation costs);
``--confirm-above 2`` against ``1`` on the same tree, what measuring every claimed gain by the judge's clock costs.
``--cpu`` measures the ``cpu_cpp`` backend instead (the C++ candidates of examples/candidates that neither hang
nor crash), reporting each candidate's median over ``--repeat`` passes after the first: a 2-core machine is noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "examples" / "candidates"
GPU = CPU / "gpu"
CPU_SET = ["1_LeakyReluScale_fast.py", "2_FusedSwishScaleClamp_fast.py", "2_FusedSwishScaleClamp_wrong.py",
           "6_ResidualLayerNorm_fast.py"]
TASKS = ROOT / "examples" / "tasks"
ORIGINAL = [  # the set as it was before issue 13, without the hang and the illegal address
    "1_LeakyReluScale_cuda_fused.py", "2_FusedSwishScaleClamp_cuda_fused.py", "5_RowSoftmax_cuda_fused.py",
    "8_TinyMagnitudeScale_cuda_fused.py", "1_LeakyReluScale_cuda_nvrtc_fused.py",
    "2_FusedSwishScaleClamp_cuda_nvrtc_fused.py", "5_RowSoftmax_cuda_nvrtc_fused.py",
    "1_LeakyReluScale_triton_fused.py", "2_FusedSwishScaleClamp_triton_fused.py", "5_RowSoftmax_triton_fused.py",
    "2_FusedSwishScaleClamp_cuda_compile_error.py",
    "2_FusedSwishScaleClamp_cuda_wrong.py", "2_FusedSwishScaleClamp_cuda_extra_stream.py",
    "2_FusedSwishScaleClamp_cuda_memoise.py", "2_FusedSwishScaleClamp_cuda_mutate_input.py",
    "2_FusedSwishScaleClamp_cuda_alias_output.py", "8_TinyMagnitudeScale_cuda_zeros.py",
    "2_FusedSwishScaleClamp_cuda_torch_only.py", "2_FusedSwishScaleClamp_cuda_partial_write.py",
    "2_FusedSwishScaleClamp_triton_wrong.py", "2_FusedSwishScaleClamp_cuda_nvrtc_wrong.py",
    "2_FusedSwishScaleClamp_triton_torch_only.py",
]


def measure(build_dir: str, names: list[str], out: Path | None = None,
            extra: dict[str, object] | None = None) -> dict[str, dict[str, object]]:
    import stark_ray
    from stark_ray.config import EvalConfig
    from stark_ray.eval.service import EvalService
    from stark_ray.eval.tasks import load_task

    expected = json.loads((GPU / "expected.json").read_text())
    print(f"stark_ray from {Path(stark_ray.__file__).parent}", flush=True)
    rows: dict[str, dict[str, object]] = {}
    for backend in ("cuda", "cuda_nvrtc", "triton"):
        mine = [n for n in names if expected[n]["backend"] == backend]
        if not mine:
            continue
        cfg = EvalConfig(backend=backend, build_dir=build_dir, check_timeout_s=120, timing_timeout_s=120,
                         compile_timeout_s=600, **(extra or {}))
        with EvalService(cfg) as service:
            by_task: dict[str, list[str]] = {}
            for n in mine:
                by_task.setdefault(expected[n]["task"], []).append(n)
            for task_name, files in by_task.items():
                task = load_task(TASKS / f"{task_name}.py")
                service.reference(task)
                sources = [(GPU / f).read_text() for f in files]
                service.evaluate_many(task, sources)  # pass 1: builds, warm workers
                for f, src in zip(files, sources, strict=True):
                    started = time.perf_counter()
                    r = service.evaluate(task, src)
                    rows[f] = {"eval_s": r.eval_s, "wall_s": time.perf_counter() - started, "stage": r.stage,
                               "accepted": r.accepted, "flags": r.flags, "speedup": r.speedup}
                    print(f"{f:52s} {r.stage:12s} eval {r.eval_s or 0:7.3f} s  speedup {r.speedup or 0:6.2f} "
                          f"{r.flags}", flush=True)
                    if out is not None:  # as it goes: a run cut short keeps what it measured
                        out.write_text(json.dumps(rows, indent=1))
    return rows


def measure_cpu(build_dir: str, names: list[str], repeat: int, out: Path | None = None,
                extra: dict[str, object] | None = None) -> dict[str, dict[str, object]]:
    import stark_ray
    from stark_ray.config import EvalConfig
    from stark_ray.eval.service import EvalService
    from stark_ray.eval.tasks import load_task

    print(f"stark_ray from {Path(stark_ray.__file__).parent}", flush=True)
    rows: dict[str, dict[str, object]] = {}
    cfg = EvalConfig(backend="cpu_cpp", build_dir=build_dir, compile_timeout_s=900, **(extra or {}))
    with EvalService(cfg) as service:
        for f in names:
            task = load_task(TASKS / f"{f.rsplit('_', 1)[0]}.py")
            service.reference(task)
            src = (CPU / f).read_text()
            service.evaluate(task, src)  # pass 1: the build, a warm worker
            times, results = [], []
            for _ in range(repeat):
                started = time.perf_counter()
                results.append(service.evaluate(task, src))
                times.append(time.perf_counter() - started)
            r = results[-1]
            evals = [x.eval_s or 0.0 for x in results]
            rows[f] = {"eval_s": statistics.median(evals), "eval_s_all": evals, "wall_s": statistics.median(times),
                       "stage": r.stage, "accepted": r.accepted, "flags": r.flags, "speedup": r.speedup}
            print(f"{f:52s} {r.stage:12s} eval {statistics.median(evals):7.3f} s (of {len(evals)}: "
                  f"{min(evals):.3f}-{max(evals):.3f})  speedup {r.speedup or 0:6.2f} {r.flags}", flush=True)
            if out is not None:
                out.write_text(json.dumps(rows, indent=1))
    return rows


def compare(old: dict[str, dict[str, object]], new: dict[str, dict[str, object]]) -> None:
    both = [n for n in old if n in new]
    print(f"{'candidate':52s} {'old s':>8s} {'new s':>8s} {'ratio':>6s}")
    for n in both:
        o, w = float(old[n]["eval_s"] or 0), float(new[n]["eval_s"] or 0)
        print(f"{n:52s} {o:8.3f} {w:8.3f} {w / o if o else float('nan'):6.2f}")
    o_sum = sum(float(old[n]["eval_s"] or 0) for n in both)
    w_sum = sum(float(new[n]["eval_s"] or 0) for n in both)
    ratios = [float(new[n]["eval_s"] or 0) / float(old[n]["eval_s"]) for n in both if old[n]["eval_s"]]
    print(f"total over {len(both)} candidates: old {o_sum:.2f} s, new {w_sum:.2f} s, ratio {w_sum / o_sum:.2f}; "
          f"median per-candidate ratio {statistics.median(ratios):.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default="/tmp/stark-bench-build")
    p.add_argument("--json", help="write the per-candidate figures here")
    p.add_argument("--only", default="", help="comma-separated candidate files (default: the original set)")
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two --json outputs")
    p.add_argument("--cpu", action="store_true", help="the cpu_cpp backend and its candidates")
    p.add_argument("--repeat", type=int, default=5, help="--cpu: passes measured after the first")
    p.add_argument("--isolate", default="", help="auto | on | off (default: the config's; not given to an old tree)")
    p.add_argument("--confirm-above", type=float, default=None,
                   help="EvalConfig.confirm_above (default: the config's): 2 against 1 on one tree is what measuring "
                        "every claimed gain by the judge's clock costs")
    args = p.parse_args()
    if args.compare:
        compare(*(json.loads(Path(f).read_text()) for f in args.compare))
        return 0
    only = [n for n in args.only.split(",") if n]
    out = Path(args.json) if args.json else None
    extra: dict[str, object] = {"isolate": args.isolate} if args.isolate else {}
    if args.confirm_above is not None:
        extra["confirm_above"] = args.confirm_above
    if args.cpu:
        measure_cpu(args.build_dir, only or CPU_SET, args.repeat, out, extra)
    else:
        measure(args.build_dir, only or ORIGINAL, out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
