"""The environment of an evaluator process (judge, worker, compile pool): only what the toolchains, torch and the
evaluator need, never a credential; the package importable, threads pinned.

An allowlist, not a deny list: a deny list of secret-looking names let ``PGPASSWORD``, ``DATABASE_URL``,
``OPENAI_KEY`` and ``SSH_AUTH_SOCK`` through to the generated code. A variable is passed when its name is on
PASSED_NAMES or starts with one of PASSED_PREFIXES or of the backends' own (``Backend.env_prefixes`` of every backend
offered, and of the one the process runs), and does not look like a secret (``TORCH_HUB_TOKEN`` is dropped all the
same). ``stark doctor`` lists what is passed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from stark_ray.eval.backends import declared

# API keys, and the cloud credentials a run directory on an object store needs (AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, GOOGLE_APPLICATION_CREDENTIALS, AWS_SHARED_CREDENTIALS_FILE, ...)
SECRET_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET", "_SECRET_KEY", "_PASSWORD", "_ACCESS_KEY", "_KEY_ID",
                   "_CREDENTIALS", "_CREDENTIALS_FILE")
SECRET_NAMES = {"API_KEY", "TOKEN", "PASSWORD", "SECRET"}
PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory holding stark_ray/

# glibc malloc serves large blocks with mmap and adapts that threshold as blocks are freed, so whether an
# eager op's 16 MB temporary costs fresh page faults depends on allocation history: the same reference
# measured 11 ms or 33 ms from one worker to the next. Heap-only allocation that is never trimmed makes it
# steady (like the CUDA caching allocator on a GPU: after warm-up, allocations cost next to nothing).
MALLOC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"

# The CUDA caching allocator of the judge and the worker, which run under a cap (eval/measure/memory.py): a cached block
# larger than this is never split to serve a smaller request. Without it the comparisons' chunk temporaries
# (256-512 MB) were carved out of a task's freed 6 GB blocks, which then could neither serve the next 6 GB tensor
# nor go back to the device: a worker holding 24 GB of tensors under a 36 GB cap ran out of memory while timing.
# Blocks that are never split can all be given back when the cap is reached. A user's own setting of either kind
# is kept.
ALLOCATOR_SETTINGS = "max_split_size_mb:512"
ALLOCATOR_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


PASSED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM",  # the basics (getpass, locale)
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",  # compilers, loaders
    "CC", "CXX", "CUDAHOSTCXX", "MAX_JOBS",  # torch.utils.cpp_extension
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "XDG_CACHE_HOME", "GLIBC_TUNABLES",
})
PASSED_PREFIXES = ("LC_", "PYTHON", "CUDA_", "NVIDIA_", "NVCC_", "TORCH_", "PYTORCH_", "OMP_", "KMP_", "GOMP_",
                   "MKL_", "OPENBLAS_", "CUBLAS", "CUDNN_", "STARK_RAY_")


def passed(name: str, backend: str | None = None) -> bool:
    """Whether an evaluator process (of ``backend``, a name or an import path; None: any backend offered here)
    gets this variable of the parent's environment."""
    prefixes = PASSED_PREFIXES + declared(backend).env_prefixes
    return (name in PASSED_NAMES or name.startswith(prefixes)) and not is_secret(name)


def is_secret(name: str) -> bool:
    upper = name.upper()
    return upper in SECRET_NAMES or upper.endswith(SECRET_SUFFIXES)


def worker_env(workdir: Path, threads: int, base: Mapping[str, str] | None = None,
               backend: str | None = None) -> dict[str, str]:
    """The environment of an evaluator process of ``backend`` (as for :func:`passed`) whose private directory is
    ``workdir``, from ``base`` (None: this process's)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if passed(k, backend)}
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + path if path else "")
    env["PYTHONFAULTHANDLER"] = "1"  # a crash before the worker enables faulthandler still dumps a stack
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)
    env["TMPDIR"] = str(workdir)
    # torch.compile builds in this process, not in a pool of its own: the judge kills every process a request
    # leaves running below the worker (eval/proc/lifetime.py)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    # the allocator's settings under either of torch's names (PYTORCH_ALLOC_CONF is the newer): ours are added to
    # the one the user set, unless the user chose a block policy already
    name = next((n for n in ALLOCATOR_VARIABLES if env.get(n)), ALLOCATOR_VARIABLES[-1])
    conf = env.get(name, "")
    if "max_split_size_mb" not in conf and "expandable_segments:true" not in conf.lower():
        env[name] = f"{conf},{ALLOCATOR_SETTINGS}" if conf else ALLOCATOR_SETTINGS
    tunables = env.get("GLIBC_TUNABLES")
    env["GLIBC_TUNABLES"] = f"{tunables}:{MALLOC_TUNABLES}" if tunables else MALLOC_TUNABLES
    return env
