"""``--profile ncu`` (eval/ncu.py) off the GPU: reading ncu's CSV, its reasons for failing, which kernel it is told
to count, the run's plumbing (a stand-in ``ncu`` on PATH: the spawn, the report, the reading are real), and the
one line a CPU backend gets. On the GPU: tests/test_gpu.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stark_ray.eval import ncu
from stark_ray.eval.proc.launch import WorkerSpec
from stark_ray.prompts.render import NCU_LINE

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(metric: str, unit: str, value: str, kernel: str = "relu_kernel") -> str:
    return (f'"0","4242","python3.12","127.0.0.1","{kernel}","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


REPORT = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    '==PROF== Profiling "relu_kernel" - 0: 0%....50%....100% - 9 passes',
    "==PROF== Disconnected from process 4242",
    HEADER,
    row(ncu.METRICS["dram"], "%", "87.41"),
    row(ncu.METRICS["sm"], "%", "21.07"),
    row(ncu.METRICS["occupancy"], "%", "61.5"),
    row(ncu.METRICS["duration"], "usecond", "1,204.38"),
    row(ncu.LIMITS["registers"], "block", "4"),
    row(ncu.LIMITS["shared memory"], "block", "32"),
    row(ncu.LIMITS["warps"], "block", "8"),
    row(ncu.LIMITS["blocks per SM"], "block", "32"),
])


def test_the_counters_of_the_profiled_launch_are_one_line() -> None:
    c = ncu.parse(REPORT)
    assert c is not None and (c.dram_pct, c.sm_pct, c.occupancy_pct) == (87.41, 21.07, 61.5)
    assert c.duration_us == pytest.approx(1204.38) and c.occupancy_limit == "registers"
    line = ncu.reading(REPORT, "relu_kernel", 0)
    assert line == ("Nsight Compute, top kernel relu_kernel: DRAM 87% and SM 21% of peak (memory side busier); "
                    "achieved occupancy 62%, limited by registers; 1204 us under ncu")
    assert line.startswith(NCU_LINE)  # the prompts show it (and only a reading that has counters)


@pytest.mark.parametrize(("text", "code", "says"), [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters",
     1, "not permitted to this user (ERR_NVGPUCTRPERM"),
    ("==ERROR== Failed to initialize the profiler: LibraryNotLoaded", 1, "Failed to initialize the profiler"),
    ("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.", 0, "was not launched"),
    ("Traceback (most recent call last): ...", 1, "exited with status 1 and no counters"),
    ("", None, "did not finish within 300 s"),
])
def test_why_there_are_no_counters_is_one_line(text: str, code: int | None, says: str) -> None:
    line = ncu.reading(text, "relu_kernel", code)
    assert line.startswith("no Nsight Compute profile: ") and says in line and "\n" not in line, line
    assert not line.startswith(NCU_LINE)


def test_the_kernel_counted_is_the_top_one_by_its_function_name() -> None:
    described = ("3 launches, 0.5 ms of GPU time: void fused::swish_clamp<float, 4>(float const*, float*, long) "
                 "0.4 ms (80%, 1 launch); copy_kernel 0.1 ms (20%, 2 launches)")
    from stark_ray.eval.measure.kernel_times import top_kernel

    assert ncu.kernel_base_name(top_kernel(described) or "") == "swish_clamp"
    argv = ncu.command("/x/ncu", "swish_clamp", ["python", "-m", "t"], "/w/r.csv")
    assert argv[argv.index("--kernel-name") + 1] == "regex:^swish_clamp$" and argv[-3:] == ["python", "-m", "t"]
    assert argv[argv.index("--clock-control") + 1] == "none" and argv[argv.index("--launch-count") + 1] == "1"
    assert argv[argv.index("--profile-from-start") + 1] == "off"


def _spec(tmp_path: Path) -> WorkerSpec:
    return WorkerSpec("cpu_cpp", str(tmp_path / "build"), 1)


def test_without_ncu_the_reason_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ncu, "NCU_PLACES", ())
    line = ncu.profile(_spec(tmp_path), "t", "class Model: ...", "class ModelNew: ...",
                       "1 launch, 0.1 ms of GPU time: k 0.1 ms (100%, 1 launch)", 0)
    assert line.startswith("no Nsight Compute profile: ncu is not installed"), line
    assert ncu.profile(_spec(tmp_path), "t", "", "", None, 0).startswith("no Nsight Compute profile: no GPU profile")


def test_a_run_of_ncu_reads_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ncu that writes the report a real one writes where --log-file says, and checks that it was asked
    to run the target module on the candidate written for it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    report = tmp_path / "report.txt"
    report.write_text(REPORT)
    fake = bin_dir / "ncu"
    fake.write_text("#!/bin/sh\n"
                    'log=""; prev=""\n'
                    'for a in "$@"; do [ "$prev" = "--log-file" ] && log="$a"; prev="$a"; done\n'
                    'case "$*" in *stark_ray.eval.worker.ncu_target*candidate.py*) ;; *) echo "==ERROR== bad target"; '
                    "exit 3;; esac\n"
                    f'cp "{report}" "$log"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    line = ncu.profile(_spec(tmp_path), "t", "class Model: ...", "class ModelNew: ...",
                       "1 launch, 1.2 ms of GPU time: relu_kernel 1.2 ms (100%, 1 launch)", 0)
    assert line.startswith("Nsight Compute, top kernel relu_kernel: DRAM 87%"), line


def test_a_cpu_backend_with_profile_ncu_is_one_line_at_once() -> None:
    from stark_ray.config import EvalConfig
    from stark_ray.eval.service import EvalService, EvaluatorError

    with pytest.raises(EvaluatorError, match="--profile ncu counts a GPU's kernels"):
        EvalService(EvalConfig(backend="cpu_cpp", profile="ncu"))
    with pytest.raises(ValueError, match="unknown profile"):
        EvalConfig(profile="nsys")


@pytest.mark.parametrize(("name", "base"), [
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "cunn_SoftMaxForward"),
    ("void (anonymous namespace)::my_kernel<float>(float*)", "my_kernel"),
    ("void ns::k<float>(float*, int)", "k"),
    ("relu_kernel", "relu_kernel"),
])
def test_a_kernels_function_name_whatever_its_namespaces_and_templates(name: str, base: str) -> None:
    assert ncu.kernel_base_name(name) == base


def test_a_copy_is_never_the_kernel_counted() -> None:
    from stark_ray.eval.measure.kernel_times import top_kernel

    described = ("3 launches, 0.5 ms of GPU time: Memcpy DtoD (Device -> Device) 0.3 ms (60%, 1 launch); "
                 "void k<float>(float*) 0.2 ms (40%, 2 launches)")
    assert top_kernel(described) == "void k<float>(float*)"
    assert top_kernel("1 launch, 0.5 ms of GPU time: Memset (Device) 0.5 ms (100%, 1 launch)") is None


def test_what_the_candidate_prints_is_never_read_as_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target's own output (a candidate can print anything) is not ncu's report: a stand-in ncu that writes no
    report while the target prints CSV rows gives no counters."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "forged.txt").write_text(REPORT)
    fake = bin_dir / "ncu"
    fake.write_text(f'#!/bin/sh\ncat "{tmp_path / "forged.txt"}"\nexit 0\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    line = ncu.profile(_spec(tmp_path), "t", "class Model: ...", "class ModelNew: ...",
                       "1 launch, 1.2 ms of GPU time: relu_kernel 1.2 ms (100%, 1 launch)", 0)
    assert line == "no Nsight Compute profile: ncu exited with status 0 and no counters", line


def test_a_target_out_of_device_memory_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ncu's process runs beside the judge and its worker (outside the memory budget's account): a target that ran
    out of device memory is that reason, not a bare exit status."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ncu"
    fake.write_text("#!/bin/sh\necho 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB'\n"
                    "exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    line = ncu.profile(_spec(tmp_path), "t", "class Model: ...", "class ModelNew: ...",
                       "1 launch, 1.2 ms of GPU time: relu_kernel 1.2 ms (100%, 1 launch)", 0)
    assert line.startswith("no Nsight Compute profile: the candidate ran out of device memory"), line
    assert "\n" not in line
