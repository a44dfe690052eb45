"""The ``stark`` application that every command registers on, and what the commands share: one error line and
an exit status for a user's mistake (never a traceback), the options a user gave, a stop signal as Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.backends import available_backends

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="STARK on Ray: LLM agents that search for faster GPU kernels.")
err = Console(stderr=True)

EXIT_USAGE = 2  # bad task file, bad settings, missing key
# the settings' defaults, which the commands' options take and their help shows: defined once, in config.py
SEARCH, AGENTS, EVAL = SearchConfig(), AgentConfig(), EvalConfig()

# The evaluator's options, as `stark optimize` and `stark eval` both take them (defaults: EVAL's fields)
Backend = Annotated[str, typer.Option(help=f"Candidate format: {' | '.join(available_backends())}")]
Trials = Annotated[int, typer.Option(help="Correctness trials with fresh inputs.")]
Baseline = Annotated[str, typer.Option(help="eager | compile (also time torch.compile(reference)).")]
Profile = Annotated[str, typer.Option(
    help="none | ncu (each accepted candidate's top kernel counted by Nsight Compute, on a GPU where it can).")]
Tolerance = Annotated[str, typer.Option(help="default (per dtype) | kernelbench (atol=rtol=1e-2).")]
BuildDir = Annotated[Path | None, typer.Option(help="Build cache (default ~/.cache/stark-ray/build).")]
Isolate = Annotated[str, typer.Option(help="auto | on | off: generated code in namespaces of its own, no other "
                                           "process visible, no network (auto: where the host allows it; on: an "
                                           "error where it does not).")]
CompileTimeout = Annotated[float, typer.Option(help="Seconds one candidate's build may take (a busy host's builds "
                                                    "can take minutes).")]
MemoryBudget = Annotated[float | None, typer.Option(
    help="Device memory (GB) for one evaluation, judge and worker together (default: 90% of the GPU's free memory); "
         "what is kept is chosen to fit, a task that cannot is one line.", show_default=False)]


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def show_version(value: bool) -> None:
    if value:
        from stark_ray import __version__

        typer.echo(f"stark-ray {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=show_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """STARK on Ray: LLM agents that search for faster GPU kernels."""


def given_options(ctx: typer.Context) -> list[str]:
    """The parameters the user set on the command line (or through the environment), not left at their default."""
    sources = {name: ctx.get_parameter_source(name) for name in ctx.params}  # Typer's own click: compare names
    return [name for name, source in sources.items()
            if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")]


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def plain_flags(command: Any) -> Any:
    """``command`` (a click command or group, as typer builds it) with its flags shown bare in the help: typer writes
    ``<bool>`` beside ``--quiet`` and ``--help``, which take no value. Returns ``command``."""
    import click

    help_option = command.get_help_option(click.Context(command))
    for param in [*command.params, help_option]:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        plain_flags(sub)
    return command
