"""No orphans (eval/proc/lifetime.py): what a candidate starts and leaves running is killed after it, double-forked or
not; the evaluator's processes die with a ``stark eval`` killed by SIGKILL; a process started from a thread that
ends lives on. Real processes, the cpu_cpp backend, not isolated (the default on a host without namespaces), and
isolated (the default where the host allows it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from leaky_candidates import MODEL, TASK, quick_service

from stark_ray.eval.proc import lifetime
from stark_ray.eval.proc.lifetime import spawn
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
LIVENESS_S = 60.0  # how long a killed process may take to be gone (a busy 2-core machine)

LEAVES_PROCESSES = """
import os, subprocess, sys, torch

_started = False


def _leave(record):
    global _started
    if _started:
        return
    _started = True
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)  # its own group and session
    with open(record + ".sleeper", "w") as f:
        f.write(str(sleeper.pid))
    if os.fork() == 0:  # a double fork: the grandchild is re-parented when its parent exits
        os.setsid()
        if os.fork() == 0:
            with open(record + ".orphan", "w") as f:
                f.write(str(os.getpid()))
            os.execvp("sleep", ["sleep", "600"])
        os._exit(0)
""" + MODEL

HANGS = """
import os, time, torch
""" + MODEL


def _gone(pid: int) -> bool:
    """Ended (no such process, or a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + LIVENESS_S
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if not _gone(p)]


def _read_pid(path: Path) -> int:
    deadline = time.monotonic() + LIVENESS_S
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.strip().isdigit():
            return int(text)
        time.sleep(0.1)
    raise AssertionError(f"{path} was never written")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvalService]:
    with quick_service(str(tmp_path_factory.mktemp("build"))) as s:
        yield s


def test_processes_a_candidate_leaves_running_are_killed_after_it(service: EvalService, tmp_path: Path) -> None:
    record = str(tmp_path / "pids")
    task = load_task(TASK)
    source = LEAVES_PROCESSES.format(forward=f"_leave({record!r})", factor="")
    r = service.evaluate(task, source)
    sleeper, orphan = _read_pid(Path(record + ".sleeper")), _read_pid(Path(record + ".orphan"))
    assert _wait_gone([sleeper, orphan]) == []
    assert "process(es) the candidate left running" in r.log, r.log[-1500:]
    honest = service.evaluate(task, HANGS.format(forward="pass", factor=""))  # the same worker judges on, right
    assert honest.passed_checks and honest.stage == "ok", honest.error


WATCHES_ITS_CHILD = """
import subprocess, torch

_child = None


def _watch(record):
    global _child
    if _child is None:
        _child = subprocess.Popen(["sleep", "600"])
    elif _child.poll() is not None:  # killed while the request goes on
        open(record + ".killed", "w").close()
""" + MODEL


def test_a_candidates_process_is_killed_before_the_judge_times_its_own_side(service: EvalService,
                                                                           tmp_path: Path) -> None:
    """Not only after the request: once the judge stops the worker to time its own side (here in the wall-clock
    confirmation every candidate gets), the processes the candidate started are killed — on a GPU what one queued in
    a context of its own would run on through the stop — and the candidate, called again after, finds it gone."""
    record = str(tmp_path / "child")
    cfg = replace(service.cfg, confirm_above=0.0)
    r = service.evaluate(load_task(TASK), WATCHES_ITS_CHILD.format(forward=f"_watch({record!r})", factor=""), cfg)
    assert Path(record + ".killed").exists(), r.log[-1500:]
    assert "process(es) the candidate left running" in r.log, r.log[-1500:]
    assert r.passed_checks, r.error


def test_processes_that_end_with_their_candidates_worker_are_still_said(service: EvalService, tmp_path: Path) -> None:
    """With a worker per candidate (a GPU's default), the worker ends after the candidate and takes what it left
    running with it: the log still says so (it once said nothing where a suspicious candidate's worker was killed)."""
    record = str(tmp_path / "pids")
    source = LEAVES_PROCESSES.format(forward=f"_leave({record!r})", factor="")
    r = service.evaluate(load_task(TASK), source, replace(service.cfg, worker_candidates=1))
    assert _wait_gone([_read_pid(Path(record + ".sleeper")), _read_pid(Path(record + ".orphan"))]) == []
    assert "process(es) the candidate left running" in r.log, r.log[-1500:]


