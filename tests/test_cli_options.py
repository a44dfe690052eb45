"""Options are defined once, in the config dataclasses: every option of ``stark optimize``, ``stark eval`` and
``stark campaign`` that sets a field of SearchConfig, AgentConfig, EvalConfig (or a campaign's Caps) is made from
that field (stark_ray/cli/options.py) and defaults to its default (a campaign's options default to None: unset, the
TOML's value or the config's is taken); a field declared for the command line cannot be left out of a command that
takes its dataclass, nor written again by hand."""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from stark_ray.cli.campaign import campaign
from stark_ray.cli.eval import eval_candidate
from stark_ray.cli.main import app
from stark_ray.cli.optimize import optimize
from stark_ray.cli.options import Settings, settings_options
from stark_ray.config import AgentConfig, CliOption, EvalConfig, SearchConfig, cli_option, option
from stark_ray.run.campaign import Caps

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "1_LeakyReluScale.py"

CONFIGS = (SearchConfig(), AgentConfig(), EvalConfig())
# options whose default is worked out from others (provider: replay with --cassette; model: by provider)
DERIVED = {"provider", "model"}


def settings(command: Any) -> dict[str, list[tuple[str, Any, Any]]]:
    """Per option that names a config field: (config, the option's default, the field's default)."""
    out: dict[str, list[tuple[str, Any, Any]]] = {}
    for name, param in inspect.signature(command).parameters.items():
        for cfg in CONFIGS:
            if name in {f.name for f in fields(cfg)}:
                out.setdefault(name, []).append((type(cfg).__name__, param.default, getattr(cfg, name)))
    return out


@pytest.mark.parametrize("command", [optimize, eval_candidate], ids=["optimize", "eval"])
def test_an_options_default_is_its_configs(command: Any) -> None:
    found = settings(command)
    assert len(found) >= (20 if command is optimize else 8)  # the parameters are still named as the fields
    differ = {name: v for name, v in found.items() if name not in DERIVED and any(d != c for _, d, c in v)}
    assert differ == {}


def test_a_campaigns_options_are_unset_by_default() -> None:
    found = settings(campaign)
    assert len(found) >= 20
    assert {name: v for name, v in found.items() if any(d is not None for _, d, _ in v)} == {}


# -- every option of the settings, made from its field ----------------------------------------------------------------
SECTIONS: dict[str, type] = {"search": SearchConfig, "agents": AgentConfig, "eval": EvalConfig, "caps": Caps}
# the settings each command takes (a campaign's options are unset unless given: its file's values, else the defaults)
TAKES = {"optimize": ("search", "agents", "eval"), "eval": ("eval",), "campaign": ("search", "agents", "eval", "caps")}
UNSET = {"campaign"}


def click_command(name: str) -> Any:
    """The command as typer builds it (of the click typer brings)."""
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def command_line_fields(section: str) -> list[tuple[Any, CliOption]]:
    return [(f, o) for f in fields(SECTIONS[section]) if (o := cli_option(f)) is not None]


@pytest.mark.parametrize("name", sorted(TAKES))
def test_every_command_line_field_is_an_option_of_each_command_that_takes_its_settings(name: str) -> None:
    """Spelled as the field says (``--field-name`` where it says nothing), with the field's default (None where it
    is derived from other settings, and in a campaign, where unset means the file's value or the default)."""
    options = [p for p in click_command(name).params if p.param_type_name == "option"]
    checked = 0
    for section in TAKES[name]:
        for f, cli in command_line_fields(section):
            spellings = set(cli.flags or (f"--{f.name.replace('_', '-')}",))
            (option,) = [o for o in options if spellings <= set(o.opts) | set(o.secondary_opts)] or [None]
            assert option is not None, f"{name}: no option {sorted(spellings)} for {section}.{f.name}"
            default = None if name in UNSET or cli.derived else f.default
            assert option.default == default, f"{name} {option.opts}: default {option.default!r}, not {default!r}"
            assert option.help, f"{name} {option.opts}: no help"
            checked += 1
    assert checked >= {"optimize": 30, "eval": 12, "campaign": 34}[name]


