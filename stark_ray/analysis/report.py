"""``write_report(dir)``: ``report.md`` (tables per level, per run, per task) and PNG plots in ``report/``."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stark_ray.analysis import metrics
from stark_ray.analysis.metrics import FAST_PS, Baseline, Summary
from stark_ray.analysis.views import connect, rows, run_dirs, task_rows
from stark_ray.eval.measure.noise import interval
from stark_ray.store.location import Location, locate

REPORT_FILE = "report.md"
PLOTS_DIR = "report"
TREES = 12  # search trees drawn by default: those of the tasks with the highest best speedup


@dataclass
class Report:
    """What :func:`generate` wrote and computed."""

    path: Path | Location  # a Location after an upload to a filesystem URI
    overall: Summary
    levels: list[Summary]
    runs: list[Summary]
    tasks: list[dict[str, Any]]
    failures: dict[str, int]
    repeats: list[metrics.Repeat] = field(default_factory=list)  # tasks run more than once
    attempts: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)  # per drawn task, its rows
    devices: list[dict[str, Any]] = field(default_factory=list)
    plots: list[Path | Location] = field(default_factory=list)  # Locations after an upload
    plot_error: str | None = None
    trees: list[Path | Location] = field(default_factory=list)  # one picture per task drawn (report/tree_*.png)
    trees_of: int = 0  # of how many tasks


def write_report(path: str | Path | Location, out: str | Path | Location | None = None) -> Path | Location:
    """Analyse the run(s) at ``path`` and write ``report.md`` (and the plots) into ``out`` (default: ``path``);
    the report's path."""
    return generate(path, out).path


def generate(path: str | Path | Location, out: str | Path | Location | None = None, trees: int = TREES) -> Report:
    """``path`` and ``out`` may be local directories or filesystem URIs (``s3://...``); a report for a URI is
    written in a local temporary directory and then uploaded. ``trees``: how many tasks' search trees to draw
    (those with the highest best speedup, then by name; 0: none)."""
    source = locate(path)
    runs = run_dirs(source)
    with connect(source) as con:
        tasks = task_rows(con)
        failures = {r["failure"]: int(r["n"]) for r in rows(
            con, "SELECT failure, count(*) AS n FROM judged WHERE seq > 0 AND failure IS NOT NULL "
                 "GROUP BY failure ORDER BY n DESC, failure")}
        progress = rows(con, "SELECT run_id, task, seq, best_speedup_so_far FROM judged WHERE seq > 0 "
                             "ORDER BY run_id, task, seq")
        devices = rows(con, "SELECT * FROM devices WHERE device <> 'unknown' ORDER BY run_id, device")
        drawn = _tree_tasks(tasks, trees)
        nodes = rows(con, "SELECT run_id, task, seq, node_id, parent_id, agent, accepted, failure, speedup, "
                          "speedup_err, flags, error FROM judged ORDER BY run_id, task, seq") if drawn else []
    shapes = {key: [n for n in nodes if (n["run_id"], n["task"]) == key] for key in drawn}
    target = locate(out) if out is not None else source
    if target.local:
        return _write(target.local_path(), tasks, failures, progress, devices, source, runs, shapes)
    with tempfile.TemporaryDirectory(prefix="stark-report-") as tmp:
        report = _write(Path(tmp), tasks, failures, progress, devices, source, runs, shapes)
        uploaded: list[Path | Location] = []
        for f in [report.path, *report.plots, *report.trees]:
            local = Path(str(f))
            dest = target.join(*local.relative_to(tmp).parts)
            dest.parent.mkdir()
            dest.write_bytes(local.read_bytes())
            uploaded.append(dest)
        report.path = uploaded[0]
        report.plots = uploaded[1:1 + len(report.plots)]
        report.trees = uploaded[1 + len(report.plots):]
    return report


