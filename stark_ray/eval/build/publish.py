"""The trusted side's half of an isolated build (eval/build/builder.py): what a builder made in a directory of its own
is published into the build cache (eval/build/cache.py) under the key it named before its compiler ran — its one
library (a regular file, not a link) and what the build chose for its headers, with the library's digest recorded
here, by the trusted side — and what a failed build chose for its headers is kept for the next build of its key.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from stark_ray.eval.build.cache import DIGEST_FILE, HEADERS_FULL, HEADERS_LIGHT, LIB_EXT, file_digest
from stark_ray.eval.build.locks import file_lock

MAX_ENTRY_BYTES = 1 << 30  # what a published entry may hold (a builder's output is the candidate's)


def publish(built: Path, cache: Path) -> None:
    """Install the build a builder made in ``built`` (a directory named by its key) as the cache's entry of that
    key: its library (a regular file, not a link) and what the build chose, with the library's digest recorded
    here, by the trusted side. ValueError when ``built`` holds no single library."""
    key = built.name
    if built.is_symlink() or not built.is_dir():  # the builder made it: a link could point anywhere
        raise ValueError(f"the build {key} made no directory of its own")
    files = [p for p in built.iterdir() if p.is_file() and not p.is_symlink()]
    libraries = [p for p in files if p.name.endswith(f"_{key}{LIB_EXT}")]
    if len(libraries) != 1:
        raise ValueError(f"the build {key} made {len(libraries)} libraries, not one")
    size = sum(p.lstat().st_size for p in files)
    if size > MAX_ENTRY_BYTES:
        raise ValueError(f"the build {key} made {size} bytes, more than {MAX_ENTRY_BYTES}")
    staging = cache / f".{key}.publish.{os.getpid()}.{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for p in files:
            if p in libraries or p.name in ("stark_headers", "stark_pch"):
                shutil.copyfile(p, staging / p.name)
        (staging / DIGEST_FILE).write_text(file_digest(staging / libraries[0].name))
        for p in staging.iterdir():  # readable by whoever loads it (a root evaluator's worker is nobody)
            p.chmod(0o644)
        staging.chmod(0o755)
        with file_lock(cache / f"{key}.lock"):
            target, old = cache / key, cache / f".{key}.old.{os.getpid()}.{threading.get_ident()}"
            if target.exists():
                target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_choice(built: Path, cache: Path) -> None:
    """What a failed build chose for its headers (``stark_headers``: light or full), kept for the next build of
    its key, as a failed build in this process keeps it (the next one then skips the try without the header)."""
    choice = built / "stark_headers"
    if built.is_symlink() or not choice.is_file() or choice.is_symlink():
        return
    if choice.read_text() not in (HEADERS_LIGHT, HEADERS_FULL):
        return
    entry = cache / built.name
    with file_lock(cache / f"{built.name}.lock"):
        entry.mkdir(parents=True, exist_ok=True)
        entry.chmod(0o755)
        shutil.copyfile(choice, entry / choice.name)
        (entry / choice.name).chmod(0o644)
