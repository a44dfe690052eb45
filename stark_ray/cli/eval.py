"""``stark eval``: compile, check and time one candidate against a task's reference."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from stark_ray.cli.app import app, fail
from stark_ray.cli.options import Settings, check_names, settings_options
from stark_ray.config import EvalConfig

if TYPE_CHECKING:
    from stark_ray.records import EvalResult


@app.command("eval")
@settings_options(eval=EvalConfig)
def eval_candidate(
    task: Annotated[Path, typer.Argument(help="KernelBench-style task file.", show_default=False)],
    candidate: Annotated[Path, typer.Argument(help="Candidate module defining class ModelNew.",
                                              show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a report.")] = False,
    *,
    settings: Settings,  # here: the options of EvalConfig (cli/options.py)
) -> None:
    """Compile, check and time one candidate against the task's reference. Exit 0 when it is accepted."""
    import json
    from dataclasses import asdict

    from stark_ray.cli.places import gpu_first
    from stark_ray.eval.service import EvalService, EvaluatorError
    from stark_ray.eval.tasks import TaskError, load_task

    try:  # the backend's name too, by its registry (one given by its import path is imported here, once)
        cfg = EvalConfig(**settings["eval"])
        check_names(cfg)
    except ValueError as e:
        fail(str(e))
    try:
        the_task = load_task(task)
        source = candidate.read_text(encoding="utf-8")
    except TaskError as e:
        fail(str(e))
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{candidate}: cannot read the candidate ({getattr(e, 'strerror', None) or e})")
    gpu_first(cfg.backend, None)
    try:
        service = EvalService(cfg)
    except EvaluatorError as e:
        fail(str(e))
    with service:
        try:
            reference = service.reference(the_task)  # the task must run before a candidate is judged against it
        except (TaskError, EvaluatorError) as e:
            fail(str(e))
        result = service.evaluate(the_task, source)
        peaks = service.hello().get("peaks")
    result = named_as(result, candidate.name)
    if as_json:
        typer.echo(json.dumps({**asdict(result), "accepted": result.accepted, "task": the_task.name,
                               "backend": cfg.backend, "candidate": str(candidate),
                               "reference_alone_ms": reference.runtime_ms}))
    else:
        typer.echo(eval_report(the_task.name, candidate.name, result, peaks if isinstance(peaks, str) else None))
    raise typer.Exit(0 if result.accepted else 1)


_IMPORTED_AS = re.compile(r"\bcandidate\.py\b")  # the name the evaluator imports every candidate under


def named_as(result: EvalResult, file_name: str) -> EvalResult:
    """The result with the evaluator's name for the candidate's module (``candidate.py``, in its errors, line
    numbers and tracebacks) replaced by the user's file name: the lines are the file's own."""
    if file_name == "candidate.py":
        return result
    return replace(result, error=result.error and _IMPORTED_AS.sub(file_name, result.error),
                   log=result.log and _IMPORTED_AS.sub(file_name, result.log))


def eval_report(task_name: str, candidate_name: str, result: EvalResult, peaks: str | None = None) -> str:
    from stark_ray.eval.measure.noise import interval, is_noisy

    verdict = "accepted" if result.accepted else (
        f"REJECTED ({', '.join(result.flags)})" if result.passed_checks else f"FAILED at {result.stage}")
    lines = [f"{task_name}: {candidate_name}: {verdict}"]
    if result.runtime_ms is not None and result.ref_runtime_ms is not None:
        known = "" if result.speedup_err is None else f" {interval(result.speedup_err)} (95%)"
        lines.append(f"  runtime {result.runtime_ms:.4f} ms, reference {result.ref_runtime_ms:.4f} ms "
                     f"(same run): speedup {result.speedup:.3f}x{known}")
        if is_noisy(result.speedup_err):
            lines.append("  noisy: the calls timed in pairs disagree that much even measured twice (a busy host, or "
                         "a kernel whose time varies); this speedup is not one to trust: run it again on a quiet "
                         "machine")
    if result.sol_ms is not None:
        ref = (f", the reference's {result.sol_ms / result.ref_runtime_ms:.1%}" if result.ref_runtime_ms else "")
        lines.append(f"  speed of light {result.sol_ms:.4f} ms ({result.sol_bound}-bound): "
                     + (f"{result.sol_fraction:.1%} of it{ref}" if result.sol_fraction is not None else "not timed"))
        if peaks:
            lines.append(f"  from the device's limits: {peaks}")
    if result.kernels:
        lines.append(f"  kernels in one call: {result.kernels}")
    if result.profile:
        lines.append(f"  {result.profile}")
    if result.ref_compile_runtime_ms is not None and result.runtime_ms:
        lines.append(f"  torch.compile baseline {result.ref_compile_runtime_ms:.4f} ms: speedup "
                     f"{result.ref_compile_runtime_ms / result.runtime_ms:.3f}x")
    if result.max_abs_err is not None:
        lines.append(f"  max_abs_err {result.max_abs_err:.3g}, rel_err {result.rel_err:.3g}")
    if result.compile_s is not None:
        lines.append(f"  compile {result.compile_s:.1f} s, evaluation {result.eval_s or 0:.1f} s")
    if result.flags:
        lines.append(f"  flags: {', '.join(result.flags)}")
    if result.error:
        lines.append(f"  error: {result.error}")
    if result.log:
        lines.append("  log:\n    " + "\n    ".join(result.log.splitlines()[-30:]))
    return "\n".join(lines)
