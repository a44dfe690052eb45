"""Compaction of a run's part files: a task's files into one, a run's into a few, the same rows read before,
during and after, nothing lost when it stops half way, and writers of running tasks unaffected."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from test_store import sample_tree, without_time, write_tree

from stark_ray.store import compact, parts
from stark_ray.store.compact import Compactor, compact_run, compact_task
from stark_ray.store.location import Location
from stark_ray.store.read import attempt_rows, call_rows, connect, load_trees
from stark_ray.store.run_store import RunStore

TASKS = ("a", "b", "c")


def small_files_run(root: Path, tasks: tuple[str, ...] = TASKS) -> Path:
    """A run whose every row is its own part file (as a live campaign writes them)."""
    tree, calls = sample_tree()
    with RunStore(root, "run", flush_rows=1, background=False) as store:
        for t in tasks:
            write_tree(store, t, tree, calls)
    return root / "run"


def files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("part-*.parquet"))


def snapshot(run: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[dict[str, Any]]], int]:
    trees = {t: sorted((n.to_record() for n in tree), key=lambda r: r["node_id"])
             for t, tree in load_trees(run).items()}
    count = connect(run).execute("SELECT count(*) FROM attempts a JOIN llm_calls c USING (task, seq)").fetchone()
    return ([without_time(r) for r in attempt_rows(run)], call_rows(run), trees, count[0] if count else -1)


def test_a_task_and_then_the_run_are_compacted_with_the_same_rows(tmp_path: Path) -> None:
    run = small_files_run(tmp_path)
    before = snapshot(run)
    assert len(files(run)) == 3 * (6 + 5)  # one file per row: six attempts and five calls per task

    done = compact_task(run, "b")
    assert done.files_before == {"attempts": 6, "llm_calls": 5} and done.files_after == {"attempts": 1, "llm_calls": 1}
    assert [f for f in files(run) if "/b/" in f] == [f for f in files(run) if f.startswith(("attempts/b/",
                                                                                            "llm_calls/b/"))]
    assert len([f for f in files(run) if "/b/" in f]) == 2 and snapshot(run) == before

    done = compact_run(run)
    assert done.files_after == {"attempts": 1, "llm_calls": 1}
    assert [f.rpartition("/")[0] for f in files(run)] == ["attempts/_compacted", "llm_calls/_compacted"]
    assert snapshot(run) == before
    again = compact_run(run)  # nothing left to do
    assert again.rows == {} and len(files(run)) == 2 and snapshot(run) == before


def test_a_tasks_compaction_lists_and_reads_its_own_files_only(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Compacting one task of a campaign opens the compacted files of its own directory and of ``_compacted``
    (a whole run's compaction may have replaced its files), never the other tasks': thousands of tasks ending one by
    one must not each read every other task's files."""
    run = small_files_run(tmp_path)
    compact_task(run, "a")
    before = snapshot(run)
    opened: list[str] = []
    real = parts.replaces
    monkeypatch.setattr(compact, "replaces", lambda path, fs: opened.append(path) or real(path, fs))
    monkeypatch.setattr(parts, "replaces", lambda path, fs: opened.append(path) or real(path, fs))
    listed: list[object] = []
    real_files = parts.part_files
    monkeypatch.setattr(compact, "part_files", lambda loc, only=None: listed.append(only) or real_files(loc, only))
    done = compact_task(run, "b")
    assert done.files_after == {"attempts": 1, "llm_calls": 1}
    assert opened == [] and listed and all(only == ("b", "_compacted") for only in listed)
    assert snapshot(run) == before