def test_the_evaluator_dies_with_a_killed_stark_eval(tmp_path: Path) -> None:
    """``kill -9`` of ``stark eval`` while its worker runs a hanging candidate: judge and worker go with it."""
    record = tmp_path / "pids"
    candidate = tmp_path / "hang.py"
    candidate.write_text(HANGS.format(forward=(
        f"open({str(record)!r}, 'w').write(f'{{os.getpid()}} {{os.getppid()}}')\n"
        "        while True:\n            time.sleep(0.05)"), factor=""))
    cli = subprocess.Popen([sys.executable, "-m", "stark_ray.cli", "eval", str(TASK), str(candidate),
                            "--backend", "cpu_cpp", "--build-dir", str(tmp_path / "build"), "--isolate", "off"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(record.read_text().split() if record.exists() else []) < 2:
            assert cli.poll() is None, "stark eval ended before its candidate ran"
            time.sleep(0.2)
        worker, judge = (int(x) for x in record.read_text().split())
        assert not _gone(worker) and not _gone(judge)
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
        assert _wait_gone([worker, judge]) == []
    finally:
        if cli.poll() is None:
            cli.kill()


MARKED = """
import os, subprocess, time, torch

_started = False


def _leave(seconds, hang):
    global _started
    if not _started:
        _started = True
        subprocess.Popen(["sleep", seconds], start_new_session=True)
        if os.fork() == 0:  # a double fork
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", seconds])
            os._exit(0)
    while hang:
        time.sleep(0.05)
""" + MODEL


def _marked(seconds: str) -> list[int]:
    """Processes on this host whose command line is ``sleep SECONDS`` (isolated, a candidate cannot tell its
    host pids: the unusual duration marks its processes)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", seconds.encode()]:
                    found.append(int(proc.name))
            except OSError:
                continue
    return [p for p in found if not _gone(p)]


def _isolation_or_skip() -> None:
    from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix

    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))


def test_isolated_what_a_candidate_leaves_running_is_killed_after_it(tmp_path: Path) -> None:
    """The default where the host allows it: the same sweep reaches into the namespace."""
    _isolation_or_skip()
    seconds = f"{600 + os.getpid() % 1000}.{time.time_ns() % 10**6:06d}"
    with quick_service(str(tmp_path / "build"), isolate="on") as service:
        task = load_task(TASK)
        r = service.evaluate(task, MARKED.format(forward=f"_leave({seconds!r}, False)", factor=""))
        assert r.passed_checks, r.error
        assert _wait_marked_gone(seconds) == [], "left running after the request"
        assert "process(es) the candidate left running" in r.log, r.log[-1500:]
        honest = service.evaluate(task, HANGS.format(forward="pass", factor=""))
        assert honest.passed_checks and honest.stage == "ok", honest.error


def test_isolated_everything_dies_with_a_killed_stark_eval(tmp_path: Path) -> None:
    """``kill -9`` of ``stark eval`` (isolated by default) while its candidate hangs: judge, worker and what the
    candidate started all end (the namespace ends with its first process)."""
    _isolation_or_skip()
    seconds = f"{700 + os.getpid() % 1000}.{time.time_ns() % 10**6:06d}"
    candidate = tmp_path / "hang.py"
    candidate.write_text(MARKED.format(forward=f"_leave({seconds!r}, True)", factor=""))
    cli = subprocess.Popen([sys.executable, "-m", "stark_ray.cli", "eval", str(TASK), str(candidate),
                            "--backend", "cpu_cpp", "--build-dir", str(tmp_path / "build")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(_marked(seconds)) < 2:
            assert cli.poll() is None, "stark eval ended before its candidate ran"
            time.sleep(0.2)
        assert len(_marked(seconds)) == 2
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
        assert _wait_marked_gone(seconds) == []
    finally:
        if cli.poll() is None:
            cli.kill()


def _wait_marked_gone(seconds: str) -> list[int]:
    deadline = time.monotonic() + LIVENESS_S
    while time.monotonic() < deadline and _marked(seconds):
        time.sleep(0.2)
    return _marked(seconds)


def test_a_process_started_from_a_thread_that_ends_lives_on() -> None:
    """The kernel's parent-death signal follows the thread that forked: every start goes through one thread that
    lives as long as the process, so a worker started by a short-lived thread is not killed when it ends."""
    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(spawn(["sleep", "30"], dict(os.environ))))
    thread.start()
    thread.join()
    try:
        time.sleep(1.0)  # a parent-death signal would have come at the thread's end
        assert started[0].poll() is None
    finally:
        started[0].kill()
        started[0].wait()


def test_without_setpriv_a_child_checks_its_own_parent_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where setpriv is missing the child asks for the signal itself and exits if its parent is already gone; a
    wrapped child (unshare) is not told a parent to check, nor is a grandchild told its grandparent's."""
    monkeypatch.setattr(lifetime, "death_prefix", lambda: ())
    env = {**os.environ, lifetime.PARENT_ENV: "1"}  # as if this process had been told its own parent
    show = [sys.executable, "-c", f"import os; print(os.environ.get({lifetime.PARENT_ENV!r}))"]
    direct = spawn(show, env, stdout=subprocess.PIPE)
    wrapped = spawn(show, env, direct=False, stdout=subprocess.PIPE)
    assert direct.communicate()[0].decode().strip() == str(os.getpid())
    assert wrapped.communicate()[0].decode().strip() == "None"


def test_a_service_closed_while_another_thread_evaluates_ends_it_instead_of_waiting(shared_build_dir: str) -> None:
    """A resumed local run times its reference in a thread of its own beside its first agent call; interrupted then,
    closing the evaluator waited on the device for the whole request (up to its limits and the judge's margin).
    Now the judge is ended under the request, and the thread that ran it ends too."""
    task = load_task(TASK)
    hang = "import torch\n" + MODEL.format(forward="while True: pass", factor="")
    with quick_service(shared_build_dir) as service:
        service.reference(task)
        cfg = replace(service.cfg, check_timeout_s=3600, timing_timeout_s=3600)  # a request that would hold an hour
        evaluating = threading.Thread(target=service.evaluate, args=(task, hang, cfg), daemon=True)
        evaluating.start()
        while "checking" not in {doing for doing, _ in service.activity().values()}:
            assert evaluating.is_alive(), "the evaluation ended before it ran the candidate"
            time.sleep(0.05)
        service.close()  # with the hour's request on the device: it ends it
        evaluating.join(LIVENESS_S)
        assert not evaluating.is_alive() and not service.judge.alive


def test_a_worker_ended_from_two_threads_at_once_is_ended_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A service closed under another thread's request ends its judge while that thread ends it too (CI saw it: the
    second end closed the log descriptor again, by then the number of the first's directory scan, which failed with
    EBADF). Whoever asks second finds nothing left to end."""
    from stark_ray.eval.proc import runner
    from stark_ray.eval.proc.launch import WorkerSpec

    worker = runner.WorkerProcess(WorkerSpec("cpu_cpp", str(tmp_path), 1))
    sleeper = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE, start_new_session=True)
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    worker._proc, worker._workdir = sleeper, workdir
    worker._log_fd = os.open(tmp_path / "log", os.O_CREAT | os.O_RDWR)
    ends: list[int] = []
    real_end = runner.end_process

    def slow_end(proc: subprocess.Popen[bytes], *args: object, **kwargs: object) -> None:
        ends.append(proc.pid)
        time.sleep(0.5)  # the other thread asks meanwhile
        real_end(proc, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "end_process", slow_end)
    errors: list[BaseException] = []

    def end() -> None:
        try:
            worker.kill()
        except BaseException as e:  # what the thread raised is the test's verdict
            errors.append(e)

    threads = [threading.Thread(target=end) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIVENESS_S)
    assert errors == [] and ends == [sleeper.pid]
    assert sleeper.poll() is not None and not workdir.exists() and not worker.alive
