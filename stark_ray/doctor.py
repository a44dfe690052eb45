"""``stark doctor``: is this machine ready for a backend? One check per tool, each with a fix when it is not.

Every external probe runs in a subprocess with a timeout; torch.cuda is queried only in a child process, so the
doctor never creates a CUDA context and a hung driver cannot hang it. API keys are reported as set or not set,
never any part of their value.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from stark_ray.eval.backends import (
    Backend,
    Package,
    available_backends,
    backend_class,
    get_backend,
    known_backend,
    offered,
)
from stark_ray.eval.backends.requirements import (
    CUDA_MATCH,
    CXX,
    DRIVER,
    GPU,
    ISOLATION,
    KEYS,
    NINJA,
    NVCC,
    NVRTC,
    RAY,
    TORCH_CUDA,
    WORKER_ENV,
)

Status = Literal["ok", "warn", "missing"]

TOOL_TIMEOUT_S = 15.0  # nvcc, ninja, c++, nvidia-smi
PACKAGES_TIMEOUT_S = 90.0  # importing torch, the backends' packages and ray (slow on a cold file cache)
DEVICES_TIMEOUT_S = 45.0  # torch.cuda: a hung driver ends here
_MARK = "@@stark-doctor@@"

_CUDA_WHEELS = "install a CUDA build of torch (the cuXYZ wheel index for your CUDA: pytorch.org/get-started/locally)"

# its arguments: the packages to import beside torch (the backends', then ray)
_PACKAGES_PROBE = f"""
import json, sys
out = {{}}
def error(e):
    return (type(e).__name__ + ": " + str(e)).splitlines()[0][:200]
try:
    import torch
    out["torch"] = {{"version": torch.__version__, "cuda": torch.version.cuda,
                    "compile_kernel": hasattr(torch.cuda, "_compile_kernel")}}
except Exception as e:
    out["torch"] = {{"error": error(e)}}
for name in sys.argv[1:]:
    try:
        out[name] = {{"version": str(getattr(__import__(name), "__version__", "unknown"))}}
    except Exception as e:
        out[name] = {{"error": error(e)}}
