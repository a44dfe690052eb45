"""Streaming Parquet part files: rows are buffered and written as complete files, never partial ones.

Each flush writes ``<root>/<table>/<task>/part-<seq>-<token>.parquet`` under a temporary name and renames it
into place, so a process killed at any moment leaves only whole files behind.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def safe_name(name: str) -> str:
    """A task name as a directory name (no separators, no '=' so readers do not mistake it for a partition)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "task"


class PartWriter:
    """Append rows of one table for one task. A flush happens when ``flush_rows`` rows are buffered, when a row
    arrives ``flush_s`` seconds or more after the last flush, and on :meth:`close` (there is no timer)."""

    def __init__(self, root: str | Path, table: str, task: str, schema: pa.Schema,
                 flush_rows: int = 64, flush_s: float = 10.0) -> None:
        self.dir = Path(root) / table / safe_name(task)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schema, self.flush_rows, self.flush_s = schema, flush_rows, flush_s
        self._rows: list[dict[str, Any]] = []
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex[:8]
        self._seq = len(list(self.dir.glob("part-*.parquet")))
        self.rows_written = 0

    def append(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._rows.append({name: row.get(name) for name in self.schema.names})
            due = len(self._rows) >= self.flush_rows or time.monotonic() - self._last >= self.flush_s
        if due:
            self.flush()

    def flush(self) -> Path | None:
        with self._lock:
            rows, self._rows = self._rows, []
            self._last = time.monotonic()
            if not rows:
                return None
            seq, self._seq = self._seq, self._seq + 1
        final = self.dir / f"part-{seq:06d}-{self._token}.parquet"
        tmp = self.dir / f".{final.name}.tmp"
        try:
            pq.write_table(pa.Table.from_pylist(rows, schema=self.schema), tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with self._lock:  # keep the rows for the next flush
                self._rows[:0] = rows
            tmp.unlink(missing_ok=True)
            raise
        self.rows_written += len(rows)
        return final

    def close(self) -> None:
        self.flush()
