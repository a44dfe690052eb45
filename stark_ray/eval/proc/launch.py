"""What a process of the evaluator is started as: a :class:`WorkerSpec` (the module it runs, its backend, build
directory, threads, device, isolation) gives its command line (wrapped in the namespaces of eval/proc/isolation.py where
it is isolated) and its environment (eval/proc/sandbox_env.py's allowlist, with its caches, home and visible GPU)."""

from __future__ import annotations

import os
import site
import sys
from dataclasses import dataclass
from pathlib import Path

from stark_ray.eval.backends import backend_path, declared
from stark_ray.eval.proc.isolation import jailed
from stark_ray.eval.proc.sandbox_env import worker_env


@dataclass(frozen=True)
class WorkerSpec:
    backend: str  # a backend name, or its import path (eval/backends: backend_path)
    build_dir: str
    threads: int
    compile_only: bool = False  # a compile-pool worker or a builder: no device
    device: int | None = None  # index among this process's visible GPUs (None: the default / no GPU)
    arch: str | None = None  # TORCH_CUDA_ARCH_LIST for builds (compile workers get the GPU worker's)
    isolate: bool = False  # in namespaces of its own: no other process visible, no network (eval/proc/isolation.py)
    module: str = "stark_ray.eval.worker.main"  # what runs: the worker (candidates) or the judge
    fd_channel: bool = False  # a Unix socket for file descriptors beside the pipes (a device worker's)
    extra: tuple[str, ...] = ()  # more arguments for the module
    env: tuple[tuple[str, str], ...] = ()  # more environment variables for it
    hidden: tuple[str, ...] = ()  # isolated: paths it does not see (eval/proc/isolation.py: hidden_paths)
    writable: tuple[str, ...] = ()  # isolated: what it may write beside its own directory (a builder's output)
    disk_bytes: int = 0  # generated code: the most it may write (EvalConfig.worker_disk_gb); 0: no cap
    memory_bytes: int = 0  # the device worker: the most host memory it may hold (EvalConfig.worker_memory_gb); 0: none

    def argv(self, spare: bool = False, fd: int | None = None) -> list[str]:
        args = [sys.executable, "-m", self.module, "--backend", backend_path(self.backend),
                "--build-dir", self.build_dir, "--threads", str(self.threads), *self.extra]
        if self.compile_only:
            args.append("--compile-only")
        if self.arch:
            args += ["--arch", self.arch]
        if spare:
            args.append("--spare")
        if fd is not None:
            args += ["--fd-channel", str(fd)]
        if self.disk_bytes:
            args += ["--max-file-bytes", str(self.disk_bytes)]
        if self.memory_bytes and not self.compile_only:  # a build's compiler keeps the host's memory
            args += ["--max-data-bytes", str(self.memory_bytes)]
        if self.isolate:  # the cache read-only: what is missing there, a builder makes (eval/build/builder.py)
            args.append("--ask-builds")
            return jailed(args, writable=self.writable, readable=(self.build_dir,), hidden=self.hidden,
                          quota=self.disk_bytes, toolchain=declared(self.backend).toolchain_vars)
        return args


def visible_device(device: int | None, base: str | None) -> str | None:
    """CUDA_VISIBLE_DEVICES for a worker pinned to ``device`` among the parent's visible GPUs (Ray sets the
    parent's list for a num_gpus=1 actor: the worker keeps exactly that one)."""
    if device is None:
        return None
    if base:
        ids = [x.strip() for x in base.split(",") if x.strip()]
        if device < len(ids):
            return ids[device]
    return str(device)


def spec_env(spec: WorkerSpec, workdir: Path) -> dict[str, str]:
    """The environment of a process of ``spec`` whose private directory is ``workdir``."""
    env = worker_env(workdir, spec.threads, backend=spec.backend)
    for variable, directory in declared(spec.backend).caches:  # the backends' (Backend.caches)
        if spec.isolate:  # a cache that candidates write is theirs alone
            env[variable] = str(workdir / directory)
        else:
            env.setdefault(variable, str(Path(spec.build_dir) / directory))
    if spec.isolate:  # a home of its own: the evaluator's is not there (eval/proc/jail.py)
        user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
        if user_site and os.path.isdir(user_site):  # what was installed with pip --user stays importable
            env["PYTHONPATH"] += os.pathsep + user_site
        env["HOME"] = str(workdir)
        env["XDG_CACHE_HOME"] = str(workdir / ".cache")
    if spec.compile_only:
        env["CUDA_VISIBLE_DEVICES"] = ""  # builds never touch a GPU (nor create a context on it)
    else:
        pinned = visible_device(spec.device, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if pinned is not None:
            env["CUDA_VISIBLE_DEVICES"] = pinned
    env.update(dict(spec.env))
    return env
