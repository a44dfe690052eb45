"""The live view of ``stark optimize``: a progress bar plus one line per attempt."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from stark_ray.agents.base import AgentResult
from stark_ray.eval.measure.noise import interval, is_noisy
from stark_ray.eval.tasks import Task
from stark_ray.llm.usage import UsageTotals
from stark_ray.records import Node
from stark_ray.run.reporter import InFlight, Reporter
from stark_ray.run.summary import RunSummary
from stark_ray.search.runoff import ROUNDS, Runoff
from stark_ray.search.tree import Tree


def describe(node: Node) -> str:
    """One line of rich markup; everything that comes from a compiler, a model or a candidate is escaped."""
    r = node.result
    if node.accepted:
        if not r.speedup:
            return "[green]accepted[/]"
        noisy = known(r.speedup_err) if is_noisy(r.speedup_err) else ""
        return f"[green]accepted[/] {r.runtime_ms:.3f} ms, {r.speedup:.2f}×{noisy}"
    flags = escape(f" [{', '.join(r.flags)}]") if r.flags else ""
    first = (r.error or "").splitlines()[0][:110] if r.error else ""
    return f"[red]{r.stage}[/]{flags}: {escape(first)}"


def known(err: float | None) -> str:
    """`` ±3% (95%)`` after a speedup whose error is known, in yellow with a word when it is noisy."""
    if err is None:
        return ""
    return f" [yellow]{interval(err)} (95%), noisy[/]" if is_noisy(err) else f" {interval(err)} (95%)"


def best_of(tree: Tree) -> str:
    """The best speedup, and how close that candidate comes to the task's speed of light where it is known."""
    best = tree.best()
    if not (best and best.result.speedup):
        return "—"
    light = best.result.sol_fraction
    return f"{best.result.speedup:.2f}×" + (f" (at {light:.0%} of SOL)" if light is not None else "")


def replay_note(n: int) -> str:
    """``, N replay mismatch(es)`` after a run's or the live view's figures (nothing where there were none)."""
    return f", {n} replay mismatch(es)" if n else ""


def mismatches(n: int) -> str:
    return (f"{n} prompt(s) the cassette does not hold, each answered with its role's next recorded reply (the "
            "search took another path than the recording)")


def spend(usage: UsageTotals) -> str:
    """The live view's spend: dollars or calls, and replayed prompts the cassette did not hold."""
    shown = f"${usage.cost_usd:.3f}" if usage.cost_usd else f"{usage.calls} calls"
    return shown + replay_note(usage.replay_mismatches)


def phase_line(console: Console, what: str, since: float) -> None:
    """On a terminal only: a user's mistake found at start-up stays one line where stderr is read by a program."""
    if console.is_terminal:
        console.print(f"[dim]  {time.monotonic() - since:5.1f} s  {escape(what)} …[/]", highlight=False)