print("\\n{_MARK}" + json.dumps(out))
"""

_DEVICES_PROBE = f"""
import json, torch
devices = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    devices.append([p.name, p.major, p.minor, p.multi_processor_count, p.total_memory])
print("\\n{_MARK}" + json.dumps(devices))
"""


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    needed: bool = False  # does the chosen backend require it?

    def line(self) -> str:
        fix = f" — fix: {self.fix}" if self.fix and self.status != "ok" else ""
        return f"{self.status:<8}{self.name:<13}{self.detail}{fix}"


@dataclass(frozen=True)
class Report:
    backend: str
    default_reason: str | None  # why this backend was picked when none was asked for
    checks: list[Check] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return all(c.status != "missing" for c in self.checks if c.needed)

    def text(self) -> str:
        chosen = f"{self.backend} ({self.default_reason})" if self.default_reason else self.backend
        missing = [c.name for c in self.checks if c.needed and c.status == "missing"]
        needs = ", ".join(c.name for c in self.checks if c.needed)
        verdict = (f"backend {chosen}: ready (it needs {needs}; the other lines are for information)" if not missing
                   else f"backend {chosen}: NOT ready, missing {', '.join(missing)}")
        return "\n".join([*(c.line() for c in self.checks), verdict])


def run_tool(cmd: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit status, stdout + stderr). The status is None when the command could not start or did not finish in
    time (the text says why); the command is then killed with its process group and abandoned if it will not die."""
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", start_new_session=True)
    except OSError as e:
        return None, e.strerror or str(e)
    try:
        out, errs = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (OSError, AttributeError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel (a hung driver): leave it
            proc.communicate(timeout=2)
        return None, f"no answer within {timeout:g} s"
    return proc.returncode, out + errs


def _python_probe(script: str, timeout: float, *args: str) -> tuple[Any, str]:
    """(the JSON the probe printed, or None; why it failed)."""
    code, out = run_tool([sys.executable, "-c", script, *args], timeout)
    for line in reversed(out.splitlines()):
        if line.startswith(_MARK):
            try:
                return json.loads(line[len(_MARK):]), ""
            except ValueError:
                break
    if code is None:
        return None, out
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return None, lines[-1][:200] if lines else f"exit status {code}"


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _version(cmd: list[str], pattern: str) -> tuple[str | None, str]:
    """(version, problem): the version found in ``cmd --version``'s output, else what went wrong."""
    code, out = run_tool([*cmd, "--version"], TOOL_TIMEOUT_S)
    m = re.search(pattern, out)
    if code == 0 and m:
        return m.group(1), ""
    return None, out.strip()[:200] if code is None else f"`{' '.join(cmd)} --version` failed: {_first_line(out)}"


def find_nvcc() -> tuple[str | None, str]:
    """(path to nvcc or None, where it was looked for). CUDA_HOME, else CUDA_PATH, decides when set (as for
    torch.utils.cpp_extension); PATH otherwise."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            return shutil.which("nvcc", path=os.path.join(home, "bin")), f"{var}={home}"
    return shutil.which("nvcc"), "PATH"


def check_nvcc() -> tuple[Check, str | None]:
    path, where = find_nvcc()
    if path is None:
        fix = ("install the CUDA toolkit, or put its bin/ on PATH, or set CUDA_HOME" if where == "PATH"
               else f"point {where.split('=')[0]} at a CUDA toolkit (one with bin/nvcc) or unset it")
        return Check(NVCC, "missing", f"no nvcc ({where})", fix), None
    version, problem = _version([path], r"release (\d+\.\d+)")
    if version is None:
        return Check(NVCC, "missing", f"{path}: {problem}", "reinstall the CUDA toolkit"), None
    via = "" if where == "PATH" else f" (from {where.split('=')[0]})"
    return Check(NVCC, "ok", f"{version} at {path}{via}"), version


def check_ninja() -> Check:
    path = shutil.which("ninja")
    if path is None:
        return Check(NINJA, "missing", "no ninja on PATH (torch.utils.cpp_extension builds with it)",
                     "pip install ninja")
    version, problem = _version([path], r"(\d+\.\d+(?:\.\d+)?)")
    if version is None:
        return Check(NINJA, "missing", f"{path}: {problem}", "pip install --force-reinstall ninja")
    return Check(NINJA, "ok", f"{version} at {path}")


def check_cxx() -> Check:
    cxx = os.environ.get("CXX")
    try:
        cmd = shlex.split(cxx) if cxx else ["c++"]
    except ValueError:
        cmd = []
    if not cmd:
        return Check(CXX, "missing", f"CXX={cxx!r} is not a command", "set CXX to a C++ compiler, or unset it")
    path = shutil.which(cmd[0])
    if path is None:
        if cxx:
            return Check(CXX, "missing", f"CXX={cxx}: {cmd[0]} not found", "set CXX to a C++ compiler, or unset it")
        gxx = shutil.which("g++")
        if gxx:
            return Check(CXX, "warn", f"no c++ on PATH, but {gxx}", "export CXX=g++ (torch builds with CXX or c++)")
        return Check(CXX, "missing", "no c++ or g++ on PATH", "install g++ (apt-get install g++) or set CXX")
    code, out = run_tool([path, *cmd[1:], "--version"], TOOL_TIMEOUT_S)
    if code != 0:
        return Check(CXX, "missing", f"{path}: {_first_line(out)[:200]}", "reinstall the compiler or set CXX")
    via = " (CXX)" if cxx else ""
    return Check(CXX, "ok", f"{_first_line(out)} at {path}{via}")


def nvidia_smi() -> tuple[list[str] | None, str]:
    """(one line per GPU as nvidia-smi lists them, or None; why not)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "no nvidia-smi"
    code, out = run_tool([smi, "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"],
                         TOOL_TIMEOUT_S)
    if code != 0:
        return None, f"nvidia-smi: {_first_line(out)[:200]}"
    return [ln.strip() for ln in out.splitlines() if ln.strip()], ""


def check_driver(smi: list[str] | None, smi_problem: str, gpu_visible: bool) -> Check:
    if smi:
        rows = [[f.strip() for f in ln.split(",")] for ln in smi]  # driver, name, compute capability
        kinds = Counter(f"{', '.join(r[1:-1])} (compute {r[-1]})" for r in rows if len(r) >= 3)
        listed = "; ".join(f"{n}× {kind}" for kind, n in kinds.items())
        return Check(DRIVER, "ok", f"{rows[0][0]} (nvidia-smi: {listed or smi[0]})")
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            m = re.search(r"Kernel Module\s+(\S+)", f.read())
    except OSError:
        m = None
    if m:
        return Check(DRIVER, "ok", f"{m.group(1)} (/proc/driver/nvidia/version; {smi_problem})")
    if gpu_visible:
        return Check(DRIVER, "warn", f"{smi_problem}, but torch sees a GPU", "put nvidia-smi on PATH")
    return Check(DRIVER, "missing", f"no NVIDIA driver found ({smi_problem})",
                 "install the NVIDIA driver, or run on a GPU host")


def check_torch_cuda(torch: dict[str, Any]) -> Check:
    if "error" in torch:
        return Check(TORCH_CUDA, "missing", f"torch not importable: {torch['error']}", "pip install torch")
    if not torch.get("cuda"):
        return Check(TORCH_CUDA, "missing", f"torch {torch['version']} is a CPU-only build", _CUDA_WHEELS)
    return Check(TORCH_CUDA, "ok", f"{torch['cuda']} (torch {torch['version']})")


def check_gpu(devices: list[list[Any]] | None, problem: str, torch: dict[str, Any], smi: list[str] | None,
              backend: str) -> Check:
    if devices:
        parts = [f"{name}: sm_{major}{minor}, {sms} SMs, {mem / 2**30:.1f} GiB"
                 for name, major, minor, sms, mem in devices]
        detail = f"{len(parts)}× {parts[0]}" if len(set(parts)) == 1 else "; ".join(parts)
        return Check(GPU, "ok", detail)
    fix = "run on a GPU host or use --backend cpu_cpp"
    if without := backend_class(backend).without_gpu:  # how the backend's kernels run without one
        fix += f" (or {without})"
    if problem:
        return Check(GPU, "missing", f"torch.cuda failed: {problem}", "check nvidia-smi; the driver may be hung")
    if torch.get("cuda") is None and smi:
        return Check(GPU, "missing", f"nvidia-smi lists {len(smi)} GPU but torch is a CPU-only build", _CUDA_WHEELS)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    return Check(GPU, "missing", f"no CUDA device visible{hint}", fix)


def check_cuda_match(nvcc: str | None, torch_cuda: str | None) -> Check:
    if nvcc is None or torch_cuda is None:
        lacking = [x for x, v in (("no nvcc", nvcc), ("torch has no CUDA build", torch_cuda)) if v is None]
        return Check(CUDA_MATCH, "missing", f"cannot compare: {' and '.join(lacking)}",
                     "see the nvcc and torch CUDA lines")
    n, t = nvcc.split(".")[:2], torch_cuda.split(".")[:2]
    if n[0] != t[0]:
        return Check(CUDA_MATCH, "missing", f"nvcc {nvcc} vs torch built with CUDA {torch_cuda}: majors differ",
                     f"install CUDA toolkit {t[0]}.x (or set CUDA_HOME to one), or a torch built for CUDA {n[0]}")
    if n != t:
        return Check(CUDA_MATCH, "warn", f"nvcc {nvcc} vs torch CUDA {torch_cuda}: minor versions differ",
                     f"usually fine; a toolkit {torch_cuda} matches exactly")
    return Check(CUDA_MATCH, "ok", f"nvcc {nvcc} = torch CUDA {torch_cuda}")


def check_nvrtc(torch: dict[str, Any]) -> Check:
    if not torch.get("cuda"):
        return Check(NVRTC, "missing", "needs a CUDA build of torch (NVRTC ships with it)", _CUDA_WHEELS)
    if not torch.get("compile_kernel"):
        return Check(NVRTC, "missing", f"torch {torch['version']} lacks torch.cuda._compile_kernel",
                     "upgrade torch")
    return Check(NVRTC, "ok", f"torch.cuda._compile_kernel (CUDA {torch['cuda']})")


def backend_packages(backend: str | None = None) -> list[tuple[Package, type[Backend]]]:
    """The packages of every backend offered here and of ``backend`` (``Backend.packages``), each once, with the
    backend that declares it (the first one to)."""
    found: dict[str, tuple[Package, type[Backend]]] = {}
    for cls in offered(backend):
        for package in cls.packages:
            found.setdefault(package.module, (package, cls))
    return list(found.values())


def check_package(package: Package, backend: type[Backend], probed: dict[str, Any], gpu_visible: bool) -> Check:
    """The line of a backend's package: missing where it is not importable, else as the backend says
    (:meth:`~stark_ray.eval.backends.base.Backend.package_line`)."""
    if "error" in probed:
        return Check(package.check, "missing", f"not importable: {probed['error']}", package.install)
    status, detail, fix = backend.package_line(package, probed["version"], gpu_visible)
    return Check(package.check, status, detail, fix)


def check_ray(ray: dict[str, Any]) -> Check:
    if "error" in ray:
        return Check(RAY, "missing", f"not importable: {ray['error']}", "pip install 'ray[default]'")
    return Check(RAY, "ok", ray["version"])


def check_keys() -> Check:
    """Only whether each variable is set: never any part of a value."""
    names = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    parts = [f"{n} {'set' if os.environ.get(n) else 'not set'}" for n in names]
    if os.environ.get("OPENAI_BASE_URL"):
        parts.append("OPENAI_BASE_URL set")
    if any(os.environ.get(n) for n in names):
        return Check(KEYS, "ok", ", ".join(parts))
    return Check(KEYS, "warn", ", ".join(parts),
                 "export OPENAI_API_KEY or ANTHROPIC_API_KEY for a real model (replaying --cassette needs none)")


def check_worker_env(backend: str | None = None) -> Check:
    """Which variables of this environment the evaluator's processes (of ``backend``) get (names only: never a
    value)."""
    from stark_ray.eval.proc.sandbox_env import passed

    kept = sorted(n for n in os.environ if passed(n, backend))
    dropped = len(os.environ) - len(kept)
    return Check(WORKER_ENV, "ok", f"passes {len(kept)} variable(s) to the evaluator: {', '.join(kept) or 'none'}; "
                                   f"drops the other {dropped} (an allowlist: stark_ray/eval/proc/sandbox_env.py)")


def check_isolation() -> Check:
    """Whether generated code runs isolated here under the default ``--isolate auto`` (namespaces and a read-only
    world: stark_ray/eval/proc/isolation.py, jail.py)."""
    from stark_ray.eval.proc.isolation import IsolationUnavailable, isolation_prefix

    try:
        isolation_prefix()
    except IsolationUnavailable as e:
        return Check(ISOLATION, "warn", f"unavailable: {e}",
                     "generated code runs unisolated (it can read other processes' environments and write your "
                     "files): allow user namespaces, or in Docker --security-opt seccomp=unconfined --cap-add "
                     "SYS_ADMIN (docs/evaluator.md)")
    return Check(ISOLATION, "ok", "generated code runs in PID, network and mount namespaces of its own, in a "
                                  "read-only world without your home or working directory, nor the run "
                                  "directory (--isolate auto)")


def diagnose(backend: str | None = None) -> Report:
    """Run every check; ``backend`` None picks cuda when torch sees a CUDA GPU, else cpu_cpp."""
    if backend is not None and not known_backend(backend):
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(available_backends())}")
    own = backend_packages(backend)
    modules = (*(package.module for package, _ in own), "ray")
    with ThreadPoolExecutor(max_workers=5) as pool:
        packages_f = pool.submit(_python_probe, _PACKAGES_PROBE, PACKAGES_TIMEOUT_S, *modules)
        nvcc_f, smi_f = pool.submit(check_nvcc), pool.submit(nvidia_smi)
        ninja_f, cxx_f = pool.submit(check_ninja), pool.submit(check_cxx)
        packages, packages_problem = packages_f.result()
        if not isinstance(packages, dict):
            failed = {"error": f"the probe failed: {packages_problem}"}
            packages = {name: failed for name in ("torch", *modules)}
        torch: dict[str, Any] = packages["torch"]
        devices: list[list[Any]] | None = []
        devices_problem = ""
        if torch.get("cuda"):  # a CPU-only build sees no device: no need to ask
            devices, devices_problem = _python_probe(_DEVICES_PROBE, DEVICES_TIMEOUT_S)
        (nvcc, nvcc_version), (smi, smi_problem) = nvcc_f.result(), smi_f.result()
        ninja, cxx = ninja_f.result(), cxx_f.result()
    gpu_visible = bool(devices)
    reason = None
    if backend is None:
        backend, reason = ("cuda", "default: a CUDA GPU is visible") if gpu_visible else \
            ("cpu_cpp", "default: no CUDA GPU visible")
    checks = [
        nvcc, ninja, cxx,
        check_driver(smi, smi_problem, gpu_visible),
        check_torch_cuda(torch),
        check_gpu(devices, devices_problem, torch, smi, backend),
        check_cuda_match(nvcc_version, torch.get("cuda")),
        check_nvrtc(torch),
        *(check_package(package, cls, packages[package.module], gpu_visible) for package, cls in own),
        check_ray(packages["ray"]),
        check_keys(),
        check_worker_env(backend),
        check_isolation(),
    ]
    needs = set(get_backend(backend).needs())  # what the backend says it needs here
    return Report(backend, reason, [replace(c, needed=c.name in needs) for c in checks])
