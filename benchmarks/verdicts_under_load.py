"""The judge's verdicts on a busy host: honest candidates must keep a speedup, cheats must gain none.

Each candidate is evaluated ``--repeat`` times by one ``EvalService`` (``cpu_cpp`` by default), beside ``--busy``
processes spinning on the CPU (started before the service, ended after it), and each verdict is sorted by what
stood: the worker's claim (``claim``), the judge's own figure recorded for it (``judge``), ``suspicious``, or
another failure. Printed per candidate: the counts, and the speedups of record (lowest to highest).

The candidates (the two cheats are the red team's, taken from the tests that run them):

* ``honest_fused``: examples/candidates/2_FusedSwishScaleClamp_fast.py, a fused C++ loop (about 5x on 2 cores);
* ``honest_eager``: the same task's own PyTorch chain (about 1.0x: a claimed gain is the host's noise);
* ``hides_time``: tests/test_integrity.py's 384x384 float32 matmul that patches ``time.perf_counter`` to hide 80%
  of its own time, with the worker's own report of patches switched off first (really 1.0x);
* ``spinner``: tests/test_timing_cheats.py's ``SPINNER`` on examples/tasks/3_LinearGelu.py, a thread that keeps a
  core busy whenever its own forward is not running (it slows the reference's calls in its process; really 1.0x).

An honest candidate flagged ``suspicious`` is the machine charged to the model; a cheat recorded above ~1.2x is a
gain it did not make. The version measured is whichever ``stark_ray`` is first on PYTHONPATH, so two trees (one
``git archive <commit> stark_ray | tar -x -C DIR``) compare on one machine, one after the other:

    PYTHONPATH=$PWD python benchmarks/verdicts_under_load.py --busy 3 --repeat 6 --build-dir /tmp/b --json new.json
    PYTHONPATH=OLD_TREE python benchmarks/verdicts_under_load.py --busy 3 --repeat 6 --build-dir /tmp/b --json old.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks"
FUSED_TASK = TASKS / "2_FusedSwishScaleClamp.py"
FUSED = ROOT / "examples" / "candidates" / "2_FusedSwishScaleClamp_fast.py"

HONEST = ("honest_fused", "honest_eager")


def candidates(workdir: Path) -> dict[str, tuple[Path, str]]:
    """name -> (task file, candidate source): the cheats are the red team's, as the tests run them."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_integrity as integrity
    import test_timing_cheats as timing_cheats

    matmul_task = workdir / "3_Matmul.py"
    matmul_task.write_text(integrity.MATMUL_TASK)
    hides_time = integrity.matmul(integrity.HIDE_BODY, integrity.BLIND + integrity.HIDE_TIME)
    eager = FUSED_TASK.read_text().replace("class Model(", "class ModelNew(")
    return {"honest_fused": (FUSED_TASK, FUSED.read_text()), "honest_eager": (FUSED_TASK, eager),
            "hides_time": (matmul_task, hides_time), "spinner": (timing_cheats.TASK, timing_cheats.SPINNER)}


def sort(result: Any) -> str:
    """What stood: the worker's claim, the judge's figure, suspicious, or a failure's stage."""
    if "suspicious" in (result.flags or []):
        return "suspicious"
    if not result.accepted:
        return f"failed:{result.stage}"
    notes = result.notes or ""
    return "judge" if "its figure stands" in notes else "claim"


def run(names: list[str], repeat: int, busy: int, build_dir: str) -> dict[str, list[dict[str, Any]]]:
    import stark_ray
    from stark_ray.config import EvalConfig
    from stark_ray.eval.service import EvalService
    from stark_ray.eval.tasks import load_task

    print(f"stark_ray from {Path(stark_ray.__file__).parent}; {busy} spinning process(es)", flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            chosen = {n: c for n, c in candidates(Path(tmp)).items() if n in names}
            cfg = EvalConfig(backend="cpu_cpp", build_dir=build_dir, compile_timeout_s=900, trials=3, warmup=2,
                             timing_trials=20)
            with EvalService(cfg) as service:
                for i in range(repeat):
                    for name, (task_file, source) in chosen.items():
                        task = load_task(task_file)
                        started = time.monotonic()
                        r = service.evaluate(task, source)
                        row = {"verdict": sort(r), "speedup": r.speedup, "error": (r.error or "")[:300],
                               "notes": r.notes or "", "flags": list(r.flags or []),
                               "eval_s": round(time.monotonic() - started, 2), "runtime_ms": r.runtime_ms,
                               "ref_runtime_ms": r.ref_runtime_ms,
                               "spares_stopped": getattr(service, "worker_spares_stopped", None)}
                        rows[name].append(row)
                        print(f"  pass {i + 1} {name}: {row['verdict']} "
                              f"{'' if r.speedup is None else f'{r.speedup:.2f}x'} ({row['eval_s']} s)", flush=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return rows


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}" if values else "-"


def report(rows: dict[str, list[dict[str, Any]]]) -> None:
    print(f"{'candidate':<14} {'claim':>6} {'judge':>6} {'suspicious':>11} {'failed':>7}  speedups of record; "
          f"the worker's ms a call, candidate / reference (lowest to highest)")
    for name, results in rows.items():
        counts = {k: sum(r["verdict"] == k for r in results) for k in ("claim", "judge", "suspicious")}
        failed = sum(r["verdict"].startswith("failed") for r in results)
        figures = sorted(r["speedup"] for r in results if r["speedup"] is not None and r["verdict"] != "suspicious")
        shown = ", ".join(f"{s:.2f}" for s in figures) or "-"
        times = "; ".join(spread([r[k] for r in results if r.get(k)]) for k in ("runtime_ms", "ref_runtime_ms"))
        print(f"{name:<14} {counts['claim']:>6} {counts['judge']:>6} {counts['suspicious']:>11} {failed:>7}  {shown}; "
              f"{times}")
    honest_flagged = sum(r["verdict"] == "suspicious" for n in HONEST if n in rows for r in rows[n])
    cheat_gain = [r["speedup"] for n, rs in rows.items() if n not in HONEST for r in rs
                  if r["verdict"] in ("claim", "judge") and r["speedup"] is not None and r["speedup"] > 1.2]
    stopped = [r["spares_stopped"] for rs in rows.values() for r in rs if r.get("spares_stopped") is not None]
    print(f"honest candidates flagged suspicious: {honest_flagged}; cheats recorded above 1.2x: {len(cheat_gain)}; "
          f"spares stopped while measuring: {max(stopped) if stopped else 'not counted by this version'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=3, help="processes spinning on the CPU beside the evaluations")
    p.add_argument("--repeat", type=int, default=4, help="evaluations of each candidate")
    p.add_argument("--only", nargs="*", default=None, help="candidates to evaluate (default: all)")
    p.add_argument("--build-dir", default=None, help="a build cache kept between runs (default: a temporary one)")
    p.add_argument("--json", type=Path, default=None, help="write every verdict here")
    a = p.parse_args()
    names = a.only or ["honest_fused", "honest_eager", "hides_time", "spinner"]
    unknown = sorted(set(names) - {"honest_fused", "honest_eager", "hides_time", "spinner"})
    if unknown or a.busy < 0 or a.repeat < 1:
        print(f"error: unknown candidate(s) {unknown}" if unknown else "error: --busy >= 0 and --repeat >= 1",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        rows = run(names, a.repeat, a.busy, a.build_dir or scratch)
    report(rows)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
