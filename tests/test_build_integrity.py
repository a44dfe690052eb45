"""A build cache a candidate cannot poison for the ones after it (eval/build/cache.py): a cached library rewritten
in place is noticed and built again, and a process that had loaded it is not disturbed (it loaded a copy). Real
builds of a tiny pybind11 module (seconds, no torch headers), real processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from leaky_candidates import MODEL, TASK, quick_service

from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
TINY = ('#include <pybind11/pybind11.h>\\nint f() { return 7; }\\n'
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }\\n')

POISON = """
for so in Path(ROOT).rglob("*.so"):  # in place: the same file, which a process that loaded it maps
    with open(so, "r+b") as f:
        f.truncate(64)
        f.seek(0)
        f.write(bytes(64))
"""

SCRIPT = f"""
import sys
from pathlib import Path
from torch.utils import cpp_extension
from stark_ray.eval.build.cache import BuildCache
ROOT = sys.argv[1]
load = BuildCache(Path(ROOT), use_pch=False).wrap(cpp_extension.load_inline, is_inline=True)
first = load(name="tiny", cpp_sources=['{TINY}'], no_implicit_headers=True)
print("first", first.f(), flush=True)
{POISON}
again = load(name="tiny", cpp_sources=['{TINY}'], no_implicit_headers=True)
print("again", again.f(), "first still", first.f(), flush=True)
"""

CANDIDATE = """
import torch
from pathlib import Path
from torch.utils.cpp_extension import load_inline

ROOT = {root!r}
EXT = load_inline(name="tiny", cpp_sources=['{tiny}'], no_implicit_headers=True)
""" + MODEL


def test_a_library_rewritten_in_place_is_built_again_and_its_loaded_copy_stays_usable(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "cache")], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])  # -7: SIGBUS
    assert "first 7" in proc.stdout and "again 7 first still 7" in proc.stdout, proc.stdout
    assert "changed since it was first loaded; building it again" in proc.stderr


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvalService]:
    with quick_service(str(tmp_path_factory.mktemp("build"))) as s:
        yield s


def test_a_candidate_that_poisons_the_cache_does_not_fail_the_next_ones(service: EvalService) -> None:
    task = load_task(TASK)
    root = str(service.build_dir)
    honest = CANDIDATE.format(root=root, tiny=TINY, forward="pass", factor=" * (EXT.f() / 7)")
    first = service.evaluate(task, honest)
    assert first.passed_checks, first.error
    poisoner = CANDIDATE.format(root=root, tiny=TINY, forward=POISON.replace("\n", "\n        ").strip(),
                               factor=" * (EXT.f() / 7)")
    service.evaluate(task, poisoner)  # its own verdict does not matter here
    after = service.evaluate(task, honest)  # the same worker, which had loaded the library
    assert after.passed_checks and after.stage == "ok", (after.stage, after.error, after.log[-2000:])
