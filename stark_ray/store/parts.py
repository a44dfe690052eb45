"""Which part files of a table hold its rows, and reading them as one Arrow table.

A table's rows are in ``<run>/<table>/<dir>/part-*.parquet``: ``<dir>`` is a task's directory (what its writers
append, :mod:`stark_ray.store.parquet`) or ``_compacted`` (a run's compacted files; ``safe_name`` never makes a
task directory that starts with ``_``). A *compacted* file (``part-<N>-<token>-c.parquet``, in either
place) names, in its Parquet metadata, the part files whose rows it holds (:data:`REPLACES_KEY`, paths relative to
the table's directory). The *live* part files are all complete part files but the ones a compacted file replaces:
every reader reads those, so each row is read once whether a compaction has not begun, is under way, or stopped
between writing its file and deleting the ones it replaces (:mod:`stark_ray.store.compact`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from stark_ray.records import RENAMED_COLUMNS
from stark_ray.store.location import Location
from stark_ray.store.parquet import PART_RE

COMPACTED_DIR = "_compacted"
REPLACES_KEY = b"stark_ray.replaces"
READ_TRIES = 3  # a part file deleted between listing and reading (a compaction finishing): list again
log = logging.getLogger(__name__)


def is_compacted(name: str) -> bool:
    m = PART_RE.match(name)
    return bool(m and m.group(2))


def part_files(table_loc: Location, only: Collection[str] | None = None) -> dict[str, str]:
    """Every complete part file one directory below ``table_loc`` (or below the directories named in ``only``):
    {``<dir>/<name>``: its path (local, or inside the filesystem)}, sorted."""
    found: dict[str, str] = {}
    if table_loc.fs is None:
        root = Path(table_loc.path)
        try:
            dirs = sorted(d for d in root.iterdir() if d.is_dir()) if only is None else sorted(
                root / name for name in only if (root / name).is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return {}
        for d in dirs:
            try:
                names = sorted(n.name for n in d.iterdir())
            except FileNotFoundError:
                continue
            found.update({f"{d.name}/{n}": str(d / n) for n in names if PART_RE.match(n)})
        return found
    base = table_loc.path.rstrip("/") + "/"
    infos = table_loc.fs.get_file_info(pafs.FileSelector(table_loc.path, recursive=True, allow_not_found=True))
    for i in sorted(infos, key=lambda i: i.path):
        rel = i.path[len(base):] if i.path.startswith(base) else ""
        if (i.type == pafs.FileType.File and rel.count("/") == 1 and PART_RE.match(i.base_name)
                and (only is None or rel.partition("/")[0] in only)):
            found[rel] = i.path
    return found


def replaces(path: str, fs: pafs.FileSystem | None) -> list[str]:
    """The part files (relative to the table's directory) a compacted file holds the rows of."""
    meta = pq.read_metadata(path, filesystem=fs).metadata or {}
    return list(json.loads(meta.get(REPLACES_KEY, b"[]")))


def live_parts(table_loc: Location) -> dict[str, str]:
    """:func:`part_files` less those a compacted file replaces."""
    files = part_files(table_loc)
    gone: set[str] = set()
    for rel, path in files.items():
        if is_compacted(rel.rpartition("/")[2]):
            try:
                gone.update(replaces(path, table_loc.fs))
            except FileNotFoundError:
                continue  # replaced and deleted meanwhile by a later compaction
    return {rel: path for rel, path in files.items() if rel not in gone}


def read_parts(paths: list[str], table: str, schema: pa.Schema, filesystem: pafs.FileSystem | None,
               columns: list[str] | None = None, task: str | None = None) -> pa.Table:
    """The part files as one table of ``schema``'s columns (or ``columns``): nulls where a file lacks one, its old
    name's values for a renamed one (``records.RENAMED_COLUMNS``)."""
    if not paths:
        return schema.empty_table().select(columns or schema.names)
    renamed = {new: old for new, old in RENAMED_COLUMNS.get(table, {}).items() if columns is None or new in columns}
    full = pa.schema([*schema, *(pa.field(old, schema.field(new).type) for new, old in renamed.items())])
    wanted = None if columns is None else [*columns, *renamed.values()]
    data = ds.dataset(paths, schema=full, format="parquet", filesystem=filesystem).to_table(
        columns=wanted, filter=None if task is None else ds.field("task") == task)
    for new, old in renamed.items():
        i = data.schema.get_field_index(new)
        data = data.set_column(i, new, pc.coalesce(data[new], data[old]))
        data = data.drop_columns([old])
    return data


def read_live(table_loc: Location, table: str, schema: pa.Schema, columns: list[str] | None = None,
              task: str | None = None) -> pa.Table:
    """The live part files of a table, read as one (listed again should a compaction delete one meanwhile)."""
    for attempt in range(READ_TRIES):
        paths = list(live_parts(table_loc).values())
        try:
            return read_parts(paths, table, schema, table_loc.fs, columns, task)
        except OSError as e:  # FileNotFoundError, or pyarrow's error for a file that went away
            if attempt + 1 == READ_TRIES or not _vanished(paths, table_loc.fs):
                raise
            log.debug("a part file went away while reading (a compaction): listing again (%s)", e)
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _vanished(paths: list[str], fs: pafs.FileSystem | None) -> bool:
    if fs is None:
        return any(not Path(p).exists() for p in paths)
    return any(i.type == pafs.FileType.NotFound for i in fs.get_file_info(paths))
