"""`stark doctor`: the real command on this machine, plus its probes against fake tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stark_ray import doctor
from stark_ray.eval.backends import BUILT_IN, backend_class, get_backend
from stark_ray.eval.backends.triton import TRITON

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-Zq8vW3xK9pL2mN7rT4yU"


def stark_doctor(*args: str, env: dict[str, str] | None = None,
                 drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.endswith("_API_KEY") and k not in ("OPENAI_BASE_URL", *drop)}
    return subprocess.run([sys.executable, "-m", "stark_ray.cli", "doctor", *args], capture_output=True, text=True,
                          env={**base, "COLUMNS": "200", **(env or {})}, cwd=ROOT, timeout=300)


def lines_by_name(stdout: str) -> dict[str, str]:
    names = (doctor.NVCC, doctor.NINJA, doctor.CXX, doctor.DRIVER, doctor.TORCH_CUDA, doctor.GPU,
             doctor.CUDA_MATCH, doctor.NVRTC, TRITON.check, doctor.RAY, doctor.KEYS, doctor.WORKER_ENV,
             doctor.ISOLATION)
    found = {name: ln for ln in stdout.splitlines() for name in names if ln[8:].startswith(name + " ")}
    assert set(found) == set(names), stdout
    return found


def fake_tool(directory: Path, name: str, output: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in output.splitlines()))  # builtins only
    path.chmod(0o755)
    return path


def test_cpu_cpp_is_ready_here() -> None:
    proc = stark_doctor("--backend", "cpu_cpp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = lines_by_name(proc.stdout)
    assert lines[doctor.CXX].startswith("ok ") and lines[doctor.NINJA].startswith("ok ")
    assert all(ln.split()[0] in ("ok", "warn", "missing") for ln in lines.values())
    assert proc.stdout.splitlines()[-1].startswith("backend cpu_cpp: ready")
    assert proc.stderr == ""


def test_cuda_without_a_gpu_names_what_is_missing() -> None:
    proc = stark_doctor("--backend", "cuda")
    gpu = lines_by_name(proc.stdout)[doctor.GPU]
    if gpu.startswith("ok "):
        pytest.skip("a CUDA GPU is visible here")
    assert proc.returncode == 1
    assert gpu.startswith("missing GPU ") and "no CUDA device visible" in gpu and " — fix: " in gpu
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("backend cuda: NOT ready") and "GPU" in last
    assert "Traceback" not in proc.stdout + proc.stderr


def test_api_key_values_never_appear() -> None:
    proc = stark_doctor(env={"OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": "http://10.1.2.3:8000/v1"})
    out = proc.stdout + proc.stderr
    keys = lines_by_name(proc.stdout)[doctor.KEYS]
    assert keys.startswith("ok ")
    assert "OPENAI_API_KEY set" in keys and "ANTHROPIC_API_KEY not set" in keys and "OPENAI_BASE_URL set" in keys
    for part in (SECRET, SECRET[:8], SECRET[-6:], "10.1.2.3"):
        assert part not in out
    assert "(default: " in proc.stdout.splitlines()[-1]


def test_the_worker_environment_is_listed_by_name_only() -> None:
    """What the evaluator's processes get: allowed names listed, a secret and an unlisted name not, no values."""
    proc = stark_doctor(env={"OPENAI_API_KEY": SECRET, "PGPASSWORD": SECRET, "TORCH_CUDA_ARCH_LIST": "9.0",
                             "TORCH_HUB_TOKEN": SECRET})
    line = lines_by_name(proc.stdout)[doctor.WORKER_ENV]
    assert line.startswith("ok ") and "TORCH_CUDA_ARCH_LIST" in line and "PATH" in line, line
    for absent in ("OPENAI_API_KEY", "PGPASSWORD", "TORCH_HUB_TOKEN", SECRET[:8], "9.0"):
        assert absent not in line, line


def test_isolation_says_whether_generated_code_runs_isolated_here() -> None:
    from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix

    try:
        isolation_prefix()
        here = "ok "
    except IsolationUnavailable:
        here = "warn "
    assert lines_by_name(stark_doctor().stdout)[doctor.ISOLATION].startswith(here)
    # a host without util-linux's unshare (only python on PATH): one line with the cause and what to do
    line = lines_by_name(stark_doctor(env={"PATH": str(Path(sys.executable).parent)}).stdout)[doctor.ISOLATION]
    assert line.startswith("warn ") and "unshare" in line and "unisolated" in line, line


