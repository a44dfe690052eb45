"""The key of the judge's trial inputs (eval/judge/input_key.py): made once, the same for every process of the user on
this machine, known to no candidate ahead; a trial's seed a keyed hash that tells nothing of the key."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stark_ray.eval.judge import input_key as key


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    key.input_key.cache_clear()
    yield
    key.input_key.cache_clear()


def test_the_key_is_made_once_readable_by_its_user_alone_and_kept(tmp_path: Path) -> None:
    first = key.input_key()
    path = tmp_path / "config" / "stark-ray" / "input-key"
    assert path.stat().st_mode & 0o777 == 0o600
    key.input_key.cache_clear()
    assert key.input_key() == first  # read back, not drawn again


def test_processes_that_make_it_at_once_agree(tmp_path: Path) -> None:
    code = "from stark_ray.eval.judge.input_key import input_key; print(input_key())"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    seen = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(seen) == 1 and seen != {""}, seen


def test_a_file_that_is_no_key_is_replaced_and_no_home_draws_one(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config" / "stark-ray" / "input-key"
    path.parent.mkdir(parents=True)
    path.write_text("")  # a crash between its creation and its write
    made = key.input_key()
    assert len(path.read_text().strip()) == 16 and int(path.read_text(), 16) == made
    key.input_key.cache_clear()
    path.unlink()
    path.parent.rmdir()
    path.parent.write_text("a file where the directory would be")
    assert key.input_key() >= 0 and "could not be kept" in capsys.readouterr().err


def test_a_seed_is_a_keyed_hash() -> None:
    seeds = {key.trial_seed(7, 0, t) for t in range(5)}
    assert len(seeds) == 5 and all(0 <= s < key.SEEDS for s in seeds)
    assert key.trial_seed(7, 0, 1) == key.trial_seed(7, 0, 1) != key.trial_seed(8, 0, 1)  # the key decides
    assert key.trial_seed(7, 1, 0) != key.trial_seed(7, 0, 1)  # not seed + t
