"""Reading a run back: its rows, each task's search tree rebuilt, and DuckDB views for analysis.

Only the live part files are read: the complete ``<run_dir>/<table>/*/part-*.parquet`` but those a compacted
file replaces (:mod:`stark_ray.store.parts`; temporary ``.part-*.tmp`` files never match). :func:`attempt_rows`,
:func:`call_rows` and :func:`rebuild` read them with ``pyarrow.dataset`` (what a resume needs, without DuckDB); a
column a file lacks (written by an older version) reads as null, or as its old name's values where it was renamed
(``records.RENAMED_COLUMNS``). ``connect(run_dir)`` gives DuckDB views ``attempts`` and ``llm_calls`` over the files
live when it connects. A table without files yet is an empty view with the schema's columns. Local directories
(and ``file://`` URIs) are read by DuckDB itself; on other filesystems the part files are read once through
``pyarrow.dataset`` and registered.

``load_trees`` rebuilds each task's :class:`Tree` for ``--resume`` (:func:`recorded_attempts` only counts them,
from two columns). A (task, seq) written twice is an error
(:class:`StoreError`); a gap in a task's seqs (a row lost because its process died before flushing it) keeps
the longest complete prefix ``0..k``: :func:`rebuild` returns the dropped seqs, :func:`load_trees` logs them.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from stark_ray.records import RENAMED_COLUMNS
from stark_ray.search.tree import Tree
from stark_ray.store.location import Location, locate
from stark_ray.store.parts import live_parts, read_live
from stark_ray.store.run_store import ATTEMPTS, LLM_CALLS, schemas

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)


class StoreError(Exception):
    """The stored rows of a run are inconsistent (a node written twice, rows that do not form a tree)."""


@dataclass
class Rebuilt:
    """The trees of a run, and per task the seqs left out after a gap (absent when none were)."""

    trees: dict[str, Tree]
    dropped: dict[str, list[int]] = field(default_factory=dict)


def connect(run_dir: str | Path | Location, filesystem: pafs.FileSystem | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with views ``attempts`` and ``llm_calls`` over the run's part files.
    ``run_dir`` is a local path, a ``pyarrow.fs`` URI, or a path inside ``filesystem``."""
    import duckdb

    loc = locate(run_dir, filesystem)
    _require_dir(loc)
    con = duckdb.connect()
    try:
        for table, schema in schemas().items():
            _create_view(con, loc.join(table), table, schema)
    except BaseException:
        con.close()
        raise
    return con


def attempt_rows(run_dir: str | Path | Location, task: str | None = None,
                 filesystem: pafs.FileSystem | None = None) -> list[dict[str, Any]]:
    """The attempts rows (of one task, or all), ordered by task, then seq."""
    return _rows(run_dir, ATTEMPTS, task, filesystem)


def call_rows(run_dir: str | Path | Location, task: str | None = None,
              filesystem: pafs.FileSystem | None = None) -> list[dict[str, Any]]:
    """The llm_calls rows (of one task, or all), ordered by task, then seq."""
    return _rows(run_dir, LLM_CALLS, task, filesystem)


def recorded_attempts(run_dir: str | Path | Location, filesystem: pafs.FileSystem | None = None) -> dict[str, int]:
    """Per task, the attempts a resume continues from, as :func:`rebuild`'s tree counts them (``evaluated``: the
    longest complete prefix of seqs ``0..k`` less the reference's row; a task without seq 0 is absent), read from
    the ``task`` and ``seq`` columns alone: what a resume needs to know before the memory rebuilds the trees.
    StoreError when a (task, seq) was written twice."""
    table = _table(locate(run_dir, filesystem), ATTEMPTS, None, columns=["task", "seq"])
    keys = list(zip(table.column("task").to_pylist(), table.column("seq").to_pylist(), strict=True))
    _refuse_duplicates(keys)
    seqs: dict[str, set[int]] = {}
    for task, seq in keys:
        seqs.setdefault(task, set()).add(seq)
    counts: dict[str, int] = {}
    for task, present in seqs.items():
        k = 0
        while k in present:
            k += 1
        if k:
            counts[task] = k - 1
    return counts


def task_names(run_dir: str | Path | Location, filesystem: pafs.FileSystem | None = None) -> list[str]:
    """The tasks that have attempts rows, sorted."""
    table = _table(locate(run_dir, filesystem), ATTEMPTS, None, columns=["task"])
    return sorted(set(table.column("task").to_pylist()))


