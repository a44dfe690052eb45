"""The key the judge's trial inputs are drawn with: a secret of this user's on this machine.

The trials' seeds were ``seed + t``: whoever wrote a candidate could compute ``get_inputs()`` for them ahead, and a
candidate that recognised those inputs was right on them alone (a red team's: half its output zero elsewhere,
accepted). With the key (``~/.config/stark-ray/input-key``: 64 random bits, made once, readable by its user
alone) the seeds are ``seed + key + t``: the same run after run on this machine — an evaluation is reproducible, the
Ray and local executors agree (on one machine: each node of a cluster keeps its own) — and known to no candidate
ahead. A seed is a keyed hash (:func:`trial_seed`): one a candidate sees (a task that draws random numbers is seeded
with it before each call) tells nothing of the key or of the other seeds. An isolated worker never sees the file
(the directory is hidden from it: eval/proc/jail.py); an unisolated one could read it, but by then it runs in the
evaluator, which it can tell anyway (docs/evaluator.md, Known limits). Where no key can be kept (no home, a read-only
one, a file that cannot be read), one is drawn for the process, and a line on stderr says so.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import sys
import tempfile
from pathlib import Path

SEEDS = 1 << 31  # a trial's seed is below this


def key_path() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "stark-ray" / "input-key"


@functools.cache
def input_key() -> int:
    """The key: from the file (made here where it is missing or unreadable as a key), else drawn now."""
    try:
        return _kept(key_path())
    except OSError as e:
        print(f"stark: the trials' input key could not be kept ({e}): one drawn for this process (evaluations on it "
              "are not reproducible)", file=sys.stderr, flush=True)
        return secrets.randbits(64)


def trial_seed(key: int, seed: int, trial: int) -> int:
    """The seed of trial ``trial`` under ``seed``: a hash keyed by ``key``."""
    digest = hashlib.blake2b(f"{seed}:{trial}".encode(), key=key.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEEDS


def _kept(path: Path) -> int:
    """The key in ``path``, written there first where it is missing or not a key (by one process of several at once:
    a link of a finished file either lands or finds the other's; a file that is no key is replaced whole)."""
    try:
        return _read(path)
    except (FileNotFoundError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".input-key-")
    try:
        os.write(fd, f"{secrets.randbits(64):016x}\n".encode())
        os.fchmod(fd, 0o600)
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process made it meanwhile (its key stands), or one that is no key lies there
            try:
                return _read(path)
            except ValueError:
                os.replace(tmp, path)
                return _read(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return _read(path)


def _read(path: Path) -> int:
    text = path.read_text().strip()
    if len(text) != 16:
        raise ValueError("not a key")
    return int(text, 16)
