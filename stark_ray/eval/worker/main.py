"""The worker process: ``python -m stark_ray.eval.worker.main --backend B ...`` runs candidates — untrusted code.

Started by the judge (a device worker, with a descriptor channel: ``--fd-channel``) or by the service's compile
pool (``--compile-only``), through :mod:`stark_ray.eval.proc.runner`, in a new session (its own process group), a
private working directory and a scrubbed environment (no credentials), and with ``isolate`` in namespaces of its
own. At start it moves the control channel off fd 1 and points fd 1 at the log (fd 2), so nothing a candidate or
a compiler prints can corrupt the protocol, and all of it lands in the log the debug agent sees; faulthandler dumps
the Python stack on a crash or when the judge asks before a kill. It prepares its backend once (a GPU worker
creates its CUDA context here), says hello, then answers one message per stdin line, each in a fresh private
directory (:class:`~stark_ray.eval.worker.host.CandidateHost` for a device worker; a build for a compile worker), until
its stdin ends or a step leaves it unhealthy. A ``--spare`` worker (a device worker's hot spare) does every import
first and then waits for a ``go`` line before it touches the device, so that it neither disturbs the timings of
the worker it will replace nor keeps the next candidate waiting for imports.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from stark_ray.eval.proc.lifetime import become_subreaper, die_with_parent, reap
from stark_ray.eval.wire.protocol import MODE_BUILD, STACK_DUMP_SIGNAL, WorkerRequest, result_to_message


def _control_channel() -> TextIO:
    """Keep the real stdout for the protocol; from now on fd 1 writes into the log (fd 2)."""
    sys.stdout.flush()
    ctrl = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return ctrl


SPARE_NICE = 10  # a spare's imports yield the CPU to the worker that times (as the compile processes' builds do)


def _spare_imports(backend: str) -> None:
    from stark_ray.eval.backends import get_backend
    from stark_ray.eval.worker.guards import imports_dynamo_ahead
    from stark_ray.eval.worker.host import CandidateHost  # noqa: F401

    if imports_dynamo_ahead(get_backend(backend).device):
        import torch._dynamo  # noqa: F401


def _niced(work: Callable[[], None]) -> None:
    """``work`` in a thread of its own at a lower priority: Linux keeps a nice value per thread, so the process's
    main thread — which serves once the spare is promoted — keeps its own, which an unprivileged process could not
    raise again (threads the imports start keep the lower one). Where that thread fails (an import that must run in
    the main thread), the caller's imports that follow do the work at the usual priority."""
    def run() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, SPARE_NICE)  # this thread only (per-thread on Linux)
        try:
            work()
        except Exception:  # said in the log; the imports that follow in the main thread do it again
            traceback.print_exc()

    thread = threading.Thread(target=run, name="stark-spare-imports")
    thread.start()
    thread.join()


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stark_ray.eval.worker.main")
    p.add_argument("--backend", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--arch", default=None)
    p.add_argument("--spare", action="store_true",
                   help="import, then wait for a 'go' line on stdin before touching the device (a hot spare)")
    p.add_argument("--fd-channel", type=int, default=None, help="the Unix socket the judge passes buffers on")
    p.add_argument("--ask-builds", action="store_true",
                   help="isolated: the cache is read-only here; missing entries are built by the parent's builder")
    p.add_argument("--max-file-bytes", type=int, default=0, help="no file written grows past this (RLIMIT_FSIZE)")
    p.add_argument("--max-data-bytes", type=int, default=0, help="the host memory it may hold (RLIMIT_DATA)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    # `python -m` put the working directory first on sys.path: a module a candidate writes there would be what the
    # next candidate imports (the package itself comes from PYTHONPATH)
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(os.getcwd()):
        del sys.path[0]
    die_with_parent()  # and what a candidate detaches stays below us (eval/proc/lifetime.py)
    become_subreaper()
    args = _args(argv)
    if args.max_file_bytes > 0:  # soft and hard: what a candidate writes (its log too) cannot fill the disk
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        cap = args.max_file_bytes if hard == resource.RLIM_INFINITY else min(args.max_file_bytes, hard)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails (EFBIG) where the candidate sees it
    if args.max_data_bytes > 0:  # soft and hard: an allocation past it fails in the candidate's call (eval/defences.py)
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        cap = args.max_data_bytes if hard == resource.RLIM_INFINITY else min(args.max_data_bytes, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    if args.compile_only:
        os.nice(10)  # builds (and a spare's imports) yield the CPU to the device worker, which launches and times
    ctrl = _control_channel()
    faulthandler.enable(all_threads=True)
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)  # the parent asks for a stack before a kill

    def send(msg: dict[str, Any]) -> None:
        ctrl.write(json.dumps(msg) + "\n")
        ctrl.flush()

    try:
        started = time.perf_counter()
        laps: dict[str, float] = {}

        def lap(name: str) -> None:
            laps[name] = round(time.perf_counter() - started - sum(laps.values()), 3)

        if args.spare and not args.compile_only:  # what it imports, ahead and niced
            _niced(lambda: _spare_imports(args.backend))
        from stark_ray.eval.backends import get_backend
        from stark_ray.eval.build.cache import set_requester
        from stark_ray.eval.proc.garbage import collect
        from stark_ray.eval.worker.builds import build_extension, build_only
        from stark_ray.eval.worker.host import CandidateHost

        backend = get_backend(args.backend)
        build_dir = Path(args.build_dir)
        if args.ask_builds:
            set_requester(_asking(send))
        lap("imports_s")
        if args.spare:  # a hot spare: nothing on the device until the parent promotes it (its timings go on)
            send({"waiting": True})
            if sys.stdin.readline().strip() != "go":
                os._exit(0)  # the parent closed it unused
            lap("spare_wait_s")
        host: CandidateHost | None = None
        if args.compile_only:
            backend.prepare_compiler(build_dir, args.threads, args.arch)
        else:
            backend.prepare_worker(build_dir, args.threads)
            lap("prepare_s")
            import torch

            torch.set_grad_enabled(False)
            sock = socket.socket(fileno=args.fd_channel) if args.fd_channel is not None else None
            host = CandidateHost(backend, sock)
            collect()  # what start-up made is frozen: a collection after each candidate scans only its objects
            lap("host_s")
        hello: dict[str, Any] = {"device": backend.device, "start_phases": laps}
    except BaseException as e:  # a host problem (no GPU, no backend package): the parent reports the log's last lines
        traceback.print_exc()
        print(f"worker start failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(3)
    send({"hello": hello})

    home = Path.cwd()
    count = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        reap()  # what the judge killed of a candidate's processes (none is ours to wait for between requests)
        healthy = True
        if host is None:  # a compile worker: one build per request, in a private directory
            count += 1
            private = Path(tempfile.mkdtemp(prefix="req-", dir=home))
            os.chdir(private)
            try:
                req = WorkerRequest.from_json(line)
                made = build_extension(req, send, build_dir) if req.mode == MODE_BUILD else build_only(req, send, count)
                answer = result_to_message(made, True)
            finally:
                os.chdir(home)
                with contextlib.suppress(OSError):
                    shutil.rmtree(private, ignore_errors=True)
        else:  # a device worker: each candidate in a private directory from its load to its end
            msg = json.loads(line)
            answer = host.handle(msg, send)
            answer["seq"] = msg.get("seq")  # which request this answers: an answer the candidate sent ahead of it
            healthy = host.healthy  # leaves this one a step behind, which the judge sees
        sys.stdout.flush()
        sys.stderr.flush()
        send(answer)
        if not healthy:
            break
    sys.stdout.flush()
    sys.stderr.flush()
    ctrl.close()
    os._exit(0)  # no interpreter teardown: a candidate's atexit hooks and destructors cannot hang it


def _asking(send: Any) -> Any:
    """The build requester of an isolated worker: the request on the control channel, the answer the parent's next
    line on stdin (the worker reads nothing else while a request runs)."""

    def ask(payload: dict[str, Any]) -> dict[str, Any]:
        send({"build": payload})
        line = sys.stdin.readline()
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        return answer if isinstance(answer, dict) else {"built": False, "error": "no answer to the build request"}

    return ask


if __name__ == "__main__":
    main()