def rebuild(run_dir: str | Path | Location, filesystem: pafs.FileSystem | None = None) -> Rebuilt:
    """Every task's tree from its attempts rows. Raises :class:`StoreError` when a (task, seq) appears more than
    once, when a row's node_id is not its seq, or when the rows do not form a tree. After a gap in a task's seqs
    only the prefix ``0..k`` is kept and the rest is reported in ``dropped``; a task without seq 0 gets no tree."""
    rows = attempt_rows(run_dir, filesystem=filesystem)
    _refuse_duplicates([(r["task"], r["seq"]) for r in rows])
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rows:  # ordered by task, seq
        by_task.setdefault(r["task"], []).append(r)
    out = Rebuilt(trees={})
    for task, task_rows in by_task.items():
        k = 0
        while k < len(task_rows) and task_rows[k]["seq"] == k:
            k += 1
        if k < len(task_rows):
            out.dropped[task] = [r["seq"] for r in task_rows[k:]]
        if k:
            out.trees[task] = _tree(task, task_rows[:k])
    return out


def load_trees(run_dir: str | Path | Location, filesystem: pafs.FileSystem | None = None) -> dict[str, Tree]:
    """:func:`rebuild`'s trees; the seqs dropped after a gap are logged as a warning (use :func:`rebuild` to get
    them as data)."""
    result = rebuild(run_dir, filesystem)
    for task, seqs in result.dropped.items():
        kept = len(result.trees[task]) if task in result.trees else 0
        log.warning("run %s, task %r: seq %d is missing; kept seqs 0..%d, dropped %s", run_dir, task, kept,
                    kept - 1, seqs)
    return result.trees


# --- internals ---------------------------------------------------------------------------------------------
def _require_dir(loc: Location) -> None:
    if not loc.is_dir():
        raise FileNotFoundError(f"no run directory at {loc}")


def _create_view(con: duckdb.DuckDBPyConnection, table_loc: Location, table: str, schema: pa.Schema) -> None:
    """The view of a table's live part files as listed now (a compaction meanwhile changes which files hold the
    rows, not the rows: connect again to see rows written later)."""
    columns = ", ".join(f'"{n}"' for n in schema.names)
    paths = list(live_parts(table_loc).values())
    if table_loc.fs is None and paths:
        files = "[" + ", ".join(_sql_string(p) for p in paths) + "]"
        source = f"read_parquet({files}, union_by_name = true, hive_partitioning = false)"
        present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        columns = ", ".join(_column_sql(f, present, RENAMED_COLUMNS.get(table, {}).get(f.name)) for f in schema)
        con.execute(f"CREATE VIEW {table} AS SELECT {columns} FROM {source}")
        return
    data = read_live(table_loc, table, schema) if paths else schema.empty_table()
    con.register(f"_arrow_{table}", data)
    con.execute(f"CREATE VIEW {table} AS SELECT {columns} FROM _arrow_{table}")


def _column_sql(f: pa.Field, present: set[str], old: str | None) -> str:
    """A view's column: itself; for a renamed one, its old name's values where a file has only those; NULL in a
    run written before the column existed."""
    if old is not None and old in present:
        return f'coalesce("{f.name}", "{old}") AS "{f.name}"' if f.name in present else f'"{old}" AS "{f.name}"'
    return f'"{f.name}"' if f.name in present else f'CAST(NULL AS {_duck_type(f.type)}) AS "{f.name}"'


def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    return {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}.get(t, "VARCHAR")




def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _rows(run_dir: str | Path | Location, table: str, task: str | None,
          filesystem: pafs.FileSystem | None) -> list[dict[str, Any]]:
    data = _table(locate(run_dir, filesystem), table, task)
    return data.sort_by([("task", "ascending"), ("seq", "ascending")]).to_pylist()


def _table(loc: Location, table: str, task: str | None, columns: list[str] | None = None) -> pa.Table:
    """The live part files of ``table`` as one Arrow table (the schema's columns; nulls where a file lacks one),
    optionally one task's rows only."""
    _require_dir(loc)
    return read_live(loc.join(table), table, schemas()[table], columns, task)


def _refuse_duplicates(keys: list[tuple[str, int]]) -> None:
    counts = Counter(keys)
    twice = sorted((key, n) for key, n in counts.items() if n > 1)
    if twice:
        listed = "; ".join(f"task {task!r} seq {seq} ({n} rows)" for (task, seq), n in twice)
        raise StoreError(f"attempts written more than once: {listed}. A resume must not write a node twice: "
                         "remove the part files of the duplicate writer before resuming")


def _tree(task: str, rows: list[dict[str, Any]]) -> Tree:
    for r in rows:
        if r["node_id"] != r["seq"]:
            raise StoreError(f"task {task!r} seq {r['seq']}: node_id is {r['node_id']}, expected the seq")
    try:
        return Tree.from_records(rows)
    except ValueError as e:
        raise StoreError(f"task {task!r}: the attempts rows do not form a tree: {e}") from e

