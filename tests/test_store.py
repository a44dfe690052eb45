"""The results store: Parquet part files (complete files only, every row once, rows kept when a write fails),
RunStore's flush policy and crash behaviour, and reading a run back with DuckDB into the same search trees."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from stark_ray.records import (
    AGENT_DEBUG,
    AGENT_PLAN_CODE,
    STAGE_COMPILE,
    STAGE_CORRECTNESS,
    STAGE_OK,
    STAGE_PARSE,
    EvalResult,
    LLMUsage,
    Node,
    attempt_schema,
    llm_call_schema,
)
from stark_ray.search.tree import Tree
from stark_ray.store import parquet
from stark_ray.store.parquet import PartWriter
from stark_ray.store.read import (
    StoreError,
    attempt_rows,
    call_rows,
    connect,
    load_trees,
    rebuild,
    recorded_attempts,
    task_names,
)
from stark_ray.store.run_store import RunStore, attempt_row, llm_call_rows

REPO = Path(__file__).resolve().parents[1]


def row(i: int) -> dict[str, object]:
    return {"run_id": "r", "task": "t", "seq": i, "role": "plan", "provider": "p", "model": "m",
            "input_tokens": i, "output_tokens": 1, "cost_usd": 0.5, "latency_s": 0.1, "ok": True,
            "error": None, "node_id": i}


def count(root: Path) -> list[int]:
    return [s for (s,) in duckdb.sql(f"SELECT seq FROM '{root}/llm_calls/*/*.parquet' ORDER BY seq").fetchall()]


def sample_tree() -> tuple[Tree, dict[int, list[LLMUsage]]]:
    """A small tree with every kind of field filled (flags, logs, None values, scaffold, tokens), and the LLM
    calls behind each node."""
    t = Tree.with_reference("class Model: ...", EvalResult(compiled=True, passed_checks=True, runtime_ms=10.0,
                                                           stage=STAGE_OK, eval_s=0.5))
    calls: dict[int, list[LLMUsage]] = {0: []}

    def add(parent: int, source: str, agent: str, result: EvalResult, usage: list[LLMUsage], **kw: object) -> None:
        node = t.add(parent, source, agent, result, usage=usage, **kw)  # type: ignore[arg-type]
        calls[node.id] = usage

    add(0, "class ModelNew: fused", AGENT_PLAN_CODE,
        EvalResult(compiled=True, passed_checks=True, runtime_ms=4.0, ref_runtime_ms=10.0, speedup=2.5, stage=STAGE_OK,
                   max_abs_err=1e-7, rel_err=2e-8, flags=["suspicious", "no_kernel"], compile_s=1.25, eval_s=0.3,
                   ref_compile_runtime_ms=6.0, runtime_cv=0.01, ref_runtime_cv=0.02),
        [LLMUsage("plan", "openai", "gpt-4o", 120, 40, 0.002, 1.5), LLMUsage("code", "openai", "gpt-4o", 300, 900,
                                                                             0.01, 7.25)],
        instruction="fuse the three ops", scaffold="// ANCHOR 1\nx = a * b")
    add(1, "class ModelNew: expf", AGENT_PLAN_CODE, EvalResult.failed(STAGE_COMPILE, "error: 'expf' is not a member",
                                                                      "line\n" * 2000),
        [LLMUsage("code", "openai", "gpt-4o", 10, 20, 0.0, 0.5)], instruction="vectorize")
    add(2, "class ModelNew: fixed", AGENT_DEBUG,
        EvalResult(compiled=True, passed_checks=False, runtime_ms=None, stage=STAGE_CORRECTNESS, error="mismatch",
                   max_abs_err=0.5), [LLMUsage("debug", "openai", "gpt-4o", 50, 60, 0.001, 2.0)])
    add(0, "", AGENT_PLAN_CODE, EvalResult.failed(STAGE_PARSE, "no code block"),
        [LLMUsage("plan", "openai", "gpt-4o", 5, 0, 0.0, 30.0, ok=False, error="timeout")])
    add(1, "class ModelNew: simd", AGENT_PLAN_CODE,
        EvalResult(compiled=True, passed_checks=True, runtime_ms=2.0, ref_runtime_ms=10.0, speedup=5.0, stage=STAGE_OK),
        [])
    return t, calls


def write_tree(store: RunStore, task: str, tree: Tree, calls: dict[int, list[LLMUsage]],
               seqs: range | list[int] | None = None) -> None:
    for node in sorted(tree, key=lambda n: n.id):
        if seqs is None or node.id in seqs:
            store.record(task, node, calls.get(node.id, []))


def parts(root: Path) -> list[Path]:
    return sorted(root.rglob("part-*.parquet"))


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


# --- PartWriter ------------------------------------------------------------------------------------------------
def test_rows_flush_in_batches_as_whole_files(tmp_path: Path) -> None:
    w = PartWriter(tmp_path, "llm_calls", "a/b task", llm_call_schema(), flush_rows=2, flush_s=3600)
    for i in range(5):
        w.append(row(i))
    assert count(tmp_path) == [0, 1, 2, 3]  # two files of two rows; one row still buffered
    w.close()
    assert count(tmp_path) == [0, 1, 2, 3, 4]
    files = sorted(tmp_path.glob("llm_calls/*/*"))
    assert [f.parent.name for f in files] == ["a_b_task"] * 3 and all(f.suffix == ".parquet" for f in files)
    assert w.rows_written == 5


def test_a_failed_write_keeps_its_rows_for_the_next_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = PartWriter(tmp_path, "llm_calls", "t", llm_call_schema(), flush_rows=100)
    w.append(row(0))
    real = pq.write_table

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(parquet.pq, "write_table", broken)
    with pytest.raises(OSError):
        w.flush()
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.parquet"))
    monkeypatch.setattr(parquet.pq, "write_table", real)
    w.append(row(1))
    w.close()
    assert count(tmp_path) == [0, 1]


def test_a_second_writer_for_the_same_task_adds_files_instead_of_overwriting(tmp_path: Path) -> None:
    for start in (0, 10):
        w = PartWriter(tmp_path, "llm_calls", "t", llm_call_schema(), flush_rows=1)
        w.append(row(start))
        w.close()
    assert count(tmp_path) == [0, 10]
    first, second = (f.name.split("-") for f in parts(tmp_path))
    assert (first[1], second[1]) == ("000000", "000001") and first[2] != second[2]  # numbered on, own token


def test_flush_if_due_waits_for_flush_s(tmp_path: Path) -> None:
    w = PartWriter(tmp_path, "llm_calls", "t", llm_call_schema(), flush_rows=100, flush_s=0.1, fsync=False)
    assert w.flush_if_due() is None  # nothing pending
    w.append(row(0))
    assert w.flush_if_due() is None and w.pending == 1  # not yet due
    time.sleep(0.15)
    path = w.flush_if_due()
    assert isinstance(path, Path) and path.exists() and w.pending == 0
    assert count(tmp_path) == [0]


# --- RunStore round trips ----------------------------------------------------------------------------------
def without_time(row: dict[str, Any]) -> dict[str, Any]:
    """A row without ``recorded_at`` (the wall-clock time the store took it)."""
    return {k: v for k, v in row.items() if k != "recorded_at"}


def test_rows_and_tree_round_trip_exactly(tmp_path: Path) -> None:
    tree, calls = sample_tree()
    with RunStore(tmp_path, "run-1", flush_rows=2, background=False) as store:
        write_tree(store, "2_Fused Swish", tree, calls)
    run_dir = tmp_path / "run-1"
    assert sorted(p.name for p in (run_dir / "attempts").iterdir()) == ["2_Fused_Swish"]

    expected = [without_time(attempt_row("run-1", "2_Fused Swish", n)) for n in sorted(tree, key=lambda n: n.id)]
    got = attempt_rows(run_dir)
    assert all(isinstance(r["recorded_at"], datetime) and r["recorded_at"].tzinfo is not None for r in got)
    assert [without_time(r) for r in got] == expected
    assert [without_time(r) for r in attempt_rows(run_dir, task="2_Fused Swish")] == expected
    assert attempt_rows(run_dir, task="x") == []
    expected_calls = [r for i in sorted(calls) for r in llm_call_rows("run-1", "2_Fused Swish", i, calls[i])]
    got_calls = call_rows(run_dir)
    assert sorted(got_calls, key=str) == sorted(expected_calls, key=str)
    assert [r["node_id"] for r in got_calls] == [r["seq"] for r in got_calls]

    trees = load_trees(run_dir)
    assert list(trees) == ["2_Fused Swish"] and task_names(run_dir) == ["2_Fused Swish"]
    assert trees["2_Fused Swish"].to_records() == tree.to_records()
    assert trees["2_Fused Swish"][1].result.flags == ["suspicious", "no_kernel"]


def test_duckdb_views_and_empty_tables(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    con = connect(tmp_path / "empty")
    for table, schema in (("attempts", attempt_schema()), ("llm_calls", llm_call_schema())):
        cur = con.execute(f"SELECT * FROM {table}")
        assert cur.fetchall() == [] and [d[0] for d in cur.description] == schema.names
    assert con.execute("SELECT count(*) FROM attempts a JOIN llm_calls c USING (task, seq)").fetchone() == (0,)

    tree, _ = sample_tree()
    with RunStore(tmp_path, "run", background=False) as store:  # attempts only: llm_calls stays empty
        write_tree(store, "t", tree, {})
    con = connect(tmp_path / "run")
    best = con.execute("SELECT node_id, speedup FROM attempts WHERE passed_checks ORDER BY speedup DESC LIMIT 1")
    assert best.fetchone() == (5, 5.0)
    assert con.execute("SELECT count(*) FROM llm_calls").fetchone() == (0,)


def test_a_run_written_before_a_column_existed_reads_it_as_null(tmp_path: Path) -> None:
    tree, _ = sample_tree()
    with RunStore(tmp_path, "run", background=False) as store:
        write_tree(store, "t", tree, {})
    for part in (tmp_path / "run" / "attempts" / "t").glob("part-*.parquet"):  # as an older version wrote them
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["recorded_at", "device"]), part)
    con = connect(tmp_path / "run")
    cur = con.execute("SELECT count(*), count(recorded_at), count(device), max(speedup) FROM attempts")
    assert cur.fetchone() == (6, 0, 0, 5.0)
    assert [d[0] for d in con.execute("SELECT * FROM attempts").description] == attempt_schema().names


@pytest.mark.parametrize("old_files", ["all", "some"])
def test_a_run_written_before_correct_was_renamed_passed_checks_reads_the_same(tmp_path: Path, old_files: str) -> None:
    """Part files whose column is still called ``correct`` (all of them, or some: a resumed older run) give the same
    ``passed_checks`` through DuckDB, the rows and the rebuilt trees."""
    tree, _ = sample_tree()
    with RunStore(tmp_path, "run", flush_rows=2, flush_s=3600, background=False) as store:
        write_tree(store, "t", tree, {})
    files = sorted((tmp_path / "run" / "attempts" / "t").glob("part-*.parquet"))
    assert len(files) == 3
    for part in files if old_files == "all" else files[:2]:
        table = pq.read_table(part)
        pq.write_table(table.rename_columns(["correct" if n == "passed_checks" else n for n in table.column_names]),
                       part)
    want = [n.result.passed_checks for n in sorted(tree, key=lambda n: n.id)]
    con = connect(tmp_path / "run")
    assert [r for (r,) in con.execute("SELECT passed_checks FROM attempts ORDER BY seq").fetchall()] == want
    assert [d[0] for d in con.execute("SELECT * FROM attempts").description] == attempt_schema().names
    assert [r["passed_checks"] for r in attempt_rows(tmp_path / "run", "t")] == want
    assert "correct" not in attempt_rows(tmp_path / "run", "t")[0]
    rebuilt = load_trees(tmp_path / "run")["t"]
    assert [n.result.passed_checks for n in sorted(rebuilt, key=lambda n: n.id)] == want
    assert [n.accepted for n in sorted(rebuilt, key=lambda n: n.id)] == [n.accepted for n in sorted(tree,
                                                                                                  key=lambda n: n.id)]


def test_flush_by_row_count_and_close(tmp_path: Path) -> None:
    tree, _ = sample_tree()
    store = RunStore(tmp_path, "run", flush_rows=2, flush_s=3600, background=False)
    for node in sorted(tree, key=lambda n: n.id):  # 6 nodes -> 3 files, nothing buffered
        store.record_node("t", node)
    store.record_node("t", Node(id=6, parent=0, depth=1, source="s", agent=AGENT_PLAN_CODE))
    assert [r["seq"] for r in attempt_rows(tmp_path / "run")] == [0, 1, 2, 3, 4, 5]
    assert store.rows_written == {("attempts", "t"): 6}
    store.close()
    assert [r["seq"] for r in attempt_rows(tmp_path / "run")] == list(range(7))
    store.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        store.record_node("t", tree.root)


def test_background_thread_flushes_by_time_without_close(tmp_path: Path) -> None:
    tree, calls = sample_tree()
    idle = RunStore(tmp_path, "idle", flush_rows=1000, flush_s=0.2, background=False)
    timed = RunStore(tmp_path, "timed", flush_rows=1000, flush_s=0.2, background=True)
    try:
        for store in (idle, timed):
            write_tree(store, "t", tree, calls, seqs=range(3))
        assert eventually(lambda: len(attempt_rows(tmp_path / "timed")) == 3, timeout=3.0)
        assert eventually(lambda: len(call_rows(tmp_path / "timed")) == 3, timeout=3.0)  # nodes 1 and 2: 2 + 1
        assert attempt_rows(tmp_path / "idle") == []  # no timer: still buffered
        write_tree(timed, "t", tree, calls, seqs=[3])
        assert eventually(lambda: len(attempt_rows(tmp_path / "timed")) == 4, timeout=3.0)
    finally:
        idle.close()
        timed.close()
    assert len(attempt_rows(tmp_path / "idle")) == 3  # close flushes the rest


def test_several_threads_record_at_once(tmp_path: Path) -> None:
    with RunStore(tmp_path, "run", flush_rows=4, flush_s=0.05) as store:
        def work(task: str) -> None:
            for i in range(40):
                store.record(task, Node(id=i, parent=None if i == 0 else i - 1, depth=i, source=f"{task} {i}",
                                        agent=AGENT_PLAN_CODE), [LLMUsage("code", "p", "m", i, i)])

        threads = [threading.Thread(target=work, args=(f"task{k}",)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    trees = load_trees(tmp_path / "run")
    assert sorted(trees) == [f"task{k}" for k in range(4)] and all(len(t) == 40 for t in trees.values())
    assert len(call_rows(tmp_path / "run")) == 160


def test_every_row_recorded_before_close_reaches_the_disk(tmp_path: Path) -> None:
    store = RunStore(tmp_path, "run", flush_rows=3, flush_s=0.05)
    accepted: dict[str, int] = {}

    def work(task: str) -> None:
        i = 0
        try:
            while True:
                store.record_node(task, Node(id=i, parent=None if i == 0 else i - 1, depth=i, source="s",
                                             agent=AGENT_PLAN_CODE))
                i += 1
        except RuntimeError:  # closed
            accepted[task] = i

    threads = [threading.Thread(target=work, args=(f"task{k}",)) for k in range(3)]
    for th in threads:
        th.start()
    time.sleep(0.1)
    store.close()
    for th in threads:
        th.join()
    trees = load_trees(tmp_path / "run")
    assert {task: len(t) for task, t in trees.items()} == accepted and min(accepted.values()) > 0


def test_rows_are_checked_against_the_schema_and_the_store(tmp_path: Path) -> None:
    with RunStore(tmp_path, "run", background=False) as store:
        root = Tree.with_reference("ref", EvalResult()).root
        with pytest.raises(ValueError, match="not in the schema"):
            store.record_attempt("t", {**attempt_row("run", "t", root), "extra": 1})
        with pytest.raises(ValueError, match="run_id"):
            store.record_attempt("t", attempt_row("other", "t", root))
        with pytest.raises(ValueError, match="task"):
            store.record_attempt("t", attempt_row("run", "u", root))
        with pytest.raises(ValueError, match="no seq"):
            store.record_calls("t", [{"role": "plan"}])
        store.record_node("t", root)
        with pytest.raises(ValueError, match="seq 0 was already recorded"):
            store.record_node("t", root)
    with pytest.raises(ValueError, match="run_id"):
        RunStore(tmp_path, "a/b")


# --- crashes and resumes -----------------------------------------------------------------------------------
WRITER = """
import sys
from stark_ray.records import EvalResult, LLMUsage, Node
from stark_ray.store.run_store import RunStore

