"""A campaign across the nodes of a simulated Ray cluster (``ray.cluster_utils.Cluster``: a head and three worker
nodes with one logical GPU each, in ``tests/cluster_campaign.py``, run as a process of its own): evaluations
spread over the workers; a worker node removed mid-campaign; the whole head (its GCS, raylet, driver and
TreeMemory actor) killed mid-campaign and the campaign finished by ``--resume`` on a new cluster. The run
directory is on storage every node shares: a local path, or the S3-compatible test server. What each test shows
is docs/cluster.md's table of what survives which failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stark_ray.store.location import locate
from stark_ray.store.read import attempt_rows

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "cluster_campaign.py"
TASKS, BUDGET = 6, 8


def env() -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def script(*args: str, timeout: float = 900) -> dict[str, Any]:
    """Run the cluster script to its end; its last line of JSON (a raylet's broadcast, "(raylet) Task ... failed.
    There are infinite retries remaining", can come after it on the same stdout: a node removed mid-run)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env(),
                          timeout=timeout, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert results, proc.stdout[-3000:]
    return json.loads(results[-1])


def rows_by_task(run_dir: str) -> dict[str, dict[int, dict[str, Any]]]:
    """Every attempts row by task and seq; a seq written twice fails."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for row in attempt_rows(run_dir):
        seqs = out.setdefault(row["task"], {})
        assert row["seq"] not in seqs, f"{row['task']}: seq {row['seq']} written twice"
        seqs[row["seq"]] = row
    return out


def assert_complete(result: dict[str, Any], run_dir: str) -> dict[str, dict[int, dict[str, Any]]]:
    assert len(result["tasks"]) == TASKS
    assert all(t == {"status": "finished", "attempts": BUDGET} for t in result["tasks"].values()), result["tasks"]
    rows = rows_by_task(run_dir)
    assert sorted(rows) == sorted(result["tasks"])
    for seqs in rows.values():  # every attempt once: the root and seqs 1..budget, no gap, nothing twice
        assert sorted(seqs) == list(range(BUDGET + 1))
    return rows


def test_a_worker_node_removed_mid_campaign_moves_its_work_to_the_others(tmp_path: Path) -> None:
    """The candidates in flight on the removed node go to the evaluators left (uncharged: one death, no note) once
    the driver has waited MOVE_AFTER_S (3 s here) for a restart that cannot come; nothing recorded is lost, nothing
    is doubled, the campaign finishes."""
    result = script("run", str(tmp_path / "runs"), str(tmp_path), "--tasks", str(TASKS), "--budget", str(BUDGET),
                    "--remove-worker-at", "15")
    rows = assert_complete(result, str(tmp_path / "runs" / "cluster"))
    assert len(result["nodes"]) == 3 and result["head"] not in result["nodes"]  # every worker evaluated, not the head
    assert result["removed"] in result["nodes"]
    # every candidate evaluated to its end (a candidate logged on the removed node whose answer was lost with it
    # is evaluated again), and none charged
    assert TASKS * BUDGET <= result["evaluations"] <= TASKS * BUDGET + result["evaluated_on_removed"]
    assert not [r for seqs in rows.values() for r in seqs.values() if r["stage"] == "crash"]


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_a_campaign_whose_head_is_killed_is_finished_by_resume_on_a_new_head(
        tmp_path: Path, storage: str, request: pytest.FixtureRequest) -> None:
    """kill -9 of the head's whole process group (GCS, raylet, the driver with the TreeMemory actor's owner) at
    about 40% of the campaign; a new cluster resumes the run directory from the shared storage and finishes it:
    every row recorded before the kill unchanged, every attempt once."""
    out = request.getfixturevalue("s3_root") if storage == "s3" else str(tmp_path / "runs")
    run_dir = str(locate(out) / "cluster")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "run", out, str(tmp_path), "--tasks", str(TASKS),
                             "--budget", str(BUDGET)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(), start_new_session=True)
    try:
        seen = 0
        assert proc.stdout is not None
        for line in proc.stdout:
            seen += line.startswith("attempt ")
            if seen >= TASKS * BUDGET * 4 // 10:
                break
        else:
            pytest.fail(f"the campaign ended before the kill: {proc.stderr.read() if proc.stderr else ''}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the head: the script's process group holds every Ray process
        proc.wait()
    deadline = time.monotonic() + 30
    while True:  # nothing of the old cluster is left running
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the killed head are still running"
        time.sleep(0.2)
    before = rows_by_task(run_dir)
    assert 0 < sum(len(seqs) for seqs in before.values()) < TASKS * (BUDGET + 1)
    result = script("resume", run_dir, str(tmp_path))
    after = assert_complete(result, run_dir)
    for task, seqs in before.items():  # nothing recorded before the kill was lost or changed
        for seq, row in seqs.items():
            assert after[task][seq] == row
