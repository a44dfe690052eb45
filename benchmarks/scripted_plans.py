"""Scripted plan-agent content for the benchmarks: a valid anchored plan for whatever code the prompt shows,
computed from the prompt alone (so every Ray worker process gives the same reply to the same request)."""

from __future__ import annotations

import hashlib
import re

from stark_ray.llm.base import LLMRequest

FENCE = re.compile(r"(`{3,})python\n(.*?)\n\1", re.S)
JOB = "# Your job"  # the heading of the plan prompt's last section, which shows the selected node's code


def user_text(request: LLMRequest) -> str:
    return next(m.content for m in reversed(request.messages) if m.role == "user")


def prompt_tag(request: LLMRequest, n: int = 16) -> str:
    """A short hex digest of the request's last user message (distinct prompts give distinct tags)."""
    return hashlib.sha256(user_text(request).encode()).hexdigest()[:n]


def selected_code(prompt: str) -> str:
    """The code the plan agent must reproduce: the block under 'Your job', or (for the reference, shown there as
    a pointer) the task section's block."""
    head, _, job = prompt.partition(JOB)
    found = FENCE.search(job) or FENCE.search(head)
    if found is None:
        raise ValueError("the plan prompt shows no python code block")
    return found.group(2)


def anchored(code: str) -> str:
    """``code`` with one anchor span around its last non-blank line (indented like it)."""
    lines = code.split("\n")
    last = max(i for i, line in enumerate(lines) if line.strip())
    indent = lines[last][: len(lines[last]) - len(lines[last].lstrip())]
    lines[last:last + 1] = [f"{indent}# <<<IMPROVE BEGIN 1>>>", lines[last], f"{indent}# <<<IMPROVE END 1>>>"]
    return "\n".join(lines)


def plan_reply(request: LLMRequest) -> str:
    return ("The forward is one elementwise chain.\n\n```python\n" + anchored(selected_code(user_text(request))) +
            "\n```\n\nINSTRUCTION 1: Fuse the chain into a single pass over the input.\n")


def reference_as_candidate(request: LLMRequest) -> str:
    """The task's reference, renamed ``ModelNew`` (correct by construction, about as fast as the reference, and
    flagged ``no_kernel``): the first code block of the prompt that defines ``class Model``."""
    text = "\n".join(m.content for m in request.messages)
    source = next(b for _, b in FENCE.findall(text) if "class Model(" in b)
    source = re.sub(r"^\s*# <<<IMPROVE (BEGIN|END) \d+>>>\n", "", source + "\n", flags=re.M)
    return source.replace("class Model(", "class ModelNew(").replace("super(Model, self)", "super(ModelNew, self)")


def task_name(request: LLMRequest) -> str | None:
    """The task the prompt is about (its '# Task: NAME' heading)."""
    for m in request.messages:
        found = re.search(r"^# Task: (\S+)", m.content, re.M)
        if found:
            return found.group(1)
    return None
