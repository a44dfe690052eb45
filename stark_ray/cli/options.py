"""The options of the commands that take a run's settings, made from the settings dataclasses.

A field declared with ``config.option`` is an option of every command that takes its dataclass: its spellings, its
help and its default are the field's, written once (as a campaign file's keys are: stark_ray/run/campaign.py). A
command names the dataclasses it takes with :func:`settings_options`, and its parameter ``settings`` receives what
was given, by section; the options of its own (paths, where it runs, ``--resume``) stay in its signature. The names
a policy and a backend are given by are checked by their registries (:func:`check_names`), before any work.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from stark_ray.config import AgentConfig, EvalConfig, SearchConfig, cli_option
from stark_ray.eval.backends import available_backends, backend_class
from stark_ray.search.policy import POLICIES, policy_factory

# section ("search", "agents", "eval", "caps": a campaign file's names for them) -> field -> the value given
Settings = dict[str, dict[str, Any]]
R = TypeVar("R")
# the help panel of each section's options (a command's own options come first, under "Options")
PANELS = {"search": "Search", "agents": "Agents", "eval": "Evaluator", "caps": "Spending caps"}


@dataclasses.dataclass
class Made:
    """One option made from the fields it sets, ``(section, field)``: those that share its spellings."""

    name: str  # the parameter's: its first field's
    flags: tuple[str, ...]
    kind: Any  # the fields' type
    default: Any
    help: str
    derived: bool
    path: bool
    panel: str
    fields: list[tuple[str, str]]

    def parameter(self, unset: bool) -> inspect.Parameter:
        """The command's parameter, as typer reads it. ``unset``: it defaults to None (the field's default, or a
        campaign file's value, applies), and the help says the field's default."""
        kind = Path if self.path else _without_none(self.kind)
        default = None if unset or self.derived else self.default
        text = self.help.format(policies=" | ".join(POLICIES), backends=" | ".join(available_backends()))
        if unset and not self.derived and self.default is not None:
            shown = f"{self.default:g}" if isinstance(self.default, float) else self.default
            text = f"{text.removesuffix('.')} (default: {shown})."
        flags = self.flags
        if kind is bool and len(flags) == 1 and "/" not in flags[0]:  # a flag: on and off
            flags = (f"{flags[0]}/--no-{flags[0].removeprefix('--')}",)
        info = typer.Option(*flags, help=text, rich_help_panel=self.panel)
        annotation = Annotated[kind if default is not None else kind | None, info]  # type: ignore[valid-type]
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def made_options(sections: dict[str, type]) -> list[Made]:
    """The options of the command-line fields of ``sections``' dataclasses, in their order. Fields that share a
    spelling are one option, which sets each of them (their types and defaults must agree); TypeError where two
    options would share a spelling or a parameter name."""
    by_flags: dict[tuple[str, ...], Made] = {}
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            cli = cli_option(f)
            if cli is None:
                continue
            flags = cli.flags or ("--" + f.name.replace("_", "-"),)
            known = by_flags.get(flags)
            if known is None:
                by_flags[flags] = Made(f.name, flags, hints[f.name], f.default, cli.help, cli.derived, cli.path,
                                       PANELS.get(section, section.capitalize()), [(section, f.name)])
            elif (known.kind, known.default, known.derived, known.path) != (hints[f.name], f.default, cli.derived,
                                                                            cli.path):
                raise TypeError(f"{flags[0]} sets {known.fields[0][0]}.{known.fields[0][1]} and {section}.{f.name}, "
                                "whose types or defaults differ")
            else:
                known.fields.append((section, f.name))
                known.help = known.help or cli.help
    options = list(by_flags.values())
    spellings = [flag for o in options for flag in o.flags]
    names = [o.name for o in options]
    twice = sorted({x for x in spellings if spellings.count(x) > 1} | {x for x in names if names.count(x) > 1})
    if twice:
        raise TypeError(f"two options of the settings are spelled or named {twice[0]}")
    return options


def settings_options(unset: bool = False, **sections: type) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """A decorator: the command gets an option for each command-line field of the dataclasses of ``sections``
    (``search=SearchConfig``, ...) where its parameter ``settings`` stands, and ``settings`` receives
    {section: {field: value}} of the options given a value (with ``unset``, those given on the command line; else
    each option's default too, the derived ones' and None excepted: the dataclass's default applies)."""
    options = made_options(sections)

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        at = [p.name for p in own].index("settings")
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                  for p in [*own[:at], *(o.parameter(unset) for o in options), *own[at + 1:]]]
        clash = {p.name for p in own} & {o.name for o in options}
        if clash:
            raise TypeError(f"{command.__name__}: {', '.join(sorted(clash))} is an option of the settings already")

        @functools.wraps(command)
        def run(**given: Any) -> R:
            settings: Settings = {section: {} for section in sections}
            for o in options:
                value = given.pop(o.name)
                if value is not None:
                    for section, name in o.fields:
                        settings[section][name] = str(value) if o.path else value
            return command(**given, settings=settings)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what typer reads
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


def check_names(*configs: SearchConfig | EvalConfig) -> None:
    """The names ``configs`` hold, each checked by its registry: a search policy's by the table of policies, a
    backend's by the backends' (which imports one given by its import path, once). ValueError, one line, for a
    name its registry does not know."""
    for cfg in configs:
        if isinstance(cfg, SearchConfig):
            policy_factory(cfg.policy)
        else:
            backend_class(cfg.backend)


def run_settings(settings: Settings) -> tuple[SearchConfig, AgentConfig, EvalConfig]:
    """A run's settings from what was given (each dataclass's defaults for the rest): a cassette with no provider
    means replay; the names checked by their registries. ValueError (one line) for a value they refuse, TypeError
    for a key no dataclass has."""
    agents = dict(settings["agents"])
    if agents.get("cassette"):
        agents.setdefault("provider", "replay")
    search, agent_cfg, ev = SearchConfig(**settings["search"]), AgentConfig(**agents), EvalConfig(**settings["eval"])
    check_names(search, ev)
    return search, agent_cfg, ev


def _without_none(kind: Any) -> Any:
    """``int`` for ``int | None``; any other type as it is."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) in (types.UnionType, typing.Union) and len(args) == 1 else kind
