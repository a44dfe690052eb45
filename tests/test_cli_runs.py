"""Whole `stark optimize` runs through the real entry point: a real OpenAI SDK against a local server, a
provider that refuses the key, and a run stopped by SIGTERM. Replies are scripted; everything else is real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from llm_server import OPENAI_PATH, FakeLLMServer, ok, unauthorized
from scripted_replies import SLOW, WRONG

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "1_LeakyReluScale.py"


def plan_text() -> str:
    code = TASK.read_text().rstrip("\n")
    return ("Fuse the elementwise chain.\n\n```python\n" + code + "\n# <<<IMPROVE BEGIN 1>>>\n"
            "# <<<IMPROVE END 1>>>\n```\n\nINSTRUCTION 1: Fuse the chain into one kernel.\n")


def code_text(source: str) -> str:
    return f"Here it is.\n\n```python\n{source}```\n"


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return {**base, "COLUMNS": "200", **extra}


def stark(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stark_ray.cli", "optimize", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def test_openai_compatible_server_end_to_end(ray_cluster: str, tmp_path: Path) -> None:
    with FakeLLMServer() as server:
        server.script(OPENAI_PATH, ok(plan_text(), input_tokens=1000, output_tokens=100),
                      ok(code_text(WRONG), input_tokens=2000, output_tokens=200),
                      ok(plan_text(), input_tokens=1000, output_tokens=100),
                      ok(code_text(SLOW), input_tokens=2000, output_tokens=200))
        proc = stark(str(TASK), "--base-url", server.openai_base_url, "--model", "gpt-4o", "-B", "2",
                     "--epsilon", "0", "--out", str(tmp_path), "--trials", "2", "--quiet", "--address", ray_cluster,
                     env=env(OPENAI_API_KEY="sk-test"))
        out, errs = proc.communicate(timeout=300)
        bodies = [r.body for r in server.received(OPENAI_PATH)]
    assert proc.returncode == 0, errs
    assert "finished, 2 attempts" in out
    assert [b["temperature"] for b in bodies] == [0.8, 0.1, 0.8, 0.1]  # plan, code, plan, code
    assert all(b["model"] == "gpt-4o" for b in bodies)
    [run] = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["success"] and summary["attempts"] == 2 and summary["llm_calls"] == 4
    assert summary["tokens"] == {"input": 6000, "output": 600}
    assert summary["cost"] == pytest.approx((6000 * 2.5 + 600 * 10.0) / 1e6)  # gpt-4o's list price
    rows = duckdb.sql(f"SELECT role, provider, input_tokens, node_id FROM '{run}/llm_calls/*/*.parquet' "
                      "ORDER BY node_id, role DESC").fetchall()
    assert rows == [("plan", "openai", 1000, 1), ("code", "openai", 2000, 1),
                    ("plan", "openai", 1000, 2), ("code", "openai", 2000, 2)]
    assert (run / "best_kernel.py").read_text() == SLOW


def test_a_refused_key_stops_the_run_with_one_line_and_keeps_what_was_recorded(ray_cluster: str,
                                                                              tmp_path: Path) -> None:
    with FakeLLMServer() as server:
        server.fallback(OPENAI_PATH, unauthorized())
        proc = stark(str(TASK), "--base-url", server.openai_base_url, "-B", "30", "--out", str(tmp_path),
                     "--trials", "2", "--address", ray_cluster, env=env(OPENAI_API_KEY="sk-wrong"))
        _, errs = proc.communicate(timeout=300)
        calls = len(server.received(OPENAI_PATH))
    assert proc.returncode == 1, errs
    assert calls == 1  # no retry of a 401, and no second call: the run stopped instead of burning its budget
    error_lines = [ln for ln in errs.splitlines() if ln.startswith("error:")]
    assert len(error_lines) == 1 and "auth" in error_lines[0] and "Traceback" not in errs
    [run] = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["attempts"] == 0
    assert duckdb.sql(f"SELECT count(*) FROM '{run}/attempts/*/*.parquet'").fetchall() == [(1,)]  # the reference


def test_sigterm_stops_cleanly_with_everything_recorded(ray_cluster: str, tmp_path: Path) -> None:
    cassette = tmp_path / "c.jsonl"  # served in order (no prompts recorded): a long run of correct attempts
    lines = [{"role": "plan", "prompt_sha256": "-", "reply": plan_text()},
             {"role": "code", "prompt_sha256": "-", "reply": code_text(SLOW)}] * 30
    cassette.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "runs"
    proc = stark(str(TASK), "--cassette", str(cassette), "-B", "30", "--epsilon", "0", "--out", str(out),
                 "--trials", "2", "--address", ray_cluster, env=env())
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(out.glob("*/attempts/*/part-*.parquet"))) < 3:
        time.sleep(0.2)  # the reference and two attempts are on disk
    proc.send_signal(signal.SIGTERM)
    _, errs = proc.communicate(timeout=120)
    assert proc.returncode == 130, errs
    assert "interrupted" in errs and "Traceback" not in errs
    [run] = out.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 2 <= summary["attempts"] < 30
    n = duckdb.sql(f"SELECT count(*) FROM '{run}/attempts/*/*.parquet'").fetchall()[0][0]
    assert n == summary["attempts"] + 1  # every attempt the summary counts is a row, and no more
    assert (run / "best_kernel.py").read_text() == SLOW
    assert not list(run.rglob("*.tmp"))


def test_a_run_in_which_no_attempt_produced_a_candidate_exits_non_zero(tmp_path: Path) -> None:
    """A `-B 2` run in which every LLM call failed exited 0; here every reply holds no code (the same outcome: not
    one candidate to evaluate), with the local executor."""
    cassette = tmp_path / "c.jsonl"
    reply = {"role": "plan", "prompt_sha256": "-", "reply": "I cannot help with that."}  # asked twice per attempt
    cassette.write_text("".join(json.dumps(reply) + "\n" for _ in range(6)))
    proc = stark(str(TASK), "--cassette", str(cassette), "-B", "2", "--out", str(tmp_path / "runs"), "--trials", "2",
                 "--executor", "local", "--quiet", env=env())
    _, errs = proc.communicate(timeout=300)
    assert proc.returncode == 1, errs
    error_lines = [ln for ln in errs.splitlines() if ln.startswith("error:")]
    assert len(error_lines) == 1 and "no candidate was evaluated: all 2 attempt(s)" in error_lines[0], errs
    [run] = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["attempts"] == 2  # recorded all the same
    assert summary["models"] == ["replay"] and summary["settings"]["agents"]["model"] != "gpt-4o"  # not a guess


def test_where_ray_cannot_start_a_one_task_run_goes_on_with_the_local_executor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy host 18 of 25 private Ray starts failed (its agents must come up within ~15 s): each `stark
    optimize` then ended after ~4 minutes with one line and no run. A run the local executor can do goes on there."""
    from typer.testing import CliRunner

    import stark_ray.run.ray_driver as ray_driver
    from stark_ray.cli.main import app
    from stark_ray.run.directory import RayUnavailable

    def cannot_start(*args: object, **kwargs: object) -> bool:
        raise RayUnavailable("Ray could not start on this machine (3 tries): gave up waiting for its dashboard agent")

    monkeypatch.setattr(ray_driver, "connect", cannot_start)
    cassette = tmp_path / "c.jsonl"
    reply = {"role": "plan", "prompt_sha256": "-", "reply": "I cannot help with that."}
    cassette.write_text("".join(json.dumps(reply) + "\n" for _ in range(2)))
    result = CliRunner().invoke(app, ["optimize", str(TASK), "--cassette", str(cassette), "-B", "1", "--out",
                                      str(tmp_path / "runs"), "--trials", "2", "--quiet"])
    assert "running with --executor local instead" in result.output, result.output
    [run] = (tmp_path / "runs").iterdir()
    assert json.loads((run / "run.json").read_text())["executor"] == "local"  # it ran, on the local executor
    # asked for Ray by name (or with --parallel), it is an error as before
    asked = CliRunner().invoke(app, ["optimize", str(TASK), "--cassette", str(cassette), "-B", "1", "--out",
                                     str(tmp_path / "asked"), "--executor", "ray", "--quiet"])
    assert asked.exit_code != 0 and "running with --executor local" not in asked.output
