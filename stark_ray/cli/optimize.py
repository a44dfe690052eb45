"""``stark optimize``: one task, searched with either executor (a new run, or ``--resume`` of a recorded one)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from stark_ray.cli.app import app, err, fail, given_options, interrupt, spelled
from stark_ray.cli.options import PANELS, Settings, check_names, run_settings, settings_options
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig

if TYPE_CHECKING:
    from stark_ray.eval.tasks import Task
    from stark_ray.llm.base import LLMClient
    from stark_ray.run.ray_driver import RayRun
    from stark_ray.run.reporter import Reporter
    from stark_ray.run.summary import RunSummary
    from stark_ray.store.location import Location


@app.command()
@settings_options(search=SearchConfig, agents=AgentConfig, eval=EvalConfig)
def optimize(
    ctx: typer.Context,
    task: Annotated[Path | None, typer.Argument(help="KernelBench-style task file (class Model, get_inputs, "
                                                     "get_init_inputs).", show_default=False)] = None,
    ref_path: Annotated[Path | None, typer.Option("--ref-path", "--ref_path", help="Same as TASK.")] = None,
    kernelbench: Annotated[Path | None, typer.Option(help="A KernelBench checkout: the task is --level's "
                                                          "--problem there, instead of TASK.",
                                                     show_default=False)] = None,
    level: Annotated[int | None, typer.Option(help="KernelBench level (with --kernelbench).",
                                              show_default=False)] = None,
    problem: Annotated[str | None, typer.Option(help="KernelBench problem of --level: its id (19) or a part of "
                                                     "its name (ReLU) that names one file.",
                                                show_default=False)] = None,
    out: Annotated[str, typer.Option(help="Where run directories go: a local directory or a filesystem URI "
                                          "(s3://bucket/prefix, gs://…).")] = "runs",
    executor: Annotated[str, typer.Option(help="ray (TreeMemory and Evaluator actors, agent tasks) | local "
                                               "(one process, no Ray).")] = "ray",
    address: Annotated[str | None, typer.Option(help="Ray cluster to join: auto or ray://host:10001 (default: "
                                                     "an embedded local Ray).")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this run directory (its task, settings and "
                                                    "executor; a path or a URI).",
                                                show_default=False)] = None,
    evaluators: Annotated[int | None, typer.Option(help="Evaluator actors (default: one per GPU of the cluster "
                                                        "at the start; more wait for the autoscaler).",
                                                   show_default=False)] = None,
    max_in_flight: Annotated[int | None, typer.Option(help="Ray: agent calls and evaluations outstanding at once "
                                                      "(default: derived from the evaluators and the measured agent "
                                                      "and evaluation times, at least 64).", min=1,
                                                 show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live view; print the summary only.")] = False,
    *,
    settings: Settings,  # here: the options of SearchConfig, AgentConfig and EvalConfig (cli/options.py)
    cassette: Annotated[Path | None, typer.Option(help="Replay recorded LLM exchanges from this JSONL.",
                                                  rich_help_panel=PANELS["agents"])] = None,
    record: Annotated[Path | None, typer.Option(help="Record every LLM exchange to this JSONL.",
                                                rich_help_panel=PANELS["agents"])] = None,
) -> None:
    """Search for a faster implementation of TASK and write the best one to the run directory."""
    from stark_ray.cli.places import gpu_first, kernelbench_task, writable_dir, writable_file
    from stark_ray.eval.tasks import TaskError, load_task
    from stark_ray.llm.base import ConfigError
    from stark_ray.llm.factory import check_credentials, check_provider, make_client

    if executor not in ("ray", "local"):
        fail(f"unknown executor {executor!r}; choose ray or local")
    if evaluators is not None and evaluators < 1:
        fail("--evaluators must be >= 1")
    if resume is not None:
        _resume(ctx, resume, executor, address, quiet, evaluators, max_in_flight)
        return
    path = _one_task(task, ref_path) if kernelbench is None and level is None and problem is None else \
        kernelbench_task(kernelbench, level, problem, given=task or ref_path)
    provider = settings["agents"].get("provider")
    if cassette is not None and provider not in (None, "replay"):
        fail(f"--cassette replays recorded replies; it cannot be combined with --provider {provider}")
    settings["agents"].update({k: str(v) for k, v in (("cassette", cassette), ("record", record)) if v})
    try:  # the names too, by their registries (a backend given by its import path is imported here, once)
        search_cfg, agent_cfg, eval_cfg = run_settings(settings)
    except ValueError as e:
        fail(str(e))
    try:  # the task and the places first (the first thing to fix), then the key, before any work
        the_task = load_task(path)
        out_dir = writable_dir(out, "--out")
        if record is not None:
            writable_file(record, "--record")
        check_credentials(agent_cfg)
        check_provider(agent_cfg)  # one cheap request, before any work
        client = make_client(agent_cfg)
    except (ConfigError, TaskError) as e:
        fail(str(e))
    gpu_first(eval_cfg.backend, address if executor == "ray" else None, evaluators)

    if search_cfg.parallel > 1 and executor == "local":
        fail("--parallel needs --executor ray (the local executor expands one node at a time)")
    reporter = reporter_for(quiet)
    if executor == "ray":
        from stark_ray.run.ray_driver import RayRun

        # a private Ray that cannot start (a host too busy for its agents) leaves a run the local executor can do
        # (one task, one expansion at a time, executor not asked for) to it, with one line, instead of no run
        local_can = "executor" not in given_options(ctx) and address is None and search_cfg.parallel == 1 \
            and evaluators in (None, 1)

        def instead() -> None:
            run_locally(the_task, client, search_cfg, agent_cfg, eval_cfg, out_dir, reporter_for(quiet))

        run_on_ray(RayRun([the_task], search_cfg, agent_cfg, eval_cfg, out_dir, address=address,
                          evaluators=evaluators, max_in_flight=max_in_flight), reporter,
                   instead if local_can else None)
        return
    run_locally(the_task, client, search_cfg, agent_cfg, eval_cfg, out_dir, reporter)


def run_locally(task: Task, client: LLMClient, search_cfg: SearchConfig, agent_cfg: AgentConfig,
                 eval_cfg: EvalConfig, out: Path | Location, reporter: Reporter,
                 resume: Path | Location | None = None) -> None:
    from stark_ray.eval.service import EvaluatorError
    from stark_ray.eval.tasks import TaskError
    from stark_ray.llm.base import LLMError
    from stark_ray.run.directory import RunError
    from stark_ray.run.local import optimize as run_optimize

    signal.signal(signal.SIGTERM, interrupt)  # a scheduler's stop ends the run like Ctrl-C: all recorded
    try:
        try:
            summaries = [run_optimize(task, client, search_cfg, agent_cfg, eval_cfg, out, reporter, resume=resume)]
        finally:
            reporter.close()
    except (TaskError, EvaluatorError, RunError) as e:
        fail(str(e))
    except LLMError as e:
        fail(f"LLM calls cannot go on ({e.kind}): {e}; what was recorded is kept", 1)
    except KeyboardInterrupt:
        fail("interrupted; everything recorded so far is in the run directory (--resume it)", 130)
    fail_if_nothing_evaluated(summaries)


def fail_if_nothing_evaluated(summaries: list[RunSummary]) -> None:
    """Exit 1, one line, where attempts were made and no task got a single candidate to evaluate (a run in which
    every LLM call failed exited 0)."""
    made = [s for s in summaries if s.attempts > 0]
    if made and all(s.nothing_evaluated for s in made):
        attempts = sum(s.attempts for s in made)
        fail(f"no candidate was evaluated: all {attempts} attempt(s) failed before evaluation (the LLM calls failed "
             f"or the replies held no code; their errors are in the run's attempts, {made[0].run_dir})", 1)


def reporter_for(quiet: bool) -> Reporter:
    if quiet:
        return QuietReporter()
    from stark_ray.cli.progress import RichReporter

    return RichReporter(err)


def run_on_ray(run: RayRun, reporter: Reporter, instead: Callable[[], None] | None = None) -> None:
    """The run on Ray; ``instead``: what runs it where a private local Ray cannot start (said in one line)."""
    from rich.markup import escape

    from stark_ray.eval.service import EvaluatorError
    from stark_ray.eval.tasks import TaskError
    from stark_ray.llm.base import LLMError
    from stark_ray.run.directory import RayUnavailable, RunError
    from stark_ray.run.ray_driver import run_ray

    signal.signal(signal.SIGTERM, interrupt)
    started: list[object] = []  # the run directory, once it exists
    try:
        try:
            summaries = run_ray(run, reporter, on_started=started.append)
        finally:
            reporter.close()
    except RayUnavailable as e:
        if instead is None:
            fail(str(e))
        err.print(f"{escape(str(e))}: running with --executor local instead", highlight=False, soft_wrap=True)
        instead()
        return
    except (TaskError, EvaluatorError, RunError) as e:
        fail(str(e))
    except LLMError as e:
        fail(f"LLM calls cannot go on ({e.kind}): {e}; what was recorded is kept", 1)
    except KeyboardInterrupt:
        fail("interrupted; everything recorded so far is in the run directory (--resume it)", 130)
    except OSError as e:  # a full disk, a vanished directory, a cluster that cannot be reached
        kept = f"; everything acknowledged so far is recorded: continue with --resume {started[0]}" if started else ""
        fail(f"{type(e).__name__}: {e}{kept}", 1)
    fail_if_nothing_evaluated(summaries)


RESUME_OPTIONS = frozenset({"resume", "budget", "parallel", "stop_at_sol", "address", "quiet", "evaluators",
                            "executor", "max_in_flight"})


def _resume(ctx: typer.Context, resume: str, executor: str, address: str | None, quiet: bool,
            evaluators: int | None = None, max_in_flight: int | None = None) -> None:
    """Continue a run: its task(s) and settings come from its run.json; --budget and --parallel may change
    (see stark_ray/run/resume.py), anything else given is refused; a finished run says so at once. It goes on
    with the executor that made it, or the one --executor names."""
    from stark_ray.cli.places import existing_dir
    from stark_ray.llm.base import ConfigError
    from stark_ray.llm.factory import check_credentials, check_provider, make_client
    from stark_ray.run.directory import RunError
    from stark_ray.run.ray_driver import RayRun
    from stark_ray.run.resume import refuse_changes, resumed

    given = given_options(ctx)
    run_dir = existing_dir(resume, "--resume", "run directory")
    try:
        refuse_changes(["TASK" if g in ("task", "ref_path") else spelled(ctx, g)
                        for g in given if g not in RESUME_OPTIONS])
        run = resumed(run_dir, ctx.params["budget"] if "budget" in given else None,
                      ctx.params["parallel"] if "parallel" in given else None,
                      ctx.params["stop_at_sol"] if "stop_at_sol" in given else None)
        if run.finished:
            typer.echo(run.finished_line(run_dir))
            return
        check_names(run.search, run.eval)
        check_credentials(run.agents)
        check_provider(run.agents)  # one cheap request, before any work
        if "executor" not in given:
            executor = run.executor  # the one that made it, unless told otherwise
        if executor == "local" and (len(run.tasks) > 1 or run.search.parallel > 1):
            raise RunError("the local executor runs one task, one expansion at a time: resume this run with "
                           "--executor ray")
        client = make_client(run.agents) if executor == "local" else None
    except (RunError, ConfigError, ValueError, TypeError) as e:
        fail(f"--resume {run_dir}: {e}")
    if client is not None:
        run_locally(run.tasks[0], client, run.search, run.agents, run.eval, run_dir.parent, reporter_for(quiet),
                     run_dir)
        return
    run_on_ray(RayRun(run.tasks, run.search, run.agents, run.eval, run_dir.parent, resume=run_dir,
                       address=address, evaluators=evaluators, max_in_flight=max_in_flight), reporter_for(quiet))


class QuietReporter:
    def phase(self, *args: object) -> None: ...
    def start(self, *args: object) -> None: ...
    def attempt(self, *args: object) -> None: ...
    def status(self, *args: object) -> None: ...
    def close(self) -> None: ...

    def finish(self, summary: RunSummary) -> None:
        from stark_ray.cli.progress import replay_note

        speedup = "none" if summary.best_speedup is None else f"{summary.best_speedup:.3f}x"
        odd = replay_note(summary.replay_mismatches)
        typer.echo(f"{summary.task}: {summary.status}, {summary.attempts} attempts, best speedup {speedup}{odd}, "
                   f"results in {summary.run_dir}")


def _one_task(task: Path | None, ref_path: Path | None) -> Path:
    if task is not None and ref_path is not None and task != ref_path:
        fail("give the task once: either TASK or --ref-path")
    path = task or ref_path
    if path is None:
        fail("no task given: stark optimize TASK.py (or --ref-path TASK.py)")
    return path


