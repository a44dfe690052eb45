"""Parquet part files: complete files only, every row once, rows kept when a write fails."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from stark_ray.records import llm_call_schema
from stark_ray.store import parquet
from stark_ray.store.parquet import PartWriter


def row(i: int) -> dict[str, object]:
    return {"run_id": "r", "task": "t", "seq": i, "role": "plan", "provider": "p", "model": "m",
            "input_tokens": i, "output_tokens": 1, "cost_usd": 0.5, "latency_s": 0.1, "ok": True,
            "error": None, "node_id": i}


def count(root: Path) -> list[int]:
    return [s for (s,) in duckdb.sql(f"SELECT seq FROM '{root}/llm_calls/*/*.parquet' ORDER BY seq").fetchall()]


def test_rows_flush_in_batches_as_whole_files(tmp_path: Path) -> None:
    w = PartWriter(tmp_path, "llm_calls", "a/b task", llm_call_schema(), flush_rows=2, flush_s=3600)
    for i in range(5):
        w.append(row(i))
    assert count(tmp_path) == [0, 1, 2, 3]  # two files of two rows; one row still buffered
    w.close()
    assert count(tmp_path) == [0, 1, 2, 3, 4]
    files = sorted(tmp_path.glob("llm_calls/*/*"))
    assert [f.parent.name for f in files] == ["a_b_task"] * 3 and all(f.suffix == ".parquet" for f in files)


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
