"""Streaming Parquet part files: rows are buffered and written as complete files, never partial ones.

Each flush writes ``<root>/<table>/<task>/part-<NNNNNN>-<token>.parquet`` under a temporary name
(``.part-<NNNNNN>-<token>.parquet.tmp``) and then moves it into place, so a process killed at any moment leaves
only whole part files behind (and perhaps a temporary file, which readers never match). ``NNNNNN`` continues
after the highest number already in the directory and ``<token>`` is random per writer, so a later process
(a resume) or a concurrent one never overwrites an earlier file.

The root is a local path or a URI that ``pyarrow.fs`` understands (``file:///...``, ``s3://bucket/prefix``,
...). Local directories take a fast path (``os.replace``, optional ``fsync`` of the file and its directory);
object stores (S3, GCS) write the object in place (it appears only once complete), other filesystems write the
temporary file and ``move`` it into place.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from stark_ray.store.location import Location, locate, writes_whole

PART_RE = re.compile(r"^part-(\d+)-[0-9a-f]+(-c)?\.parquet$")  # "-c": a compacted file (store/parts.py)


def safe_name(name: str) -> str:
    """A task name as a directory name (no separators, no '=' so readers do not mistake it for a partition)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "task"


def part_names(loc: Location) -> list[str]:
    """Names of the complete part files directly in ``loc`` (temporary files excluded); [] when it is absent."""
    if loc.fs is None:
        try:
            names = os.listdir(loc.path)
        except FileNotFoundError:
            return []
    else:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
        names = [i.base_name for i in infos if i.type == pafs.FileType.File]
    return sorted(n for n in names if PART_RE.match(n))


def next_part_number(loc: Location) -> int:
    """The number a new part file in ``loc`` takes: one past the highest there (0 in an empty directory)."""
    return max((int(m.group(1)) for n in part_names(loc) if (m := PART_RE.match(n))), default=-1) + 1


class PartWriter:
    """Append rows of one table for one task; thread-safe.

    A flush happens when ``flush_rows`` rows are buffered (in the appending thread), when :meth:`flush_if_due`
    finds rows waiting ``flush_s`` seconds or more (call it from a timer thread: an append never writes because
    of time, so a caller on an event loop is not held up by a write it did not ask for), on :meth:`flush` and on
    :meth:`close`. Files are written one at a time, in order, so the rows on disk are always a prefix of the
    rows appended. ``fsync`` (local only) makes each file and its rename durable against power loss; a killed
    process never leaves a partial part file either way.
    """

    def __init__(self, root: str | Path | Location, table: str, task: str, schema: pa.Schema,
                 flush_rows: int = 64, flush_s: float = 10.0, fsync: bool = True,
                 filesystem: pafs.FileSystem | None = None) -> None:
        self.loc = locate(root, filesystem).join(table, safe_name(task))
        if self.loc.fs is None:
            Path(self.loc.path).mkdir(parents=True, exist_ok=True)
        else:
            self.loc.fs.create_dir(self.loc.path, recursive=True)
        self.schema, self.flush_rows, self.flush_s, self.fsync = schema, flush_rows, flush_s, fsync
        self._rows: list[dict[str, Any]] = []
        self._last = time.monotonic()
        self._lock = threading.Lock()  # the buffer and counters
        self._io = threading.Lock()  # one file at a time, in order
        self._token = uuid.uuid4().hex[:8]
        self._seq = next_part_number(self.loc)
        self.rows_written = 0

    @property
    def dir(self) -> Path | str:
        """The task's directory: a Path when local, else the path inside the filesystem."""
        return Path(self.loc.path) if self.loc.fs is None else self.loc.path

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._rows)

    def append(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._rows.append({name: row.get(name) for name in self.schema.names})
            due = len(self._rows) >= self.flush_rows
        if due:
            self.flush()

    def due(self) -> bool:
        """Rows are waiting and ``flush_s`` seconds have passed since the last flush."""
        with self._lock:
            return bool(self._rows) and time.monotonic() - self._last >= self.flush_s

    def flush_if_due(self) -> Path | str | None:
        """Flush when :meth:`due`."""
        return self.flush() if self.due() else None

    def flush(self) -> Path | str | None:
        """Write the buffered rows as one part file; returns its path (None when nothing was buffered). When the
        write fails the rows stay buffered for the next flush and the error propagates."""
        with self._io:
            with self._lock:
                rows, self._rows = self._rows, []
                self._last = time.monotonic()
                if not rows:
                    return None
                seq, self._seq = self._seq, self._seq + 1
            name = f"part-{seq:06d}-{self._token}.parquet"
            try:
                table = pa.Table.from_pylist(rows, schema=self.schema)
                final = write_part(self.loc, name, table, self.fsync)
            except BaseException:
                with self._lock:  # keep the rows for the next flush, under the same name: should the failed
                    self._rows[:0] = rows  # write have landed after all (an object store's timeout), the
                    self._seq = seq  # retry replaces it instead of writing its rows a second time
                raise
            with self._lock:
                self.rows_written += len(rows)
            return final

    def close(self) -> None:
        self.flush()


def _place(directory: Location, name: str, write: Callable[[Any], None], fsync: bool) -> Path | str:
    """The part file ``directory/name`` that ``write(sink)`` makes, whole or not at all: locally under a temporary
    name, then renamed (with ``fsync``: the file and the rename made durable); on an object store in place (an
    object appears once its stream is closed); elsewhere a temporary file moved into place. Returns its path."""
    if directory.fs is None:
        final = Path(directory.path) / name
        tmp = final.with_name(f".{name}.tmp")
        try:
            write(str(tmp))
            if fsync:
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if fsync:
            _fsync_dir(final.parent)
        return final
    target = directory.join(name)
    whole = writes_whole(directory.fs)
    staged = target.path if whole else directory.join(f".{name}.tmp").path
    try:
        with directory.fs.open_output_stream(staged) as out:
            write(out)
        if not whole:
            directory.fs.move(staged, target.path)
    except BaseException:
        with contextlib.suppress(OSError):
            directory.fs.delete_file(staged)
        raise
    return target.path


def write_part_from(directory: Location, name: str, schema: pa.Schema, tables: Iterable[pa.Table],
                    fsync: bool = True) -> int:
    """The tables, one after another, as the part file ``directory/name`` of ``schema``, whole or not at all (as
    :func:`write_part`), holding one of them in memory at a time; the rows written."""
    rows = 0

    def write_all(sink: Any) -> None:
        nonlocal rows
        with pq.ParquetWriter(sink, schema) as writer:
            for table in tables:
                writer.write_table(table.cast(schema))
                rows += table.num_rows

    _place(directory, name, write_all, fsync)
    return rows


def write_part(directory: Location, name: str, table: pa.Table, fsync: bool = True) -> Path | str:
    """``table`` as the part file ``directory/name``, whole or not at all (:func:`_place`). Returns its path."""
    return _place(directory, name, lambda sink: pq.write_table(table, sink), fsync)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not supported here (e.g. some platforms); the file itself was synced
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
