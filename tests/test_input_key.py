"""The key of the judge's trial inputs (eval/input_key.py): made once, the same for every process of the user on
this machine, known to no candidate ahead."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stark_ray.eval import input_key as key


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(key.ENV, raising=False)
    key.input_key.cache_clear()
    yield
    key.input_key.cache_clear()


def test_the_key_is_made_once_readable_by_its_user_alone_and_kept(tmp_path: Path) -> None:
    first = key.input_key()
    path = tmp_path / "config" / "stark-ray" / "input-key"
    assert path.stat().st_mode & 0o777 == 0o600 and 0 <= first < key.SPAN
    key.input_key.cache_clear()
    assert key.input_key() == first  # read back, not drawn again


def test_processes_that_make_it_at_once_agree(tmp_path: Path) -> None:
    code = "from stark_ray.eval.input_key import input_key; print(input_key())"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    seen = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(seen) == 1 and seen != {""}, seen


def test_the_environment_sets_it_and_an_unwritable_home_draws_one(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv(key.ENV, "12345")
    assert key.input_key() == 12345
    key.input_key.cache_clear()
    monkeypatch.delenv(key.ENV)
    (tmp_path / "config").write_text("a file where the directory would be")
    assert 0 <= key.input_key() < key.SPAN