def test_closing_a_campaigns_compactor_stops_its_work_and_the_run_compaction_after_it_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a campaign's end the memory actor's close cancels the per-task compactions (queued: dropped; running: its
    process stopped, and waited for) so that the whole-run compaction that follows never overlaps one."""
    run = small_files_run(tmp_path)
    before = snapshot(run)
    monkeypatch.setattr(compact, "_NICE", ("sh", "-c", "exec sleep 600", "x"))  # a compaction that takes long
    compactor = Compactor(Location(None, str(run)))
    compactor.add("a")
    deadline = time.monotonic() + 60
    while compactor.proc is None:  # running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    compactor.add("b")  # queued behind it
    compactor.close(300, cancel=True)
    assert compactor.worker is None or not compactor.worker.is_alive()  # it returned long before 600 s
    assert compactor.proc.returncode == -signal.SIGTERM and compactor.queued == [] and compactor.runs == 1
    compactor.add("a")  # and nothing starts after it
    compactor.close(120)
    assert compactor.runs == 1
    assert snapshot(run) == before
    compact_run(run)
    assert snapshot(run) == before and len(files(run)) == 2


def test_a_compaction_stopped_before_deleting_what_it_replaced_loses_and_doubles_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = small_files_run(tmp_path)
    before = snapshot(run)
    real, removed = Location.remove, []

    def dies_after_two(self: Location) -> None:
        if len(removed) == 2:
            raise OSError("killed")
        removed.append(self.path)
        real(self)

    monkeypatch.setattr(Location, "remove", dies_after_two)
    with pytest.raises(OSError, match="killed"):
        compact_run(run)
    monkeypatch.setattr(Location, "remove", real)
    left = files(run)
    assert any("_compacted" in f for f in left) and len(left) > 2  # the new file and most of the old ones
    assert snapshot(run) == before  # readers skip what the compacted file replaces
    compact_run(run)  # the next one deletes the leftovers first
    assert len(files(run)) == 2 and snapshot(run) == before


def test_a_running_tasks_writer_goes_on_beside_a_compaction(tmp_path: Path) -> None:
    tree, calls = sample_tree()
    with RunStore(tmp_path, "run", flush_rows=1, background=False) as store:
        write_tree(store, "t", tree, calls, seqs=range(0, 3))
        compact_task(tmp_path / "run", "t")
        compact_run(tmp_path / "run")
        write_tree(store, "t", tree, calls, seqs=range(3, 6))  # the same writers, after their files were replaced
    assert [r["seq"] for r in attempt_rows(tmp_path / "run")] == list(range(6))
    assert len(load_trees(tmp_path / "run")["t"]) == 6


def test_an_old_runs_renamed_column_comes_out_under_its_new_name(tmp_path: Path) -> None:
    run = small_files_run(tmp_path, ("t",))
    want = [r["passed_checks"] for r in attempt_rows(run)]
    for part in (run / "attempts" / "t").glob("part-*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.rename_columns(["correct" if n == "passed_checks" else n for n in table.column_names]),
                       part)
    compact_task(run, "t")
    (only,) = (run / "attempts" / "t").glob("part-*.parquet")
    assert "passed_checks" in pq.read_schema(only).names and "correct" not in pq.read_schema(only).names
    assert [r["passed_checks"] for r in attempt_rows(run)] == want


def test_a_reader_lists_again_when_a_compaction_deletes_a_file_under_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run = small_files_run(tmp_path, ("t",))
    before = snapshot(run)
    stale = parts.live_parts(Location(None, str(run / "attempts")))
    compact_task(run, "t")
    real, served = parts.live_parts, []

    def first_stale(table_loc: Location) -> dict[str, str]:
        if table_loc.path.endswith("attempts") and not served:
            served.append(1)
            return stale  # listed before the compaction, read after it
        return real(table_loc)

    monkeypatch.setattr(parts, "live_parts", first_stale)
    assert [without_time(r) for r in attempt_rows(run)] == before[0] and served == [1]


def test_a_run_on_another_filesystem_is_compacted_the_same_way(tmp_path: Path) -> None:
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    tree, calls = sample_tree()
    with RunStore("results", "run", flush_rows=1, background=False, filesystem=fs) as store:
        for t in TASKS:
            write_tree(store, t, tree, calls)
    local = tmp_path / "results" / "run"
    before = snapshot(local)
    loc = Location(fs, "results/run")
    compact_task(loc, "a")
    compact_run(loc)
    assert len(files(local)) == 2 and snapshot(local) == before
    assert len(attempt_rows("results/run", filesystem=fs)) == 3 * 6


def test_stark_compact_compacts_every_run_of_a_directory_and_says_what_it_did(tmp_path: Path) -> None:
    import subprocess
    import sys

    first, second = small_files_run(tmp_path / "one"), small_files_run(tmp_path / "two", ("t",))
    runs = tmp_path / "runs"
    runs.mkdir()
    first.rename(runs / "first")
    second.rename(runs / "second")
    before = snapshot(runs / "first")
    proc = subprocess.run([sys.executable, "-m", "stark_ray.cli", "compact", str(runs)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{runs / 'first'}: attempts: 18 -> 1 files (18 rows rewritten); llm_calls: 15 -> 1 files (15 rows rewritten)",
        f"{runs / 'second'}: attempts: 6 -> 1 files (6 rows rewritten); llm_calls: 5 -> 1 files (5 rows rewritten)"]
    assert snapshot(runs / "first") == before and len(files(runs / "second")) == 2
    missing = subprocess.run([sys.executable, "-m", "stark_ray.cli", "compact", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr
