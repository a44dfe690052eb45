"""An isolated worker's world is read-only (eval/proc/jail.py): a hostile candidate cannot write into site-packages, the
project, the home directory or a run directory, cannot read the home directory's credential files, and what it
writes to ``/tmp`` stays in its own; the next honest candidate is judged right. The same candidate unisolated
reaches what it aims at (the harmless targets only): the test can fail. A device worker reads the build cache the
compile pool writes and cannot write it (where its backend builds in the pool: CUDA). Real processes and
namespaces, the cpu_cpp backend."""

from __future__ import annotations

import hashlib
import os
import site
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from eval_helpers import passed
from leaky_candidates import MODEL, TASK

from stark_ray.config import EvalConfig
from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task
from stark_ray.records import EvalResult

ROOT = Path(__file__).resolve().parents[1]
TINY = ('#include <pybind11/pybind11.h>\\nint f() { return 7; }\\n'
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }\\n')
SECRET = "do-not-leak-0451"

HOSTILE = """
import os
import torch
from torch.utils.cpp_extension import load_inline

EXT = load_inline(name="tiny", cpp_sources=['{tiny}'], no_implicit_headers=True)


def _attempt():
    reached = []
    for name, path in {writes!r}.items():
        try:
            with open(path, "a") as f:
                f.write("written by a candidate\\n")
            reached.append(name)
        except OSError:
            pass
    for name, path in {reads!r}.items():
        try:
            if {secret!r} in open(path).read():
                reached.append(name)
        except OSError:
            pass
    for name, path in {lists!r}.items():
        try:
            if os.listdir(path):
                reached.append(name)
        except OSError:
            pass
    with open({tmp_marker!r}, "w") as f:  # always possible: a private /tmp when isolated
        f.write("x")
    if reached:
        raise RuntimeError(f"reached: {{sorted(reached)}}")


_attempt()
""" + MODEL

HONEST = """
import torch
from torch.utils.cpp_extension import load_inline

EXT = load_inline(name="tiny", cpp_sources=['{tiny}'], no_implicit_headers=True)
""" + MODEL


