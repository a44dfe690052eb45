"""One run's results store: every attempt and every LLM call becomes a Parquet row as soon as it finishes.

Rows go to ``<root>/<run_id>/attempts/<task>/part-*.parquet`` and ``<root>/<run_id>/llm_calls/<task>/...``,
one :class:`~stark_ray.store.parquet.PartWriter` per (table, task). A row is the record of
:mod:`stark_ray.records` plus ``run_id``, ``task`` and ``seq`` (the node's id): :func:`attempt_row` and
:func:`llm_call_rows` make them. Buffered rows are written every ``flush_rows`` rows, and a background thread
writes rows that waited ``flush_s`` seconds even when no new row arrives. No Ray here.

An attempt's row never reaches the disk before its LLM calls' rows: :meth:`RunStore.record` buffers the calls before
the attempt, and every flush of a task's attempts (by count, by time, on demand) writes its calls first. A process
killed at any moment leaves every attempt on disk with all of its call rows (calls of an attempt not yet written
may be there without it: their spend was real). Before, the two tables were flushed each on its own: a driver kill
at 50% of a 250-task campaign left 2-8 attempts without their call rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from stark_ray.records import LLMUsage, Node, attempt_schema, llm_call_schema
from stark_ray.store.location import Location, locate
from stark_ray.store.parquet import PartWriter, safe_name

log = logging.getLogger(__name__)

ATTEMPTS, LLM_CALLS = "attempts", "llm_calls"
FLUSH_THREADS = 16


def schemas() -> dict[str, pa.Schema]:
    """The store's tables and their Arrow schemas (from the one record definition)."""
    return {ATTEMPTS: attempt_schema(), LLM_CALLS: llm_call_schema()}


def attempt_row(run_id: str, task: str, node: Node) -> dict[str, Any]:
    """The attempts row of a node: its record, with ``seq`` = the node's id and ``recorded_at`` = now."""
    return {"run_id": run_id, "task": task, "seq": node.id, "recorded_at": datetime.now(timezone.utc),
            **node.to_record()}


def llm_call_rows(run_id: str, task: str, seq: int, usage: Iterable[LLMUsage]) -> list[dict[str, Any]]:
    """The llm_calls rows of the calls that produced node ``seq``; a call's ``node_id``, when unset, is ``seq``
    (the usage objects themselves are left unchanged)."""
    rows = []
    for u in usage:
        rec = u.to_record()
        if rec["node_id"] is None:
            rec["node_id"] = seq
        rows.append({"run_id": run_id, "task": task, "seq": seq, **rec})
    return rows


