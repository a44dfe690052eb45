"""The service's compile processes: a fresh process for every build, started ahead by a spare."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from stark_ray.config import EvalConfig
from stark_ray.eval.build.pool import CompilePool
from stark_ray.eval.proc.launch import WorkerSpec
from stark_ray.eval.wire.protocol import MODE_COMPILE, PHASE_COMPILE, PHASE_SETUP, WorkerRequest

LIMITS = {PHASE_SETUP: 300.0, PHASE_COMPILE: 300.0}


def _request(source: str) -> WorkerRequest:
    return WorkerRequest(mode=MODE_COMPILE, task_name="t", task_source="", cfg=asdict(EvalConfig(backend="cpu_cpp")),
                         candidate_source=source)


def test_each_build_runs_in_a_fresh_process_that_waited_as_a_spare(tmp_path: Path) -> None:
    spec = WorkerSpec("cpu_cpp", str(tmp_path / "builds"), 1, compile_only=True)
    marks = tmp_path / "pids"
    mark = f"import os\nopen({str(marks)!r}, 'a').write(str(os.getpid()) + chr(10))\n"
    pool = CompilePool(1)
    try:
        pool.prestart(spec)
        built = [pool.run(spec, _request(mark), LIMITS) for _ in range(3)]
        crashed = pool.run(spec, _request("import os\nos._exit(3)\n"), LIMITS)  # a crash at import ends only it
        after = pool.run(spec, _request(mark), LIMITS)
    finally:
        pool.close()
    assert all(o.result is not None and o.result.compiled and o.result.stage == "ok" for o in [*built, after])
    assert crashed.result is None and crashed.returncode == 3
    pids = marks.read_text().split()
    assert len(pids) == 4 and len(set(pids)) == 4  # nothing of one candidate's import is seen by the next
    assert pool.promoted >= 3  # every build after the first was served by a process that had started ahead
    assert not _running(str(tmp_path / "builds"))  # closed: the spare that waited for a sixth build is gone too


def _running(marker: str, wait_s: float = 10.0) -> list[str]:
    """Processes whose command line holds ``marker``, once those ending have had ``wait_s`` to go."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(entry.name)
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
