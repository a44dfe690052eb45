"""Isolating a worker that runs generated code: Linux namespaces of its own, through util-linux ``unshare``.

A worker started with :func:`isolation_prefix` runs in a new PID namespace with its own ``/proc`` (it sees no other
process: not the ``/proc/<pid>/environ`` of the driver or the agent workers, which hold API keys, and it cannot
signal the evaluator), and in a new network namespace (no network at all: nothing to send data to, no cloud
metadata endpoint that hands out the node's credentials), in a new mount namespace where the whole file system is
read-only but for its own directory and a private ``/tmp`` (:mod:`stark_ray.eval.proc.jail`, which also hides the
home, working and run directories but for what the worker needs of them, gives it a ``/dev`` of its own, makes a
root evaluator's worker ``nobody``, and locks all of it against the candidate). Where the caller is not root, a
user namespace maps it to root inside, which the other namespaces need. CUDA works inside (checked on an H200).
Builds an isolated worker needs are made outside its reach (:mod:`stark_ray.eval.build.builder`).

Inside, the worker is the namespace's first process (PID 1): a signal it sends itself with no handler installed
(``os.kill(os.getpid(), SIGSEGV)``, ``raise(SIGABRT)``) is ignored rather than fatal; faults raised by the
hardware (a segfault, an illegal instruction) still end it and are reported as before (``unshare`` passes the
signal on). ``--kill-child`` makes the worker die with the ``unshare`` process the evaluator kills.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stark_ray.eval.backends import declared

NAMESPACES = ("--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc")
JAIL = Path(__file__).with_name("jail.py")
PACKAGE = Path(__file__).resolve().parents[2]  # stark_ray/: the worker's code, wherever it lies
_AS_ROOT_INSIDE = ("--user", "--map-root-user")


class IsolationUnavailable(RuntimeError):
    """This host cannot create the namespaces (no ``unshare``, or the kernel or a container refuses them)."""


@functools.cache
def isolation_prefix() -> tuple[str, ...]:
    """The command prefix that starts a process isolated (probed once per process); IsolationUnavailable, with
    the reason in one line, when neither form works here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise IsolationUnavailable("isolation needs util-linux `unshare`, which is not installed")
    reasons = []
    for extra in ((), _AS_ROOT_INSIDE):
        prefix = (unshare, *extra, *NAMESPACES)
        try:  # in a directory of its own, like a worker's (the caller's may be /tmp, or /)
            with tempfile.TemporaryDirectory(prefix="stark-probe-") as here:
                probe = subprocess.run([*prefix, sys.executable, str(JAIL), "--", "true"], capture_output=True,
                                       text=True, timeout=20, cwd=here)
        except (OSError, subprocess.TimeoutExpired) as e:
            reasons.append(str(e))
            continue
        if probe.returncode == 0:
            return prefix
        reasons.append((probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1])
    raise IsolationUnavailable(f"this host cannot create the namespaces for isolation ({reasons[-1]})")


def jailed(command: list[str], writable: tuple[str, ...] = (), readable: tuple[str, ...] = (),
           hidden: tuple[str, ...] = (), quota: int = 0, toolchain: tuple[str, ...] | None = None) -> list[str]:
    """``command`` started isolated, in a read-only world (:mod:`stark_ray.eval.proc.jail`) where its working directory,
    a private ``/tmp`` and ``writable`` can be written, ``readable`` (and this package) stays visible and
    ``hidden`` is not there; ``quota``: its working directory a tmpfs of that many bytes (0: the host's own);
    ``toolchain``: the variables naming the backends' tools, beside the jail's own (``Backend.toolchain_vars``;
    None: those of every backend offered here)."""
    readable = (*readable, str(PACKAGE))
    if toolchain is None:
        toolchain = declared().toolchain_vars
    paths = ([a for p in writable for a in ("--rw", p)] + [a for p in readable for a in ("--ro", p)]
             + [a for p in hidden for a in ("--hide", p)] + (["--quota", str(quota)] if quota else [])
             + [a for v in toolchain for a in ("--toolchain", v)])
    return [*isolation_prefix(), sys.executable, str(JAIL), *paths, "--", *command]


def checkout() -> Path | None:
    """The project checkout this package runs from (an editable install: its parent holds a pyproject.toml or a
    .git), or None: an installed package (its parent is site-packages, which every worker needs)."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() or (root / ".git").exists() else None


def hidden_paths(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What an isolated worker of this process does not see: its home directory (everything of the user's: keys,
    other projects), its working directory (the project: a ``.env``, the run directories under it), the checkout this
    package runs from where it is one (its ``.env``, ``.git``, old runs: an editable install run from elsewhere
    showed them all; the package alone is put back) and ``extra`` (``EvalConfig.hidden_paths``: the run directory,
    wherever it lies). What a worker needs of them is put back (eval/proc/jail.py)."""
    root = checkout()
    paths = [str(Path.home()), os.getcwd(), *([str(root)] if root is not None else []), *extra]
    return tuple(dict.fromkeys(str(Path(p).expanduser().absolute()) for p in paths if p and "://" not in p))


def resolve_isolation(mode: str) -> tuple[bool, str | None]:
    """Whether workers run isolated under ``mode`` (``EvalConfig.isolate``), and the line to show where ``auto``
    finds that this host cannot create the namespaces (None otherwise). IsolationUnavailable for ``on`` there."""
    if mode == "off":
        return False, None
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        if mode == "on":
            raise
        return False, f"{e}: generated code runs unisolated (--isolate on makes this an error)"
    return True, None