class RunStore:
    """The Parquet rows of one run, thread-safe. Use it as a context manager or call :meth:`close`.

    ``root`` is a local directory or a ``pyarrow.fs`` URI (``file:///...``, ``s3://...``), or a path inside
    ``filesystem`` when one is given; the run's directory is ``<root>/<run_id>``. With ``background`` a daemon
    thread flushes, about every ``flush_s / 4`` seconds, the rows that have waited ``flush_s`` seconds.
    A second store on the same root and run (a resume) adds new part files and never touches the old ones.
    """

    def __init__(self, root: str | Path | Location, run_id: str, flush_rows: int = 64, flush_s: float = 2.0,
                 background: bool = True, fsync: bool = True, filesystem: pafs.FileSystem | None = None) -> None:
        if not run_id or safe_name(run_id) != run_id:
            raise ValueError(f"run_id {run_id!r} is not a plain directory name (letters, digits, '.', '_', '-')")
        if flush_rows < 1 or flush_s <= 0:
            raise ValueError(f"flush_rows must be >= 1 and flush_s > 0 (got {flush_rows}, {flush_s})")
        self.run_id = run_id
        self.loc = locate(root, filesystem).join(run_id)
        self.flush_rows, self.flush_s, self.fsync = flush_rows, flush_s, fsync
        self._schemas = schemas()
        self._writers: dict[tuple[str, str], PartWriter] = {}
        self._seqs: dict[str, set[int]] = {}
        self._lock = threading.Condition()
        self._inflight = 0  # record calls between their check and their append
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None  # remote filesystems: concurrent part-file writes
        self._pool_shut = False
        if background:
            self._thread = threading.Thread(target=self._flush_loop, name=f"run-store-{run_id}", daemon=True)
            self._thread.start()

    @property
    def run_dir(self) -> Location:
        """The run's directory (``str()`` of it is a local path or a URI)."""
        return self.loc

    # --- recording -------------------------------------------------------------------------------------------
    def record_attempt(self, task: str, row: dict[str, Any]) -> None:
        """One attempts row (see :func:`attempt_row`). A seq this store already recorded for the task is refused:
        a node is written once."""
        row = self._checked(ATTEMPTS, task, row)
        seq = int(row["seq"])
        with self._lock:
            self._open()
            seen = self._seqs.setdefault(task, set())
            if seq in seen:
                raise ValueError(f"task {task!r}: attempt seq {seq} was already recorded by this store")
            writer = self._enter(ATTEMPTS, task)
            seen.add(seq)
        try:
            writer.append(row)
            if writer.pending >= self.flush_rows:  # its calls first (the writer itself never flushes by count)
                self._flush_task(task)
        finally:
            self._leave()

    def record_calls(self, task: str, rows: Iterable[dict[str, Any]]) -> None:
        """llm_calls rows (see :func:`llm_call_rows`)."""
        checked = [self._checked(LLM_CALLS, task, r) for r in rows]
        if not checked:
            return
        with self._lock:
            self._open()
            writer = self._enter(LLM_CALLS, task)
        try:
            for r in checked:
                writer.append(r)
        finally:
            self._leave()

    def record_node(self, task: str, node: Node) -> None:
        """A node without LLM calls (the reference)."""
        self.record_attempt(task, attempt_row(self.run_id, task, node))

    def record(self, task: str, node: Node, usage: Iterable[LLMUsage]) -> None:
        """A node and the LLM calls that produced it: the calls first (see the module's doc)."""
        self.record_calls(task, llm_call_rows(self.run_id, task, node.id, usage))
        self.record_attempt(task, attempt_row(self.run_id, task, node))

    # --- flushing and closing --------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every buffered row now. On a remote filesystem (an object store: each file is a request of tens
        of milliseconds) the part files of different (table, task) writers are written at once, by up to
        ``FLUSH_THREADS`` threads; locally one after another. When a write fails the others still happen, its rows
        stay buffered, and the first error is raised."""
        for table in (LLM_CALLS, ATTEMPTS):  # every call row before any attempt row
            self._flush_writers([w for (t, _), w in self._snapshot() if t == table and w.pending])

    def _flush_writers(self, writers: list[PartWriter]) -> None:
        futures = None
        with self._lock:  # submitted under the lock: close() shuts the pool down under it
            if self.loc.fs is not None and len(writers) > 1 and not self._pool_shut:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="stark-flush")
                futures = [self._pool.submit(w.flush) for w in writers]
        if futures is None:
            for writer in writers:
                writer.flush()
            return
        errors = [e for f in futures if (e := f.exception()) is not None]
        if errors:
            raise errors[0]

    def _flush_task(self, task: str) -> None:
        """One task's call rows, then its attempt rows."""
        with self._lock:
            calls, attempts = self._writers.get((LLM_CALLS, task)), self._writers.get((ATTEMPTS, task))
        if calls is not None:
            calls.flush()
        if attempts is not None:
            attempts.flush()

    def close(self) -> None:
        """Stop the flush thread and write what is buffered; later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.wait_for(lambda: self._inflight == 0)  # rows being appended right now are flushed too
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.flush()
        finally:
            with self._lock:
                self._pool_shut, pool = True, self._pool  # later flushes write one file after another
            if pool is not None:
                pool.shutdown()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def rows_written(self) -> dict[tuple[str, str], int]:
        """Rows on disk so far, per (table, task)."""
        with self._lock:
            return {key: w.rows_written for key, w in self._writers.items()}

    # --- internals ---------------------------------------------------------------------------------------
    def _checked(self, table: str, task: str, row: dict[str, Any]) -> dict[str, Any]:
        names = self._schemas[table].names
        unknown = sorted(set(row) - set(names))
        if unknown:
            raise ValueError(f"{table} row for task {task!r} has fields not in the schema: {unknown}")
        for key, want in (("run_id", self.run_id), ("task", task)):
            if row.get(key, want) != want:
                raise ValueError(f"{table} row has {key}={row[key]!r}, this store writes {key}={want!r}")
        if row.get("seq") is None:
            raise ValueError(f"{table} row for task {task!r} has no seq")
        return {**row, "run_id": self.run_id, "task": task}

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError(f"run store {self.run_id!r} is closed")

    def _enter(self, table: str, task: str) -> PartWriter:
        """The writer for (table, task), counted as in use until :meth:`_leave`; call with the lock held."""
        writer = self._writer(table, task)
        self._inflight += 1
        return writer

    def _leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._lock.notify_all()

    def _writer(self, table: str, task: str) -> PartWriter:
        key = (table, task)
        writer = self._writers.get(key)
        if writer is None:  # an attempts writer never flushes by count itself: record_attempt does, calls first
            rows = self.flush_rows if table == LLM_CALLS else 1 << 62
            writer = PartWriter(self.loc, table, task, self._schemas[table], flush_rows=rows,
                                flush_s=self.flush_s, fsync=self.fsync)
            self._writers[key] = writer
        return writer

    def _snapshot(self) -> list[tuple[tuple[str, str], PartWriter]]:
        with self._lock:
            return list(self._writers.items())

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.flush_s / 4):
            for (table, task), writer in self._snapshot():
                try:
                    if table == LLM_CALLS:
                        writer.flush_if_due()
                    elif writer.due():
                        self._flush_task(task)  # its calls first
                except Exception:  # the rows stay buffered; the next tick or close() tries again
                    log.exception("run store %s: a timed flush failed", self.run_id)