root, flush_rows = sys.argv[1], int(sys.argv[2])
store = RunStore(root, "run", flush_rows=flush_rows, flush_s=0.01)  # the timer races the row-count flushes
source = "x = 1\\n" * 4000
seq = 0
while True:
    node = Node(id=seq, parent=None if seq == 0 else seq - 1, depth=seq, source=source + str(seq), agent="plan+code",
                result=EvalResult(stage="ok", runtime_ms=float(seq)))
    store.record("t", node, [LLMUsage("code", "p", "m", seq, seq), LLMUsage("plan", "p", "m", seq, seq)])
    if seq == 3 * flush_rows:
        print("ready", flush=True)
    seq += 1
"""


@pytest.mark.parametrize("flush_rows", [1, 5])
def test_kill_9_leaves_only_complete_files_and_a_prefix_of_rows(tmp_path: Path, flush_rows: int) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(flush_rows)], stdout=subprocess.PIPE,
                            env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.6)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    run_dir = root / "run"
    files = parts(run_dir)
    assert len(files) > 2
    for f in files:  # every part file is whole
        duckdb.sql(f"SELECT count(*) FROM read_parquet('{f}')").fetchall()
    torn = run_dir / "attempts" / "t" / ".part-999999-deadbeef.parquet.tmp"
    torn.write_bytes(b"PAR1 half a file")  # a temp file cut short by the kill must never be read

    seqs = [r["seq"] for r in attempt_rows(run_dir)]
    assert seqs == list(range(len(seqs))) and len(seqs) >= 3 * flush_rows
    call_seqs = [r["seq"] for r in call_rows(run_dir)]
    assert call_seqs == sorted(call_seqs) and set(call_seqs) == set(range(max(call_seqs) + 1))
    # every attempt on disk has all of its call rows there (a driver killed at 50% of a campaign left 2-8 attempts
    # without theirs): the calls are written first
    assert all(call_seqs.count(s) == 2 for s in seqs), [s for s in seqs if call_seqs.count(s) != 2]
    result = rebuild(run_dir)
    assert result.dropped == {} and len(result.trees["t"]) == len(seqs)


def test_a_resume_adds_files_and_never_doubles_a_node(tmp_path: Path) -> None:
    tree, calls = sample_tree()
    with RunStore(tmp_path, "run", flush_rows=2, background=False) as first:
        write_tree(first, "t", tree, calls, seqs=range(3))
    before = {f: f.read_bytes() for f in parts(tmp_path)}

    with RunStore(tmp_path, "run", flush_rows=2, background=False) as resumed:
        assert len(load_trees(tmp_path / "run")["t"]) == 3
        write_tree(resumed, "t", tree, calls, seqs=range(3, 6))
    assert all(f.read_bytes() == data for f, data in before.items())  # old files untouched
    assert len(parts(tmp_path)) > len(before)
    assert load_trees(tmp_path / "run")["t"].to_records() == tree.to_records()

    with RunStore(tmp_path, "run", background=False) as again:  # a resume that forgot what was written
        write_tree(again, "t", tree, calls, seqs=[2, 4])
    with pytest.raises(StoreError, match=r"task 't' seq 2 \(2 rows\); task 't' seq 4 \(2 rows\)"):
        load_trees(tmp_path / "run")
    with pytest.raises(StoreError, match=r"task 't' seq 2 \(2 rows\)"):
        recorded_attempts(tmp_path / "run")


def test_a_gap_keeps_the_complete_prefix_and_reports_the_rest(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    tree, calls = sample_tree()
    with RunStore(tmp_path, "run", background=False) as store:
        write_tree(store, "gap", tree, calls, seqs=[0, 1, 2, 4, 5])  # row 3 never reached the disk
        write_tree(store, "whole", tree, calls)
        write_tree(store, "rootless", tree, calls, seqs=[1, 2])
    result = rebuild(tmp_path / "run")
    assert result.dropped == {"gap": [4, 5], "rootless": [1, 2]}
    assert sorted(result.trees) == ["gap", "whole"]
    assert result.trees["gap"].to_records() == tree.to_records()[:3]
    assert result.trees["whole"].to_records() == tree.to_records()
    with caplog.at_level(logging.WARNING, logger="stark_ray.store.read"):
        assert sorted(load_trees(tmp_path / "run")) == ["gap", "whole"]
    assert "'gap': seq 3 is missing; kept seqs 0..2, dropped [4, 5]" in caplog.text
    # what a resume counts from two columns is what the rebuilt trees hold
    assert recorded_attempts(tmp_path / "run") == {n: t.evaluated for n, t in result.trees.items()} == {
        "gap": 2, "whole": len(tree) - 1}


def test_rows_that_do_not_form_a_tree_are_a_store_error(tmp_path: Path) -> None:
    with RunStore(tmp_path, "run", background=False) as store:
        store.record_node("t", Tree.with_reference("ref", EvalResult()).root)
        store.record_attempt("t", {**attempt_row("run", "t", Node(id=7, parent=0, depth=1, source="s",
                                                                  agent=AGENT_PLAN_CODE)), "seq": 1})
    with pytest.raises(StoreError, match="task 't' seq 1: node_id is 7"):
        load_trees(tmp_path / "run")


# --- other roots, bad input --------------------------------------------------------------------------------
def test_a_file_uri_root_works_end_to_end(tmp_path: Path) -> None:
    tree, calls = sample_tree()
    uri = tmp_path.as_uri()
    assert uri.startswith("file://")
    with RunStore(uri, "run", flush_rows=3) as store:
        write_tree(store, "t", tree, calls)
    assert parts(tmp_path / "run" / "attempts" / "t")
    assert load_trees(f"{uri}/run")["t"].to_records() == tree.to_records()
    assert task_names(f"{uri}/run") == ["t"]


def test_a_non_local_filesystem_writes_and_reads_through_pyarrow(tmp_path: Path) -> None:
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())  # not a LocalFileSystem: the generic path
    tree, calls = sample_tree()
    with RunStore("results", "run", flush_rows=2, background=False, filesystem=fs) as store:
        write_tree(store, "t", tree, calls)
        store.record_node("u", tree.root)
    assert parts(tmp_path / "results" / "run") and not list(tmp_path.rglob("*.tmp"))
    assert load_trees("results/run", filesystem=fs)["t"].to_records() == tree.to_records()
    assert task_names("results/run", filesystem=fs) == ["t", "u"]
    assert len(call_rows("results/run", filesystem=fs)) == sum(len(c) for c in calls.values())
    fs.create_dir("results/empty")
    con = connect("results/empty", filesystem=fs)
    assert con.execute("SELECT count(*) FROM attempts").fetchone() == (0,)
    with pytest.raises(FileNotFoundError, match="results/missing"):
        connect("results/missing", filesystem=fs)


def test_a_remote_store_writes_the_files_of_one_flush_at_once_and_keeps_a_failed_writers_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a non-local filesystem (an object store's requests take tens of ms) one flush writes the part files
    of different tasks concurrently; a write that fails leaves its rows buffered for the next flush and the
    others written."""
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    tree, _ = sample_tree()
    lock, active, peak, broken = threading.Lock(), [0], [0], {"t3"}
    real = parquet.write_part

    def slow_write(directory: Any, name: str, table: Any, fsync: bool = True) -> Any:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.05)
            if any(f"/{t}" in str(directory.path) for t in broken):
                raise OSError("the store refused the write")
            return real(directory, name, table, fsync)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(parquet, "write_part", slow_write)
    tasks = [f"t{i}" for i in range(8)]
    with RunStore("results", "run", flush_rows=100, background=False, filesystem=fs) as store:
        for t in tasks:
            store.record_node(t, tree.root)
        with pytest.raises(OSError, match="refused"):
            store.flush()
        assert peak[0] > 1  # written at once, not one after another
        assert task_names("results/run", filesystem=fs) == [t for t in tasks if t not in broken]
        broken.clear()  # the store recovers: the kept rows go out with the next flush
    assert task_names("results/run", filesystem=fs) == tasks


