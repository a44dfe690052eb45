"""Candidate-evaluation throughput: KernelBench-style harnesses against our EvalService, on one GPU.

The candidate set is ``benchmarks/candidates.py`` (16 hand-written kernels over four example tasks, each in cuda,
cuda_nvrtc and triton form). Every harness checks correctness against the task's Model and times the candidate; the
figure of merit is candidates per minute of wall-clock time, everything included (process start-up, builds, checks,
timing).

(a) serial (KernelBench's single-sample procedure), cuda form: for each candidate, one at a time, a fresh spawned
    Python process with a fresh, empty extension directory (TORCH_EXTENSIONS_DIR set to a new temp dir, which is
    where load_inline puts its build_directory, as KernelBench does) imports the candidate (load_inline builds it),
    builds Model and ModelNew under the same seed, checks 5 trials (allclose atol=rtol=1e-2, inputs seeded per
    trial), times ModelNew with CUDA events (3 warm-up calls, then 100 timed calls on one input set, a
    synchronize after each), and exits.
(b) two-phase (KernelBench's batch mode), cuda form: phase 1 builds ALL candidates in a pool of CPU-only processes
    (pool size = CPU count, CUDA_VISIBLE_DEVICES="", TORCH_CUDA_ARCH_LIST = the GPU's arch, a fresh extension
    directory per candidate); barrier; phase 2 checks and times them one by one, each in a fresh GPU process that
    loads the built extension from its directory (same correctness and timing as (a)). TORCH_CUDA_ARCH_LIST is set
    in both phases (and in (a)) so that phase 2 finds the build up to date; the report says if anything rebuilt.
(c) our evaluator, cuda form: EvalService(EvalConfig(backend="cuda", build_dir=<fresh empty temp dir>, trials=5,
    warmup=3, timing_trials=100)) started once (its start-up counted), then evaluate_batch([(task, source), ...]) of
    all candidates at once. Note the evaluator does more per candidate than (a)/(b): it also times the
    reference, interleaved with the candidate (so twice the timed calls), on fresh inputs every round, and scales
    the inputs of the last correctness trials. --reference also calls svc.reference(task) once per task.
(c-warm) the same as (c) with the evaluator's toolchain warm, as on any machine after its first run: the
    precompiled torch/extension.h of the usual flags is built into the fresh build directory first (its time is
    reported, not counted); every candidate is still a fresh build.
(d-nvrtc-c-warm, d-triton-c-warm) (c) of the cuda_nvrtc / triton form with the device worker started before the
    clock (its start reported, not counted): the evaluator as a campaign has it after its start, paid once per GPU
    and campaign; the kernels still compile fresh (NVRTC, Triton JIT into a fresh cache).
(d) the same kernels in cuda_nvrtc and triton form, through (c) (a fresh build dir, and TRITON_CACHE_DIR pointed at
    a fresh temp dir) and through (b)'s two-phase procedure, where the "build" phase is what can be done ahead:
      triton: phase 1 imports each candidate and runs its forward once on the task's inputs, in a pool of GPU
              processes (pool size = CPU count), each with its own fresh TRITON_CACHE_DIR; phase 2's fresh process
              uses the same cache dir, so it loads the compiled kernels instead of compiling them.
      nvrtc:  torch.cuda._compile_kernel keeps nothing on disk, so a phase 1 could produce nothing that phase 2
              reuses; it is skipped (a run that did it would only add its time) and phase 2 compiles in-process.
Every harness builds a distinct copy of the candidate sources (their names carry a per-run, per-harness tag), so no
cache anywhere (torch extensions, Triton, the evaluator's) can serve an earlier build.

Run on the GPU machine:  python benchmarks/eval_throughput.py [--n 16] [--serial-n 4] [--only a,b,c,c-warm,d] [--json F]
Harnesses run in separate commands (each under a time limit) combine afterwards, anywhere:
  python benchmarks/eval_throughput.py --report a.json b.json d.json [--json all.json]

Plumbing smoke test without a GPU (processes, pool, barrier, report; Triton's interpreter, host-clock timing):
  STARK_BENCH_DEVICE=cpu TRITON_INTERPRET=1 python benchmarks/eval_throughput.py --only d-triton-b --n 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the repository: stark_ray without installing it

import bench_util
import candidates as cands

SEED = 0


def _device() -> str:
    """"cuda", or "cpu" for the plumbing smoke test (STARK_BENCH_DEVICE=cpu with TRITON_INTERPRET=1)."""
    return os.environ.get("STARK_BENCH_DEVICE", "cuda")


def _sync() -> None:
    if _device() == "cuda":
        import torch

        torch.cuda.synchronize()


def _time_call_ms(fn: Callable[[], Any]) -> float:
    """One call timed with CUDA events around it and a synchronize after (KernelBench's way); host clock on CPU."""
    import torch

    if _device() != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


@dataclass(frozen=True)
class Candidate:
    index: int
    stem: str
    label: str
    backend: str
    source: str


@dataclass
class CandidateResult:
    index: int
    stem: str
    label: str
    compiled: bool = False
    correct: bool = False  # (a), (b): passed their checks; (c): EvalResult.accepted (also timed, not flagged)
    error: str = ""
    build_s: float | None = None  # import of the candidate (the build, where one happens)
    runtime_ms: float | None = None  # (a)/(b): mean of the timed calls, as KernelBench reports; (c): the median
    runtime_median_ms: float | None = None
    ref_runtime_ms: float | None = None  # (c) only
    speedup: float | None = None  # (c) only
    max_abs_err: float | None = None
    rel_err: float | None = None
    rebuilt: bool | None = None  # phase 2 of (b): did loading compile anything? (None: not known)
    process_s: float | None = None  # the fresh process's whole life, seen from the parent


@dataclass
class HarnessRun:
    key: str  # "a", "b", "c", "d-nvrtc-b", ...
    title: str
    backend: str
    wall_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    results: list[CandidateResult] = field(default_factory=list)
    note: str = ""

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def n_correct(self) -> int:
        return sum(r.correct for r in self.results)

    @property
    def per_min(self) -> float:
        return 60.0 * self.n / self.wall_s if self.wall_s > 0 else math.nan


def select(backend: str, n: int, tag: str) -> list[Candidate]:
    pairs = cands.candidates(backend, tag=tag)[:n]
    labels = cands.candidate_labels()
    return [Candidate(i, stem, labels[i][1], backend, src) for i, (stem, src) in enumerate(pairs)]


# ---------------------------------------------------------------------------------------------------------------
# What runs in the fresh processes
# ---------------------------------------------------------------------------------------------------------------
def _describe(e: BaseException) -> str:
    """One line: the exception's type, the first line of its message and, if longer, its last line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(e).__name__}: {text}"[:400]


def _snapshot(cache_dir: str | None) -> dict[str, int]:
    """Files under a build/cache directory and their modification times (to tell whether loading rebuilt)."""
    if not cache_dir or not os.path.isdir(cache_dir):
        return {}
    out = {}
    for root, _, files in os.walk(cache_dir):
        for f in files:
            if f.endswith((".so", ".cubin", ".ptx", ".json")) and f != "lock":
                p = os.path.join(root, f)
                out[p] = os.stat(p).st_mtime_ns
    return out


def _check_and_time(job: dict[str, Any], res: CandidateResult) -> None:
    """KernelBench's procedure in this (fresh) process: build the models, 5 correctness trials, CUDA-event timing."""
    import torch

    workdir = Path(job["workdir"])
    before = _snapshot(job.get("cache_dir"))
    t0 = time.perf_counter()
    try:
        cand = bench_util.import_source(job["source"], workdir, f"candidate_{job['index']}")
    except Exception as e:
        res.error = f"build/import: {_describe(e)}"
        return
    res.build_s = time.perf_counter() - t0
    res.compiled = True
    task = bench_util.import_file(Path(job["task_path"]), f"task_{job['index']}")
    device = _device()
    with torch.no_grad():
        try:
            ref_model, new_model = bench_util.build_models(task, cand, SEED, device)
            worst_abs = worst_rel = 0.0
            for trial in range(job["trials"]):
                seed = SEED + trial
                inputs = bench_util.task_inputs(task, seed, device)
                torch.manual_seed(seed)
                ref = ref_model(*inputs)
                _sync()
                torch.manual_seed(seed)
                out = new_model(*inputs)
                _sync()
                c = bench_util.compare(out, ref)  # shape, dtype, allclose(atol=rtol=1e-2)
                worst_abs, worst_rel = max(worst_abs, c.max_abs_err), max(worst_rel, c.rel_err)
                if not c.ok:
                    res.error = f"trial {trial + 1}: {c.problem}"
                    break
            res.max_abs_err, res.rel_err = worst_abs, worst_rel
            if res.error:
                return
            res.correct = True
            inputs = bench_util.task_inputs(task, SEED, device)
            for _ in range(job["warmup"]):
                new_model(*inputs)
            _sync()
            times = [_time_call_ms(lambda: new_model(*inputs)) for _ in range(job["timing_trials"])]
            res.runtime_ms = statistics.fmean(times)
            res.runtime_median_ms = statistics.median(times)
        except Exception as e:
            res.correct = False
            res.error = f"run: {_describe(e)}"
    if job.get("cache_dir") is not None:
        after = _snapshot(job["cache_dir"])
        res.rebuilt = any(before.get(p) != t for p, t in after.items())


def _eval_child(conn: Connection, job: dict[str, Any]) -> None:
    """Entry point of a fresh GPU process: (a), or phase 2 of (b)."""
    os.environ.update(job["env"])
    res = CandidateResult(job["index"], job["stem"], job["label"])
    try:
        _check_and_time(job, res)
    except BaseException as e:  # report, never hang the parent
        res.error = res.error or _describe(e)
        traceback.print_exc()
    conn.send(asdict(res))
    conn.close()


def _build_worker_init(env: dict[str, str]) -> None:
    os.environ.update(env)


def _build_job(job: dict[str, Any]) -> dict[str, Any]:
    """Phase 1 of (b): build one candidate (cuda: import = load_inline; triton: import and run forward once)."""
    os.environ.update(job["env"])
    t0 = time.perf_counter()
    try:
        cand = bench_util.import_source(job["source"], Path(job["workdir"]), f"candidate_{job['index']}")
        if job["backend"] == "triton":
            import torch

            task = bench_util.import_file(Path(job["task_path"]), f"build_task_{job['index']}")
            with torch.no_grad():
                _, new_model = bench_util.build_models(task, cand, SEED, _device())
                new_model(*bench_util.task_inputs(task, SEED, _device()))
                _sync()
        return {"index": job["index"], "ok": True, "error": "", "seconds": time.perf_counter() - t0}
    except Exception as e:
        return {"index": job["index"], "ok": False, "error": _describe(e), "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------------------------
# Harnesses
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    arch: str
    trials: int
    warmup: int
    timing_trials: int
    timeout_s: float
    workers: int
    compile_workers: int | None
    reference: bool
    keep: bool
    tolerance: str


def _fresh_dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=False)
    return d


def _job(c: Candidate, s: Settings, workdir: Path, env: dict[str, str], cache_dir: Path | None) -> dict[str, Any]:
    return {"index": c.index, "stem": c.stem, "label": c.label, "backend": c.backend, "source": c.source,
            "task_path": str(cands.task_path(c.stem)), "workdir": str(workdir), "env": env,
            "cache_dir": str(cache_dir) if cache_dir is not None else None, "trials": s.trials,
            "warmup": s.warmup, "timing_trials": s.timing_trials}


def _run_fresh_process(job: dict[str, Any], timeout_s: float) -> CandidateResult:
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    proc = ctx.Process(target=_eval_child, args=(send, job))
    proc.start()
    send.close()
    res = CandidateResult(job["index"], job["stem"], job["label"])
    try:
        if recv.poll(timeout_s):
            res = CandidateResult(**recv.recv())
        else:
            res.error = f"timed out after {timeout_s:g} s"
    except EOFError:
        res.error = "the process died without a result"
    finally:
        recv.close()
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join()
    res.process_s = time.perf_counter() - t0
    return res


def _print_result(key: str, r: CandidateResult) -> None:
    status = "ok  " if r.correct else "FAIL"
    ms = f"{r.runtime_ms:.4f} ms" if r.runtime_ms is not None else "-"
    build = f"build {r.build_s:.1f} s" if r.build_s is not None else ""
    took = f"process {r.process_s:.1f} s" if r.process_s is not None else ""
    rebuilt = " REBUILT" if r.rebuilt else ""
    extra = f"  {r.error}" if r.error else ""
    print(f"  [{key}] {status} #{r.index:02d} {r.stem} {r.label}: {ms} {build} {took}{rebuilt}{extra}", flush=True)


def run_serial(cs: list[Candidate], s: Settings, root: Path) -> HarnessRun:
    run = HarnessRun("a", "(a) serial, fresh process per candidate (KernelBench single-sample)", "cuda")
    t0 = time.perf_counter()
    for c in cs:
        ext_dir = _fresh_dir(root, f"a_ext_{c.index:02d}")
        env = {"TORCH_EXTENSIONS_DIR": str(ext_dir), "TORCH_CUDA_ARCH_LIST": s.arch}
        r = _run_fresh_process(_job(c, s, _fresh_dir(root, f"a_work_{c.index:02d}"), env, None), s.timeout_s)
        run.results.append(r)
        _print_result("a", r)
    run.wall_s = time.perf_counter() - t0
    return run


def run_two_phase(cs: list[Candidate], s: Settings, root: Path, key: str) -> HarnessRun:
    backend = cs[0].backend if cs else "cuda"
    run = HarnessRun(key, f"two-phase: parallel build pool, barrier, fresh GPU process per candidate ({backend})",
                     backend)
    prefix = key.replace("-", "_")
    jobs: list[dict[str, Any]] = []
    for c in cs:
        env: dict[str, str] = {}
        cache: Path | None = None
        if backend == "cuda":
            cache = _fresh_dir(root, f"{prefix}_ext_{c.index:02d}")
            env = {"TORCH_EXTENSIONS_DIR": str(cache), "TORCH_CUDA_ARCH_LIST": s.arch}
        elif backend == "triton":
            cache = _fresh_dir(root, f"{prefix}_triton_{c.index:02d}")
            env = {"TRITON_CACHE_DIR": str(cache)}
        jobs.append(_job(c, s, _fresh_dir(root, f"{prefix}_work_{c.index:02d}"), env, cache))

    t0 = time.perf_counter()
    build_errors: dict[int, str] = {}
    if backend in ("cuda", "triton"):
        pool_env = {"CUDA_VISIBLE_DEVICES": "", "TORCH_CUDA_ARCH_LIST": s.arch} if backend == "cuda" else {}
        ctx = mp.get_context("spawn")
        with ctx.Pool(processes=min(s.workers, len(jobs)) or 1, initializer=_build_worker_init,
                      initargs=(pool_env,)) as pool:
            for b in pool.imap_unordered(_build_job, jobs):
                status = "built" if b["ok"] else f"BUILD FAILED: {b['error']}"
                print(f"  [{key}] phase 1 #{b['index']:02d} {status} ({b['seconds']:.1f} s)", flush=True)
                if not b["ok"]:
                    build_errors[b["index"]] = b["error"]
        run.phases["build_s"] = time.perf_counter() - t0
        if backend == "triton":
            run.note = "phase 1 = import + one forward per candidate in a pool of GPU processes (Triton cache)"
    else:
        run.note = "nvrtc: no phase 1 (NVRTC output is not cached on disk); phase 2 compiles in-process"
    t1 = time.perf_counter()
    for job in jobs:  # phase 2 runs every candidate; a failed build fails again there, as in KernelBench
        r = _run_fresh_process(job, s.timeout_s)
        if job["index"] in build_errors and not r.error:
            r.error = f"phase 1: {build_errors[job['index']]}"
        run.results.append(r)
        _print_result(key, r)
    run.phases["check_time_s"] = time.perf_counter() - t1
    run.wall_s = time.perf_counter() - t0
    return run


def run_service(cs: list[Candidate], s: Settings, root: Path, key: str, warm: bool = False) -> HarnessRun:
    try:
        from stark_ray.config import EvalConfig
        from stark_ray.eval.service import EvalService
        from stark_ray.eval.tasks import load_task
    except ImportError as e:
        raise SystemExit(f"error: harness {key} needs stark_ray's EvalService: {e}") from None

    backend = cs[0].backend if cs else "cuda"
    run = HarnessRun(key, f"our evaluator: EvalService.evaluate_batch of all candidates ({backend})", backend)
    build_dir = _fresh_dir(root, f"{key.replace('-', '_')}_build")
    warm_s = None
    if warm and backend == "cuda":  # the toolchain as every run after a machine's first finds it: the precompiled
        # torch header built
        from stark_ray.eval.backends import get_backend

        t_warm = time.perf_counter()
        get_backend(backend).warm_toolchain(build_dir)
        warm_s = time.perf_counter() - t_warm
        run.title += ", toolchain warmed first (not counted)"
    extra: dict[str, Any] = {}
    if s.tolerance and "tolerance" in {f.name for f in dataclasses.fields(EvalConfig)}:
        extra["tolerance"] = s.tolerance  # "kernelbench": atol = rtol = 1e-2, as (a) and (b) check
    cfg = EvalConfig(backend=backend, build_dir=str(build_dir), trials=s.trials, warmup=s.warmup,
                     timing_trials=s.timing_trials, seed=SEED, **extra)
    saved_triton_cache = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(_fresh_dir(root, f"{key.replace('-', '_')}_triton_cache"))
    try:
        # warm, in-process backends: the evaluator as a campaign has it after its start (the device worker up)
        _run_service_groups(cs, s, cfg, key, run, EvalService, load_task, started=warm and backend != "cuda")
    finally:
        if saved_triton_cache is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved_triton_cache
    if warm_s is not None:
        run.phases["toolchain_warm_s (not counted)"] = warm_s
        pch = sorted(build_dir.glob("pch/*/torch/extension.h.gch"))
        run.note = f"precompiled header {'present' if pch else 'MISSING'}; "
    run.note = (run.note or "") + "times the reference too (interleaved), fresh inputs per round" + (
        "; svc.reference per task" if s.reference else "")
    return run


def _run_service_groups(cs: list[Candidate], s: Settings, cfg: Any, key: str, run: HarnessRun, service_cls: Any,
                        load_task: Callable[[Path], Any], started: bool = False) -> None:
    tasks = {c.stem: load_task(cands.task_path(c.stem)) for c in cs}
    by_index: dict[int, CandidateResult] = {}
    t0 = time.perf_counter()
    with service_cls(cfg, device=0, compile_workers=s.compile_workers) as svc:
        if started:  # the device worker started first, its time reported and not counted
            svc.hello()
            run.phases["worker_start_s (not counted)"] = time.perf_counter() - t0
            run.title += ", device worker started first (not counted)"
            t0 = time.perf_counter()
        # the device worker starts inside evaluate_batch, while the first builds run (its start-up is in the
        # evaluate phase); with --reference it starts here
        run.phases["start_s"] = time.perf_counter() - t0
        if s.reference:
            for stem, task in tasks.items():
                try:
                    svc.reference(task)
                except Exception as e:
                    print(f"  [{key}] WARNING: reference of {stem} failed: {_describe(e)}", flush=True)
        # every candidate of every task at once: the service builds them in its pool and times each when built
        results = svc.evaluate_batch([(tasks[c.stem], c.source) for c in cs])
        for c, er in zip(cs, results, strict=True):
            error = er.error or ("" if er.accepted else f"stage {er.stage}, flags {','.join(er.flags) or '-'}")
            r = CandidateResult(c.index, c.stem, c.label, compiled=bool(er.compiled), correct=bool(er.accepted),
                                error=error, build_s=getattr(er, "compile_s", None),
                                runtime_ms=er.runtime_ms, runtime_median_ms=er.runtime_ms,
                                ref_runtime_ms=er.ref_runtime_ms, speedup=er.speedup,
                                max_abs_err=getattr(er, "max_abs_err", None), rel_err=getattr(er, "rel_err", None))
            by_index[c.index] = r
            _print_result(key, r)
            spent = [ln for ln in (er.log or "").splitlines() if ln.startswith("evaluator time:")]
            if spent:
                print(f"  [{key}]      {spent[0]}", flush=True)
        started = svc.hello().get("start_phases")
        if started:
            print(f"  [{key}] device worker start: {started}", flush=True)
        run.phases["evaluate_s"] = time.perf_counter() - t0 - run.phases["start_s"]
    run.wall_s = time.perf_counter() - t0
    run.phases["close_s"] = run.wall_s - run.phases["start_s"] - run.phases["evaluate_s"]
    run.results = [by_index[c.index] for c in cs]


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------
def _ratio(x: float, base: HarnessRun | None) -> str:
    if base is None or not base.per_min or math.isnan(base.per_min) or math.isnan(x):
        return "-"
    return f"{x / base.per_min:.2f}x"


def report(runs: list[HarnessRun]) -> list[str]:
    by_key = {r.key: r for r in runs}
    a, b = by_key.get("a"), by_key.get("b")
    warnings = []
    for r in runs:
        if r.n_correct < r.n:
            bad = ", ".join(f"#{x.index:02d} {x.stem} {x.label} ({x.error or 'incorrect'})"
                            for x in r.results if not x.correct)
            warnings.append(f"WARNING: harness {r.key} ({r.backend}) found {r.n - r.n_correct} of {r.n} candidates "
                            f"not correct: {bad}")
        rebuilt = [x for x in r.results if x.rebuilt]
        if rebuilt:
            warnings.append(f"WARNING: harness {r.key}: {len(rebuilt)} candidates rebuilt when loaded in phase 2 "
                            "(the build phase's output was not reused)")
    print()
    header = f"{'harness':<14} {'backend':<11} {'cands':>5} {'wall s':>9} {'cands/min':>10} {'correct':>8} " \
             f"{'vs (a)':>7} {'vs (b)':>7} {'vs own b':>8}"
    print(header)
    print("-" * len(header))
    for r in runs:
        base_key = r.key.removesuffix("-warm")  # c, c-warm -> b; d-triton-c -> d-triton-b
        own_b = by_key.get(base_key[:-1] + "b") if base_key.endswith("c") else None
        print(f"{r.key:<14} {r.backend:<11} {r.n:>5} {r.wall_s:>9.1f} {r.per_min:>10.2f} "
              f"{f'{r.n_correct}/{r.n}':>8} {_ratio(r.per_min, a):>7} {_ratio(r.per_min, b):>7} "
              f"{_ratio(r.per_min, own_b):>8}")
    print("ratios: candidates/min over the cuda (a) row, the cuda (b) row, and (for an evaluator row) the two-phase "
          "row of its own backend; each harness ran the number of candidates in its 'cands' column")
    for r in runs:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r.phases.items())
        if phases or r.note:
            print(f"  {r.key}: {phases}{'; ' if phases and r.note else ''}{r.note}")
    for w in warnings:
        print(w)
    if not warnings:
        print("every harness found every candidate it ran correct")
    return warnings


def load_runs(paths: list[Path]) -> list[HarnessRun]:
    """The harness runs recorded in --json files (later files win for a harness that appears twice)."""
    runs: dict[str, HarnessRun] = {}
    for path in paths:
        for r in json.loads(path.read_text())["runs"]:
            runs[r["key"]] = HarnessRun(r["key"], r["title"], r["backend"], r["wall_s"], dict(r["phases"]),
                                        [CandidateResult(**x) for x in r["results"]], r.get("note", ""))
    order = ["a", "b", "c", "c-warm", "d-nvrtc-c", "d-nvrtc-c-warm", "d-nvrtc-b", "d-triton-c", "d-triton-c-warm",
             "d-triton-b"]
    return sorted(runs.values(), key=lambda r: order.index(r.key) if r.key in order else len(order))


def payload_of(runs: list[HarnessRun], warnings: list[str], **meta: Any) -> dict[str, Any]:
    return {**meta,
            "runs": [{"key": r.key, "title": r.title, "backend": r.backend, "n": r.n, "wall_s": r.wall_s,
                      "candidates_per_min": r.per_min, "correct": r.n_correct, "phases": r.phases, "note": r.note,
                      "results": [asdict(x) for x in r.results]} for r in runs],
            "warnings": warnings}


def parse_only(text: str) -> list[str]:
    """a, b, c, c-warm, d (d = d-nvrtc-c, d-nvrtc-b, d-triton-c, d-triton-b) or any d harness by name (also
    d-nvrtc-c-warm, d-triton-c-warm)."""
    d_parts = ["d-nvrtc-c", "d-nvrtc-b", "d-triton-c", "d-triton-b", "d-nvrtc-c-warm", "d-triton-c-warm"]
    keys: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part in ("a", "b", "c", "c-warm"):
            keys.append(part)
        elif part == "d":
            keys.extend(d_parts)
        elif part in d_parts:
            keys.append(part)
        else:
            raise argparse.ArgumentTypeError(f"unknown harness {part!r}: use a, b, c, c-warm, d or "
                                             f"{', '.join(d_parts)}")
    return list(dict.fromkeys(keys))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    n_all = len(cands.candidate_labels())
    parser.add_argument("--n", type=int, default=n_all, help=f"use the first N candidates (default {n_all})")
    parser.add_argument("--serial-n", type=int, default=4, help="harness (a) runs only the first N of them (default 4)")
    parser.add_argument("--only", type=parse_only, default=parse_only("a,b,c,d"),
                        help="harnesses to run, comma-separated: a,b,c,d (d = d-nvrtc-c,d-nvrtc-b,d-triton-c,"
                             "d-triton-b, each also accepted alone); default all")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--timing-trials", type=int, default=100, help="timed calls per candidate (default 100)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up calls before timing (default 3)")
    parser.add_argument("--trials", type=int, default=5, help="correctness trials (default 5)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="build pool size of the two-phase harnesses (default: CPU count)")
    parser.add_argument("--compile-workers", type=int, default=None,
                        help="EvalService's compile_workers (default: the service's own choice)")
    parser.add_argument("--reference", action="store_true", help="(c)/(d): also call svc.reference(task) per task")
    parser.add_argument("--tolerance", default="kernelbench",
                        help="(c)/(d): EvalConfig.tolerance (default kernelbench: atol = rtol = 1e-2, as (a)/(b))")
    parser.add_argument("--arch", default=None, help="TORCH_CUDA_ARCH_LIST for (a)/(b) (default: the GPU's, e.g. 9.0)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per fresh process, seconds (default 900)")
    parser.add_argument("--tag", default=None, help="name tag that makes every source new (default: random)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary build directories")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="no run: print the table of harnesses recorded in these --json files (runs made "
                             "separately, e.g. to stay under a time limit per command); with --json, merge them")
    args = parser.parse_args(argv)
    if args.report:
        runs = load_runs(args.report)
        warnings = report(runs)
        if args.json:
            args.json.write_text(json.dumps(payload_of(runs, warnings, merged_from=[str(p) for p in args.report]),
                                            indent=2))
            print(f"wrote {args.json}")
        return 0 if runs and not warnings else 1
    if args.n < 1 or args.serial_n < 0:
        parser.error("--n must be >= 1 and --serial-n >= 0")

    import torch

    if _device() == "cuda":
        bench_util.require_gpu()
        major, minor = torch.cuda.get_device_capability(0)
        gpu = torch.cuda.get_device_name(0)
    else:
        major, minor, gpu = 9, 0, f"none (STARK_BENCH_DEVICE={_device()}: plumbing smoke test)"
    arch = args.arch or f"{major}.{minor}"
    settings = Settings(arch=arch, trials=args.trials, warmup=args.warmup, timing_trials=args.timing_trials,
                        timeout_s=args.timeout, workers=max(1, args.workers), compile_workers=args.compile_workers,
                        reference=args.reference, keep=args.keep, tolerance=args.tolerance)
    tag = args.tag or f"r{secrets.token_hex(3)}"
    root = Path(tempfile.mkdtemp(prefix="stark-throughput-"))
    print(f"GPU: {gpu} (arch {arch}); {os.cpu_count()} CPUs; candidates {args.n} "
          f"(serial (a): {min(args.serial_n, args.n)}); harnesses {','.join(args.only)}; tag {tag}; work dir {root}",
          flush=True)

    plan: list[tuple[str, Callable[[], HarnessRun]]] = []

    def sel(backend: str, key: str, n: int) -> list[Candidate]:
        return select(backend, n, f"{tag}_{key.replace('-', '_')}")

    for key in args.only:
        if key == "a" and args.serial_n > 0:
            plan.append((key, lambda: run_serial(sel("cuda", "a", min(args.serial_n, args.n)), settings, root)))
        elif key == "b":
            plan.append((key, lambda: run_two_phase(sel("cuda", "b", args.n), settings, root, "b")))
        elif key == "c":
            plan.append((key, lambda: run_service(sel("cuda", "c", args.n), settings, root, "c")))
        elif key == "c-warm":
            plan.append((key, lambda: run_service(sel("cuda", "c-warm", args.n), settings, root, "c-warm",
                                                  warm=True)))
        elif key.startswith("d-"):
            backend = "cuda_nvrtc" if "nvrtc" in key else "triton"
            if key.endswith("-b"):
                plan.append((key, lambda b=backend, k=key: run_two_phase(sel(b, k, args.n), settings, root, k)))
            else:
                plan.append((key, lambda b=backend, k=key: run_service(sel(b, k, args.n), settings, root, k,
                                                                       warm=k.endswith("-warm"))))
    runs: list[HarnessRun] = []
    try:
        for key, fn in plan:
            print(f"\n== harness {key}", flush=True)
            run = fn()
            print(f"== {key}: {run.n} candidates in {run.wall_s:.1f} s = {run.per_min:.2f} candidates/min, "
                  f"{run.n_correct}/{run.n} correct", flush=True)
            runs.append(run)
    finally:
        warnings = report(runs)
        if args.json:
            payload = payload_of(runs, warnings, gpu=gpu, arch=arch, cpus=os.cpu_count(), tag=tag,
                                 settings=asdict(settings), n=args.n,
                                 serial_n=min(args.serial_n, args.n) if "a" in args.only else 0)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(payload, indent=2))
            print(f"wrote {args.json}")
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if runs and not warnings else 1


if __name__ == "__main__":
    sys.exit(main())