def test_json_lists_every_check() -> None:
    proc = stark_doctor("--backend", "cuda_nvrtc", "--json", env={"ANTHROPIC_API_KEY": SECRET})
    checks = json.loads(proc.stdout)
    assert SECRET not in proc.stdout
    assert [set(c) for c in checks] == [{"name", "status", "detail", "fix", "needed"}] * len(checks)
    assert {c["status"] for c in checks} <= {"ok", "warn", "missing"}
    assert {c["name"] for c in checks if c["needed"]} == set(backend_class("cuda_nvrtc").requirements)
    missing = any(c["needed"] and c["status"] == "missing" for c in checks)
    assert proc.returncode == (1 if missing else 0)


def test_bad_backend_is_one_line_and_exit_2() -> None:
    proc = stark_doctor("--backend", "opencl")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unknown backend 'opencl'")
    assert all(b in lines[0] for b in BUILT_IN)


def test_nvcc_not_on_path_is_missing_with_a_fix(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    path = os.pathsep.join([str(empty), str(Path(sys.executable).parent)])
    proc = stark_doctor("--backend", "cuda", env={"PATH": path}, drop=("CUDA_HOME", "CUDA_PATH"))
    nvcc = lines_by_name(proc.stdout)[doctor.NVCC]
    assert nvcc.startswith("missing nvcc ") and "(PATH)" in nvcc and " — fix: install the CUDA toolkit" in nvcc
    assert proc.returncode == 1 and "nvcc" in proc.stdout.splitlines()[-1]
    assert "Traceback" not in proc.stdout + proc.stderr


# the probes, in this process, against fake tools


def test_every_backend_needs_checks_the_doctor_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    from stark_ray.eval.backends import requirements

    checks = {v for k, v in vars(requirements).items() if k.isupper()}  # the doctor's own, and the packages'
    checks |= {package.check for package, _ in doctor.backend_packages()}
    for name in BUILT_IN:
        assert backend_class(name).requirements and set(backend_class(name).requirements) <= checks, name
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert requirements.GPU not in get_backend("triton").needs()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert requirements.GPU in get_backend("triton").needs()
    with pytest.raises(ValueError, match="unknown backend"):
        doctor.diagnose("opencl")


def test_cuda_home_decides_over_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path / "cuda" / "bin", "nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    check, version = doctor.check_nvcc()
    assert (check.status, version) == ("ok", "12.4")
    assert check.detail == f"12.4 at {tmp_path / 'cuda' / 'bin' / 'nvcc'} (from CUDA_HOME)"
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nothing"))  # set but wrong: torch would use it, so missing
    check, version = doctor.check_nvcc()
    assert check.status == "missing" and version is None and "CUDA_HOME" in check.fix


def test_cuda_versions_compared_by_major_then_minor() -> None:
    assert doctor.check_cuda_match("12.8", "12.8").status == "ok"
    assert doctor.check_cuda_match("12.4", "12.8").status == "warn"
    mismatch = doctor.check_cuda_match("13.0", "12.8")
    assert mismatch.status == "missing" and "12" in mismatch.fix
    assert doctor.check_cuda_match("13.0", None).status == "missing"
    assert doctor.check_cuda_match(None, "12.8").status == "missing"


def test_driver_and_gpus_from_fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path, "nvidia-smi", "570.86.15, NVIDIA H200, 9.0\n570.86.15, NVIDIA H200, 9.0")
    monkeypatch.setenv("PATH", str(tmp_path))
    smi, problem = doctor.nvidia_smi()
    assert problem == "" and smi is not None and len(smi) == 2
    driver = doctor.check_driver(smi, problem, gpu_visible=True)
    assert driver.status == "ok" and driver.detail == "570.86.15 (nvidia-smi: 2× NVIDIA H200 (compute 9.0))"
    torch = {"version": "2.13.0+cu130", "cuda": "13.0", "compile_kernel": True}
    h200 = ["NVIDIA H200", 9, 0, 132, 150 * 2**30]
    gpu = doctor.check_gpu([h200, h200], "", torch, smi, "cuda")
    assert gpu.status == "ok" and gpu.detail == "2× NVIDIA H200: sm_90, 132 SMs, 150.0 GiB"
    cpu_torch = {"version": "2.13.0+cpu", "cuda": None, "compile_kernel": True}
    assert "CPU-only" in doctor.check_gpu([], "", cpu_torch, smi, "cuda").detail
    assert doctor.check_nvrtc(cpu_torch).status == "missing" and doctor.check_nvrtc(torch).status == "ok"


def test_cxx_env_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", sys.executable)  # answers --version like a compiler would
    check = doctor.check_cxx()
    assert check.status == "ok" and check.detail.endswith("(CXX)") and "Python" in check.detail
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    assert doctor.check_cxx().status == "missing"


def test_a_hung_probe_is_cut_off() -> None:
    start = time.monotonic()
    code, why = doctor.run_tool([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert code is None and "no answer within 0.5 s" in why
    assert time.monotonic() - start < 45  # cut off: the probe sleeps 60 s
