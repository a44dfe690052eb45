"""Every KernelBench task (levels 1-3) through the evaluator at its real sizes, under a device memory budget.

For each task and budget, one service (``cuda`` backend, isolation as by default) loads the task and times its
reference (``--baseline compile``: also torch.compile's), then evaluates one candidate that exercises every phase
of the evaluator: the reference's own forward as ``ModelNew``, which must come out correct and flagged
``no_kernel``. One CSV row per (task, budget), appended as soon as it is known, so a sweep spans several runs:
rows already in the CSV are skipped (``--stop-after`` ends a run cleanly before a device call's limit), and
``--retry-failed`` runs again the tasks whose row is not ok (after a fix: the newer row stands, the older stays
in the file as a record).

    python benchmarks/kernelbench_sweep.py --kernelbench ../shared/kernelbench --budget 40 --levels 1
    python benchmarks/kernelbench_sweep.py --budget 80 default --only-failed-at 40   # what 40 GB could not hold
    python benchmarks/kernelbench_sweep.py --budget 40 --only-failed-at 40 --retry-failed   # after a fix
    python benchmarks/kernelbench_sweep.py --summary            # the CSV, summed up per budget

On the device machine (which does not see ../shared), carry the data in the checkout (``--kernelbench .kb``) and
write the CSV under ``$OUT`` starting from the repository's copy (``cp benchmarks/results/kernelbench_sweep.csv
$OUT/ && ... --csv $OUT/kernelbench_sweep.csv``); copy it back into benchmarks/results/ after each call.

Columns: the task; ``budget`` (GB, or ``default``); ``status`` (``ok``: correct and flagged ``no_kernel`` as
expected; ``over_budget``: the task cannot fit, ``error`` says what it needs; else where it stopped); seconds of
the reference's set-up and timing (``reference_s``), of the candidate (``candidate_s``: the service's wall time,
``judge_s``: the judge's share of it) and of its phases (build/import, checks, timing, from the result's log);
the reference's runtime (eager and compiled); the candidate's timed calls; ``overhead_s`` = candidate_s - its
own runtime x its timed calls (what the evaluator costs beyond the kernel); ``peak_gb`` (the evaluation's peak
as the evaluator reports it: both processes' allocators and the shared buffers, each at its peak in one turn of
the judge or step of the worker, added) and ``smi_peak_gb`` (the device's memory in use at its highest while the
task ran, sampled by nvidia-smi every 100 ms: CUDA contexts included) and ``smi_apps_gb`` (each process's own
highest in that time, largest first: the judge, its worker, a spare worker; a buffer shared by two processes
counts in both); ``needs_gb``: the least the evaluation needs by the task's measured footprint (the budget's
check); ``task_s``: the row's wall time, loading the task included; ``confirm_s``: the judge's wall-clock
confirmation of the speedup (with ``--confirm``, which sends every candidate through it, the path a fast kernel
takes: the defence ``own_kernel`` is switched off so that the reference's own forward reaches it, and ``ok`` means
confirmed within the budget, neither ``unconfirmed`` for want of memory nor ``suspicious``). A sweep with
``--confirm`` is best written to a CSV of its own.
``sol_ms``, ``sol_bound``: the task's speed of light on the device and which floor sets it (eval/judge/sol.py; empty
where it cannot be told, and in rows from before it existed); ``ref_sol_fraction``: speed of light / the reference's
runtime (how close PyTorch already comes); ``ref_kernels``: the reference's kernels in one call (its GPU profile);
``device``: the GPU's name (empty in rows from before it was recorded: an H100 or an H200, by the date);
``ref_laps``: where ``reference_s`` went by the judge's log (the task's set-up in the judge, its paces before and
after, the timing in the worker, ``start/spare`` or ``ahead/spare`` where a worker started first: a spare that
waited ready; ``/unready``: one still importing; ``/fresh``: none) and the worker's (its set-up of the task, making
the timing sets, the profile of one call, torch.compile with ``--baseline compile``, the timing).
A CSV written before a column existed gets the new header (its rows' new cells empty) on the next run.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT / "benchmarks" / "results" / "kernelbench_sweep.csv"
COLUMNS = ["level", "id", "name", "budget", "status", "error", "reference_s", "ref_ms", "ref_compile_ms",
           "candidate_s", "build_s", "checks_s", "timing_s", "timed_calls", "overhead_s", "runtime_ms", "flags",
           "peak_gb", "smi_peak_gb", "recorded", "smi_apps_gb", "judge_s", "task_s", "confirm_s", "needs_gb",
           "sol_ms", "sol_bound", "ref_sol_fraction", "ref_kernels", "ref_laps", "device"]
CANDIDATE = "\n\nclass ModelNew(Model):  # the reference's own forward: correct, and no kernel of its own\n    pass\n"


def device_name() -> str:
    """The GPU the row was measured on (an H100 and an H200 leave different room at the default budget)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


