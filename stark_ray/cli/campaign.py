"""``stark campaign``: many tasks at once on Ray, every evaluator of the cluster busy, spending capped.

Settings come from the command line, else from ``--config campaign.toml`` (see stark_ray/run/campaign.py), else
from the settings dataclasses' defaults, as ``stark optimize``'s do: an option of the settings is unset (None)
unless given, and its help says the default.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from stark_ray.cli.app import app, err, fail, given_options, spelled
from stark_ray.cli.options import PANELS, Settings, check_names, run_settings, settings_options
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.run.campaign import Caps

# what a resume may change: the search's budget, parallelism and stop, the caps, and where and how it runs
RESUME_OPTIONS = frozenset({"resume", "budget", "parallel", "stop_at_sol", "address", "evaluators", "max_in_flight",
                            "quiet", *(f.name for f in dataclasses.fields(Caps))})


@app.command("campaign")
@settings_options(unset=True, search=SearchConfig, agents=AgentConfig, eval=EvalConfig, caps=Caps)
def campaign(
    ctx: typer.Context,
    tasks: Annotated[list[str] | None, typer.Option("--tasks", help="Task files or globs (repeatable).",
                                                    show_default=False)] = None,
    kernelbench: Annotated[str | None, typer.Option(help="A KernelBench checkout (level1/ … level4/).",
                                                    show_default=False)] = None,
    levels: Annotated[list[int] | None, typer.Option("--levels", help="KernelBench levels (repeatable).",
                                                     show_default=False)] = None,
    ids: Annotated[list[int] | None, typer.Option("--ids", help="KernelBench task ids (repeatable).",
                                                  show_default=False)] = None,
    names: Annotated[list[str] | None, typer.Option("--names", help="Name substrings (repeatable).",
                                                    show_default=False)] = None,
    subset: Annotated[str | None, typer.Option(help="all | representative (KernelBench).")] = None,
    config: Annotated[Path | None, typer.Option(help="Campaign TOML file with the same settings.",
                                                show_default=False)] = None,
    out: Annotated[str | None, typer.Option(help="Where campaign directories go: a directory or a filesystem URI "
                                                 "(s3://…) (default: runs).")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster to join (auto, ray://…).")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this campaign directory (a path or a URI).",
                                               show_default=False)] = None,
    evaluators: Annotated[int | None, typer.Option(help="Evaluator actors (default: one per GPU at the start; "
                                                        "more wait for the autoscaler).")] = None,
    max_in_flight: Annotated[int | None, typer.Option(help="Agent calls and evaluations outstanding at once, over "
                                                           "all tasks (default: derived from the evaluators and the "
                                                           "measured agent and evaluation times, at least 64).")] = (
        None),
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live view.")] = False,
    *,
    settings: Settings,  # here: the options of SearchConfig, AgentConfig, EvalConfig and Caps (cli/options.py)
    cassette: Annotated[Path | None, typer.Option(help="Replay recorded exchanges.",
                                                  rich_help_panel=PANELS["agents"])] = None,
) -> None:
    """Search many tasks at once over every evaluator of the Ray cluster, with spending caps."""

    from stark_ray.cli.places import existing_dir, gpu_first, writable_dir
    from stark_ray.llm.base import ConfigError
    from stark_ray.llm.factory import check_credentials, check_provider
    from stark_ray.run.campaign import CampaignError, load_config, select_tasks
    from stark_ray.run.directory import RunError
    from stark_ray.run.resume import refuse_changes, resumed

    cli: dict[str, dict[str, Any]] = {
        "tasks": {"files": tasks, "kernelbench": kernelbench, "levels": levels, "ids": ids, "names": names,
                  "subset": subset},
        **settings,
        "run": {"out": out, "address": address, "evaluators": evaluators, "max_in_flight": max_in_flight},
    }
    cli["agents"]["cassette"] = str(cassette) if cassette else None
    try:
        file_cfg = load_config(config) if config else {}
        merged = {name: {**file_cfg.get(name, {}), **{k: v for k, v in values.items() if v is not None}}
                  for name, values in cli.items()}
        caps = Caps(**merged["caps"])
    except (CampaignError, TypeError) as e:
        fail(f"{config}: {e}" if config and isinstance(e, TypeError) else str(e))
    run_cfg = merged["run"]
    for option, value in (("--evaluators", evaluators), ("--max-in-flight", max_in_flight)):
        if value is not None and value < 1:
            fail(f"{option} must be >= 1")

    def launch(*args: Any, **kwargs: Any) -> None:
        """The campaign on Ray. Ray and the driver are imported only here, once the options are known to be good:
        a mistake is said in a fraction of a second."""
        from stark_ray.cli.optimize import reporter_for, run_on_ray
        from stark_ray.run.ray_driver import RayRun

        run_on_ray(RayRun(*args, **kwargs), reporter_for(True) if quiet else _campaignreporter_for())

    if resume is not None:  # the recorded campaign; --budget, --parallel, the caps, where it runs may change
        run_dir = existing_dir(resume, "--resume", "campaign directory")
        search = settings["search"]
        try:
            refuse_changes([spelled(ctx, name) for name in given_options(ctx) if name not in RESUME_OPTIONS],
                           "--budget, --parallel, --stop-at-sol, the spending caps, --address, --evaluators and "
                           "--max-in-flight")
            run = resumed(run_dir, search.get("budget"), search.get("parallel"), search.get("stop_at_sol"))
            if run.finished:
                typer.echo(run.finished_line(run_dir))
                return
            check_names(run.search, run.eval)
            check_credentials(run.agents)
            check_provider(run.agents)  # one cheap request, before any work
        except (RunError, ConfigError, ValueError, TypeError) as e:
            fail(f"--resume {resume}: {e}")
        launch(run.tasks, run.search, run.agents, run.eval, run_dir.parent, resume=run_dir, address=address,
               caps=caps, evaluators=evaluators, max_in_flight=max_in_flight)
        return
    sel = merged["tasks"]
    try:
        picked = select_tasks(sel.get("files"), sel.get("kernelbench"), sel.get("levels"), sel.get("ids"),
                              sel.get("names"), sel.get("subset") or "all")
        search_cfg, agent_cfg, eval_cfg = run_settings(merged)  # the names too, by their registries
        check_credentials(agent_cfg)
        check_provider(agent_cfg)  # one cheap request, before any work
    except (CampaignError, ConfigError, ValueError) as e:
        fail(str(e))
    except TypeError as e:  # an unknown key in the TOML file
        fail(f"{config}: {e}")
    out_dir = writable_dir(str(run_cfg.get("out") or "runs"), "--out")
    gpu_first(eval_cfg.backend, run_cfg.get("address"), run_cfg.get("evaluators"))
    launch(picked, search_cfg, agent_cfg, eval_cfg, out_dir, address=run_cfg.get("address"), caps=caps,
           evaluators=run_cfg.get("evaluators"), max_in_flight=run_cfg.get("max_in_flight"))


def _campaignreporter_for() -> Any:
    from stark_ray.cli.progress import CampaignReporter

    return CampaignReporter(err)