class Phases:
    """The start-up's steps on a terminal (starting Ray, the evaluators, timing references): each one line whose
    clock runs while it goes on — a fixed time stamp looked frozen for minutes on a busy host — and stops when the
    next begins; all of them ended when the search begins (:meth:`close`). Nothing where stderr is no terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.view: Progress | None = None
        self.current: TaskID | None = None

    def begin(self, what: str) -> None:
        if not self.console.is_terminal:
            return
        if self.view is None:
            self.view = Progress(SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("[dim]{task.description}"),
                                 TimeElapsedColumn(), console=self.console, transient=False)
            self.view.start()
        self._end_current()
        self.current = self.view.add_task(escape(what), total=1)

    def _end_current(self) -> None:
        if self.view is not None and self.current is not None:
            self.view.update(self.current, completed=1)  # its clock stops at what it took

    def close(self) -> None:
        self._end_current()
        if self.view is not None:
            self.view.stop()
        self.view = self.current = None


class RichReporter(Reporter):
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("best {task.fields[best]}  failures {task.fields[fails]}  {task.fields[cost]}"),
            TimeElapsedColumn(), TextColumn("[dim]{task.fields[doing]}"), console=self.console, transient=False,
        )
        self._bar: TaskID | None = None
        self.since = time.monotonic()
        self.phases = Phases(self.console)
        self.shows_expansions = self.console.is_terminal  # the driver asks the evaluators only for a terminal

    def expansions(self, doing: list[InFlight]) -> None:
        if self._bar is not None:
            shown = "; ".join(d.describe() for d in doing[:3]) + (f"; {len(doing) - 3} more" if len(doing) > 3 else "")
            self.progress.update(self._bar, doing=escape(shown))

    def phase(self, what: str) -> None:
        if self._bar is None:
            self.phases.begin(what)
        else:  # after the search (the runoff): a line above the bar
            phase_line(self.progress.console, what, self.since)

    def start(self, task: Task, budget: int, tree: Tree) -> None:
        self.phases.close()
        ms = tree.root.result.runtime_ms
        resumed = f"; {tree.evaluated} recorded, resumed" if tree.evaluated else ""
        self.console.print(f"[bold]{escape(task.name)}[/]: reference {ms:.3f} ms timed alone (each candidate is timed "
                           f"beside it again); budget {budget} attempts{resumed}")
        self.progress.start()
        self._bar = self.progress.add_task("attempt", total=budget, completed=tree.evaluated, best=best_of(tree),
                                           fails=tree.failures(), cost="", doing="")

    def attempt(self, node: Node, step: AgentResult, tree: Tree, usage: UsageTotals) -> None:
        self.progress.console.print(
            f"  [{tree.evaluated:>3}] node {node.id:<3} ← {node.parent:<3} {node.agent:<9} {describe(node)}")
        self.progress.update(self._bar, completed=tree.evaluated,
                             best=best_of(tree),
                             fails=tree.failures(),
                             cost=spend(usage))

    def close(self) -> None:
        self.phases.close()
        self._stop_bar()

    def _stop_bar(self) -> None:
        """The bar stopped where it runs (rich prints an empty line for a stop of one never started, on no terminal)."""
        if self.progress.live.is_started:
            self.progress.stop()

    def finish(self, summary: RunSummary) -> None:
        self.phases.close()
        if self._bar is not None:  # nothing is in flight any more: the last status does not stay on screen
            self.progress.update(self._bar, doing="")
        self._stop_bar()
        if summary.status != "finished":
            self.console.print(f"[bold yellow]run {summary.status}[/] after {summary.attempts} attempts")
        final = Runoff.from_record(summary.runoff) if summary.runoff else None
        if final is not None:
            self.console.print(escape(final.line()), highlight=False)
        if summary.success:
            how = ("in the same evaluation" if final is None or final.winner is None
                   else f"in each of the runoff's {ROUNDS} rounds (their geometric mean)")
            self.console.print(
                f"[bold green]best[/]: node {summary.best_node}, {summary.best_runtime_ms:.3f} ms vs "
                f"reference {summary.best_ref_runtime_ms:.3f} ms timed beside it {how} = "
                f"[bold]{summary.best_speedup:.2f}×[/]{known(summary.best_speedup_err)}")
        else:
            self.console.print("[bold red]no accepted candidate[/] in this run")
        self.console.print(
            f"{summary.attempts} attempts, {summary.failures} failed, {summary.llm_calls} LLM calls, "
            f"{summary.tokens['input'] + summary.tokens['output']} tokens, ${summary.cost:.4f}; "
            f"results in {escape(summary.run_dir)}", highlight=False)
        if summary.replay_mismatches:
            self.console.print(f"[bold yellow]replay[/]: {mismatches(summary.replay_mismatches)}", highlight=False)


class CampaignReporter(Reporter):
    """The live view of ``stark campaign``: one status block, redrawn a few times a second, and one line per
    finished task."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.started = False
        self.since = time.monotonic()
        self.shows_expansions = self.console.is_terminal
        self.doing: list[InFlight] = []
        self.last: dict[str, Any] | None = None  # the figures last shown
        self.phases = Phases(self.console)

    def expansions(self, doing: list[InFlight]) -> None:
        self.doing = doing

    def phase(self, what: str) -> None:
        if not self.started:  # the start-up's phases come before the live table
            self.phases.begin(what)

    def start(self, task: Task, budget: int, tree: Tree) -> None:
        if not self.started:
            self.phases.close()
            self.live.start()
            self.started = True

    def status(self, stats: dict[str, Any]) -> None:
        from rich.table import Table

        self.last = stats
        table = Table.grid(padding=(0, 2))
        queued = stats["tasks"] - stats["running"] - stats["done"]
        rate = stats["accepted"] / stats["attempts"] if stats["attempts"] else 0.0
        table.add_row("tasks", f"{stats['done']} done, {stats['running']} running, {max(queued, 0)} queued "
                               f"of {stats['tasks']}")
        table.add_row("attempts", f"{stats['attempts']} ({100 * rate:.0f}% accepted)")
        best = sorted(((s, n) for n, s in stats["best"].items() if s), reverse=True)[:5]
        table.add_row("best", ", ".join(f"{escape(n)} {s:.2f}×" for s, n in best) or "—")
        table.add_row("spent", f"{stats['tokens']} tokens, ${stats['cost']:.4f}")
        waiting = f", {stats['waiting']} waiting" if stats.get("waiting") else ""
        table.add_row("evaluators", f"{stats.get('busy', '?')} of {stats['evaluators']} busy: "
                                    f"{stats['evaluating']} candidates in evaluation{waiting}")
        if self.doing:
            longest = sorted(self.doing, key=lambda d: -d.seconds)[:4]  # the ones that take longest: worth a look
            more = f"\n{len(self.doing) - len(longest)} more" if len(self.doing) > len(longest) else ""
            table.add_row("in flight", escape("\n".join(d.describe(with_task=True) for d in longest) + more))
        if stats["capped"]:
            table.add_row("capped", escape("; ".join(sorted(set(stats["capped"].values())))))
        self.live.update(table)

    def finish(self, summary: RunSummary) -> None:
        speedup = f"{summary.best_speedup:.2f}×" if summary.best_speedup else "no accepted candidate"
        self.live.console.print(f"[bold]{escape(summary.task)}[/]: {summary.status}, {summary.attempts} attempts, "
                                f"best {speedup}, ${summary.cost:.4f}{replay_note(summary.replay_mismatches)}")

    def close(self) -> None:
        self.phases.close()
        if self.started:
            self.doing = []  # nothing is in flight any more: the last status does not stay on screen
            if self.last is not None:
                self.status(self.last)
            self.live.stop()
            self.started = False
