"""The ``stark`` application that every command registers on, and what the commands share: one error line and
an exit status for a user's mistake (never a traceback), the options a user gave, a stop signal as Ctrl-C."""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="STARK on Ray: LLM agents that search for faster GPU kernels.")
err = Console(stderr=True)

EXIT_USAGE = 2  # bad task file, bad settings, missing key


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


def spelled(ctx: typer.Context, name: str) -> str:
    """Parameter ``name`` of the command as a user spells it: its first long flag (``--timeout`` for ``timeout_s``)."""
    for param in ctx.command.params:
        if param.name == name and param.opts:
            return next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return "--" + name.replace("_", "-")


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
