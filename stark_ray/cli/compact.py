"""``stark compact``: rewrite a run's many small Parquet part files as a few large ones (store/compact.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from stark_ray.cli.app import app, fail


@app.command("compact")
def compact(
    run_dir: Annotated[str, typer.Argument(metavar="DIR", help="A run directory, or a directory of run "
                                                               "directories (each compacted); a path or a URI.",
                                           show_default=False)],
) -> None:
    """Rewrite a run's Parquet part files as a few large files: the same rows, read much faster. Safe while the run
    is being read, or written (new rows go on to new files); a finished campaign does it by itself."""
    from stark_ray.analysis.views import run_dirs
    from stark_ray.store.compact import compact_run

    try:
        runs = run_dirs(run_dir)
    except (OSError, ValueError, NotImplementedError) as e:
        fail(str(e))
    for run in runs:
        try:
            done = compact_run(run)
        except OSError as e:
            fail(f"{run}: compaction stopped ({e}); nothing is lost, run it again to finish")
        typer.echo(f"{run}: {done.describe()}")
