"""Tasks from a KernelBench checkout: ``level1/ … level4/`` of ``{id}_{Name}.py`` files.

Selection is by level, id, name or a representative subset; nothing is executed (``load_task`` only parses),
so a level-4 model whose inputs take gigabytes costs nothing until it is evaluated. Task names carry their
level (``level2/17_Conv2d_InstanceNorm_Divide``) because ids repeat across levels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from stark_ray.eval.tasks import Task, TaskError, load_task

# Representative subsets for quick runs (STARK.md): level -> task ids.
REPRESENTATIVE: dict[int, tuple[int, ...]] = {
    1: (1, 3, 6, 18, 23, 26, 33, 36, 40, 42, 48, 54, 57, 65, 77, 82, 86, 87),
    2: (1, 2, 8, 18, 23, 28, 33, 43),
    3: (1, 5, 8, 11, 20, 21, 33, 38, 43),
}
SUBSETS = ("all", "representative")
_FILE = re.compile(r"(\d+)_(.+)\.py")


@dataclass(frozen=True)
class KernelBenchEntry:
    """One task file of a KernelBench checkout, found but not loaded (:func:`load` makes it a Task)."""

    level: int
    id: int
    name: str  # the file stem, e.g. "17_Conv2d_InstanceNorm_Divide"
    path: Path

    @property
    def qualified(self) -> str:
        return f"level{self.level}/{self.name}"


def levels_root(root: str | Path) -> Path:
    """The directory that holds ``level1/ …``: ``root`` itself or its ``KernelBench/`` subdirectory."""
    p = Path(root)
    for cand in (p, p / "KernelBench"):
        if cand.is_dir() and any(cand.glob("level[0-9]*")):
            return cand
    if not p.exists():
        raise TaskError(f"{p}: no such directory")
    raise TaskError(f"{p}: no level1/ … level4/ directories (is it a KernelBench checkout?)")


def scan(root: str | Path) -> list[KernelBenchEntry]:
    """Every ``{id}_{Name}.py`` under the level directories, by level then id."""
    refs = []
    for level_dir in levels_root(root).glob("level*"):
        m = re.fullmatch(r"level(\d+)", level_dir.name)
        if not (m and level_dir.is_dir()):
            continue
        for f in level_dir.glob("*.py"):
            fm = _FILE.fullmatch(f.name)
            if fm:
                refs.append(KernelBenchEntry(int(m.group(1)), int(fm.group(1)), f.stem, f))
    return sorted(refs, key=lambda r: (r.level, r.id, r.name))


def select(root: str | Path, levels: Iterable[int] | None = None, ids: Iterable[int] | None = None,
           names: Iterable[str] | None = None, subset: str = "all") -> list[KernelBenchEntry]:
    """The tasks matching every given filter. ``names`` match case-insensitively as substrings of the file
    stem. Asking for ids (or a subset) that the checkout lacks is an error naming them."""
    if subset not in SUBSETS:
        raise TaskError(f"unknown subset {subset!r}; choose one of {', '.join(SUBSETS)}")
    refs = scan(root)
    want_levels = set(levels or []) or {r.level for r in refs}
    if subset == "representative":
        unknown = sorted(want_levels - set(REPRESENTATIVE))
        if unknown:
            raise TaskError(f"no representative subset for level {unknown[0]} (there is one for levels 1-3)")
    want_ids = set(ids or [])
    lowered = [n.lower() for n in names or []]

    def keep(r: KernelBenchEntry) -> bool:
        if r.level not in want_levels:
            return False
        if subset == "representative" and r.id not in REPRESENTATIVE[r.level]:
            return False
        if want_ids and r.id not in want_ids:
            return False
        return not lowered or any(n in r.name.lower() for n in lowered)

    chosen = [r for r in refs if keep(r)]
    expected: set[tuple[int, int]] = set()  # ids the user named (or the subset holds) must all be there
    for lv in want_levels if not lowered else ():
        pool = set(REPRESENTATIVE[lv]) if subset == "representative" else None
        asked = (want_ids & pool if pool is not None else want_ids) if want_ids else (pool or set())
        expected |= {(lv, i) for i in asked}
    missing = sorted(expected - {(r.level, r.id) for r in chosen})
    if missing:
        shown = ", ".join(f"level{lv}/{i}" for lv, i in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise TaskError(f"{levels_root(root)}: no task file for {shown}{more}")
    if not chosen:
        raise TaskError(f"{levels_root(root)}: no task matches the selection")
    return chosen


def load(refs: Iterable[KernelBenchEntry]) -> list[Task]:
    """Parse and check each selected file (nothing is executed); names carry the level."""
    return [replace(load_task(r.path), name=r.qualified) for r in refs]
