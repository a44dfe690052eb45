"""A private local Ray for one run: started beside any other on the machine, on a busy host too, and gone with it.

``ray.init()`` with no address starts a local Ray whose dashboard agent listens on the fixed port 52365 and whose
raylet aborts when its agents have not written their port files within about 15 s (hard-coded in Ray 2.60: on a
host at load 13-23 two runs started at once both died, with a 91-line traceback). So a run starts its own head
with ``ray start --head --block`` instead:

- **nothing shared**: a temp directory of its own (sockets, logs, the session) and a free port for every component
  (GCS, dashboard and its agent's HTTP and gRPC ports, metrics export, runtime-env agent, Ray client), no
  dashboard, no usage report, no autoscaler monitor (one machine's Ray has nothing to scale);
- **a start that waits, then tries again**: up to :data:`START_TRIES` starts, each with new ports; one that still
  fails is one line with the cause read from the raylet's log (:func:`start_failure`);
- **gone with its driver**: every process of the cluster carries :data:`SESSION_ENV` in its environment, and a
  reaper (a process of its own session, started first) waits on a pipe from the driver; when the driver stops it,
  or dies (``kill -9`` included: the kernel closes the pipe), the reaper ends every process that carries the mark
  (Ray's agents, actors, and what they started: compile pools, compilers) or, for the agents whose title was written
  over their environment, bears Ray's title with a file of the directory open; then it removes the directory.

The driver connects with ``ray.init(address=...)``; the raylet's error broadcasts ("A worker died or was
killed ..."), which Ray prints to the driver's stdout whatever ``log_to_driver`` says, go to the log instead
(:func:`quiet_error_broadcasts`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SESSION_ENV = "STARK_RAY_SESSION"  # the mark every process of one local Ray carries: its temp directory
START_TRIES = 3
START_TIMEOUT_S = 240.0  # one start: a busy 2-core host took 74-121 s to fail; a healthy start takes 5-30 s
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL for what is left
STOP_DEADLINE_S = 30.0  # of SIGKILL rounds, for processes that appear while the session ends
PORT_OPTIONS = ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                "--metrics-export-port", "--runtime-env-agent-port", "--ray-client-server-port")

log = logging.getLogger(__name__)


class RayStartError(RuntimeError):
    """The local Ray could not start (its cause in one line)."""


@dataclass
class LocalRay:
    """A running private head: its directory, its GCS address, the ``ray start`` process and the reaper."""

    temp_dir: Path
    address: str
    head: subprocess.Popen[bytes]
    reaper: subprocess.Popen[bytes]

    def stop(self) -> None:
        """End every process of this Ray and remove its directory (the reaper does it; this waits for it)."""
        if self.reaper.stdin is not None:
            with contextlib.suppress(OSError):
                self.reaper.stdin.close()
        try:
            self.reaper.wait(timeout=STOP_GRACE_S + STOP_DEADLINE_S + 10)
        except subprocess.TimeoutExpired:
            self.reaper.kill()
            end_session(str(self.temp_dir))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.head.wait(timeout=1)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now (each bound to port 0 and released; a start that loses one to another
    process fails and is tried again with new ones)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# A busy machine's Ray: by default the raylet answers the first driver's registration only once the Python workers
# it prestarts for it have registered, and a worker that takes more than 60 s to start (imports on two cores kept
# busy by other processes) is killed without that answer ever being sent: ray.init() then waited in the raylet's
# socket for over an hour (seen in the test suite beside two `yes > /dev/null`). The first driver is answered at
# once, and a slow worker is given five minutes to register.
SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "worker_register_timeout_seconds": 300}


# no autoscaler for one machine's private Ray: 0.4 s of a core less in its first seconds. A hidden option of
# `ray start` (KubeRay's): a Ray that no longer takes it is started without it (start_local_ray)
NO_MONITOR = "--no-monitor"
_no_monitor = [NO_MONITOR]


def head_command(temp_dir: str, ports: list[int], num_cpus: int | None, num_gpus: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--temp-dir={temp_dir}",
           "--include-dashboard=false", "--disable-usage-stats", f"--system-config={json.dumps(SYSTEM_CONFIG)}",
           *_no_monitor]
    cmd += [f"{option}={port}" for option, port in zip(PORT_OPTIONS, ports, strict=True)]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    return cmd


_FATAL = re.compile(r"Check failed: .*$|Timed out waiting for file \S+", re.MULTILINE)


def start_failure(temp_dir: str, output: str) -> str:
    """Why a start failed, in one line: the raylet's fatal check if it left one, else the last line ``ray start``
    printed."""
    for name in ("raylet.err", "raylet.out", "gcs_server.err"):
        for path in sorted(Path(temp_dir).glob(f"session_*/logs/{name}")):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                waited = re.search(r"Timed out waiting for file \S*/([a-z_]+?)_port_[0-9a-f]+", text)
                if waited:
                    return (f"Ray's raylet gave up waiting for its {waited.group(1).replace('_', ' ')} to start "
                            "(Ray allows it about 15 s; the host is too busy)")
                m = _FATAL.search(text)
                if m:
                    return f"Ray's raylet failed: {' '.join(m.group(0).split())[:200]}"
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "ray start ended without a word"


def start_local_ray(num_cpus: int | None = None, num_gpus: int | None = None, env: dict[str, str] | None = None,
                    tries: int = START_TRIES, timeout_s: float = START_TIMEOUT_S) -> LocalRay:
    """Start a private head and return once its GCS address is known; RayStartError after ``tries`` failures.
    ``env``: variables for the cluster's processes (its workers inherit them), beside this process's own."""
    causes: list[str] = []
    for attempt in range(1, tries + 1):
        temp_dir = tempfile.mkdtemp(prefix="stark-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
        reaper = _start_reaper(temp_dir)
        head_env = {**os.environ, **(env or {}), SESSION_ENV: temp_dir, "RAY_USAGE_STATS_ENABLED": "0"}
        head_env.pop("RAY_ADDRESS", None)
        out_path = Path(temp_dir) / "ray-start.log"
        try:
            with out_path.open("wb") as out:
                head = subprocess.Popen(head_command(temp_dir, free_ports(len(PORT_OPTIONS)), num_cpus, num_gpus),
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=head_env, start_new_session=True)  # a Ctrl-C is the driver's
            address = _await_address(temp_dir, head, timeout_s)
        except BaseException:  # a Ctrl-C while it starts: nothing of it stays
            if reaper.stdin is not None:
                reaper.stdin.close()
            reaper.wait()
            raise
        if address is not None:
            return LocalRay(Path(temp_dir), address, head, reaper)
        output = out_path.read_text(errors="replace") if out_path.exists() else ""
        if _no_monitor and "No such option" in output and NO_MONITOR in output:
            _no_monitor.clear()  # this Ray's `ray start` has no such option: the autoscaler's monitor runs
            LocalRay(Path(temp_dir), "", head, reaper).stop()
            return start_local_ray(num_cpus, num_gpus, env, tries, timeout_s)
        cause = start_failure(temp_dir, output) if head.poll() is not None else (
            f"no address after {timeout_s:.0f} s")
        causes.append(cause)
        log.warning("local Ray start %d of %d failed: %s", attempt, tries, cause)
        LocalRay(Path(temp_dir), "", head, reaper).stop()
        if attempt < tries:
            time.sleep(2.0 * attempt)
    said = f"{tries} tries" if tries > 1 else "1 try"
    raise RayStartError(f"Ray could not start on this machine ({said}): {causes[-1]}")


def _await_address(temp_dir: str, head: subprocess.Popen[bytes], timeout_s: float) -> str | None:
    """The GCS address ``ray start`` writes once its node is up, or None when it ended or ran out of time."""
    path = Path(temp_dir) / "ray_current_cluster"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            address = path.read_text().strip()
            if address:
                return address
        if head.poll() is not None:
            return None
        time.sleep(0.1)
    return None


def _start_reaper(temp_dir: str) -> subprocess.Popen[bytes]:
    """The process that ends this Ray when the pipe from this one closes (a stop, or this process's death). It
    runs in a session of its own, so a Ctrl-C to the terminal's process group does not end it before its work."""
    env = {k: v for k, v in os.environ.items() if k != SESSION_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                    env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, "-m", "stark_ray.run.local_ray", temp_dir], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)


