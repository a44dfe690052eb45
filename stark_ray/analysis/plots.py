"""PNG plots of an analysis, drawn on matplotlib Figures with the Agg canvas: no pyplot, no display, no global
backend switch. Each function takes plain data and a path, writes the PNG and returns the path."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stark_ray.analysis.metrics import COMPILE, EAGER, fast_p_curve, group_by, level_label, speedup

DPI = 110


def _figure(width: float = 7.0, height: float = 4.2) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def fast_p_plot(tasks: Sequence[Mapping[str, Any]], path: Path, points: int = 241) -> Path:
    """fast_p against p, against eager (and torch.compile when measured); one dashed curve per level when the
    tasks span several."""
    speeds = [s for t in tasks for b in (EAGER, COMPILE) if (s := speedup(t, b)) is not None and math.isfinite(s)]
    p_max = max(2.5, min(10.0, 1.1 * max(speeds, default=0.0)))
    ps = [p_max * i / (points - 1) for i in range(points)]
    fig = _figure()
    ax = fig.add_subplot()

    def curve(rows: Sequence[Mapping[str, Any]], against: str, **style: Any) -> None:
        ys = fast_p_curve(rows, ps, against)
        if any(y is not None for y in ys):
            ax.step(ps, [100 * y if y is not None else math.nan for y in ys], where="post", **style)

    curve(tasks, EAGER, label=f"all tasks vs eager (n={len(tasks)})", color="C0", linewidth=2)
    compiled = [t for t in tasks if t.get("ref_compile_runtime_ms") is not None]
    if compiled:
        curve(compiled, COMPILE, label=f"vs torch.compile (n={len(compiled)})", color="C3", linewidth=2)
    levels = group_by(tasks, lambda t: t.get("level"))
    if len(levels) > 1:
        for i, (level, rows) in enumerate(levels.items()):
            curve(rows, EAGER, label=f"{level_label(level)} vs eager (n={len(rows)})", color=f"C{i + 4}",
                  linestyle="--", linewidth=1)
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlim(0, p_max)
    ax.set_ylim(-2, 102)
    ax.set_xlabel("p (speedup threshold)")
    ax.set_ylabel("fast_p (% of tasks with an accepted candidate, speedup > p)")
    ax.set_title("fast_p")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def best_so_far_plot(series: Mapping[str, Sequence[tuple[int, float | None]]], path: Path) -> Path:
    """Per task, the best speedup of an accepted candidate so far against the attempt number (thin lines, from the
    first accepted one), and the median over the tasks (bold): a task without an accepted candidate yet counts 0,
    a task that stopped earlier keeps its last value."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure()
    ax = fig.add_subplot()
    horizon = max((seq for points in series.values() for seq, _ in points), default=0)
    finals: list[list[float]] = []
    for points in series.values():
        xs = [seq for seq, _ in points]
        ys = [math.nan if v is None else v for _, v in points]
        if any(not math.isnan(y) for y in ys):
            ax.plot(xs, ys, drawstyle="steps-post", linewidth=0.7, alpha=0.45, color="C0", marker=".",
                    markersize=3)
        filled, last, it = [], 0.0, dict(points)
        for k in range(1, horizon + 1):
            v = it.get(k)
            if v is not None:
                last = v
            filled.append(last)
        finals.append(filled)
    if finals and horizon:
        median = [statistics.median(col) for col in zip(*finals, strict=True)]
        ax.step(range(1, horizon + 1), median, where="post", linewidth=2.4, color="C1",
                label=f"median over {len(finals)} tasks (none accepted yet = 0)")
        ax.legend(fontsize=8)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("attempt (seq)")
    ax.set_ylabel("best speedup so far (vs eager)")
    ax.set_title("Best speedup so far")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def failures_plot(counts: Mapping[str, int], path: Path) -> Path:
    """Failed attempts by reason (the stage where evaluation stopped, or the flag that rejected them)."""
    from matplotlib.ticker import MaxNLocator

    items = sorted(counts.items(), key=lambda kv: kv[1])
    fig = _figure(7.0, max(2.2, 0.45 * len(items) + 1.2))
    ax = fig.add_subplot()
    if items:
        ax.barh([k for k, _ in items], [v for _, v in items], color="C3")
        for i, (_, v) in enumerate(items):
            ax.text(v, i, f" {v}", va="center", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no failed attempts", ha="center", va="center", transform=ax.transAxes)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("attempts")
    ax.set_title("Failure reasons")
    return _save(fig, path)


def cost_plot(tasks: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """LLM cost per task (USD), highest first; green when the task succeeded."""
    rows = sorted(tasks, key=lambda t: -float(t.get("cost_usd") or 0.0))
    labelled = len(rows) <= 40
    fig = _figure(max(7.0, 0.3 * len(rows) + 2) if labelled else 9.0, 4.5)
    ax = fig.add_subplot()
    xs = range(len(rows))
    ax.bar(xs, [float(t.get("cost_usd") or 0.0) for t in rows],
           color=["C2" if t.get("success") else "C7" for t in rows])
    if labelled:
        names = [str(t.get("task")) if len({t.get("run_id") for t in rows}) == 1
                 else f"{t.get('run_id')}:{t.get('task')}" for t in rows]
        ax.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=7)
    else:
        ax.set_xticks([])
        ax.set_xlabel(f"{len(rows)} tasks, highest cost first")
    ax.set_ylabel("cost (USD)")
    ax.set_title(f"Cost per task (total ${sum(float(t.get('cost_usd') or 0.0) for t in rows):.2f}; "
                 "green: succeeded)")
    return _save(fig, path)
