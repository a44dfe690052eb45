"""A campaign: many tasks searched at once, with spending caps. Selection and caps live here (no Ray); the Ray
executor runs it.

Tasks come from a KernelBench checkout (levels, ids, names, the representative subset), from files and globs,
or from a campaign TOML file holding the same settings as the command line (both made from the settings
dataclasses' fields: a key of ``[search]``, ``[agents]``, ``[eval]`` or ``[caps]`` is its field's name)::

    [tasks]
    kernelbench = "~/KernelBench"      # or: files = ["examples/tasks/*.py"]
    levels = [1, 2]
    subset = "representative"

    [search]
    budget = 30
    parallel = 1
    policy = "epsilon_greedy"

    [agents]
    provider = "openai"
    model = "gpt-4o"

    [eval]
    backend = "cuda"

    [caps]
    max_cost = 50.0          # dollars, whole campaign
    task_max_cost = 1.0      # dollars, each task
"""

from __future__ import annotations

import dataclasses
import glob
import sys
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stark_ray.config import option
from stark_ray.eval.tasks import Task, TaskError, load_task

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class CampaignError(ValueError):
    """A campaign that cannot start as asked. One line."""


@dataclass(frozen=True)
class Caps:
    """Spending limits; None = no limit. Reaching one stops new LLM calls (work in flight finishes)."""

    max_cost: float | None = option(None, "USD cap for the campaign.")
    max_tokens: int | None = option(None, "Token cap for the campaign.")
    task_max_cost: float | None = option(None, "USD cap per task.")
    task_max_tokens: int | None = option(None, "Token cap per task.")

    def __post_init__(self) -> None:
        for name in ("max_cost", "max_tokens", "task_max_cost", "task_max_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise CampaignError(f"{name} must be > 0 (got {value})")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.max_cost, self.max_tokens, self.task_max_cost, self.task_max_tokens))


@dataclass
class Spend:
    cost: float = 0.0
    tokens: int = 0


@dataclass
class CapTracker:
    """What each task and the whole campaign have spent; which caps are reached."""

    caps: Caps
    total: Spend = field(default_factory=Spend)
    per_task: dict[str, Spend] = field(default_factory=dict)
    capped: dict[str, str] = field(default_factory=dict)  # task -> why no new LLM calls are made for it

    def add(self, task: str, cost: float, tokens: int) -> None:
        spend = self.per_task.setdefault(task, Spend())
        spend.cost += cost
        spend.tokens += tokens
        self.total.cost += cost
        self.total.tokens += tokens

    def campaign_reason(self) -> str | None:
        c, t = self.caps, self.total
        if c.max_cost is not None and t.cost >= c.max_cost:
            return f"campaign cost cap reached (${t.cost:.4f} of ${c.max_cost:g})"
        if c.max_tokens is not None and t.tokens >= c.max_tokens:
            return f"campaign token cap reached ({t.tokens} of {c.max_tokens})"
        return None

    def check(self, names: Iterable[str], every: Iterable[str]) -> None:
        """``names`` have spent more: which caps are reached now (a campaign cap stops ``every`` task)."""
        for name in every if self.campaign_reason() else names:
            if name not in self.capped and (reason := self.task_reason(name)):
                self.capped[name] = reason

    def task_reason(self, task: str) -> str | None:
        whole = self.campaign_reason()
        if whole:
            return whole
        c, s = self.caps, self.per_task.get(task, Spend())
        if c.task_max_cost is not None and s.cost >= c.task_max_cost:
            return f"task cost cap reached (${s.cost:.4f} of ${c.task_max_cost:g})"
        if c.task_max_tokens is not None and s.tokens >= c.task_max_tokens:
            return f"task token cap reached ({s.tokens} of {c.task_max_tokens})"
        return None


def tasks_from_files(patterns: list[str]) -> list[Task]:
    """Task files named directly or by glob, in the order given, each once. A pattern that matches nothing is
    an error naming it."""
    paths: list[Path] = []
    for pattern in patterns:
        expanded = Path(pattern).expanduser()
        matches = sorted(glob.glob(str(expanded))) if glob.has_magic(str(expanded)) else [str(expanded)]
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            raise CampaignError(f"{pattern}: no task file matches")
        paths += [Path(m) for m in matches if Path(m) not in paths]
    tasks = [load_task(p) for p in paths]
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CampaignError(f"two task files share the name {twice[0]!r}: rename one (names key the results)")
    return tasks


def tasks_from_kernelbench(root: str, levels: list[int] | None, ids: list[int] | None, names: list[str] | None,
                           subset: str) -> list[Task]:
    from stark_ray.eval import kernelbench

    return kernelbench.load(kernelbench.select(Path(root).expanduser(), levels, ids, names, subset))


def select_tasks(files: list[str] | None = None, kernelbench: str | None = None, levels: list[int] | None = None,
                 ids: list[int] | None = None, names: list[str] | None = None, subset: str = "all") -> list[Task]:
    if bool(files) == bool(kernelbench):
        raise CampaignError("choose the tasks with either --tasks FILES or --kernelbench DIR")
    if kernelbench and not Path(kernelbench).expanduser().is_dir():
        raise CampaignError(f"--kernelbench {kernelbench}: no such directory (a KernelBench checkout, or the "
                            "directory that holds its level1/ ...)")
    try:
        if kernelbench:
            return tasks_from_kernelbench(kernelbench, levels, ids, names, subset)
        return tasks_from_files(files or [])
    except TaskError as e:
        raise CampaignError(str(e)) from None


SECTIONS = {"tasks", "search", "agents", "eval", "caps", "run"}
# the keys of the sections that are no settings dataclass: the task selection and where the campaign runs
TASK_KEYS: dict[str, Any] = {"files": list[str], "kernelbench": str, "levels": list[int], "ids": list[int],
                             "names": list[str], "subset": str}
RUN_KEYS: dict[str, Any] = {"out": str, "address": str, "evaluators": int, "max_in_flight": int}
NOT_IN_FILES = {"eval": {"hidden_paths"}}  # set by the run itself


def section_types(name: str) -> dict[str, Any]:
    """Each key a section may hold, and its type (the settings dataclass's annotations)."""
    from stark_ray.config import AgentConfig, EvalConfig, SearchConfig

    if name == "tasks":
        return TASK_KEYS
    if name == "run":
        return RUN_KEYS
    cls = {"search": SearchConfig, "agents": AgentConfig, "eval": EvalConfig, "caps": Caps}[name]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in NOT_IN_FILES.get(name, set())}