def session_processes(mark: str) -> list[int]:
    """Every process (but this one) of the session: those whose environment carries ``SESSION_ENV=mark``, and Ray's
    own titled ones (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) that hold a file of the session's directory
    open: a title set by ``setproctitle`` longer than the process's arguments is written over its environment,
    mark included (found wiped for both agents, which then outlived a killed driver by 10-60 s)."""
    needle = f"{SESSION_ENV}={mark}".encode()
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/environ", "rb") as f:
            if needle in f.read().split(b"\0") or _titled_in(entry, mark):
                out.append(int(entry))
    return out


def _titled_in(pid: str, mark: str) -> bool:
    """Whether process ``pid`` bears a title of Ray's and has its directory or a file open under ``mark``."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        if not f.read(5).startswith(b"ray::"):
            return False
    top = mark.rstrip("/")
    places = [f"/proc/{pid}/cwd"] + [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
    for place in places:
        with contextlib.suppress(OSError):
            link = os.readlink(place)
            if link == top or link.startswith(top + "/"):
                return True
    return False


def end_session(mark: str) -> None:
    """SIGTERM every process of the session, then SIGKILL whatever is left or appears (a dying head can still
    start one), until a scan finds none twice in a row; remove its directory."""
    pids = session_processes(mark)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    graceful = time.monotonic() + STOP_GRACE_S
    while pids and time.monotonic() < graceful:
        time.sleep(0.05)
        pids = session_processes(mark)
    deadline, empty = time.monotonic() + STOP_DEADLINE_S, 0
    while empty < 2 and time.monotonic() < deadline:
        pids = session_processes(mark)
        empty = 0 if pids else empty + 1
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    if mark.startswith(tempfile.gettempdir()) or mark.startswith("/tmp/"):
        shutil.rmtree(mark, ignore_errors=True)


def quiet_error_broadcasts() -> None:
    """Send what the raylet broadcasts to drivers ("A worker died or was killed ...") to the log: Ray prints those
    on the driver's stdout even with ``log_to_driver=False``, where they break a live view and ``--json``."""
    from ray._private import worker

    printer = worker.print_to_stdstream
    if getattr(printer, "_stark_quiet", False):
        return

    def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            for line in data.get("lines", []):
                log.info("ray: %s", line)
            return
        printer(data, ignore_prefix)

    to_log._stark_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_log


def _reap(temp_dir: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdin.buffer.read()  # until the driver closes the pipe or dies
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_session(temp_dir)


if __name__ == "__main__":  # the reaper
    _reap(sys.argv[1])