@pytest.fixture
def places(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """A home directory with credentials, a project with a ``.env`` (the working directory) and a run directory,
    outside /tmp (which an isolated worker does not see at all); HOME for the evaluator's processes."""
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))
    base = Path(tempfile.mkdtemp(prefix="stark-world-", dir="/var/tmp" if Path("/var/tmp").is_dir() else None))
    home, run, project = base / "home", base / "runs" / "run-1", base / "project"
    project.mkdir()
    (project / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n")
    monkeypatch.chdir(project)
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(f"aws_secret_access_key = {SECRET}\n")
    (home / ".netrc").write_text(f"machine example.com password {SECRET}\n")
    run.mkdir(parents=True)
    (run / "attempts.parquet").write_text("rows\n")
    monkeypatch.setenv("HOME", str(home))
    yield {"base": base, "home": home, "run": run, "project": project}
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def _digests(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*.so")}


BACKENDS = [pytest.param("cpu_cpp"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _passed(r: EvalResult, backend: str) -> bool:
    """cpu_cpp: accepted up to timing noise (eval_helpers.passed: a busy host's worker timed an honest 1x candidate
    at 3.65x, which the judge's clock then flagged); cuda: built and run (its model is torch ops, not a kernel of its
    own: ``no_kernel``)."""
    return passed(r) if backend == "cpu_cpp" else r.compiled and "reached:" not in (r.error or "")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_isolated_candidate_can_write_nothing_outside_its_directory(places: dict[str, Path], tmp_path: Path,
                                                                        backend: str) -> None:
    home, run = places["home"], places["run"]
    harmless = {"the home directory": str(home / "marker"), "the run directory": str(run / "attempts.parquet")}
    writes = {**harmless, "site-packages": str(Path(site.getsitepackages()[0]) / "stark_test_world.pth"),
              "the project": str(ROOT / "stark_test_world.txt")}
    reads = {"~/.aws/credentials": str(home / ".aws" / "credentials"), "~/.netrc": str(home / ".netrc"),
             "the project's .env": str(places["project"] / ".env")}
    # not even seen: the home directory, the working directory, the run directory (hidden by the run)
    lists = {"a listing of the home": str(home), "a listing of the project": str(places["project"]),
             "a listing of the run directory": str(run)}
    marker = f"/tmp/stark-test-world-{uuid.uuid4().hex}"
    cfg = EvalConfig(backend=backend, build_dir=str(tmp_path / "build"), timing_trials=3, warmup=1,
                     isolate="on").hiding(run.parent)
    task = load_task(TASK)
    honest = HONEST.format(tiny=TINY, forward="pass", factor=" * (EXT.f() / 7)")
    hostile = HOSTILE.format(tiny=TINY, writes=writes, reads=reads, lists=lists, secret=SECRET,
                             tmp_marker=marker, forward="pass", factor=" * (EXT.f() / 7)")
    with EvalService(cfg) as service:
        first = service.evaluate(task, honest)
        assert _passed(first, backend), first.error
        built = _digests(Path(service.build_dir))
        attacked = service.evaluate(task, hostile)
        after = service.evaluate(task, honest)
    assert _passed(attacked, backend), attacked.error  # nothing reached (it says what, where it reaches something)
    assert _passed(after, backend), after.error
    assert built and _digests(Path(cfg.build_dir)) == built
    assert not Path(writes["site-packages"]).exists() and not Path(writes["the project"]).exists()
    assert not (home / "marker").exists() and (run / "attempts.parquet").read_text() == "rows\n"
    assert not Path(marker).exists()  # its /tmp was its own

    # the same candidate, unisolated, aimed at the harmless targets only: it reaches them
    exposed_src = HOSTILE.format(tiny=TINY, writes=harmless, reads=reads, lists=lists, secret=SECRET,
                                 tmp_marker=marker, forward="pass", factor="")
    with EvalService(replace(cfg, isolate="off")) as service:
        exposed = service.evaluate(task, exposed_src)
    assert not exposed.accepted and "reached:" in (exposed.error or ""), exposed.error
    for name in ("the home directory", "the run directory", "~/.aws/credentials", "~/.netrc", *lists,
                 "the project's .env"):
        assert name in (exposed.error or ""), exposed.error
    assert Path(marker).exists()
    Path(marker).unlink()


JAILED = """
import os, sys
cache, kept = sys.argv[1], sys.argv[2]
print(open(os.path.join(cache, "entry", "lib.so")).read(), open(os.path.join(kept, "module.py")).read())
for path in (os.path.join(cache, "entry", "lib.so"), os.path.join(cache, "new"), os.path.join(kept, "x")):
    try:
        open(path, "a").write("poison")
        print("wrote", path)
    except OSError as e:
        print("refused", e.strerror)
open("mine", "w").write("its own directory")
print("own directory written")
try:  # a root candidate that set this would have the kernel run its program, outside every namespace
    open("/proc/sys/kernel/core_pattern", "w").write("|/bin/false")
    print("wrote core_pattern")
except OSError as e:
    print("core_pattern refused", e.strerror)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("shm", libc.shmget(0x5EED0451, 4096, 0o1666))  # IPC_CREAT | 0666: in its own IPC namespace
print("run", sorted(os.listdir("/run")) if os.path.isdir("/run") else "none")
import stat
nodes = [os.stat("/dev/" + n, follow_symlinks=False).st_mode for n in os.listdir("/dev")]
print("block devices", sum(stat.S_ISBLK(m) for m in nodes), "kmsg" in os.listdir("/dev"), len(nodes) < 40)
open("/dev/null", "w").write("x")
open("/dev/shm/x", "w").write("x")
print("null and shm written")
hidden = sys.argv[3]
print("hidden", sorted(os.listdir(hidden)), open(os.path.join(hidden, "tools", "tool.txt")).read())
try:
    print("uid", os.getuid(), "read", open(sys.argv[4]).read())
except OSError as e:
    print("uid", os.getuid(), "refused", e.strerror)
"""


def test_a_jailed_process_reads_the_build_cache_and_cannot_write_it(places: dict[str, Path], tmp_path: Path) -> None:
    """What a device worker whose builds the pool makes gets (``readable``): the cache under /tmp stays visible,
    read-only, like a sys.path entry there; its own directory is writable; a hidden directory shows only what
    was put back of it; /dev has no disk."""
    import subprocess
    import sys

    from stark_ray.eval.proc.isolation import jailed

    cache, kept, work = tmp_path / "cache", tmp_path / "site", tmp_path / "work"
    (cache / "entry").mkdir(parents=True)
    (cache / "entry" / "lib.so").write_text("built")
    kept.mkdir()
    (kept / "module.py").write_text("imported")
    work.mkdir()
    hidden = places["base"] / "hidden"  # outside /tmp: covered by --hide, but for the part put back
    (hidden / "tools").mkdir(parents=True)
    (hidden / "key.txt").write_text(SECRET)
    (hidden / "tools" / "tool.txt").write_text("a tool")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(places["home"]), "PYTHONPATH": str(kept)}
    owned = places["base"] / "open" / "root-only.txt"  # in a directory anyone may cross, readable by its owner only
    owned.parent.mkdir()
    owned.write_text(SECRET)
    owned.chmod(0o600)
    places["base"].chmod(0o755)
    owned.parent.chmod(0o755)
    command = [sys.executable, "-c", JAILED, str(cache), str(kept), str(hidden), str(owned)]
    proc = subprocess.run(jailed(command, readable=(str(cache), str(hidden / "tools")), hidden=(str(hidden),)),
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "built imported"
    lines = proc.stdout.splitlines()
    # read-only, and (a root evaluator's candidate runs as nobody) not its own
    refused = [ln for ln in lines if ln.startswith("refused ")]
    assert len(refused) == 3 and "wrote" not in proc.stdout, proc.stdout
    assert set(refused) <= {"refused Read-only file system", "refused Permission denied"}, refused
    assert "own directory written" in proc.stdout and (work / "mine").read_text() == "its own directory"
    assert (cache / "entry" / "lib.so").read_text() == "built" and not (cache / "new").exists()
    assert "core_pattern refused Read-only file system" in proc.stdout and "wrote core_pattern" not in proc.stdout
    assert "shm -1" not in proc.stdout  # it made a segment ...
    keys = {ln.split()[0] for ln in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]}
    assert str(0x5EED0451) not in keys  # ... that the host does not have
    run = next(ln for ln in proc.stdout.splitlines() if ln.startswith("run "))
    assert run in ("run []", "run none", "run ['nvidia-persistenced']"), run  # the host's sockets are not there
    # a /dev of its own: no disk, no kernel log, a few nodes (and the GPU's); /dev/null and /dev/shm work
    assert "block devices 0 False True" in proc.stdout and "null and shm written" in proc.stdout, proc.stdout
    assert "hidden ['tools'] a tool" in proc.stdout, proc.stdout  # the key is not there, what was put back is
    if os.geteuid() == 0:  # a root evaluator's candidate is nobody: it owns no file of the host
        assert "uid 65534 refused Permission denied" in proc.stdout, proc.stdout


WRAPPED = """
import os
import torch
from torch.utils.cpp_extension import load_inline

# gcc runs every step of the build under this program (a script that tries to write the cache, then goes on)
EXT = load_inline(name="tiny", cpp_sources=['{tiny}'], no_implicit_headers=True, extra_cflags=["-wrapper", {script!r}])
try:  # and the candidate itself, after its build came back
    open(os.path.join({cache!r}, {first_key!r}, "x"), "w").write("poison")
    raise RuntimeError("wrote the build cache")
except OSError:
    pass
""" + MODEL

SCRIPT = """#!/bin/sh
touch {cache}/poisoned {cache}/{first_key}/poisoned 2>/dev/null
echo "stark-test: warning: the wrapper ran" >&2
exec "$@"
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_builds_are_made_outside_the_candidate_and_land_under_their_own_key(places: dict[str, Path],
                                                                           tmp_path: Path, backend: str) -> None:
    """Isolated, a candidate's process sees the cache read-only; its build is made by a builder that writes only
    a directory of its own, and published under the key of its arguments with the digest recorded outside: a
    compiler told to run a program (``-wrapper``; here a script that lies where the builder can read it) cannot
    touch another entry. The honest candidate before and after loads its entry. Unisolated, the same script
    writes the cache (the test can fail)."""
    cache = tmp_path / "build"
    cfg = EvalConfig(backend=backend, build_dir=str(cache), timing_trials=3, warmup=1, isolate="on")
    task = load_task(TASK)
    honest = HONEST.format(tiny=TINY, forward="pass", factor=" * (EXT.f() / 7)")
    with EvalService(cfg) as service:
        first = service.evaluate(task, honest)
        assert _passed(first, backend), first.error
        entries = {p.parent.name for p in cache.glob("*/*.so")}
        assert len(entries) == 1, entries
        first_key = entries.pop()
        built = _digests(cache)
        script = places["base"] / "tools" / "wrapper.sh"  # where anyone may run it (a root evaluator's is nobody)
        script.parent.mkdir()
        places["base"].chmod(0o755)
        script.parent.chmod(0o755)
        script.write_text(SCRIPT.format(cache=cache, first_key=first_key))
        script.chmod(0o755)
        hostile = WRAPPED.format(tiny=TINY, cache=str(cache), first_key=first_key, script=str(script),
                                 forward="pass", factor=" * (EXT.f() / 7)")
        wrapped = service.evaluate(task, hostile)
        after = service.evaluate(task, honest)
    assert _passed(wrapped, backend), (wrapped.error, wrapped.log[-2000:])  # built, under a key of its own
    assert backend != "cpu_cpp" or "the wrapper ran" in wrapped.log, wrapped.log[-2000:]
    assert _passed(after, backend), after.error
    assert not (cache / "poisoned").exists() and not (cache / first_key / "poisoned").exists()
    assert not (cache / first_key / "x").exists()
    assert {k: v for k, v in _digests(cache).items() if first_key in k} == built  # the first entry as it was
    for library in cache.glob("*/*.so"):  # every entry's digest is its library's, recorded by the trusted side
        assert (library.parent / "stark_digest").read_text() == hashlib.sha256(library.read_bytes()).hexdigest()
    assert len({p.parent.name for p in cache.glob("*/*.so")}) == 2

    with EvalService(replace(cfg, isolate="off", build_dir=str(tmp_path / "open"))) as service:
        service.evaluate(task, hostile.replace(str(cache), str(tmp_path / "open")))
    assert not (tmp_path / "open" / "poisoned").exists()  # the script names the first cache ...
    assert (cache / "poisoned").exists()  # ... which, unisolated, it writes


PEEK = """
import os
import torch
from torch.utils.cpp_extension import load_inline

EXT = load_inline(name="tiny", cpp_sources=['{tiny}'], no_implicit_headers=True)
seen = [name for name in ("pyproject.toml", ".git", "README.md", "tests")
        if os.path.exists(os.path.join({root!r}, name))]
if seen:
    raise RuntimeError(f"reached the checkout: {{seen}}")
""" + MODEL


def test_an_editable_install_run_from_elsewhere_shows_the_sandbox_only_its_package(places: dict[str, Path],
                                                                                  tmp_path: Path) -> None:
    """Run from a directory other than the checkout, the whole checkout was visible (read-only) inside the sandbox:
    a candidate read its .env, .git/config and an old run's Parquet, and its output reaches the LLM provider."""
    from stark_ray.eval.proc.isolation import checkout

    if checkout() != ROOT:
        pytest.skip("stark-ray is not run from its checkout here")
    cfg = EvalConfig(backend="cpu_cpp", build_dir=str(tmp_path / "build"), timing_trials=3, warmup=1, isolate="on")
    peek = PEEK.format(tiny=TINY, root=str(ROOT), forward="pass", factor=" * (EXT.f() / 7)")
    with EvalService(cfg) as service:
        isolated = service.evaluate(load_task(TASK), peek)
    assert passed(isolated), isolated.error  # the worker runs (its package is there), the checkout is not
    with EvalService(replace(cfg, isolate="off")) as service:  # the control: unisolated, it sees the checkout
        exposed = service.evaluate(load_task(TASK), peek)
    assert "reached the checkout" in (exposed.error or ""), exposed.error
