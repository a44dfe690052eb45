"""A run directory on an object store: ``--out s3://bucket/prefix?...`` against a local S3-compatible server
(moto, on 127.0.0.1), through the real pyarrow S3 filesystem — the driver's files, the TreeMemory actor's Parquet
rows, ``kill -9`` and ``--resume``, and ``stark sql`` / ``stark report`` reading it back."""

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
from typer.testing import CliRunner

from stark_ray.cli.main import app
from stark_ray.store.location import Location, locate
from stark_ray.store.read import attempt_rows, load_trees

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "1_LeakyReluScale.py"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_a_location_on_s3_reads_writes_lists_and_prints_as_its_uri(s3_root: str) -> None:
    root = locate(s3_root)
    assert not root.local and str(root) == s3_root  # printed as given, query included: usable by the next command
    f = root / "run-1" / "tasks" / "level1" / "t" / "summary.json"
    f.write_text('{"a": 1}')
    assert json.loads(locate(str(f)).read_text()) == {"a": 1}  # the printed URI reaches the same object
    assert f.is_file() and not f.is_dir() and (root / "run-1").is_dir()
    assert [d.name for d in root.subdirs()] == ["run-1"]
    assert [str(x) for x in (root / "run-1").find("summary.json")] == [str(f)]
    assert str(f.parent.parent) == str(root / "run-1" / "tasks" / "level1")
    new = root / "run-2"
    new.make_new()  # on an object store: the name is free (the directory appears with its first object)
    (new / "run.json").write_text("{}")
    with pytest.raises(FileExistsError):
        new.make_new()
    with pytest.raises(FileNotFoundError):
        (root / "absent.json").read_text()
    with pytest.raises(TypeError):  # never mistaken for a local path
        open(f)  # noqa: SIM115
    assert locate(Path("x")) == Location(None, "x")
    with pytest.raises(ValueError, match="not a filesystem URI"):
        locate("nosuchscheme://bucket/x")


def test_uris_are_checked_printed_back_exactly_and_directories_cost_no_writes(s3_root: str) -> None:
    import pyarrow.fs as pafs

    from stark_ray.run.directory import RunError, load_run, new_run_dir

    base, _, query = s3_root.partition("?")
    spaced = locate(f"{base}/with%20space?{query}")
    assert spaced.path.endswith("/runs/with space") and str(spaced) == f"{base}/with%20space?{query}"
    assert locate(str(spaced / "x")).path == (spaced / "x").path  # printed, then read back: the same place
    for bad, says in [("s3:/bucket/x", "without '//'"), ("file:~/runs", "without '//'"),
                      (s3_root.replace("s3://", "s3://KEY:s3cr3tvalue@"), "credentials in the URI")]:
        with pytest.raises(ValueError, match=says) as e:
            locate(bad)
        assert "s3cr3tvalue" not in str(e.value)
    with pytest.raises(RunError, match="not a filesystem URI"):  # one line, never an UnboundLocalError
        load_run("nosuchscheme://x/y")

    root = locate(s3_root)
    assert root.fs is not None
    deep = root / "a" / "b" / "c"
    listed = pafs.FileSelector(root.path, recursive=True, allow_not_found=True)
    deep.mkdir()  # directories are implicit on an object store: nothing written, so prefix-scoped policies do
    assert root.fs.get_file_info(listed) == []
    deep.check_writable()  # the probe is written and deleted (pyarrow may keep an empty marker of its directory)
    assert [i.path for i in root.fs.get_file_info(listed) if i.type != pafs.FileType.Directory] == []
    run = new_run_dir(root, "task")  # a random suffix: a name cannot be taken atomically here
    assert run.name.startswith("task-") and len(run.name.split("-")[-1]) == 4
    with pytest.raises(OSError, match="no-such-bucket-x"):  # a missing bucket fails before any work
        locate(f"s3://no-such-bucket-x/runs?{query}").check_writable()


def test_bad_uris_fail_in_one_line(s3_server: str, tmp_path: Path) -> None:
    missing = f"s3://no-such-bucket/runs?endpoint_override={s3_server}&scheme=http&region=us-east-1"
    cassette = tmp_path / "c.jsonl"
    cassette.write_text("")
    for args, says in [(("sql", missing, "SELECT 1"), "no such directory"),
                       (("report", "nosuchscheme://x/y"), "not a filesystem URI"),
                       (("optimize", str(TASK), "--out", missing, "--cassette", str(cassette), "--executor", "local"),
                        "--out s3://no-such-bucket/runs?endpoint_override="),
                       (("optimize", "--resume", missing), "no such run directory")]:
        res = invoke(*args)
        assert res.exit_code == 2, res.output
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.stderr
        assert "Traceback" not in res.output


