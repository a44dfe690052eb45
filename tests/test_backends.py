"""A backend is one object: a new one, registered by its import path, is accepted by the config, tells the agents
its format, says what the doctor must check, and is what the evaluator's own processes (the judge, the worker) run —
the example of docs/architecture.md, "Adding a backend". A JIT DSL's backend, in one file, declares what the
sandbox needs of it (variables passed, a cache made private, a toolchain path kept visible in the jail, how its
kernels are recorded) and the package the doctor checks: each reaches its place with no other file edited."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stark_ray import doctor
from stark_ray.config import EvalConfig
from stark_ray.eval import backends
from stark_ray.eval.backends import BUILT_IN, backend_class, backend_path, declared, get_backend, register_backend
from stark_ray.eval.backends.requirements import CXX, GPU
from stark_ray.eval.proc import isolation
from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix, jailed
from stark_ray.eval.proc.launch import WorkerSpec, spec_env
from stark_ray.eval.proc.sandbox_env import worker_env
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task
from stark_ray.eval.worker.kernel_sources import KernelSources, python_kernel_names
from stark_ray.eval.worker.private_places import PRIVATE_PLACES
from stark_ray.prompts.loader import system_prompt

TOY_MODULE = '''
"""toy: plain PyTorch candidates on the CPU (a backend of a package of one's own)."""

import os
from typing import Any, ClassVar

from stark_ray.eval.backends.cpu_cpp import CpuCppBackend
from stark_ray.eval.backends.requirements import CXX


class ToyBackend(CpuCppBackend):
    name: ClassVar[str] = "toy"
    target: ClassVar[str] = "plain PyTorch on a toy CPU"
    requirements: ClassVar[tuple[str, ...]] = (CXX,)

    def prepare_worker(self, build_dir, threads):
        super().prepare_worker(build_dir, threads)
        os.environ["TOY_WORKER"] = "prepared"  # the candidate below checks it ran in a toy worker

    def hardware_info(self) -> dict[str, Any]:
        return {**super().hardware_info(), "toy": "read in the judge"}

    def describe_hardware(self, info: dict[str, Any], threads: int) -> str:
        return f"a toy CPU ({info.get('toy')})"
'''
TOY_PROMPT = "Write ModelNew in plain PyTorch, toy style.\n"

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''
import os
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if os.environ.get("TOY_WORKER") != "prepared":
            raise RuntimeError("not run by the toy backend's worker")
        return torch.addcmul(torch.ones_like(x), x, torch.full_like(x, 2.0))
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The toy backend's module and its prompt file in a directory on the path (this process's and, through
    PYTHONPATH, the evaluator's processes'), registered as ``toy``."""
    package = tmp_path / "site"
    package.mkdir()
    (package / "toy_backend.py").write_text(TOY_MODULE)
    (package / "toy_backend.txt").write_text(TOY_PROMPT)
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("PYTHONPATH", str(package))
    monkeypatch.setattr(backends, "_REGISTRY", dict(BUILT_IN))
    register_backend("toy", "toy_backend:ToyBackend")
    yield "toy"
    sys.modules.pop("toy_backend", None)


def test_a_registered_backend_is_offered_described_and_checked(toy: str) -> None:
    assert EvalConfig(backend=toy).backend == toy
    prompt = system_prompt("code", toy)
    assert "plain PyTorch on a toy CPU" in prompt and TOY_PROMPT.strip() in prompt
    assert get_backend(toy).needs() == (CXX,)
    # the evaluator's processes are given the import path: they need no registration of their own
    argv = WorkerSpec(toy, "/tmp/build", 1).argv()
    assert argv[argv.index("--backend") + 1] == "toy_backend:ToyBackend" == backend_path(toy)
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; choose one of .*toy"):
        backend_class("nope")  # the registry checks a name (config does not: the judge's process imports it)
    # an import path is a backend name too, without registration
    assert backend_class("toy_backend:ToyBackend").name == "toy"
    with pytest.raises(ValueError, match="cannot import"):
        backend_class("toy_backend:Missing")

    class Local(backends.Backend):  # defined in a function: no other process could import it
        pass

    with pytest.raises(ValueError, match="importable"):
        register_backend("local", Local)


def test_every_built_in_backend_is_one_class_with_its_prompt_and_needs() -> None:
    for name in BUILT_IN:
        cls = backend_class(name)
        assert cls.name == name and cls.target and cls.requirements
        assert "class ModelNew" in cls.prompt_section()


@pytest.mark.slow
def test_the_evaluator_runs_a_registered_backend_in_its_own_processes(toy: str, tmp_path: Path,
                                                                       shared_build_dir: str) -> None:
    path = tmp_path / "1_Affine.py"
    path.write_text(TASK)
    task = load_task(path)
    cfg = EvalConfig(backend=toy, build_dir=shared_build_dir, isolate="off", trials=2, warmup=1, timing_trials=5)
    with EvalService(cfg) as service:
        assert service.hardware_description() == "a toy CPU (read in the judge)"
        service.reference(task)
        result = service.evaluate(task, CANDIDATE)
    assert result.accepted, (result.stage, result.error, result.log)


# -- a JIT DSL's backend: one file ---------------------------------------------------------------------------------

TOYJIT_MODULE = '''
"""toyjit: a toy JIT DSL (kernels are Python functions under ``@toyjit.kernel``) and its backend, in one module."""

from typing import Any, ClassVar

from stark_ray.eval.backends.base import Package
from stark_ray.eval.backends.cpu_cpp import CpuCppBackend
from stark_ray.eval.backends.requirements import CXX

__version__ = "0.1"
TOYJIT = Package("toyjit", "ToyJIT", "pip install toyjit")


class Kernel:
    """A function made a kernel (this JIT just calls it)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def kernel(fn):
    return Kernel(fn)


def _kernel_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    return getattr(args[1] if len(args) > 1 else kwargs.get("fn"), "__name__", None)  # Kernel.__init__(self, fn)


class ToyJitBackend(CpuCppBackend):
    name: ClassVar[str] = "toyjit"
    target: ClassVar[str] = "toyjit kernels on a toy CPU"
    requirements: ClassVar[tuple[str, ...]] = (CXX, TOYJIT.check)
    env_prefixes: ClassVar[tuple[str, ...]] = ("TOYJIT_",)
    caches: ClassVar[tuple[tuple[str, str], ...]] = (("TOYJIT_CACHE_DIR", "toyjit"),)
    toolchain_vars: ClassVar[tuple[str, ...]] = ("TOYJIT_COMPILER",)
    kernel_definitions: ClassVar[tuple[str, ...]] = (r"@toyjit\\.kernel\\s*\\ndef\\s+(\\w+)\\s*\\(",)
    packages: ClassVar[tuple[Package, ...]] = (TOYJIT,)
    without_gpu: ClassVar[str] = "TOYJIT_CPU=1 to run toyjit on the CPU"

    @classmethod
    def prompt_section(cls) -> str:
        return "Write ModelNew with @toyjit.kernel functions."  # here, not in a toyjit.txt: one file

    def record_kernels(self, sources) -> None:
        sources.record_names(Kernel, "__init__", _kernel_name)
'''

TOYJIT_CANDIDATE = '''
import os
import torch
import torch.nn as nn
import toyjit


@toyjit.kernel
def affine(x):
    return torch.addcmul(torch.ones_like(x), x, torch.full_like(x, 2.0))


class ModelNew(nn.Module):
    def forward(self, x):
        if os.environ.get("TOYJIT_FLAGS") != "-O3":
            raise RuntimeError("the toyjit backend's variable did not reach the worker")
        if os.environ.get("TOYJIT_CACHE_DIR") != os.environ.get("TMPDIR"):
            raise RuntimeError("the toyjit cache is not the candidate's own directory")
        return affine(x)
'''


@pytest.fixture
def toyjit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The toy JIT DSL's one module in a directory on the path (this process's and, through PYTHONPATH, the
    evaluator's and the doctor's probes'), registered as ``toyjit``."""
    package = tmp_path / "site"
    package.mkdir()
    (package / "toyjit.py").write_text(TOYJIT_MODULE)
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("PYTHONPATH", str(package))
    monkeypatch.setattr(backends, "_REGISTRY", dict(BUILT_IN))
    register_backend("toyjit", "toyjit:ToyJitBackend")
    yield "toyjit"
    sys.modules.pop("toyjit", None)


def test_a_jit_dsl_backend_in_one_file_reaches_the_sandbox_env_and_the_launch_env(
        toyjit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"PATH": "/usr/bin", "TOYJIT_FLAGS": "-O3", "TOYJIT_API_KEY": "s", "TRITON_INTERPRET": "1"}
    env = worker_env(tmp_path / "w", 1, base, backend=toyjit)
    assert env["TOYJIT_FLAGS"] == "-O3" and "TOYJIT_API_KEY" not in env  # passed by its prefix; a secret is not
    assert env["TRITON_INTERPRET"] == "1"  # every backend offered declares for every process
    # a process that knows the backend by its import path only (the judge, a worker) passes its variables too
    monkeypatch.setattr(backends, "_REGISTRY", dict(BUILT_IN))
    assert worker_env(tmp_path / "w", 1, base, backend="toyjit:ToyJitBackend")["TOYJIT_FLAGS"] == "-O3"
    assert "TOYJIT_FLAGS" not in worker_env(tmp_path / "w", 1, base, backend="cpu_cpp")  # not offered there
    register_backend(toyjit, "toyjit:ToyJitBackend")
    # its cache: in the build directory's subdirectory, an isolated process's own, and each candidate's
    build, work = tmp_path / "build", tmp_path / "work"
    assert spec_env(WorkerSpec(toyjit, str(build), 1), work)["TOYJIT_CACHE_DIR"] == str(build / "toyjit")
    isolated = spec_env(WorkerSpec(toyjit, str(build), 1, isolate=True), work)
    assert isolated["TOYJIT_CACHE_DIR"] == str(work / "toyjit") and isolated["TRITON_CACHE_DIR"] == str(work / "triton")
    assert declared(toyjit).cache_vars == ("TRITON_CACHE_DIR", "TOYJIT_CACHE_DIR")
    assert not set(declared(toyjit).cache_vars) & set(PRIVATE_PLACES)  # the worker adds them (host.py)


def test_a_jit_dsl_backends_toolchain_variable_reaches_the_jail(toyjit: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:  # the arguments, wherever isolation works or not
        m.setattr(isolation, "isolation_prefix", lambda: ("unshare",))
        argv = WorkerSpec(toyjit, str(tmp_path / "build"), 1, isolate=True).argv()
    names = [argv[i + 1] for i, a in enumerate(argv[:argv.index("--")]) if a == "--toolchain"]
    assert names == ["TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TOYJIT_COMPILER"]
    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        pytest.skip(str(e))
    # in the jail /tmp is a fresh one: the compiler it names (under /tmp here) is there only where it is declared
    tools, work = tmp_path / "toyjit-tools", tmp_path / "work"
    tools.mkdir()
    work.mkdir()
    (tools / "toyjitc").write_text("the toyjit compiler")
    env = {"PATH": "/usr/bin:/bin", "TOYJIT_COMPILER": str(tools / "toyjitc")}
    command = [sys.executable, "-c", "import os; print(open(os.environ['TOYJIT_COMPILER']).read())"]

    def jailed_run(toolchain: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(jailed(command, toolchain=toolchain), cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)

    seen = jailed_run(declared(toyjit).toolchain_vars)
    assert seen.returncode == 0 and seen.stdout.strip() == "the toyjit compiler", seen.stderr
    unseen = jailed_run(())
    assert unseen.returncode != 0 and "No such file" in unseen.stderr, (unseen.stdout, unseen.stderr)


def test_a_jit_dsl_backends_kernels_are_recorded_and_read(toyjit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch.utils import cpp_extension

    for owner, name in ((cpp_extension, "load_inline"), (cpp_extension, "load"), (torch.cuda, "_compile_kernel")):
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, getattr(owner, name))  # the recorder's wrappers go after the test
    text = "import toyjit\n\n\n@toyjit.kernel\ndef scale(x):\n    return x * 2\n"
    sources = KernelSources()
    sources.install()
    get_backend(toyjit).record_kernels(sources)
    exec(compile(text, "candidate.py", "exec"), {})  # what a candidate of its format does at import
    assert sources.recorded and sources.names() == {"scale"}
    assert python_kernel_names(text, declared(toyjit).kernel_definitions) == {"scale"}  # where nothing is recorded


def test_a_jit_dsl_backends_package_reaches_the_doctor(toyjit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOYJIT_FLAGS", "-O3")
    cls = backend_class(toyjit)
    assert [(p.module, c) for p, c in doctor.backend_packages()] == [("triton", backend_class("triton")),
                                                                     ("toyjit", cls)]
    missing = doctor.check_package(cls.packages[0], cls, {"error": "ModuleNotFoundError: toyjit"}, False)
    assert (missing.name, missing.status, missing.fix) == ("ToyJIT", "missing", "pip install toyjit")
    report = doctor.diagnose(toyjit)
    checks = {c.name: c for c in report.checks}
    assert checks["ToyJIT"].status == "ok" and checks["ToyJIT"].detail == "0.1" and checks["ToyJIT"].needed
    assert "Triton" in checks  # the other backends' packages stay listed, for information
    assert "TOYJIT_FLAGS" in checks[doctor.WORKER_ENV].detail
    if checks[GPU].status != "ok":
        assert checks[GPU].fix.endswith("(or TOYJIT_CPU=1 to run toyjit on the CPU)") and not checks[GPU].needed


@pytest.mark.slow
def test_the_evaluator_runs_a_jit_dsl_backend_with_its_variables_and_private_cache(
        toyjit: str, tmp_path: Path, shared_build_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge and the worker know the backend by its import path only: its variables pass, its cache is the
    candidate's own directory while it runs (the candidate checks both)."""
    monkeypatch.setenv("TOYJIT_FLAGS", "-O3")
    path = tmp_path / "1_Affine.py"
    path.write_text(TASK)
    task = load_task(path)
    cfg = EvalConfig(backend=toyjit, build_dir=shared_build_dir, isolate="off", trials=2, warmup=1, timing_trials=5)
    with EvalService(cfg) as service:
        service.reference(task)
        result = service.evaluate(task, TOYJIT_CANDIDATE)
    assert result.accepted, (result.stage, result.error, result.log)


def test_the_cpus_description_names_its_caches_clock_microarchitecture_and_isa(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stark_ray.eval import hardware

    for i, (level, kind, size, shared) in enumerate([(1, "Data", "48K", "0,56"), (1, "Instruction", "32K", "0,56"),
                                                     (2, "Unified", "2048K", "0,56"),
                                                     (3, "Unified", "107520K", "0-55,112-167")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    caches = hardware.cpu_caches(tmp_path)
    assert [(c.level, c.kind, c.size_bytes, c.shared_by) for c in caches][-1] == (3, "Unified", 107520 << 10, 112)
    assert hardware.describe_caches(caches) == ("Caches: L1d 48 KiB per core, L2 2 MiB per core, L3 105 MiB shared "
                                                "by 112 logical CPUs.")
    spr = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    assert hardware.microarchitecture(spr) == "family 6 model 143: Intel Sapphire Rapids"
    assert hardware.microarchitecture("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n").endswith("Zen 4")
    assert hardware.microarchitecture("vendor_id\t: Other\ncpu family\t: 7\nmodel\t\t: 1\n") == "family 7 model 1"
    flags = ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
             "amx_int8", "pdpe1gb"]
    assert hardware.simd_flags(flags) == [f for f in flags if f != "pdpe1gb"]
    monkeypatch.setattr(hardware, "_cpu_flags", lambda: flags)
    text = hardware.describe_cpu(4)
    assert "amx_bf16" in text and "ARCH_REQ_XCOMP_PERM" in text  # AMX needs the OS's permission: said
    assert "Clock:" in text and "4 usable" in text
    monkeypatch.setattr(hardware, "_cpu_flags", lambda: ["avx2", "fma"])
    assert "ARCH_REQ_XCOMP_PERM" not in hardware.describe_cpu(4)


def test_the_gpus_description_says_what_the_build_targets_and_may_call() -> None:
    from stark_ray.eval.backends.gpu import describe_device

    info = {"device": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "arch": "sm_90", "sm_count": 132,
            "memory_gb": 79.2, "l2_bytes": 50 << 20, "shared_memory_per_block": 48 << 10,
            "shared_memory_per_block_optin": 227 << 10, "shared_memory_per_sm": 228 << 10,
            "registers_per_sm": 65536, "max_threads_per_sm": 2048, "warp_size": 32, "bandwidth_gbs": 3000.0,
            "torch": "2.11.0", "cuda_runtime": "13.0", "arch_list": "9.0", "clock_mhz": 1980, "cutlass": None}
    text = describe_device(info)
    assert "sm_90a features, which this build does not target" in text and "wgmma" in text
    assert "CUTLASS/CuTe headers are not installed" in text and "library_compute" in text
    assert "SM clock up to 1980 MHz" in text
    assert "at /opt/cutlass/include" in describe_device({**info, "cutlass": "/opt/cutlass/include"})
    assert "SM clock" not in describe_device({**info, "clock_mhz": 0})  # older info: said where known only


def test_the_host_memory_is_the_least_of_the_machine_and_its_control_groups(tmp_path: Path) -> None:
    """A container's limit (cgroup v1 or v2) is the host's memory a candidate's cap is half of, not the machine's."""
    from stark_ray.eval import hardware

    v2, own = tmp_path / "v2", tmp_path / "self_cgroup"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory cpu\n")
    (v2 / "a" / "memory.max").write_text(f"{8 << 30}\n")
    (v2 / "a" / "b" / "memory.max").write_text("max\n")
    own.write_text("0::/a/b\n")
    assert hardware.cgroup_memory_limit(v2, own) == 8 << 30
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    own.write_text("4:memory:/process_api/x\n0::/\n")
    assert hardware.cgroup_memory_limit(v1, own) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{6 << 30}\n")
    assert hardware.cgroup_memory_limit(v1, own) == 6 << 30
    assert hardware.host_memory_cap(3.0, "cuda") == 3 << 30  # set: as set
    assert hardware.host_memory_cap(None, "cuda") == 0  # a GPU: no cap unless set
    assert hardware.host_memory_cap(0, "cpu") == 0
    total = hardware.host_memory_bytes()
    assert total is not None and hardware.host_memory_cap(None, "cpu") == total // 2


def test_the_kernels_out_of_memory_kills_are_read_from_the_control_group(tmp_path: Path) -> None:
    """A worker found dead by SIGKILL while this count rose was taken by the host's memory: said as out of memory
    (eval/proc/runner.py, eval/proc/outcome.py), not as a crash of the candidate's making."""
    from stark_ray.eval import hardware
    from stark_ray.eval.proc.outcome import lost_result
    from stark_ray.eval.wire.protocol import PHASE_CHECK

    v2, own = tmp_path / "v2", tmp_path / "self_cgroup"
    (v2 / "run").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory\n")
    (v2 / "run" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    own.write_text("0::/run\n")
    assert hardware.oom_kills(v2, own) == 2
    v1 = tmp_path / "v1"
    (v1 / "memory" / "grp").mkdir(parents=True)
    (v1 / "memory" / "grp" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    own.write_text("4:memory:/grp\n0::/\n")
    assert hardware.oom_kills(v1, own) == 5
    assert hardware.oom_kills(tmp_path / "none", own) is None

    killed = lost_result(PHASE_CHECK, False, -9, "", 90.0, oom_killed=True)
    assert killed.stage == "crash" and killed.flags == ["out_of_memory"]
    assert killed.error is not None and killed.error.startswith("out of memory on the host: the worker was killed")
    crashed = lost_result(PHASE_CHECK, False, -9, "", 90.0)
    assert crashed.flags == [] and "crashed (SIGKILL)" in (crashed.error or "")


def test_the_live_view_calls_a_build_in_the_workers_import_a_build() -> None:
    """A cpu_cpp candidate's g++ build (load_inline, in the worker's import) was shown as "importing" for minutes."""
    from stark_ray.eval.service import device_words
    from stark_ray.eval.wire.protocol import PHASE_COMPILE

    assert device_words(get_backend("cpu_cpp"))[PHASE_COMPILE] == "building (g++) and importing"
    assert device_words(get_backend("cuda"))[PHASE_COMPILE] == "importing"  # built before, in the compile pool