@pytest.mark.parametrize("name", sorted(TAKES))
def test_no_option_is_spelled_twice(name: str) -> None:
    """A setting's option written by hand again (beside the one made from its field) would share its spelling."""
    spellings = [s for p in click_command(name).params for s in [*p.opts, *getattr(p, "secondary_opts", [])]]
    assert sorted({s for s in spellings if spellings.count(s) > 1}) == []


def test_a_setting_given_reaches_each_field_its_option_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every option of the settings given a value: the dataclasses are made with it in each field the option sets
    (``--seed``: the search's and the evaluator's; ``--temperature-code``: the code and the single agent's)."""
    import stark_ray.cli.eval as cli_eval
    import stark_ray.cli.options as cli_options
    import stark_ray.run.campaign as run_campaign

    made: dict[str, dict[str, Any]] = {}

    class Made(Exception):
        pass

    def recorder(section: str) -> Any:
        def make(**kwargs: Any) -> Any:
            made[section] = kwargs
            if len(made) == 3 or (section == "eval" and "agents" not in made and "search" not in made):
                raise Made
            return None
        return make

    for module in (cli_options, cli_eval):
        for section in ("search", "agents", "eval"):
            if hasattr(module, SECTIONS[section].__name__):
                monkeypatch.setattr(module, SECTIONS[section].__name__, recorder(section))
    monkeypatch.setattr(run_campaign, "select_tasks", lambda *args: [])
    runner = CliRunner()
    task = str(TASK)
    for name in sorted(TAKES):
        made.clear()
        args, expected = [], {}
        for section in TAKES[name]:
            hints = typing.get_type_hints(SECTIONS[section])
            for f, cli in command_line_fields(section):
                spelling = cli.flags[0] if cli.flags else f"--{f.name.replace('_', '-')}"
                kind = next(t for t in (int, float, str) if t == hints[f.name] or t in typing.get_args(hints[f.name]))
                value = {int: "7", float: "0.5", str: "/x/y" if cli.path else "x"}[kind]
                if spelling not in args:
                    args += [spelling, value]
                expected[(section, f.name)] = {"7": 7, "0.5": 0.5}.get(value, value)
        head = {"optimize": ["optimize", task], "eval": ["eval", task, task], "campaign": ["campaign", "--tasks", task]}
        result = runner.invoke(app, [*head[name], *args])
        assert isinstance(result.exception, Made), (name, result.output, result.exception)
        for (section, field), value in expected.items():
            if section == "caps":
                continue  # made before the others, and checked by their own values (> 0) above
            assert made[section][field] == value, (name, section, field, made[section].get(field))


def test_options_made_from_a_dataclass_of_ones_own() -> None:
    """The spellings a field gives, a flag's on and off forms, one option for fields that share a spelling (set
    together), the rest at the dataclass's default; two fields that would share a spelling with different types
    or defaults are refused when the command is made."""
    @dataclass(frozen=True)
    class Toy:
        size: int = option(3, "How big.", "--size", "-s")
        loud: bool = option(False, "Shout.")
        seed: int = option(0, "Seeds it.")
        quiet_too: int = 1  # not on the command line

    @dataclass(frozen=True)
    class Other:
        seed: int = option(0, "")

    toy = typer.Typer()
    got: list[Settings] = []

    @toy.command()
    @settings_options(toy=Toy, other=Other)
    def run(name: str = "x", *, settings: Settings) -> None:
        got.append(settings)

    runner = CliRunner()
    for args, expected in ((["-s", "5", "--loud", "--seed", "2"], {"size": 5, "loud": True, "seed": 2}),
                           (["--size", "4", "--no-loud"], {"size": 4, "loud": False, "seed": 0})):
        result = runner.invoke(toy, args)
        assert result.exit_code == 0, result.output
        assert got[-1] == {"toy": expected, "other": {"seed": expected["seed"]}}
    assert runner.invoke(toy, ["--quiet-too", "2"]).exit_code == 2

    @dataclass(frozen=True)
    class Clash:
        seed: float = option(0.5, "Another seed.")

    with pytest.raises(TypeError, match=r"--seed sets toy\.seed and clash\.seed"):
        settings_options(toy=Toy, clash=Clash)
