"""``stark campaign``: many tasks at once on Ray, every evaluator of the cluster busy, spending capped.

Settings come from the command line, else from ``--config campaign.toml`` (see stark_ray/run/campaign.py), else
from the defaults of ``stark optimize``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from stark_ray.cli.app import AGENTS, EVAL, SEARCH, app, err, fail
from stark_ray.config import ABLATIONS, TOLERANCES, AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.backends import available_backends
from stark_ray.search.policy import POLICIES, policy_factory

_S, _A, _E = SEARCH, AGENTS, EVAL  # the defaults the help shows (defined in config.py, once)


@app.command("campaign")
def campaign(
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
    budget: Annotated[int | None, typer.Option("--budget", "-B",
                                               help=f"Attempts per task (default: {_S.budget}).")] = None,
    parallel: Annotated[int | None, typer.Option(help="Expansions per task in flight "
                                                      f"(default: {_S.parallel}).")] = None,
    provider: Annotated[str | None, typer.Option(help=f"openai | anthropic | replay (default: {_A.provider}, or replay "
                                                      "with --cassette).")] = None,
    model: Annotated[str | None, typer.Option(help="Model for every agent (default: gpt-4o with openai, "
                                                   "claude-sonnet-4-5 with anthropic).")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server.")] = None,
    cassette: Annotated[Path | None, typer.Option(help="Replay recorded exchanges.")] = None,
    policy: Annotated[str | None, typer.Option(help=f"{' | '.join(POLICIES)} (default: {_S.policy}).")] = None,
    ablation: Annotated[str | None, typer.Option(help=f"{' | '.join(ABLATIONS)} (default: {_S.ablation}).")] = None,
    epsilon: Annotated[float | None, typer.Option(help=f"ε of the ε-greedy policy (default: {_S.epsilon}).")] = None,
    n_root: Annotated[int | None, typer.Option(help=f"The root gets at most this many children (default: {_S.n_root}).")
                      ] = None,
    n_child: Annotated[int | None, typer.Option(help="Prune a node with more failed children than this "
                                                     f"(default: {_S.n_child}).")] = None,
    n_child_max: Annotated[int | None, typer.Option(help="No node but the root gets more children than this (0: "
                                                         f"no cap; default: {_S.n_child_max}).")] = None,
    top_r: Annotated[int | None, typer.Option(help="Leaderboard entries shown to the plan agent "
                                                   f"(default: {_S.top_r}).")] = None,
    k: Annotated[int | None, typer.Option(help=f"Best-of-K width (0: the whole budget) (default: {_S.k}).")] = None,
    stop_at_sol: Annotated[float | None, typer.Option(help="Stop a task once its best candidate runs at this share "
                                                           "of its speed of light, e.g. 0.9 (0: off; default: "
                                                           f"{_S.stop_at_sol:g}).")] = None,
    max_debug_chain: Annotated[int | None, typer.Option(help="Repairs in a row one lineage may get "
                                                             f"(default: {_S.max_debug_chain}).")] = None,
    window_chars: Annotated[int | None, typer.Option(help="Size limit of one context window in a prompt "
                                                          f"(default: {_S.window_chars}).")] = None,
    prompt_chars: Annotated[int | None, typer.Option(help="Size limit of a whole prompt, its fixed parts included "
                                                          f"(default: {_S.prompt_chars}).")] = None,
    timeout: Annotated[float | None, typer.Option(help=f"Seconds per LLM call (default: {_A.timeout_s:g}).")] = None,
    backend: Annotated[str | None, typer.Option(help=f"{' | '.join(available_backends())} "
                                                     f"(default: {_E.backend}).")] = None,
    baseline: Annotated[str | None, typer.Option(help=f"eager | compile (default: {_E.baseline}).")] = None,
    profile: Annotated[str | None, typer.Option(
        help=f"none | ncu: Nsight Compute on each accepted candidate's top kernel (default: {_E.profile}).")] = None,
    tolerance: Annotated[str | None, typer.Option(help=f"{' | '.join(TOLERANCES)} (kernelbench: atol=rtol=1e-2) "
                                                       f"(default: {_E.tolerance}).")] = None,
    trials: Annotated[int | None, typer.Option(help=f"Correctness trials (default: {_E.trials}).")] = None,
    seed: Annotated[int | None, typer.Option(help=f"Seed (default: {_S.seed}).")] = None,
    isolate: Annotated[str | None, typer.Option(help="auto | on | off: generated code in namespaces of its own "
                                                     f"(no other process visible, no network) (default: {_E.isolate}).")
                       ] = None,
    compile_timeout: Annotated[float | None, typer.Option(help="Seconds one candidate's build may take "
                                                               f"(default: {_E.compile_timeout_s:g}).")] = None,
    memory_budget: Annotated[float | None, typer.Option(help="Device memory (GB) for one evaluation (default: 90% "
                                                            "of the GPU's free memory); a task that cannot fit is "
                                                            "skipped.",
                                                       show_default=False)] = None,
    max_cost: Annotated[float | None, typer.Option(help="USD cap for the campaign.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Token cap for the campaign.")] = None,
    task_max_cost: Annotated[float | None, typer.Option(help="USD cap per task.")] = None,
    task_max_tokens: Annotated[int | None, typer.Option(help="Token cap per task.")] = None,
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
) -> None:
    """Search many tasks at once over every evaluator of the Ray cluster, with spending caps."""

    from stark_ray.cli.places import existing_dir, gpu_first, writable_dir
    from stark_ray.eval.backends import backend_class
    from stark_ray.llm.base import ConfigError
    from stark_ray.llm.factory import check_credentials
    from stark_ray.run.campaign import CampaignError, Caps, load_config, select_tasks
    from stark_ray.run.directory import RunError
    from stark_ray.run.resume import refuse_changes, resumed

    cli: dict[str, dict[str, Any]] = {
        "tasks": {"files": tasks, "kernelbench": kernelbench, "levels": levels, "ids": ids, "names": names,
                  "subset": subset},
        "search": {"budget": budget, "parallel": parallel, "policy": policy, "ablation": ablation,
                   "epsilon": epsilon, "seed": seed, "n_root": n_root, "n_child": n_child,
                   "n_child_max": n_child_max, "top_r": top_r, "k": k, "stop_at_sol": stop_at_sol,
                   "max_debug_chain": max_debug_chain, "window_chars": window_chars,
                   "prompt_chars": prompt_chars},
        "agents": {"provider": provider, "model": model, "base_url": base_url, "timeout_s": timeout,
                   "cassette": str(cassette) if cassette else None},
        "eval": {"backend": backend, "baseline": baseline, "profile": profile, "tolerance": tolerance, "trials": trials,
                 "seed": seed,
                 "isolate": isolate, "memory_budget_gb": memory_budget, "compile_timeout_s": compile_timeout},
        "caps": {"max_cost": max_cost, "max_tokens": max_tokens, "task_max_cost": task_max_cost,
                 "task_max_tokens": task_max_tokens},
        "run": {"out": out, "address": address, "evaluators": evaluators, "max_in_flight": max_in_flight},
    }
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
        fixed = {"--tasks": tasks, "--kernelbench": kernelbench, "--levels": levels, "--ids": ids, "--names": names,
                 "--subset": subset, "--provider": provider, "--model": model, "--base-url": base_url,
                 "--cassette": cassette, "--backend": backend, "--baseline": baseline, "--profile": profile,
                 "--trials": trials,
                 "--seed": seed, "--isolate": isolate, "--memory-budget": memory_budget,
                 "--compile-timeout": compile_timeout, "--policy": policy, "--ablation": ablation,
                 "--epsilon": epsilon, "--n-root": n_root, "--n-child": n_child,
                 "--n-child-max": n_child_max, "--top-r": top_r, "--k": k,
                 "--max-debug-chain": max_debug_chain, "--window-chars": window_chars,
                 "--prompt-chars": prompt_chars, "--timeout": timeout,
                 "--tolerance": tolerance, "--out": out, "--config": config}
        try:
            refuse_changes([option for option, value in fixed.items() if value not in (None, [])],
                           "--budget, --parallel, --stop-at-sol, the spending caps, --address, --evaluators and "
                           "--max-in-flight")
            run = resumed(run_dir, budget, parallel, stop_at_sol)
            if run.finished:
                typer.echo(run.finished_line(run_dir))
                return
            check_credentials(run.agents)
        except (RunError, ConfigError, ValueError, TypeError) as e:
            fail(f"--resume {resume}: {e}")
        launch(run.tasks, run.search, run.agents, run.eval, run_dir.parent, resume=run_dir, address=address,
               caps=caps, evaluators=evaluators, max_in_flight=max_in_flight)
        return
    sel = merged["tasks"]
    try:
        picked = select_tasks(sel.get("files"), sel.get("kernelbench"), sel.get("levels"), sel.get("ids"),
                              sel.get("names"), sel.get("subset") or "all")
        agents = merged["agents"]
        if agents.get("cassette") and agents.get("provider") in (None, "replay"):
            agents["provider"] = "replay"
        search_cfg = SearchConfig(**merged["search"])
        agent_cfg = AgentConfig(**agents)
        eval_cfg = EvalConfig(**merged["eval"])
        policy_factory(search_cfg.policy)  # the names, by their registries
        backend_class(eval_cfg.backend)
        check_credentials(agent_cfg)
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
