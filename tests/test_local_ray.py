"""The private local Ray of a run (stark_ray/run/local_ray.py): two at once, a killed driver, a start that fails.

Everything is real: ``ray start`` heads, the reaper, ``stark optimize`` through its entry point."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from scripted_replies import SLOW

from stark_ray.run.local_ray import SESSION_ENV, RayStartError, session_processes, start_failure, start_local_ray

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "1_LeakyReluScale.py"
LIVENESS_S = 120  # a generous bound on a busy box: what is gone is gone within seconds


def this_checkout() -> dict[str, str]:
    """The environment for a driver script run from a file: it imports this checkout's stark_ray, not whichever an
    installation points at (``python file.py`` puts the file's folder on the path, not the working directory)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def marks() -> dict[int, str]:
    """pid -> the local Ray it belongs to, for every process that carries a mark."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    for item in f.read().split(b"\0"):
                        if item.startswith(f"{SESSION_ENV}=".encode()):
                            out[int(entry)] = item.split(b"=", 1)[1].decode()
            except OSError:
                continue
    return out


def argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return []


def is_reaper(pid: int, mark: str) -> bool:
    """Whether ``pid`` is the reaper of ``mark``'s Ray: it holds the directory while it removes it, last."""
    args = argv(pid)
    return args[1:3] == ["-m", "stark_ray.run.local_ray"] and len(args) > 3 and args[3].rstrip("/") == mark.rstrip("/")


def holding(mark: str) -> dict[int, str]:
    """pid -> title of every process with its directory or a file open under ``mark``, whatever its environment says
    (a process whose title was set over its environment bears no mark: Ray's agents); the reaper left out."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or is_reaper(int(entry), mark):
            continue
        links = []
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:  # gone, or not ours to see
            continue
        for place in [f"/proc/{entry}/cwd"] + [f"/proc/{entry}/fd/{fd}" for fd in fds]:
            try:
                links.append(os.readlink(place))
            except OSError:  # that descriptor closed meanwhile: the others still count
                continue
        if any(link.startswith(mark.rstrip("/") + "/") for link in links):
            out[int(entry)] = " ".join(argv(int(entry))).strip()
    return out


def reapers(mark: str) -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and is_reaper(int(e), mark)]


def test_two_runs_started_at_once_each_get_a_ray_of_their_own(tmp_path: Path) -> None:
    """Two ``stark optimize`` at the same moment on one machine (a fixed dashboard-agent port made both die)."""
    plan = ("Fuse it.\n\n```python\n" + TASK.read_text().rstrip("\n") + "\n# <<<IMPROVE BEGIN 1>>>\n"
            "# <<<IMPROVE END 1>>>\n```\n\nINSTRUCTION 1: Fuse the chain.\n")
    lines = [{"role": "plan", "prompt_sha256": "-", "reply": plan},
             {"role": "code", "prompt_sha256": "-", "reply": f"Here.\n\n```python\n{SLOW}```\n"}] * 2
    cassette = tmp_path / "c.jsonl"
    cassette.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    procs = [subprocess.Popen([sys.executable, "-m", "stark_ray.cli", "optimize", str(TASK), "--cassette",
                               str(cassette), "-B", "2", "--epsilon", "0", "--trials", "2", "--quiet", "--out",
                               str(tmp_path / f"runs{i}")], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (out, errs) in zip(procs, results, strict=True):
        assert p.returncode == 0, errs
        assert "finished, 2 attempts" in out and "Traceback" not in errs
        assert "A worker died" not in out + errs  # the raylet's broadcasts go to the log, not the terminal


DRIVER = """
import subprocess, sys, time
import ray
from stark_ray.run.placement import connect

connect(None)

@ray.remote(num_cpus=0)
class Builder:  # as the evaluator actor does: a long compile in a process of its own
    def start(self):
        self.proc = subprocess.Popen(["sleep", "600"])
        return self.proc.pid

b = Builder.remote()
print(ray.get(b.start.remote()), flush=True)
time.sleep(600)
"""


def test_a_killed_driver_takes_its_ray_and_what_its_actors_started_with_it(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=this_checkout(), stdout=subprocess.PIPE,
                              text=True)
    assert driver.stdout is not None
    compiler = int(driver.stdout.readline())
    mark = marks()[compiler]  # the compiler carries its Ray's mark, as every process of that Ray does
    ours = session_processes(mark)
    assert compiler in ours and len(ours) >= 5  # ray start, GCS, raylet, agents, the actor, the compiler
    agents = {pid: title for pid, title in holding(mark).items() if title.startswith("ray::") and "Agent" in title}
    assert agents, f"no agent of Ray's holds a file of {mark}: {holding(mark)}"
    assert set(agents) <= set(ours), "an agent whose title was set over its environment is the session's too"
    assert Path(mark).is_dir() and len(reapers(mark)) == 1
    driver.kill()
    driver.wait()
    killed = time.monotonic()
    while (session_processes(mark) or holding(mark)) and time.monotonic() - killed < LIVENESS_S:
        time.sleep(0.2)
    gone_s = time.monotonic() - killed
    assert session_processes(mark) == [], f"still alive {gone_s:.0f} s after the driver's kill -9"
    assert holding(mark) == {}, f"still alive {gone_s:.0f} s after the driver's kill -9"
    while (Path(mark).exists() or reapers(mark)) and time.monotonic() - killed < LIVENESS_S:  # it removes it last
        time.sleep(0.2)
    assert not Path(mark).exists() and reapers(mark) == []
    print(f"every process of the killed driver's Ray was gone {gone_s:.1f} s after its kill -9")


def test_a_start_that_fails_is_tried_again_and_then_said_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """A host too busy for Ray's agents, made on purpose: each start's dashboard agent is stopped (SIGSTOP) as it
    appears, so the raylet gives up on it (Ray allows it about 15 s, hard-coded). Only this test's Ray is touched:
    its processes carry a token of the test's in their environment."""
    token = f"STARK_TEST_TOKEN={uuid.uuid4().hex}".encode()
    stop = threading.Event()
    stopped: set[int] = set()

    def carrying_the_token() -> list[int]:
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if token in f.read().split(b"\0"):
                            out.append(int(entry))
                except OSError:
                    continue
        return out

    def freeze_agents() -> None:
        while not stop.is_set():
            for pid in carrying_the_token():
                args = argv(pid)
                if pid not in stopped and len(args) > 2 and args[2].endswith("agent.py"):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
            time.sleep(0.05)

    freezer = threading.Thread(target=freeze_agents, daemon=True)
    freezer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="stark_ray.run.local_ray"), pytest.raises(RayStartError) as e:
            start_local_ray(env={"STARK_TEST_TOKEN": token.split(b"=")[1].decode()}, tries=2)
    finally:
        stop.set()
        freezer.join()
    message = str(e.value)
    assert message.startswith("Ray could not start on this machine (2 tries): ") and "\n" not in message
    assert "gave up waiting for its" in message and "agent" in message, message
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "local Ray start 1 of 2 failed", "local Ray start 2 of 2 failed"]
    assert len(stopped) >= 2
    assert carrying_the_token() == []  # both tries' processes are gone


