"""What one candidate leaves in its worker process never decides another's verdict: by default every candidate runs
in a worker process of its own (EvalConfig.worker_candidates), on the CPU backends too. Before, a CPU worker served 64
candidates: one that exhausted the file descriptors made every later candidate of its worker fail (5 of 5 honest
ones), and one that left a thread spinning slowed the next ones' timing. Real processes, the cpu_cpp backend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from eval_helpers import passed
from leaky_candidates import MODEL, TASK

from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task

pytestmark = pytest.mark.slow

TAKES_EVERY_DESCRIPTOR = """
import os, resource, torch

_kept = []
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
for _ in range(min(_soft, 50_000)):  # every descriptor it may have, kept open after it returns
    try:
        _kept.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
""" + MODEL

HONEST = "import torch\n" + MODEL


def test_a_candidate_that_takes_every_descriptor_cannot_fail_the_next(tmp_path: Path) -> None:
    task = load_task(TASK)
    cfg = EvalConfig(backend="cpu_cpp", build_dir=str(tmp_path / "build"), timing_trials=11, warmup=2, isolate="off")
    honest = HONEST.format(forward="pass", factor="")
    with EvalService(cfg) as service:
        service.evaluate(task, TAKES_EVERY_DESCRIPTOR.format(forward="pass", factor=""))  # its own verdict: any
        after = [service.evaluate(task, honest) for _ in range(2)]
    assert all(passed(r) for r in after), [(r.stage, r.error) for r in after]


# fills 3 GiB of host memory in its first call, each page touched (past a 2 GiB cap: the allocation itself fails)
FILLS_THE_HOST = "import torch\n" + MODEL.replace("{forward}", "_fill = torch.ones(3 << 28, dtype=torch.float64)")


@pytest.mark.parametrize("isolate", ["off", "auto"])
def test_a_candidate_past_its_host_memory_cap_is_out_of_memory_in_one_line(tmp_path: Path, isolate: str) -> None:
    """The candidate's process is held to worker_memory_gb (RLIMIT_DATA): a 3 GiB fill under a 2 GiB cap fails where
    the candidate made it, said as out of memory (flagged), not a crash or a time limit; the honest control beside
    it stays accepted under the same cap, and so does the next honest one."""
    task = load_task(TASK)
    cfg = EvalConfig(backend="cpu_cpp", build_dir=str(tmp_path / "build"), timing_trials=11, warmup=2,
                     isolate=isolate, worker_memory_gb=2.0)
    honest = HONEST.format(forward="pass", factor="")
    with EvalService(cfg) as service:
        before = service.evaluate(task, honest)
        filled = service.evaluate(task, FILLS_THE_HOST.format(factor=""))
        after = service.evaluate(task, honest)
    assert passed(before) and passed(after), [(r.stage, r.error) for r in (before, after)]
    assert filled.stage == "runtime" and "out_of_memory" in filled.flags, (filled.stage, filled.error, filled.flags)
    assert filled.error is not None and filled.error.startswith("out of memory on the host")
    assert "\n" not in filled.error


OOM_RUN = """
import os, sys
open(sys.argv[1], "w").write(str(os.getpid()))  # this process, the judge and its worker: in the small group
sys.path.insert(0, sys.argv[2])
from leaky_candidates import MODEL, TASK
from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task
fill = "import torch\\n" + MODEL.replace("{forward}", "_fill = torch.ones(5 << 27, dtype=torch.float64); _fill += 1")
# fills the host only the first time it is evaluated (a marker file says so): the machine's failure, as it looks
once = ("import os, torch\\nMARK = " + repr(sys.argv[3] + "-filled") + "\\n" + MODEL.replace(
    "{forward}", "if not os.path.exists(MARK):\\n            open(MARK, 'w').close()\\n"
    "            _fill = torch.ones(5 << 27, dtype=torch.float64); _fill += 1"))
cfg = EvalConfig(backend="cpu_cpp", build_dir=sys.argv[3], timing_trials=5, warmup=1, isolate="off",
                 worker_memory_gb=8)  # a cap above the group's 3 GiB: the kernel's OOM killer is what stops it
with EvalService(cfg) as s:
    for source in (fill.format(factor=""), once.format(factor=""),
                   "import torch\\n" + MODEL.format(forward="pass", factor="")):
        r = s.evaluate(load_task(TASK), source)
        print("VERDICT", r.stage, ",".join(r.flags) or "-", r.error)
        print("LOG", repr(r.log[-1000:]))
"""


def test_a_worker_the_kernels_oom_killer_takes_is_said_as_out_of_memory(tmp_path: Path) -> None:
    """In a control group of 3 GiB (made here where the host lets us: cgroup v1 or v2, as root), a candidate filling
    5 GiB under a cap of 8 GiB is killed by the kernel's OOM killer, evaluated again (the host's memory may have run
    out for others) and killed again: its verdict says out of memory on the host, not 'crashed (SIGKILL)'. One killed
    the first time only is judged on its second evaluation; the next candidate in the same group as usual."""
    import subprocess
    import sys
    import uuid

    name = f"stark-test-{uuid.uuid4().hex[:8]}"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    group = Path("/sys/fs/cgroup") / name if v2 else Path("/sys/fs/cgroup/memory") / name
    try:
        group.mkdir()
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(3 << 30))
        swap = group / ("memory.swap.max" if v2 else "memory.memsw.limit_in_bytes")
        if swap.exists():  # no swapping past the limit either: the fill is killed, not slowed
            swap.write_text("0" if v2 else str(3 << 30))
    except OSError as e:
        if group.exists():
            group.rmdir()
        pytest.skip(f"no memory control group can be made here ({e})")
    try:
        proc = subprocess.run([sys.executable, "-c", OOM_RUN, str(group / "cgroup.procs"),
                               str(Path(__file__).parent), str(tmp_path / "build")],
                              capture_output=True, text=True, timeout=900)
    finally:
        group.rmdir()
    verdicts = [line.split(" ", 3)[1:] for line in proc.stdout.splitlines() if line.startswith("VERDICT")]
    logs = [line for line in proc.stdout.splitlines() if line.startswith("LOG")]
    assert len(verdicts) == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    (stage, flags, error), (once_stage, once_flags, _), (honest_stage, _, honest_error) = verdicts
    # killed each time it is evaluated (twice): the verdict stands, and says so
    assert "evaluated 2 times: each time the kernel's out-of-memory killer" in logs[0], logs[0]
    # killed the first time only: evaluated again, judged on the second evaluation, the first one said
    assert once_stage == "ok" and once_flags == "-", verdicts[1]
    assert "evaluated again: in the first evaluation the kernel's out-of-memory killer" in logs[1], logs[1]
    assert stage == "crash" and flags == "out_of_memory", verdicts
    # the kernel picks whom to kill: the worker, or the judge above it (seen with swap limited too)
    assert re.match(r"out of memory on the host: the (worker|judge) was killed by the kernel's out-of-memory killer",
                    error), error
    assert honest_stage == "ok", honest_error
