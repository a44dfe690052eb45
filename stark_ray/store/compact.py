"""Compaction: a table's many small part files rewritten as a few large ones, never visible half done.

A run writes a part file per flush per task (:mod:`stark_ray.store.parquet`), so a long campaign leaves tens of
thousands of small files that every query must open. :func:`compact_task` rewrites one task's live files as one
file in the task's directory (the drivers do it when a task ends); :func:`compact_run` rewrites all of a run's live
files as a few files of up to :data:`TARGET_BYTES` in ``<table>/_compacted/`` (``stark compact RUN``, and the end
of a campaign). The rows keep their values; old runs' renamed columns come out under their new names.

How it stays safe for readers (:mod:`stark_ray.store.parts`): each new file is written whole under a temporary
name, lists in its metadata the files it replaces, and is renamed into place; only then are those files deleted.
Readers skip files a compacted file replaces, so they see every row once at each moment, and a compaction stopped
anywhere loses nothing (its leftovers are deleted by the next one). Writers of running tasks go on adding files
meanwhile: those are not in the list and stay live. Compactions of one local run take turns (a lock file); on
other filesystems run one at a time yourself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from stark_ray.eval.build.locks import file_lock
from stark_ray.store.location import Location, locate
from stark_ray.store.parquet import next_part_number, safe_name, write_part_from
from stark_ray.store.parts import COMPACTED_DIR, REPLACES_KEY, is_compacted, part_files, read_parts, replaces
from stark_ray.store.run_store import schemas

TARGET_BYTES = 256 << 20  # a compacted file holds the rows of part files of about this much, together
BATCH_BYTES = 16 << 20  # ... read and written this much of them at a time, and at most BATCH_FILES files: reading
BATCH_FILES = 256  # costs memory per file too (3,000 files of a few KB each took 100 MB), whatever their rows
LOCK_FILE = ".compact.lock"
log = logging.getLogger(__name__)


@dataclass
class Compacted:
    """What a compaction did, per table: files before and after, rows rewritten."""

    files_before: dict[str, int] = field(default_factory=dict)
    files_after: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return "; ".join(f"{t}: {self.files_before[t]} -> {self.files_after[t]} files ({self.rows.get(t, 0)} rows "
                         "rewritten)" for t in self.files_before)


def compact_run(run_dir: str | Path | Location, target_bytes: int = TARGET_BYTES) -> Compacted:
    """Rewrite every live part file of the run as a few files in ``<table>/_compacted/``."""
    return _compact(locate(run_dir), None, target_bytes)


def compact_task(run_dir: str | Path | Location, task: str) -> Compacted:
    """Rewrite one task's live part files (in its own directories) as one file per table, in the same place."""
    return _compact(locate(run_dir), task, None)


def compact_finished(run_dir: str | Path | Location, task: str) -> None:
    """:func:`compact_task` for a task that has ended; a failure is logged (its files stay as they were: nothing
    recorded is lost, the run is only slower to read)."""
    try:
        compact_task(run_dir, task)
    except Exception as e:
        log.warning("run %s, task %r: compacting its part files failed (%s); they stay as written", run_dir, task, e)


def whole_run_compacted(tasks: int) -> bool:
    """A run of several tasks (a campaign) is compacted whole when it ends (:func:`compact_ended`): the per-task
    compactions still queued or running then are not needed."""
    return tasks > 1