class SmiSampler:
    """The device's memory in use (MiB, all processes), sampled by ``nvidia-smi -lms``, its highest since mark();
    and each process's own highest (``--query-compute-apps``), to tell which process went beyond its account."""

    def __init__(self, index: int = 0) -> None:
        self.high = 0.0
        self.apps: dict[str, float] = {}  # pid -> MiB at its highest since mark()
        self.procs: list[subprocess.Popen[str]] = []
        for query, read in (("--query-gpu=memory.used", self._read_total),
                            ("--query-compute-apps=pid,used_memory", self._read_apps)):
            try:
                proc = subprocess.Popen(["nvidia-smi", "-i", str(index), query, "--format=csv,noheader,nounits",
                                         "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                return
            self.procs.append(proc)
            threading.Thread(target=read, args=(proc,), daemon=True).start()

    def _read_total(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self.high = max(self.high, float(line.strip()))
            except ValueError:
                continue

    def _read_apps(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            pid, _, used = line.partition(",")
            try:
                self.apps[pid.strip()] = max(self.apps.get(pid.strip(), 0.0), float(used.strip()))
            except ValueError:
                continue

    def mark(self) -> None:
        self.high = 0.0
        self.apps = {}

    def peak_gb(self) -> float | None:
        return round(self.high * 2**20 / 1e9, 2) if self.procs and self.high else None

    def apps_gb(self) -> str:
        """Each process's highest, largest first (GB, joined by '+')."""
        return "+".join(f"{v * 2**20 / 1e9:.2f}" for v in sorted(self.apps.values(), reverse=True))

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()


def latest_rows(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    """(task, budget) -> the CSV's last row for it (a task run again after a fix: the newer row stands)."""
    if not path.exists():
        return {}
    with path.open() as f:
        return {(f"level{r['level']}/{r['name']}", r["budget"]): r for r in csv.DictReader(f)}


def upgrade_header(path: Path) -> None:
    """Rewrite a CSV whose header lacks columns added since with today's (its rows' new cells empty)."""
    if not path.exists():
        return
    with path.open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        if reader.fieldnames == COLUMNS:
            return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def statuses(path: Path) -> dict[tuple[str, str], str]:
    """(task, budget) -> status, for the rows of the CSV."""
    return {key: r["status"] for key, r in latest_rows(path).items()}


def laps(log: str, label: str = "evaluator time") -> dict[str, float]:
    m = re.search(label + r": ([^\n]*)", log or "")
    out: dict[str, float] = {}
    for name, secs in re.findall(r"([a-z/]+) ([0-9.]+) s", m.group(1) if m else ""):
        out[name] = float(secs)
    return out


def timed_calls(log: str) -> int | None:
    m = re.search(r"candidate: median [^\n]*?, n (\d+)", log or "")
    return int(m.group(1)) if m else None


def one_task(service: Any, ref: Any, budget: str, cfg: Any, smi: SmiSampler) -> dict[str, Any]:
    from stark_ray.eval import kernelbench
    from stark_ray.eval.measure.memory import OverBudget
    from stark_ray.eval.tasks import TaskError
    from stark_ray.records import one_line

    task = kernelbench.load([ref])[0]
    row: dict[str, Any] = {"level": ref.level, "id": ref.id, "name": ref.name, "budget": budget}
    smi.mark()
    started = time.perf_counter()
    try:
        reference = service.reference(task, cfg)
    except OverBudget as e:
        return row | {"status": "over_budget", "error": one_line(str(e), 800), "smi_peak_gb": smi.peak_gb()}
    except TaskError as e:
        return row | {"status": "reference_failed", "error": one_line(str(e), 800), "smi_peak_gb": smi.peak_gb()}
    needs = re.search(r"device memory: needs ([0-9.]+) GB", reference.log or "")
    row |= {"reference_s": round(time.perf_counter() - started, 3), "ref_ms": reference.runtime_ms,
            "ref_compile_ms": reference.ref_compile_runtime_ms, "needs_gb": needs and float(needs.group(1)),
            "sol_ms": reference.sol_ms, "sol_bound": reference.sol_bound, "ref_sol_fraction": reference.sol_fraction,
            "ref_kernels": reference.kernels,
            "ref_laps": "; ".join(f"{who}{k} {v}" for who, label in (("", "evaluator time"), ("worker ", "worker time"))
                                  for k, v in laps(reference.log, label).items())}
    asked = time.perf_counter()
    result = service.evaluate(task, task.source + CANDIDATE, cfg)
    wall = time.perf_counter() - asked  # what the caller waits: the build process and the judge's round trip too
    phases = laps(result.log)
    calls = timed_calls(result.log)
    overhead = None
    if result.runtime_ms is not None and calls:
        overhead = round(wall - result.runtime_ms * calls / 1e3, 3)
    if cfg.confirm_above == 0.0:  # --confirm: own_kernel off, so that the claim reaches the judge's clock
        expected = result.passed_checks and result.runtime_ms is not None and "confirmation" in phases \
            and not {"unconfirmed", "suspicious"} & set(result.flags)
    else:
        expected = result.passed_checks and "no_kernel" in result.flags
    status = "ok" if expected else (result.stage if not result.passed_checks else "not_flagged")
    why = result.error or next((line for line in (result.log or "").splitlines() if "judge's wall clock" in line), "")
    return row | {"status": status, "error": one_line(why, 800) if not expected else "",
                  "candidate_s": round(wall, 3), "judge_s": result.eval_s and round(result.eval_s, 3),
                  "build_s": phases.get("build/import"), "confirm_s": phases.get("confirmation"),
                  "checks_s": phases.get("checks"), "timing_s": phases.get("timing"), "timed_calls": calls,
                  "overhead_s": overhead, "runtime_ms": result.runtime_ms, "flags": ",".join(result.flags),
                  "peak_gb": result.peak_memory_gb, "smi_peak_gb": smi.peak_gb(), "smi_apps_gb": smi.apps_gb()}


def sweep(args: argparse.Namespace) -> None:
    from stark_ray.config import EvalConfig
    from stark_ray.eval.kernelbench import select
    from stark_ray.eval.service import EvalService

    refs = [r for r in select(args.kernelbench, levels=args.levels, subset=args.subset)
            if (args.first is None or r.id >= args.first) and (args.last is None or r.id <= args.last)]
    if args.only_failed_at:  # the tasks that did not come out ok at that budget (over it, or out of memory)
        known = statuses(args.csv)
        refs = [r for r in refs if known.get((r.qualified, args.only_failed_at), "ok") != "ok"]
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    upgrade_header(args.csv)
    new_file = not args.csv.exists()
    started = time.monotonic()
    smi = SmiSampler()
    with args.csv.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
        for budget in args.budget:
            known = statuses(args.csv)
            todo = [r for r in refs if (r.qualified, budget) not in known
                    or (args.retry_failed and known[(r.qualified, budget)] != "ok")]
            print(f"budget {budget}: {len(todo)} of {len(refs)} tasks to run", flush=True)
            if not todo:
                continue
            cfg = EvalConfig(backend=args.backend, baseline=args.baseline, isolate=args.isolate,
                             memory_budget_gb=None if budget == "default" else float(budget),
                             confirm_above=0.0 if args.confirm else EvalConfig.confirm_above,
                             defences_off=("own_kernel",) if args.confirm else ())
            stopped = False
            with EvalService(cfg) as service:
                for ref in todo:
                    if args.stop_after and time.monotonic() - started > args.stop_after:
                        print(f"stopped after {time.monotonic() - started:.0f} s (--stop-after); run again to "
                              "go on", flush=True)
                        stopped = True
                        break
                    began = time.perf_counter()
                    row = one_task(service, ref, budget, cfg, smi)
                    row["task_s"] = round(time.perf_counter() - began, 3)
                    row["recorded"] = time.strftime("%Y-%m-%dT%H:%M:%S")
                    row["device"] = device_name()
                    writer.writerow(row)
                    f.flush()
                    print(f"{ref.qualified:60s} {budget:>7s} {row['status']:16s} cand {row.get('candidate_s')} s "
                          f"peak {row.get('peak_gb')} GB smi {row.get('smi_peak_gb')} GB ({row.get('smi_apps_gb')}) "
                          f"{row.get('error') or ''}"
                          [:240], flush=True)
                kept, misses = service.worker_spares  # the worker turnover behind the references' start laps
                print(f"budget {budget}: worker starts {service.worker_starts} ({service.worker_promotions} by a "
                      f"spare), spares kept {kept}, starts that found none ready {misses}", flush=True)
            if stopped:
                break
    smi.close()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(path: Path) -> None:
    rows = list(latest_rows(path).values())
    for budget in sorted({r["budget"] for r in rows}):
        mine = [r for r in rows if r["budget"] == budget]
        by_status: dict[str, list[dict[str, str]]] = {}
        for r in mine:
            by_status.setdefault(r["status"], []).append(r)
        counts = ", ".join(f"{k} {len(v)}" for k, v in sorted(by_status.items()))
        print(f"budget {budget}: {len(mine)} tasks; {counts}")
        if budget != "default":
            above = [r for r in mine if r.get("smi_peak_gb") and float(r["smi_peak_gb"]) > float(budget)]
            print(f"  device memory above the budget (nvidia-smi, contexts included): {len(above)} tasks"
                  + "".join(f"\n    level{r['level']}/{r['name']}: {r['smi_peak_gb']} GB" for r in above))
        for what in ("candidate_s", "judge_s", "overhead_s", "reference_s", "task_s", "peak_gb", "smi_peak_gb"):
            values = [float(r[what]) for r in mine if r.get(what)]
            if values:
                print(f"  {what}: median {statistics.median(values):.2f}, p95 {_quantile(values, 0.95):.2f}, "
                      f"max {max(values):.2f} (n {len(values)})")
        recorded(mine)
        light(mine)
        for status, items in sorted(by_status.items()):
            if status == "ok":
                continue
            for r in items:
                needs = f" (needs {r['needs_gb']} GB)" if r.get("needs_gb") else ""
                print(f"  {status}: level{r['level']}/{r['name']}{needs}: {r['error']}")


def recorded(rows: list[dict[str, str]]) -> None:
    """The speedup recorded for the sweep's candidate, the reference's own forward (1.0x by construction): how far
    the evaluator's figure strays from it (with --confirm, the judge's clock where its figure stood)."""
    found = sorted((float(r["ref_ms"]) / float(r["runtime_ms"]), r["name"]) for r in rows
                   if r["status"] == "ok" and r.get("ref_ms") and r.get("runtime_ms") and float(r["runtime_ms"]) > 0)
    if not found:
        return
    values = [v for v, _ in found]
    print(f"  recorded speedup of the reference's own forward (1.0x by construction): median "
          f"{statistics.median(values):.3f}, p5 {_quantile(values, 0.05):.3f}, p95 {_quantile(values, 0.95):.3f} "
          f"(n {len(values)}); lowest: " + ", ".join(f"{name} {v:.2f}" for v, name in found[:3]))


def light(rows: list[dict[str, str]]) -> None:
    """The references' shares of their speed of light, per level: how many are memory- or compute-bound, and how
    close PyTorch comes (the tasks near it have little left to win)."""
    for level in sorted({r["level"] for r in rows}):
        known = [r for r in rows if r["level"] == level and r.get("ref_sol_fraction")]
        if not known:
            continue
        shares = [float(r["ref_sol_fraction"]) for r in known]
        memory = sum(1 for r in known if r.get("sol_bound") == "memory")
        near = sorted((r for r in known if float(r["ref_sol_fraction"]) >= 0.5),
                      key=lambda r: -float(r["ref_sol_fraction"]))
        print(f"  level {level}: speed of light known for {len(known)} tasks ({memory} memory-bound, "
              f"{len(known) - memory} compute-bound); the reference's share: median {statistics.median(shares):.2f}, "
              f"p10 {_quantile(shares, 0.1):.2f}, p90 {_quantile(shares, 0.9):.2f}; at 50% or more: {len(near)}"
              + "".join(f"\n    {r['name']}: {float(r['ref_sol_fraction']):.2f} ({r['sol_bound']})" for r in near))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernelbench", default=str(ROOT.parent / "shared" / "kernelbench"))
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--first", type=int, default=None, help="the first task id of each level")
    p.add_argument("--last", type=int, default=None, help="the last task id of each level")
    p.add_argument("--subset", default="all", choices=("all", "representative"),
                   help="representative: the campaign's subset of each level (eval/kernelbench.py)")
    p.add_argument("--budget", nargs="+", default=["40"], help="GB, or 'default' (several: one after another)")
    p.add_argument("--baseline", default="eager", choices=("eager", "compile"))
    p.add_argument("--only-failed-at", default=None, metavar="BUDGET",
                   help="only the tasks whose row at this budget is not ok (e.g. 80 GB for those over 40)")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the tasks whose row at a swept budget is not ok (the newer row stands)")
    p.add_argument("--confirm", action="store_true",
                   help="every candidate through the judge's wall-clock confirmation, the path a fast kernel takes "
                        "(own_kernel off, so that the reference's own forward is not rejected first); ok: confirmed, "
                        "measured by the judge within the budget")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--isolate", default="auto")
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--stop-after", type=float, default=0.0, help="seconds: start no task after this")
    p.add_argument("--summary", action="store_true", help="sum up the CSV and exit")
    args = p.parse_args(argv)
    if args.summary:
        summary(args.csv)
        return
    import torch

    if args.backend != "cpu_cpp" and not torch.cuda.is_available():
        sys.exit("error: no CUDA GPU visible; run this on the GPU machine")
    sweep(args)


if __name__ == "__main__":
    main()
