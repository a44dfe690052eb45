"""The live view prints what compilers, models and candidates say verbatim, never as markup."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from search_helpers import add, reference_tree

from stark_ray.agents.base import AgentResult
from stark_ray.eval.tasks import Task
from stark_ray.llm.usage import UsageTotals
from stark_ray.progress import RichReporter
from stark_ray.records import STAGE_COMPILE, EvalResult


def test_error_text_with_brackets_is_printed_verbatim() -> None:
    tree = reference_tree()
    nasty = "main.cpp:3: error: no match [with T = float] [/x] [bold]"
    result = EvalResult.failed(STAGE_COMPILE, nasty)
    result.flags = ["zero_output"]
    node = tree[add(tree, 0, result)]
    buf = io.StringIO()
    reporter = RichReporter(Console(file=buf, width=200, force_terminal=False))
    reporter.start(Task(name="t[/x]", path=Path("t.py"), source=""), 5, tree.root)
    reporter.attempt(node, AgentResult(source=None), tree, UsageTotals())  # must not raise MarkupError
    text = buf.getvalue()
    reporter.progress.stop()
    assert "[with T = float] [/x] [bold]" in text and "[zero_output]" in text and "t[/x]" in text
