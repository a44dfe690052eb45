"""The parent treats everything from a worker as hostile (eval/proc/runner.py): a candidate that replaces its log with a
link to a file only the parent may read, says it moved on to another phase again and again, floods its parent
with build requests it never reads the answers to, or writes one endless line, gets its verdict (a crash or a
timeout), leaks nothing, and the next honest candidate is judged right. Found by a review of the isolation; real
processes, isolated cpu_cpp workers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from eval_helpers import passed
from leaky_candidates import MODEL, TASK, quick_service

from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task
from stark_ray.records import STAGE_COMPILE, STAGE_CRASH, STAGE_TIMEOUT

SECRET = "only-the-parent-may-read-0451"
HONEST = "import torch\n" + MODEL.format(forward="pass", factor="")

# the worker's control channel: the one pipe it holds open for writing beyond stdout and stderr
CONTROL = """
import fcntl, json, os, stat, sys, time
import torch


def control():
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if fd > 2 and stat.S_ISFIFO(st.st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
            return fd
    raise RuntimeError("no control channel")
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvalService]:
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))
    with quick_service(str(tmp_path_factory.mktemp("build")), isolate="on") as s:
        yield s


def _after(service: EvalService) -> None:
    honest = service.evaluate(load_task(TASK), HONEST)
    assert passed(honest), honest.error


def test_a_log_replaced_by_a_link_leaks_nothing(service: EvalService, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    candidate = f"""
import os, sys
log = os.readlink("/proc/self/fd/2")  # the log: its path in the worker's directory
os.unlink(log)
os.symlink({str(secret)!r}, log)
print("replaced", file=sys.stderr, flush=True)
os._exit(3)
""" + HONEST
    r = service.evaluate(load_task(TASK), candidate)
    assert SECRET not in (r.log or "") and SECRET not in (r.error or "")
    # isolated, its directory is a tmpfs of its own (EvalConfig.worker_disk_gb): the log the parent opened lies on
    # the host's directory beneath it, out of its reach; where a candidate could replace it (session 23's worker),
    # the parent read its log through the descriptor it opened, never the link
    assert r.stage == STAGE_COMPILE and "No such file or directory" in (r.error or ""), (r.stage, r.error)
    _after(service)
    with quick_service(str(tmp_path / "build"), isolate="off") as unisolated:  # the log in its reach: replaced
        r = unisolated.evaluate(load_task(TASK), candidate)
    assert r.stage == STAGE_CRASH, (r.stage, r.error)
    assert SECRET not in (r.log or "") and SECRET not in (r.error or "")
    assert "replaced" in (r.log or "")  # what it printed is still its log


def test_phases_said_again_and_again_do_not_move_the_deadline(service: EvalService) -> None:
    candidate = CONTROL + """
fd = control()
for i in range(10 ** 6):  # back and forth: each change of phase once gave the candidate a fresh limit
    os.write(fd, (json.dumps({"phase": ["check", "compile", "setup", "time"][i % 4]}) + "\\n").encode())
    time.sleep(0.5)
""" + MODEL.format(forward="pass", factor="")
    from dataclasses import replace

    cfg = replace(service.cfg, compile_timeout_s=4, compile_timeout_scale=0, check_timeout_s=4, timing_timeout_s=4)
    r = service.evaluate(load_task(TASK), candidate, cfg)
    assert r.stage == STAGE_TIMEOUT, (r.stage, r.error)
    _after(service)


@pytest.mark.parametrize("flood", ["builds", "one endless line"])
def test_a_flood_of_messages_ends_the_worker_not_the_parent(service: EvalService, flood: str) -> None:
    if flood == "builds":  # requests whose answers it never reads: the parent's writes would block
        attack = """
request = (json.dumps({"build": {"key": "0" * 16, "arguments": {}}}) + "\\n").encode()
for _ in range(5000):
    os.write(fd, request)
"""
    else:  # no newline: the parent would hold all of it in memory
        attack = """
chunk = b"[" * (1 << 20)
for _ in range(100):
    os.write(fd, chunk)
"""
    candidate = CONTROL + "fd = control()\n" + attack + "time.sleep(600)\n" + MODEL.format(forward="pass", factor="")
    r = service.evaluate(load_task(TASK), candidate)
    assert not r.accepted and r.stage in (STAGE_CRASH, STAGE_TIMEOUT), (r.stage, r.error)
    _after(service)


def test_what_a_candidate_leaves_in_its_worker_does_not_reach_the_next(service: EvalService) -> None:
    """A module written where the worker started (first on sys.path under ``python -m``) or in the candidate's
    home, temp or cache directories is not what the next candidate of the same worker imports."""
    plant = """
import os, tempfile
for where in {os.path.dirname(os.getcwd()), os.getcwd(), os.environ["HOME"], tempfile.gettempdir(),
              os.environ.get("TRITON_CACHE_DIR", os.getcwd())}:
    try:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, "stark_planted.py"), "w") as f:
            f.write("PLANTED = True\\n")
    except OSError:
        pass
""" + HONEST
    probe = """
try:
    import stark_planted  # noqa: F401
    raise RuntimeError("imported what the last candidate planted")
except ImportError:
    pass
""" + HONEST
    first = service.evaluate(load_task(TASK), plant)
    assert passed(first), first.error
    second = service.evaluate(load_task(TASK), probe)
    assert passed(second), second.error


def test_the_log_of_a_worker_ended_by_another_thread_is_never_another_files(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The log is read through the parent's own descriptor; another thread ending the worker closes it, and the next
    file opened may take its number: what is read is the worker's log or nothing, never that file's text (a key,
    say). Here the other thread ends the worker in the middle of the read, and a file is opened after it."""
    import os
    import subprocess
    import sys
    import threading

    from stark_ray.eval.proc import runner
    from stark_ray.eval.proc.launch import WorkerSpec

    worker = runner.WorkerProcess(WorkerSpec("cpu_cpp", str(tmp_path / "builds"), 1))
    log = tmp_path / "worker.log"
    log.write_text("a line of the worker's\n")
    secret = tmp_path / "secret"
    secret.write_text("OPENAI_API_KEY=sk-not-for-the-log\n")
    worker._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    worker._log_fd = os.open(log, os.O_RDONLY)
    opened: list[int] = []
    real = runner.read_log

    def read_meanwhile(log_fd: int, offset: int) -> str:
        ender = threading.Thread(target=worker.kill)
        ender.start()
        ender.join(timeout=2.0)  # where nothing holds it back, the log's descriptor is closed now ...
        opened.append(os.open(secret, os.O_RDONLY))  # ... and this file takes its number
        return real(log_fd, offset)

    monkeypatch.setattr(runner, "read_log", read_meanwhile)
    try:
        text = worker.log_since_mark()
    finally:
        for fd in opened:
            os.close(fd)
        worker.kill()
    assert "sk-not" not in text and text in ("", "a line of the worker's\n"), text
    assert worker._proc is None
