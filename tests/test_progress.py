"""The live view: what compilers, models and candidates say printed verbatim, never as markup; start-up phases
whose clocks run; what each expansion in flight is doing, with either executor, and nothing once the run is over."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from rich.console import Console
from rich.progress import TimeElapsedColumn
from scripted_replies import SLOW, code_reply, plan_reply
from search_helpers import StandInEvaluator, add, reference_tree

from stark_ray.agents.base import AgentResult
from stark_ray.cli.progress import CampaignReporter, RichReporter, best_of
from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
from stark_ray.eval.tasks import Task, load_task
from stark_ray.llm.base import LLMRequest
from stark_ray.llm.scripted import ScriptedClient
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import STAGE_COMPILE, EvalResult, source_digest
from stark_ray.run.local import optimize
from stark_ray.run.reporter import InFlight, Reporter
from stark_ray.run.summary import summary_of

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_start_up_says_what_it_is_doing_with_a_clock_that_runs() -> None:
    """Ray's start and the reference's timing took 40-100 s in silence, then as fixed time stamps that looked frozen
    for minutes: on a terminal each start-up phase is a line whose clock runs until the next phase begins, all of
    them ended before the bar."""
    buf = io.StringIO()
    reporter = RichReporter(Console(file=buf, width=200, force_terminal=True, color_system=None))
    reporter.phase("starting a private local Ray")
    reporter.phase("starting 1 cpu_cpp evaluator(s), then timing 1 reference(s) [x]")
    view = reporter.phases.view
    assert view is not None and any(isinstance(c, TimeElapsedColumn) for c in view.columns)
    first, second = view.tasks
    assert first.finished and not second.finished  # the first's clock stopped at what it took; the second's runs
    reporter.start(Task(name="t", path=Path("t.py"), source=""), 5, reference_tree())
    assert second.finished and reporter.phases.view is None and not view.live.is_started
    reporter.close()
    text = buf.getvalue()
    assert "starting a private local Ray" in text
    assert "timing 1 reference(s) [x]" in text  # verbatim, never markup


def test_nothing_stays_in_flight_on_screen_after_the_run() -> None:
    """The last status ("from node 3: timing 12 s") stayed on screen after the run had ended."""
    tree = reference_tree()
    buf = io.StringIO()
    reporter = RichReporter(Console(file=buf, width=200, force_terminal=True, color_system=None))
    reporter.start(Task(name="t", path=Path("t.py"), source=""), 5, tree)
    reporter.expansions([InFlight("t", 0, "timing", 12.0)])
    bar = reporter.progress.tasks[0]
    assert "timing 12 s" in bar.fields["doing"]
    reporter.finish(summary_of("t", "r", "/tmp/r", tree, "finished", 5, UsageTotals(), {}, 1.0))
    assert bar.fields["doing"] == "" and not reporter.progress.live.is_started


def test_a_campaigns_table_ends_without_what_was_in_flight() -> None:
    buf = io.StringIO()
    reporter = CampaignReporter(Console(file=buf, width=200, force_terminal=True, color_system=None))
    reporter.phase("starting a private local Ray")
    reporter.start(Task(name="t", path=Path("t.py"), source=""), 5, reference_tree())
    reporter.expansions([InFlight("t", 0, "building (g++) and importing", 40.0)])
    stats = {"tasks": 1, "running": 1, "done": 0, "attempts": 0, "accepted": 0, "best": {}, "tokens": 0,
             "cost": 0.0, "evaluators": 1, "evaluating": 1, "capped": {}}
    reporter.status(stats)
    reporter.close()
    assert reporter.doing == [] and not reporter.live.is_started
    last = buf.getvalue().rsplit("tasks", 1)[-1]  # the table as last drawn
    assert "in flight" not in last and "building" not in last


class Watching(Reporter):
    """A reporter that shows expansions and records every list it was told."""

    shows_expansions = True

    def __init__(self) -> None:
        self.seen: list[list[InFlight]] = []
        self.changed = threading.Condition()

    def expansions(self, doing: list[InFlight]) -> None:
        with self.changed:
            self.seen.append(doing)
            self.changed.notify_all()

    def wait_for(self, word: str) -> None:
        """Until an expansion doing ``word`` was told (a step of the run waits on it: no timing in the test)."""
        with self.changed:
            assert self.changed.wait_for(lambda: any(d.doing == word for seen in self.seen for d in seen), 120), word


class Stepping(StandInEvaluator):
    """An evaluator that says it is timing the candidate, and answers once the live view has shown that."""

    def __init__(self, reporter: Watching) -> None:
        self.reporter, self.doing = reporter, {}

    def activity(self) -> dict[str, tuple[str, float]]:
        return dict(self.doing)

    def evaluate(self, source: str) -> EvalResult:
        self.doing = {source_digest(source): ("timing", 2.0)}
        self.reporter.wait_for("timing")
        self.doing = {}
        return super().evaluate(source)


def test_the_local_executor_shows_what_its_expansion_is_doing(tmp_path: Path) -> None:
    """``--executor local`` showed no in-flight status at all: now the agent call and the evaluator's step, as the
    Ray executor shows them, and nothing once the search is over."""
    reporter = Watching()

    def plan(request: LLMRequest) -> str:
        reporter.wait_for("plan and code agents")  # answered only once the view has shown the agents at work
        return plan_reply(request)

    client = ScriptedClient({"plan": [plan], "code": [code_reply(SLOW)]})
    optimize(load_task(ROOT / "examples/tasks/1_LeakyReluScale.py"), client,
             SearchConfig(budget=1, seed=0, epsilon=0.0, runoff=0), AgentConfig(model="scripted"), EvalConfig(),
             tmp_path, reporter, evaluator_factory=lambda task, cfg: Stepping(reporter))
    told = [d for seen in reporter.seen for d in seen]
    assert {d.doing for d in told} == {"plan and code agents", "timing"}
    assert all(d.task == "1_LeakyReluScale" and d.parent == 0 for d in told)
    assert reporter.seen[-1] == []  # the search is over: nothing in flight


def test_a_view_closed_where_stderr_is_no_terminal_prints_nothing() -> None:
    """A start-up error is one line on a stderr a program reads: closing a view never started printed empty lines
    before it (twice on the Ray path, whose driver and CLI both close it)."""
    buf = io.StringIO()
    reporter = RichReporter(Console(file=buf, width=200, force_terminal=False))
    reporter.phase("starting a private local Ray")
    reporter.close()
    reporter.close()
    assert buf.getvalue() == ""