def _tree_tasks(tasks: list[dict[str, Any]], limit: int) -> list[tuple[str, str]]:
    """(run_id, task) of the tasks whose trees are drawn: the highest best speedup first, then by name."""
    ranked = sorted(tasks, key=lambda t: (-(t.get("best_speedup") or 0.0), str(t["run_id"]), str(t["task"])))
    return [(str(t["run_id"]), str(t["task"])) for t in ranked[:max(0, limit)]]


def _write(target: Path, tasks: list[dict[str, Any]], failures: dict[str, int], progress: list[dict[str, Any]],
           devices: list[dict[str, Any]], source: Location, runs: list[Location],
           shapes: dict[tuple[str, str], list[dict[str, Any]]]) -> Report:
    target.mkdir(parents=True, exist_ok=True)
    path = target / REPORT_FILE
    report = Report(path=path, overall=metrics.summarize(tasks), levels=metrics.by_level(tasks),
                    runs=metrics.by_run(tasks), tasks=tasks, failures=failures, devices=devices,
                    repeats=metrics.repeats(tasks), attempts=shapes)
    _plots(report, target / PLOTS_DIR, progress, several_runs=len(runs) > 1)
    _trees(report, target / PLOTS_DIR, shapes, several_runs=len(runs) > 1)
    text = render(report, source, runs)
    tmp = path.with_name(f".{REPORT_FILE}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return report


def headline(s: Summary) -> list[str]:
    """The few numbers worth printing."""
    e = s.eager
    counted = (f"{s.tasks} task-runs ({s.distinct_tasks} distinct tasks, in {s.runs} runs; a task run again counts "
               "once per run)" if s.distinct_tasks < s.tasks else f"{s.tasks} tasks")
    lines = [f"{counted}: success (fast_0) {_pct(e.fast_p.get(0.0))} ({e.successes}/{e.tasks}), "
             f"fast_1 {_pct(e.fast_p.get(1.0))}, fast_1.5 {_pct(e.fast_p.get(1.5))}, fast_2 {_pct(e.fast_p.get(2.0))}",
             f"geomean speedup vs eager {_x(e.geomean_speedup)} over successful tasks, {_x(e.geomean_speedup_all)} "
             "over all tasks (failure = 1.0)"]
    if s.compile is not None:
        c = s.compile
        lines.append(f"vs torch.compile ({c.tasks} of {s.tasks} tasks measured): fast_1 {_pct(c.fast_p.get(1.0))}, "
                     f"geomean speedup {_x(c.geomean_speedup)} over successful tasks")
    lines.append(f"{s.attempts} attempts (compile rate {_pct(s.compile_rate)}, passed rate {_pct(s.passed_rate)}, "
                 f"accepted rate {_pct(s.accepted_rate)}), {s.tokens:,} tokens, ${s.cost_usd:.2f}")
    return lines


# --- rendering -----------------------------------------------------------------------------------------------
def render(r: Report, source: Path | Location, runs: Sequence[Path | Location]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    names = ", ".join(f"`{p.name}`" for p in runs[:8]) + (f" and {len(runs) - 8} more" if len(runs) > 8 else "")
    counted = (f"{r.overall.distinct_tasks} tasks ({r.overall.tasks} task-runs)"
               if r.overall.distinct_tasks < r.overall.tasks else f"{r.overall.tasks} tasks")
    out = [f"# STARK analysis: `{source}`", "",
           f"{counted} in {len(runs)} run(s) ({names}); written {stamp}.", "",
           "## Headline", "", *[f"- {line}" for line in headline(r.overall)], ""]
    groups = r.levels
    out += ["## Against PyTorch eager", "", *_baseline_table(groups, lambda s: s.eager), ""]
    if r.overall.compile is not None:
        out += ["## Against torch.compile", "",
                "Only tasks whose torch.compile baseline was measured (`--baseline compile`) count.", "",
                *_baseline_table([s for s in groups if s.compile is not None], lambda s: s.compile), ""]
    if any(s.light is not None for s in groups):
        out += ["## Speed of light", "",
                "How far the references and the best candidates are from the least time each task can take on its "
                f"device (its bytes over the measured bandwidth, its FLOPs over the peak: docs/evaluator.md); near: "
                f"at {metrics.NEAR:.0%} of it or closer, where little is left to win.", "",
                *_light_table(groups), ""]
    out += ["## Search", "", *_search_table(groups), ""]
    if r.runs:
        out += ["## Per run", "", *_baseline_table(r.runs, lambda s: s.eager, first="run"), "",
                *_search_table(r.runs, first="run"), ""]
    if r.repeats:
        out += ["## Tasks run more than once", "",
                "Each run's best speedup is one draw: over a task's runs, the geometric mean of the successful runs' "
                "best speedups, with a 95% interval from their spread (Student's t on the logarithms; two "
                "successful runs at least), and the lowest and highest.", "",
                "| task | runs | successes | best speedup (geomean) | 95% interval | lowest | highest |",
                "|---|---:|---:|---:|---:|---:|---:|",
                *[f"| {_cell(x.task)} | {x.runs} | {x.successes} | {_x(x.geomean_speedup)} | "
                  f"{_x(x.low)} – {_x(x.high)} | {_x(x.least)} | {_x(x.most)} |" if x.low is not None else
                  f"| {_cell(x.task)} | {x.runs} | {x.successes} | {_x(x.geomean_speedup)} | — | {_x(x.least)} | "
                  f"{_x(x.most)} |" for x in r.repeats], ""]
    out += ["## Tasks", "", "Best speedup: the runoff's figure where one named the best (its rounds' geometric mean), "
            "else the search's; ± its 95% interval where known.", "",
            *_task_table(r.tasks, several_runs=bool(r.runs)), ""]
    out += ["## Failure reasons", ""]
    if r.failures:
        out += ["| reason | attempts |", "|---|---:|", *[f"| {_cell(k)} | {v} |" for k, v in r.failures.items()]]
    else:
        out.append("No failed attempts.")
    out.append("")
    if r.devices:
        out += ["## Devices", "", "Where candidates were evaluated; busy s: the sum of the evaluation times, "
                "references included; busy: the candidates' evaluation times over the search's span on the "
                "device (from the first candidate's start to the last candidate's row).", "",
                "| run | device | tasks | evaluations | busy s | search span s | busy |",
                "|---|---|---:|---:|---:|---:|---:|",
                *[f"| {_cell(d['run_id'])} | {_cell(d['device'])} | {d['tasks']} | {d['evaluations']} | "
                  f"{_num(d['busy_s'], '{:.1f}')} | {_num(d['span_s'], '{:.1f}')} | {_pct(d['busy_share'])} |"
                  for d in r.devices], ""]
    if r.plots:
        out += ["## Plots", ""]
        for p in r.plots:  # all in report/ beside report.md
            out += [f"![{Path(p.name).stem}]({PLOTS_DIR}/{p.name})", ""]
    elif r.plot_error:
        out += ["## Plots", "", f"No plots: {r.plot_error}.", ""]
    if r.trees:
        shown = (f"{len(r.trees)} of {r.trees_of} tasks, the highest best speedup first (`stark report --trees N` "
                 "draws more)" if len(r.trees) < r.trees_of else "every task")
        out += ["## Search trees", "",
                f"The search tree of {shown}: each attempt a node (circle: plan + code, triangle: debug), its colour "
                "what the evaluation made of it, an edge from each parent to its children; the path to the best "
                "candidate drawn bold, each accepted node's speedup beside it, each node's id (`node_id`) at "
                "its lower left.", ""]
        for p in r.trees:
            out += [f"![{Path(p.name).stem}]({PLOTS_DIR}/{p.name})", ""]
    if r.attempts:
        out += ["## Attempts", "", "Every attempt of the tasks whose trees are drawn, in the order they finished: "
                "the node and its parent, the agent, what the evaluation made of it, its speedup ± its 95% interval.",
                ""]
        for (run_id, task), rows_ in r.attempts.items():
            out += [f"### {_cell(f'{run_id}: {task}' if r.runs else task)}", "", *_attempt_table(rows_), ""]
    out += ["## Definitions", "", *_DEFINITIONS, ""]
    return "\n".join(out)


_DEFINITIONS = [
    "- success: the task has an accepted candidate: it compiled, passed the correctness checks, was timed and was "
    "not flagged `suspicious`, `no_kernel` or `unordered_stream` (`EvalResult.accepted`).",
    "- fast_p: share of the tasks that succeed with best speedup > p; the denominator is every task of the group "
    "(against torch.compile: every task whose baseline was measured). fast_0 is the success rate.",
    "- speedup vs eager: the best candidate's reference runtime / runtime, both timed in the same run; vs "
    "torch.compile: its `ref_compile_runtime_ms` / runtime.",
    "- geomean (successful): geometric mean of the best speedup over the tasks that succeed (the headline). "
    "geomean (all): over all tasks, a task without an accepted candidate counting 1.0. speed: the paper's "
    "arithmetic mean over the tasks that succeed.",
    "- compile rate, passed rate, accepted rate: per attempt, pooled over the group (parse failures are attempts): "
    "compiled, passed the checks (flagged ones included), accepted.",
    "- best's flags: what the judge said of the best candidate: `reduced_precision` (its error far above the "
    "reference's own float32 error: TF32 or half-precision arithmetic, an approximation), `faster_than_sol` (its "
    "runtime below the task's speed of light: which floor and by how much is in its row's `findings`), "
    "`large_speedup` (above 10x). A speedup so flagged is not one at the task's precision, or not yet explained.",
    "- first accepted: the seq of a task's first accepted candidate (attempts finished until then), mean / median "
    "over the tasks that succeed.",
]


def _baseline_table(groups: Sequence[Summary], pick: Callable[[Summary], Baseline | None],
                    first: str = "group") -> list[str]:
    fast = " | ".join(f"fast_{_p(p)}" for p in FAST_PS)
    lines = [f"| {first} | tasks | {fast} | geomean (successful) | geomean (all) | speed |",
             "|---|---:|" + "---:|" * len(FAST_PS) + "---:|---:|---:|"]
    for s in groups:
        b = pick(s)
        if b is None:
            continue
        cells = " | ".join(_pct(b.fast_p.get(p)) for p in FAST_PS)
        lines.append(f"| {_cell(s.label)} | {b.tasks} | {cells} | {_x(b.geomean_speedup)} | "
                     f"{_x(b.geomean_speedup_all)} | {_x(b.mean_speedup)} |")
    return lines


def _light_table(groups: Sequence[Summary], first: str = "group") -> list[str]:
    lines = [f"| {first} | tasks with one | memory-bound | reference (median) | best (median) | references near | "
             "best near |", "|---|---:|---:|---:|---:|---:|---:|"]
    for s in groups:
        if s.light is None:
            continue
        g = s.light
        lines.append(f"| {_cell(s.label)} | {g.tasks} | {g.memory_bound} | {_pct(g.ref_median)} | "
                     f"{_pct(g.best_median)} | {g.ref_near} | {g.best_near} |")
    return lines


def _search_table(groups: Sequence[Summary], first: str = "group") -> list[str]:
    lines = [f"| {first} | attempts | compile rate | passed rate | accepted rate | first accepted (mean / median) | "
             "LLM calls | tokens | cost (USD) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in groups:
        lines.append(f"| {_cell(s.label)} | {s.attempts} | {_pct(s.compile_rate)} | {_pct(s.passed_rate)} | "
                     f"{_pct(s.accepted_rate)} | {_num(s.first_accepted_mean)} / {_num(s.first_accepted_median)} | "
                     f"{s.llm_calls} | "
                     f"{s.tokens:,} | {s.cost_usd:.4f} |")
    return lines


def _task_table(tasks: Sequence[dict[str, Any]], several_runs: bool) -> list[str]:
    head = "| run | task |" if several_runs else "| task |"
    lines = [f"{head} level | status | success | best speedup | vs compile | best's flags | attempts | first accepted "
             "| tokens | cost (USD) |", "|---" * (12 if several_runs else 11) + "|"]
    for t in tasks:
        key = f"| {_cell(t['run_id'])} | {_cell(t['task'])} |" if several_runs else f"| {_cell(t['task'])} |"
        lines.append(f"{key} {_num(t.get('level'), '{}')} | {_cell(t.get('status') or '—')} | "
                     f"{'yes' if t.get('success') else 'no'} | {_x(t.get('best_speedup'))}"
                     f"{_err(t.get('best_speedup_err')) if t.get('best_speedup') is not None else ''} | "
                     f"{_x(t.get('best_speedup_vs_compile'))} | {_cell(t.get('best_flags') or '')} | "
                     f"{t.get('attempts', 0)} | "
                     f"{_num(t.get('attempts_to_first_accepted'), '{}')} | {int(t.get('tokens') or 0):,} | "
                     f"{float(t.get('cost_usd') or 0.0):.4f} |")
    return lines


def _attempt_table(rows_: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| seq | node ← parent | agent | result | speedup | flags / error |", "|---:|---|---|---|---:|---|"]
    for n in rows_:
        if n["seq"] == 0:
            continue
        result = "accepted" if n.get("accepted") else (n.get("failure") or "—")
        speed = _x(n.get("speedup")) + (_err(n.get("speedup_err")) if n.get("speedup") is not None else "")
        said = n.get("flags") or (str(n.get("error") or "").splitlines() or [""])[0][:100]
        lines.append(f"| {n['seq']} | {n['node_id']} ← {_num(n.get('parent_id'), '{}')} | {_cell(n.get('agent'))} | "
                     f"{_cell(result)} | {speed} | {_cell(said)} |")
    return lines


def _plots(r: Report, folder: Path, progress: list[dict[str, Any]], several_runs: bool) -> None:
    try:
        from stark_ray.analysis import plots
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency
        r.plot_error = f"matplotlib is not available ({e})"
        return
    series: dict[str, list[tuple[int, float | None]]] = {}
    for row in progress:
        key = f"{row['run_id']}:{row['task']}" if several_runs else str(row["task"])
        series.setdefault(key, []).append((int(row["seq"]), row["best_speedup_so_far"]))
    r.plots = [
        plots.fast_p_plot(r.tasks, folder / "fast_p.png"),
        plots.best_so_far_plot(series, folder / "best_so_far.png"),
        plots.failures_plot(r.failures, folder / "failures.png"),
    ]
    if any(float(t.get("cost_usd") or 0.0) > 0 for t in r.tasks):  # a replayed or scripted run costs nothing
        r.plots.append(plots.cost_plot(r.tasks, folder / "cost_per_task.png"))


def _trees(r: Report, folder: Path, shapes: dict[tuple[str, str], list[dict[str, Any]]], several_runs: bool) -> None:
    if r.plot_error:
        return
    from stark_ray.analysis.tree_picture import nodes_of, tree_picture
    from stark_ray.store.parquet import safe_name

    r.trees_of = len(r.tasks)
    for (run_id, task), rows_ in shapes.items():
        if not rows_:
            continue
        name = f"{run_id}:{task}" if several_runs else task
        r.trees.append(tree_picture(nodes_of(rows_), folder / f"tree_{safe_name(name)}.png", name))


# --- cells ---------------------------------------------------------------------------------------------------
def _p(p: float) -> str:
    return f"{p:g}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _x(x: float | None) -> str:
    if x is None:
        return "—"
    return "inf" if math.isinf(x) else f"{x:.2f}x"


def _err(err: Any) -> str:
    """`` ±3.0%`` (the 95% interval of a relative standard error), nothing where unknown."""
    if err is None or not math.isfinite(float(err)):
        return ""
    return f" {interval(float(err))}"


def _num(x: Any, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