def type_name(kind: Any) -> str:
    """What a TOML value of this type looks like, for an error message."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        return " or ".join(type_name(a) for a in args)
    if typing.get_origin(kind) is list:
        plural = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
        return f"a list of {plural.get(args[0], type_name(args[0]))}" if args else "a list"
    if typing.get_origin(kind) is dict:
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(kind, str(kind))


def fits(value: Any, kind: Any) -> bool:
    """Whether a TOML value has the type (a bool is no number, an integer is a float)."""
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        return any(fits(value, a) for a in typing.get_args(kind) if a is not type(None))
    if origin is list:
        (item,) = typing.get_args(kind) or (Any,)
        return isinstance(value, list) and all(item is Any or fits(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, list)
    return isinstance(value, kind)


def check_section(path: Path, name: str, section: dict[str, Any]) -> None:
    """CampaignError naming the first key of ``[name]`` that is unknown or of the wrong type."""
    known = section_types(name)
    for key, value in section.items():
        if key not in known:
            raise CampaignError(f"{path}: [{name}] has no key {key!r}; its keys are {', '.join(sorted(known))}")
        if not fits(value, known[key]):
            raise CampaignError(f"{path}: [{name}] {key} must be {type_name(known[key])}, got {value!r}")
    for key in ("evaluators", "max_in_flight"):
        if name == "run" and section.get(key) is not None and section[key] < 1:
            raise CampaignError(f"{path}: [run] {key} must be >= 1, got {section[key]}")


def load_config(path: Path) -> dict[str, dict[str, Any]]:
    """A campaign TOML file as {section: {key: value}}: unknown sections and keys, and values of the wrong type,
    are an error naming them (the settings' own checks, of ranges and choices, follow when they are built)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CampaignError(f"{path}: cannot read ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise CampaignError(f"{path}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - SECTIONS)
    if unknown:
        raise CampaignError(f"{path}: unknown section [{unknown[0]}]; sections are {', '.join(sorted(SECTIONS))}")
    for name, section in data.items():
        if not isinstance(section, dict):
            raise CampaignError(f"{path}: [{name}] must be a table")
        check_section(path, name, section)
    return {name: dict(data.get(name, {})) for name in SECTIONS}
