"""The live view prints what compilers, models and candidates say verbatim, never as markup."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from search_helpers import add, reference_tree

from stark_ray.agents.base import AgentResult
from stark_ray.cli.progress import RichReporter, best_of
from stark_ray.eval.tasks import Task
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import STAGE_COMPILE, EvalResult


def test_error_text_with_brackets_is_printed_verbatim() -> None:
    tree = reference_tree()
    nasty = "main.cpp:3: error: no match [with T = float] [/x] [bold]"
    result = EvalResult.failed(STAGE_COMPILE, nasty)
    result.flags = ["zero_output"]
    node = tree[add(tree, 0, result)]
    buf = io.StringIO()
    reporter = RichReporter(Console(file=buf, width=200, force_terminal=False))
    reporter.start(Task(name="t[/x]", path=Path("t.py"), source=""), 5, tree)
    reporter.attempt(node, AgentResult(source=None), tree, UsageTotals())  # must not raise MarkupError
    text = buf.getvalue()
    reporter.progress.stop()
    assert "[with T = float] [/x] [bold]" in text and "[zero_output]" in text and "t[/x]" in text


def test_a_resumed_runs_bar_starts_where_its_attempts_are() -> None:
    """It started at 0/5, best —, although attempts and a best were recorded."""
    tree = reference_tree()
    node = tree[add(tree, 0, EvalResult(compiled=True, passed_checks=True, runtime_ms=1.0, ref_runtime_ms=2.5,
                                        speedup=2.5, stage="ok"))]
    assert node.accepted and tree.evaluated == 1
    buf = io.StringIO()
    reporter = RichReporter(Console(file=buf, width=200, force_terminal=False))
    reporter.start(Task(name="t", path=Path("t.py"), source=""), 5, tree)
    bar = reporter.progress.tasks[0]
    reporter.progress.stop()
    assert bar.completed == 1 and bar.fields["best"] == "2.50×"
    assert "1 recorded, resumed" in buf.getvalue()
    lit = tree[add(tree, 0, EvalResult(compiled=True, passed_checks=True, runtime_ms=0.5, ref_runtime_ms=2.5,
                                       speedup=5.0, stage="ok", sol_ms=0.4, sol_bound="memory", sol_fraction=0.8))]
    assert lit.accepted and best_of(tree) == "5.00× (at 80% of SOL)"  # how close the best comes, where known


def test_the_start_up_says_what_it_is_doing() -> None:
    """Ray's start and the reference's timing took 40-100 s in silence: on a terminal each start-up phase is a
    line, with the seconds since the view began, before the bar."""
    buf = io.StringIO()
    reporter = RichReporter(Console(file=buf, width=200, force_terminal=True, color_system=None))
    reporter.phase("starting a private local Ray")
    reporter.phase("starting 1 cpu_cpp evaluator(s), then timing 1 reference(s) [x]")
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith(" s  starting a private local Ray …")
    assert "timing 1 reference(s) [x] …" in lines[1]  # verbatim, never markup
    quiet = io.StringIO()  # where a program reads stderr, an error found at start-up stays its only line
    RichReporter(Console(file=quiet, width=200, force_terminal=False)).phase("starting a private local Ray")
    assert quiet.getvalue() == ""
