"""``stark sql`` and ``stark report``: query a run (or a directory of runs) with DuckDB, and write its report.

Mistakes (a missing directory, bad SQL, an unknown format) end
in one line on stderr starting with ``error:`` and exit status 2.
"""

from __future__ import annotations

import csv
import io
import json
import math
from decimal import Decimal
from typing import Annotated, Any, NoReturn

import typer

from stark_ray.cli.app import app, fail

FORMATS = ("table", "csv", "json")
CELL_LIMIT = 60  # characters of a cell in the table format (csv and json keep everything)
# what analysis/views.py makes (tests/test_analysis.py holds the two together; named here: no duckdb at start-up)
VIEWS = ("attempts", "llm_calls", "judged", "best", "tasks", "runs", "devices")
TREES = 12  # search trees stark report draws by default (analysis/report.py: TREES; a test holds the two together)


@app.command("sql")
def sql(
    run_dir: Annotated[str, typer.Argument(metavar="DIR", help="A run directory, or a directory of run "
                                                               "directories (united); a path or a URI.",
                                           show_default=False)],
    query: Annotated[str, typer.Argument(metavar="QUERY", help=f"SQL over the views {', '.join(VIEWS)}.",
                                         show_default=False)],
    fmt: Annotated[str, typer.Option("--format", "-f", help=" | ".join(FORMATS))] = "table",
) -> None:
    """Run one SQL query over a run's attempts, LLM calls and per-task results, and print the result."""
    import duckdb

    from stark_ray.analysis.views import connect

    if fmt not in FORMATS:
        _fail(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not query.strip():
        _fail("the query is empty")
    try:
        con = connect(run_dir)
    except (OSError, ValueError, NotImplementedError, duckdb.Error) as e:
        _fail(_message(e))
    with con:
        try:
            cur = con.execute(query)
            names = [d[0] for d in cur.description] if cur.description else []
            values = cur.fetchall() if names else []
        except duckdb.Error as e:
            _fail(_message(e))
    typer.echo(_format(names, values, fmt, _terminal_width()), nl=False)


@app.command("report")
def report(
    run_dir: Annotated[str, typer.Argument(metavar="DIR", help="A run directory, or a directory of run "
                                                               "directories; a path or a URI.", show_default=False)],
    out: Annotated[str | None, typer.Option(help="Where report.md and report/*.png go (default: DIR; a path or "
                                                 "a URI).", show_default=False)] = None,
    trees: Annotated[int, typer.Option(help="Draw the search trees of this many tasks (the highest best speedup "
                                            "first; 0: none).", min=0)] = TREES,
) -> None:
    """Write report.md (fast_p, speedups, search statistics per level, per task), PNG plots and pictures of the
    search trees; print the headline numbers."""
    import duckdb

    from stark_ray.analysis.report import generate, headline

    try:
        result = generate(run_dir, out, trees)
    except (OSError, ValueError, NotImplementedError, duckdb.Error) as e:
        _fail(_message(e))
    typer.echo(f"report: {result.path}")
    for line in headline(result.overall):
        typer.echo(line)


# --- internals ---------------------------------------------------------------------------------------------
def _fail(message: str) -> NoReturn:
    fail(message)


def _message(e: BaseException) -> str:
    """One line: DuckDB's message without the caret picture under it, or the exception's text."""
    text = str(e) or type(e).__name__
    kept: list[str] = []
    for line in text.splitlines():
        if line.startswith("LINE ") or (kept and not line.strip()):
            break
        if line.strip():
            kept.append(line.strip())
    return " ".join(kept) or type(e).__name__


def _terminal_width() -> int | None:
    """The terminal's columns when the output goes to one (or ``COLUMNS`` says), else None: a table piped to a
    file or a program is never folded."""
    import os
    import shutil
    import sys

    if not (os.environ.get("COLUMNS") or sys.stdout.isatty()):
        return None
    return shutil.get_terminal_size().columns


def _format(names: list[str], values: list[tuple[Any, ...]], fmt: str, width: int | None = None) -> str:
    if fmt == "json":
        return json.dumps([{n: _plain(v) for n, v in zip(names, row, strict=True)} for row in values],
                          indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if names:
            writer.writerow(names)
        writer.writerows([["" if v is None else _csv_cell(v) for v in row] for row in values])
        return buf.getvalue()
    table = _table(names, values)
    if width is None or max(map(len, table.splitlines()), default=0) <= width:
        return table
    return _records(names, values, width)


def _records(names: list[str], values: list[tuple[Any, ...]], width: int) -> str:
    """A table too wide for the terminal, one row after another as ``column | value`` lines (psql's expanded
    form), each value cut to the terminal's width."""
    pad = max(map(len, names))
    room = max(12, width - pad - 3)
    out: list[str] = []
    for k, row in enumerate(values, 1):
        head = f"-[ row {k} ]"
        out.append(head + "-" * max(0, min(width, pad + 3 + room) - len(head)))
        for name, v in zip(names, row, strict=True):
            text = _text(v)
            out.append(f"{name.ljust(pad)} | {text if len(text) <= room else text[: room - 1] + '…'}")
    out.append(f"({len(values)} row{'s' if len(values) != 1 else ''}, one under another: too wide for the "
               "terminal)")
    return "\n".join(out) + "\n"


def _table(names: list[str], values: list[tuple[Any, ...]]) -> str:
    if not names:
        return "OK\n"
    cells = [[_text(v) for v in row] for row in values]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    numeric = [bool(values) and all(r[i] is None or _is_number(r[i]) for r in values) for i in range(len(names))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric,
                                                                                  strict=True)).rstrip()

    out = [line(names), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    out.append(f"({len(values)} row{'s' if len(values) != 1 else ''})")
    return "\n".join(out) + "\n"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | Decimal) and not isinstance(v, bool)


def _text(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    text = str(v).replace("\r\n", "\n").replace("\n", "\\n").replace("\t", " ")
    return text if len(text) <= CELL_LIMIT else text[: CELL_LIMIT - 1] + "…"


def _csv_cell(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple | dict):
        return json.dumps(_plain(v), ensure_ascii=False)
    return v


def _plain(v: Any) -> Any:
    """A value JSON can hold: non-finite floats become null, lists and structs stay, anything else is text."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float | Decimal):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, bytes):
        return v.hex()
    return str(v)
