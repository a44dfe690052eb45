"""The worker's sandbox, seen by candidates that look around: no credentials in its environment, a private
working directory; isolated, no other process and no network, and a crash or a hang judged as unisolated.
(Split from test_eval.py so that the two run beside each other under pytest-xdist.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from eval_helpers import passed
from test_eval import DEMO, PY_CANDIDATES, eager, task

from stark_ray.config import EvalConfig
from stark_ray.eval import Evaluator
from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix
from stark_ray.eval.proc.sandbox_env import is_secret
from stark_ray.records import STAGE_CRASH, STAGE_TIMEOUT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cfg(shared_build_dir: str) -> EvalConfig:
    return EvalConfig(build_dir=shared_build_dir, trials=5, warmup=2, timing_trials=10, check_timeout_s=90)


def test_worker_environment_has_no_credentials(tmp_path: Path, cfg: EvalConfig,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARK_TEST_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("STARK_TEST_TOKEN", "do-not-leak")
    for name in ("PGPASSWORD", "DATABASE_URL", "OPENAI_KEY", "SSH_AUTH_SOCK"):  # no secret-looking name
        monkeypatch.setenv(name, "do-not-leak")
    record = tmp_path / "env.json"
    snoop = (f"import json, os\njson.dump({{'env': dict(os.environ), 'cwd': os.getcwd()}}, "
             f"open({str(record)!r}, 'w'))\n")
    # unisolated, so that it can write down what it saw (the same allowlist applies isolated)
    r = Evaluator(task(DEMO), replace(cfg, isolate="off")).evaluate(eager(prelude=snoop))
    assert passed(r), r.error
    seen = json.loads(record.read_text())
    assert not [k for k in seen["env"] if is_secret(k)]
    assert "sk-do-not-leak" not in json.dumps(seen) and "do-not-leak" not in json.dumps(seen)
    cwd = Path(seen["cwd"])  # a private directory per request inside the worker's own
    assert cwd.name.startswith("req-") and cwd.parent.name.startswith("stark-eval-") and cwd != Path(os.getcwd())
    assert not cwd.exists()  # the private working directory is removed afterwards


def test_an_isolated_worker_sees_no_other_process_and_no_network(tmp_path: Path, cfg: EvalConfig) -> None:
    """``isolate``: a candidate can read neither another process's environment (the driver and the agent workers
    hold API keys in theirs) nor reach the network. The same candidate without it does both: that is the risk."""
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],  # an agent worker, say
                              env={**os.environ, "STARK_TEST_API_KEY": "sk-do-not-leak"})
    server = socket.create_server(("127.0.0.1", 0))
    record = tmp_path / "seen.json"
    snoop = (f"import json, os, socket\n"
             f"pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
             f"found = []\n"
             f"for p in pids:\n"
             f"    try:\n"
             f"        if b'sk-do-not-leak' in open(f'/proc/{{p}}/environ', 'rb').read(): found.append(p)\n"
             f"    except OSError:\n"
             f"        pass\n"
             f"s = socket.socket(); s.settimeout(3)\n"
             f"seen = {{'found': found, 'pids': len(pids), 'connect': s.connect_ex(('127.0.0.1', "
             f"{server.getsockname()[1]}))}}\n")
    # unisolated, it writes what it saw where the test reads it; isolated, it can write nothing the test could read
    # (a read-only world): it fails, saying what, if it saw anything
    tell = f"json.dump(seen, open({str(record)!r}, 'w'))\n"
    fail = "if seen['found'] or seen['connect'] == 0 or seen['pids'] > 3:\n    raise RuntimeError(f'saw {seen}')\n"
    try:
        exposed = Evaluator(task(DEMO), replace(cfg, isolate="off")).evaluate(eager(prelude=snoop + tell))
        seen_exposed = json.loads(record.read_text())
        isolated = Evaluator(task(DEMO), replace(cfg, isolate="on")).evaluate(eager(prelude=snoop + fail))
    finally:
        holder.kill()
        holder.wait()
        server.close()
    assert passed(exposed) and passed(isolated), (exposed.error, isolated.error)
    assert seen_exposed["found"] and seen_exposed["connect"] == 0


def test_an_isolated_worker_that_crashes_or_hangs_is_judged_as_before(cfg: EvalConfig) -> None:
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))
    iso = replace(cfg, isolate="on", check_timeout_s=10)
    crashed = Evaluator(task(DEMO), iso).evaluate(PY_CANDIDATES["py_segfault"])
    assert crashed.stage == STAGE_CRASH and crashed.error is not None and "SIGSEGV" in crashed.error
    hung = Evaluator(task(DEMO), iso).evaluate(PY_CANDIDATES["py_hang_in_forward"])
    assert hung.stage == STAGE_TIMEOUT and hung.error is not None
    assert "at candidate.py:" in hung.error  # the stack dump reached the worker inside the namespace
    assert passed(Evaluator(task(DEMO), iso).evaluate(eager()))  # and a good one after both


# what a candidate writes at its import: 64 files of 1 MiB in its directory (none past the cap alone), then one file
# of 64 MiB; each write's error, in order, on the worker's log (stderr) and as the failure it raises
FILL = '''
import os
import sys

_found = []
try:
    for i in range(64):
        with open(f"part{i}.bin", "wb") as f:
            f.write(bytes(1 << 20))
    _found.append("64 files written")
except OSError as e:
    _found.append(f"files: {e.strerror}")
try:
    with open("one.bin", "wb") as f:
        for _ in range(64):
            f.write(bytes(1 << 20))
    _found.append("one file written")
except OSError as e:
    _found.append(f"one file: {e.strerror}")
raise RuntimeError("; ".join(_found))
'''


def test_what_a_candidate_writes_is_capped(cfg: EvalConfig) -> None:
    """``worker_disk_gb``: isolated, its directory is a tmpfs of that size (64 files of 1 MiB do not fit in 32
    MiB); isolated or not, no file grows past it (RLIMIT_FSIZE). A candidate that filled the host's disk would take
    the run's results with it."""
    small = replace(cfg, worker_disk_gb=32 / 1024)
    unisolated = Evaluator(task(DEMO), replace(small, isolate="off")).evaluate(eager(prelude=FILL))
    assert unisolated.error is not None and "one file: File too large" in unisolated.error, unisolated.error
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))
    isolated = Evaluator(task(DEMO), replace(small, isolate="on")).evaluate(eager(prelude=FILL))
    assert isolated.error is not None and "files: No space left on device" in isolated.error, isolated.error
    assert passed(Evaluator(task(DEMO), replace(cfg, isolate="on")).evaluate(eager(prelude=FILL.replace(
        "range(64)", "range(4)").replace("raise RuntimeError", "print")))), "a few MiB are no trouble"