@pytest.mark.slow
def test_a_ray_run_on_s3_survives_kill_9_resumes_and_reads_back(ray_cluster: str, s3_root: str, tmp_path: Path,
                                                                 shared_build_dir: str) -> None:
    from test_ray_runtime import driver_script

    script = driver_script(tmp_path, s3_root, "killed", ray_cluster, shared_build_dir)
    run_dir = locate(s3_root) / "killed"
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_rows(str(run_dir), 4, proc)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {r["seq"]: r for r in attempt_rows(str(run_dir))}
    recorded = load_trees(str(run_dir))["1_LeakyReluScale"]
    assert 4 <= len(before) < 11 and (run_dir / "run.json").is_file()

    import ray_replies

    from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
    from stark_ray.run.directory import resume_settings
    from stark_ray.run.ray_driver import RayRun, run_ray

    resumed = RayRun([], SearchConfig(), AgentConfig(), EvalConfig(), s3_root, resume=str(run_dir),
                     client_factory=ray_replies.client)
    resumed.tasks, resumed.search, resumed.agents, resumed.eval = resume_settings(str(run_dir))
    [summary] = run_ray(resumed)
    after = attempt_rows(str(run_dir))
    seqs = [r["seq"] for r in after]
    assert summary.status == "finished" and summary.attempts == 10 and seqs == list(range(11))  # none twice
    for row in after[: len(before)]:  # nothing recorded before the kill was lost or changed
        assert before[row["seq"]] == row
    assert load_trees(str(run_dir))["1_LeakyReluScale"].to_records()[: len(recorded)] == recorded.to_records()
    # the driver's files are objects beside the rows
    assert summary.run_dir == str(run_dir)
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["status"] == "finished" and saved["attempts"] == 10
    if summary.best_node is not None:
        assert "class ModelNew" in (run_dir / "best_kernel.py").read_text()
    assert not [p for p in _objects(run_dir) if p.endswith(".tmp")]  # objects are written in place: no leftovers

    res = invoke("sql", s3_root, "SELECT count(*) AS n, count(DISTINCT seq) AS d FROM attempts", "-f", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"n": 11, "d": 11}]
    res = invoke("report", str(run_dir))
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == f"report: {run_dir / 'report.md'}"
    text = (run_dir / "report.md").read_text()
    assert "1_LeakyReluScale" in text and "(report/fast_p.png)" in text
    assert (run_dir / "report" / "fast_p.png").read_bytes().startswith(b"\x89PNG")


def _objects(loc: Location) -> list[str]:
    import pyarrow.fs as pafs

    assert loc.fs is not None
    return [i.path for i in loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True))]


def _wait_for_rows(run_dir: str, n: int, proc: subprocess.Popen[bytes], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if len(attempt_rows(run_dir)) >= n:
                return
        except (FileNotFoundError, OSError):
            pass
        if proc.poll() is not None:
            err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            raise AssertionError(f"the driver exited early: {err}")
        time.sleep(0.3)
    raise AssertionError(f"fewer than {n} rows in {run_dir} after {timeout} s")


@pytest.mark.slow
def test_stark_optimize_writes_its_run_to_s3_with_the_local_executor(s3_root: str) -> None:
    """The command line end to end (a real OpenAI SDK against a local server): the printed run directory is
    the URI, and summary, best kernel and rows are objects in the bucket."""
    from llm_server import OPENAI_PATH, FakeLLMServer, ok
    from scripted_replies import SLOW
    from test_cli_runs import code_text, env, plan_text, stark

    with FakeLLMServer() as server:
        server.script(OPENAI_PATH, ok(plan_text()), ok(code_text(SLOW)))
        proc = stark(str(TASK), "--base-url", server.openai_base_url, "--model", "gpt-4o", "-B", "1",
                     "--out", s3_root, "--executor", "local", "--trials", "2", "--quiet",
                     env=env(OPENAI_API_KEY="sk-test"))
        out, errs = proc.communicate(timeout=300)
    assert proc.returncode == 0, errs
    [run] = locate(s3_root).subdirs()
    assert f"results in {run}" in out  # the URI, query included: what --resume and stark sql take
    assert json.loads((run / "summary.json").read_text())["attempts"] == 1
    assert (run / "best_kernel.py").read_text() == SLOW
    assert [r["seq"] for r in attempt_rows(str(run))] == [0, 1]
