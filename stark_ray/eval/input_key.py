"""The key the judge's trial inputs are drawn with: a secret of this user's on this machine.

The trials' seeds were ``seed + t``: whoever wrote a candidate could compute ``get_inputs()`` for them ahead, and a
candidate that recognised those inputs was right on them alone (a red team's: half its output zero elsewhere,
accepted). With the key (``~/.config/stark-ray/input-key``: 64 random bits, made once, readable by its user
alone) the seeds are ``seed + key + t``: the same run after run on this machine — an evaluation is reproducible, the
Ray and local executors agree — and known to no candidate ahead. An isolated worker never sees the file (the
directory is hidden from it: eval/jail.py); an unisolated one could read it, but by then it runs in the evaluator,
which it can tell anyway (docs/evaluator.md, Known limits). ``STARK_INPUT_KEY`` (a number) sets it instead; where
no key can be kept (no home, a read-only one), one is drawn for the process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import tempfile
from pathlib import Path

ENV = "STARK_INPUT_KEY"
SPAN = 1 << 30  # the key's share of a seed (seeds stay well inside a 63-bit generator seed)


def key_path() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "stark-ray" / "input-key"


@functools.cache
def input_key() -> int:
    """The key, in [0, SPAN): from STARK_INPUT_KEY, else the file (made here where missing), else drawn now."""
    given = os.environ.get(ENV, "").strip()
    if given:
        try:
            return int(given) % SPAN
        except ValueError:
            pass  # not a number: the file's
    try:
        return _kept(key_path()) % SPAN
    except OSError:
        return secrets.randbelow(SPAN)


def _kept(path: Path) -> int:
    """The number in ``path``, written there first where it is missing (by one process of several at once: a link
    of a finished file either lands or finds the other's)."""
    try:
        return int(path.read_text().strip(), 16)
    except (FileNotFoundError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".input-key-")
    try:
        os.write(fd, f"{secrets.randbits(64):016x}\n".encode())
        os.fchmod(fd, 0o600)
        os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile: its key stands
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return int(path.read_text().strip(), 16)
