"""``stark doctor``: the toolchain, the GPU and the keys this project needs, one line each."""

from __future__ import annotations

from typing import Annotated

import typer

from stark_ray.cli.app import app, fail
from stark_ray.eval.backends import available_backends


@app.command()
def doctor(
    backend: Annotated[str | None, typer.Option(help="Check what this backend needs: "
                                                     f"{' | '.join(available_backends())} (default: cuda when a GPU "
                                                     "is visible, else cpu_cpp).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as a JSON list.")] = False,
) -> None:
    """Check the toolchain, the GPU and the keys this project needs; exit 1 when the backend lacks something."""
    import json
    from dataclasses import asdict

    from stark_ray.doctor import diagnose

    if backend is not None and backend not in available_backends():
        fail(f"unknown backend {backend!r}; choose one of {', '.join(available_backends())}")
    report = diagnose(backend)
    if as_json:
        typer.echo(json.dumps([asdict(c) for c in report.checks]))
    else:
        typer.echo(report.text())
    raise typer.Exit(0 if report.ready else 1)