class Compactor:
    """Compacts tasks as they end, beside a running search: in a process of its own at the lowest CPU priority
    (``nice 19``), the tasks that ended meanwhile together, so the search's own processes keep the CPU (a thread of
    the memory actor doing it slowed a 2-core run's last tasks by a third). A daemon thread starts those processes
    and waits for them; :meth:`add` returns at once."""

    def __init__(self, run_dir: Location) -> None:
        self.run_dir = run_dir
        self.queued: list[str] = []
        self.lock = threading.Lock()
        self.worker: threading.Thread | None = None
        self.proc: subprocess.Popen[bytes] | None = None  # the compaction process running now
        self.cancelled = False
        self.runs = 0  # compaction processes started (tests)

    def add(self, task: str) -> None:
        with self.lock:
            self.queued.append(task)
            if self.worker is None or not self.worker.is_alive():
                self.worker = threading.Thread(target=self._work, name="stark-compactor", daemon=True)
                self.worker.start()

    def _work(self) -> None:
        while True:
            try:
                with self.lock:
                    tasks, self.queued = self.queued, []
                    if not tasks or self.cancelled:
                        self.worker = None
                        return
                    self.runs += 1
                    self.proc = proc = subprocess.Popen(
                        [*_NICE, sys.executable, "-m", "stark_ray.store.compact", str(self.run_dir), *tasks],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                _, err = proc.communicate(timeout=3600)
                if proc.returncode and not self.cancelled:
                    log.warning("compacting %s failed (exit %s): %s", ", ".join(tasks), proc.returncode,
                                err.decode(errors="replace")[-500:])
            except subprocess.TimeoutExpired as e:  # stopped (a compaction stopped anywhere loses nothing)
                proc.kill()
                proc.communicate()
                log.warning("compacting %s failed: %s", ", ".join(tasks), e)
            except OSError as e:  # the files stay as written: nothing is lost
                log.warning("compacting %s failed: %s", ", ".join(tasks), e)

    def close(self, timeout: float, cancel: bool = False) -> None:
        """Wait up to ``timeout`` seconds for the compactions under way and queued; with ``cancel`` (the whole run is
        compacted next), drop the queued ones and stop the one running first (a compaction stopped anywhere loses
        nothing), so that it never overlaps the next."""
        if cancel:
            with self.lock:
                self.cancelled, self.queued = True, []
                if self.proc is not None and self.proc.poll() is None:
                    self.proc.terminate()
        worker = self.worker
        if worker is not None:
            worker.join(timeout)


# the lowest CPU priority, through nice(1): a preexec_fn that calls os.nice can deadlock a process with threads
_NICE = ("nice", "-n", "19") if shutil.which("nice") else ()


def compact_ended(run_dir: str | Path | Location) -> None:
    """:func:`compact_run` at the end of a run of several tasks; a failure is logged (nothing is lost)."""
    try:
        done = compact_run(run_dir)
        log.info("run %s compacted: %s", run_dir, done.describe())
    except Exception as e:
        log.warning("run %s: compacting its part files failed (%s); `stark compact` can do it later", run_dir, e)


def _compact(run: Location, task: str | None, target_bytes: int | None) -> Compacted:
    out = Compacted()
    with _turn(run):
        for table, schema in schemas().items():
            table_loc = run.join(table)
            # a task's own files, and those a whole run's compaction may have replaced: not every task's (listing
            # them all and reading each compacted file's list made a 2,500-task campaign's compactions fall behind)
            only = None if task is None else (safe_name(task), COMPACTED_DIR)
            _delete_replaced(table_loc, only)  # what an interrupted compaction left behind
            files = part_files(table_loc, only)
            if task is not None:
                files = {rel: p for rel, p in files.items() if rel.partition("/")[0] == safe_name(task)}
            out.files_before[table] = len(files)
            groups = _groups(table_loc, files, target_bytes)
            for group in groups:
                out.rows[table] = out.rows.get(table, 0) + _rewrite(table_loc, table, schema, group,
                                                                     task is None, files)
            out.files_after[table] = out.files_before[table] - sum(len(g) - 1 for g in groups)
    return out


def _groups(table_loc: Location, files: dict[str, str], target_bytes: int | None) -> list[list[str]]:
    """The files to rewrite together (each group becomes one file); groups of one are left as they are."""
    rels = sorted(files)
    if target_bytes is None:
        return [rels] if len(rels) > 1 else []
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for rel in rels:
        n = _size(files[rel], table_loc)
        if current and size + n > target_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(rel)
        size += n
    if current:
        groups.append(current)
    return [g for g in groups if len(g) > 1 or not g[0].startswith(COMPACTED_DIR + "/")]  # one compacted: as is


def _rewrite(table_loc: Location, table: str, schema: pa.Schema, group: list[str], into_compacted: bool,
             files: dict[str, str]) -> int:
    """The group's files as one, read and written a batch of files at a time (BATCH_BYTES of them on disk, in name
    order: by task, then as written), so that a compaction's memory is one batch's, whatever the run's size (reading
    a whole group at once took 714 MB for a 250-task campaign, 1.94 GB for 1,000); each batch is read by pyarrow's
    threads at once (file by file took 2.5 times as long)."""
    directory = COMPACTED_DIR if into_compacted else group[0].partition("/")[0]
    target = table_loc.join(directory)
    target.mkdir()
    name = f"part-{next_part_number(target):06d}-{uuid.uuid4().hex[:8]}-c.parquet"
    marked = schema.with_metadata({**(schema.metadata or {}), REPLACES_KEY: json.dumps(group).encode()})
    def tables() -> Iterator[pa.Table]:
        for batch in _batches(table_loc, files, sorted(group)):
            yield read_parts(batch, table, schema, table_loc.fs)
            pa.default_memory_pool().release_unused()  # what the batch took goes back, not kept for the next

    rows = write_part_from(target, name, marked, tables(), fsync=True)
    for rel in group:  # the new file is in place and replaces these: readers already skip them
        table_loc.join(*rel.split("/")).remove()
    return rows


def _batches(table_loc: Location, files: dict[str, str], rels: list[str]) -> list[list[str]]:
    """The files' paths in batches of about BATCH_BYTES on disk and at most BATCH_FILES files, in order."""
    batches: list[list[str]] = [[]]
    size = 0
    for rel in rels:
        n = _size(files[rel], table_loc)
        if batches[-1] and (size + n > BATCH_BYTES or len(batches[-1]) >= BATCH_FILES):
            batches.append([])
            size = 0
        batches[-1].append(files[rel])
        size += n
    return [b for b in batches if b]


def _delete_replaced(table_loc: Location, only: Collection[str] | None = None) -> None:
    files = part_files(table_loc, only)
    for rel, path in files.items():
        if is_compacted(rel.rpartition("/")[2]):
            for gone in replaces(path, table_loc.fs):
                if gone in files:
                    table_loc.join(*gone.split("/")).remove()


def _size(path: str, table_loc: Location) -> int:
    if table_loc.fs is None:
        return os.path.getsize(path)
    return int(table_loc.fs.get_file_info(path).size or 0)


def _turn(run: Location) -> contextlib.AbstractContextManager[None]:
    """The run's compaction lock (local runs; elsewhere compactions must not overlap)."""
    return contextlib.nullcontext() if run.fs is not None else file_lock(Path(run.path) / LOCK_FILE)


def main(argv: list[str]) -> int:
    """``python -m stark_ray.store.compact RUN [TASK ...]``: the tasks' files (:func:`compact_finished`), or the
    whole run's (:func:`compact_run`) when no task is named."""
    if not argv:
        print("usage: python -m stark_ray.store.compact RUN [TASK ...]", file=sys.stderr)
        return 2
    run, tasks = locate(argv[0]), argv[1:]
    for task in tasks:
        compact_finished(run, task)
    if not tasks:
        compact_run(run)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    sys.exit(main(sys.argv[1:]))