def test_the_cause_of_a_failed_start_is_read_from_the_raylets_log(tmp_path: Path) -> None:
    logs = tmp_path / "session_1" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.err").write_text(
        "[2026 C 1 1] (raylet) node_manager.cc:3576: An unexpected system state has occurred. Check failed: "
        "x.has_value() Timed out waiting for file /tmp/s/session_1/metrics_agent_port_1ba1dba906\n")
    assert start_failure(str(tmp_path), "Exception: timed out") == (
        "Ray's raylet gave up waiting for its metrics agent to start (Ray allows it about 15 s; the host is too busy)")
    (logs / "raylet.err").write_text("")
    assert start_failure(str(tmp_path), "a\nException: The node timed out during startup.\n\n") == (
        "Exception: The node timed out during startup.")


BROADCAST_DRIVER = """
import os, signal, time
import ray
from stark_ray.run.placement import connect, disconnect

connect(None)

@ray.remote(num_cpus=0, max_restarts=0)
class Doomed:
    def pid(self):
        return os.getpid()

d = Doomed.remote()
os.kill(ray.get(d.pid.remote()), signal.SIGKILL)  # the raylet tells every driver that a worker died
time.sleep(8)
print("driver done", flush=True)
disconnect()
"""


def test_the_raylets_broadcasts_stay_off_the_terminal(tmp_path: Path) -> None:
    """Ray prints "A worker died or was killed ..." on the driver's stdout whatever log_to_driver says; a run's
    live view and ``--json`` must not get it."""
    script = tmp_path / "driver.py"
    script.write_text(BROADCAST_DRIVER)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=this_checkout(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "driver done", proc.stdout
    assert "worker died" not in (proc.stdout + proc.stderr).lower()


def test_a_ray_whose_start_takes_no_such_option_is_started_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The private head asks `ray start` for no autoscaler monitor through a hidden option; a Ray that no longer
    takes it (here: an option no Ray has, in its place) is started without it, with no try counted."""
    from stark_ray.run import local_ray

    monkeypatch.setattr(local_ray, "NO_MONITOR", "--stark-no-such-option")
    monkeypatch.setattr(local_ray, "_no_monitor", ["--stark-no-such-option"])
    ray = start_local_ray(tries=1)
    try:
        assert ray.address and local_ray._no_monitor == []
        assert "--stark-no-such-option" not in " ".join(argv(ray.head.pid))
    finally:
        ray.stop()