def test_a_write_that_failed_but_landed_is_replaced_by_its_retry_not_doubled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object store can report a failure for a write that landed (a timeout after the upload): the retry
    reuses the part file's name, so its rows are never on the store twice."""
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    tree, _ = sample_tree()
    real, calls = parquet.write_part, []

    def lands_then_fails(directory: Any, name: str, table: Any, fsync: bool = True) -> Any:
        calls.append(name)
        written = real(directory, name, table, fsync)
        if len(calls) == 1:
            raise OSError("timed out waiting for the reply")
        return written

    monkeypatch.setattr(parquet, "write_part", lands_then_fails)
    store = RunStore("results", "run", flush_rows=100, background=False, filesystem=fs)
    store.record_node("t", tree.root)
    with pytest.raises(OSError, match="timed out"):
        store.flush()
    store.record_node("t", tree.nodes[1])
    store.close()
    store.flush()  # after close: nothing left, and no error from the closed pool
    assert calls[0] == calls[1]  # the same name, replaced
    assert [r["seq"] for r in attempt_rows("results/run", filesystem=fs)] == [0, 1]


def test_a_missing_run_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-run"
    with pytest.raises(FileNotFoundError, match=r"no run directory at .*no-such-run"):
        connect(missing)
    with pytest.raises(FileNotFoundError, match="no-such-run"):
        load_trees(missing)
    with pytest.raises(FileNotFoundError, match="no-such-run"):
        attempt_rows(missing.as_uri())
