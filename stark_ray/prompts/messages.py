"""The (system, user) texts of each agent role, built from the templates, the task and a rendered window.

The selected node's code is always shown in full in the user message (the plan agent must reproduce it,
the debug agent must fix it), and the reference in the task section; the window therefore shows pointers
instead of their code.

Two caps bound a prompt. The window is rendered where the tree is (:func:`window_section`, by the team's
``request``) under ``window_chars`` and under what the rest of the prompt leaves of ``prompt_chars``
(:func:`window_room`), so an agent call carries the window's text, never the nodes behind it. The whole user
message then stays under ``prompt_chars``: :func:`capped` cuts a window that the code agent's scaffold (not known
when the window was rendered) pushed over, and refuses (:class:`PromptTooLarge`) a prompt whose fixed parts alone
— the reference, the selected code, the scaffold — exceed the cap: no call is made, the attempt fails with that
line.
"""

from __future__ import annotations

from collections.abc import Callable

from stark_ray.agents.base import TaskInfo
from stark_ray.prompts.loader import fill, system_prompt
from stark_ray.prompts.render import fenced, render_window
from stark_ray.records import Node, excerpt

DEBUG_LOG_CHARS = 4000


def task_section(task: TaskInfo, reference: str | None = None) -> str:
    """The task: its name, the reference (``reference``: a pointer to where the prompt shows it instead), the
    hardware and the task's speed of light, math modes and tolerance on it."""
    hardware = task.hardware.strip() or "(not described)"
    return fill("task", name=task.name, reference=reference or fenced(task.reference_source, "python"),
                hardware=f"{hardware}\n{task.light}" if task.light else hardware).strip()


ANALYSIS_CHARS = 3000  # of the plan agent's analysis, passed on to the code agent
REFERENCE_AS_SCAFFOLD = "(the scaffold below is this reference with anchors added; it is not repeated here)"


def analysis_section(node: Node, analysis: str) -> str:
    """The plan agent's analysis for the code agent, or a line saying it gave none."""
    text = analysis.strip()
    if not text:
        return "# The plan agent's analysis\n(none given)"
    if len(text) > ANALYSIS_CHARS:
        text = text[: ANALYSIS_CHARS - 40].rstrip() + " ...[the rest of the analysis cut]"
    return f"# The plan agent's analysis\nWhat limits candidate {node.id} now, as the plan agent read it:\n{text}"


def _system(role: str, task: TaskInfo) -> str:
    return system_prompt(role, task.backend, task.device)


def _is_reference(task: TaskInfo, node: Node) -> bool:
    return node.source.strip() == task.reference_source.strip()


def window_section(task: TaskInfo, node: Node, window: list[Node], limit: int) -> str:
    """The window's text, at most ``limit`` characters (see :mod:`stark_ray.prompts.render`)."""
    elsewhere = {node.id} | {n.id for n in window if n.is_root and _is_reference(task, n)}
    return render_window(window, node, limit, code_elsewhere=elsewhere)


class PromptTooLarge(ValueError):
    """The parts of a prompt that cannot be cut (reference, selected code, scaffold) exceed ``prompt_chars``."""


SCAFFOLD_RESERVE = 4000  # characters the code agent's scaffold and instructions add to the selected code's size,
# kept free when its window is rendered (before the plan exists); :func:`capped` settles the rest


GOAL_FLOOR = 4000  # the least a window is given for the sake of ``prompt_goal`` (where ``prompt_chars`` allows)


def window_room(role: str, task: TaskInfo, node: Node, window_chars: int, prompt_chars: int,
                prompt_goal: int = 0) -> int:
    """The characters a ``role`` window may take: ``window_chars``, or less where the prompt's other parts leave
    less of ``prompt_chars`` (none left: 0); with ``prompt_goal``, less where the whole prompt would grow past it
    (but never under GOAL_FLOOR for it: the goal is met by what can be cut, the window, and no further)."""
    if role == "code":
        fixed = len(_code_user(task, node, fenced(node.source, "python"), "", "", "")) + SCAFFOLD_RESERVE \
            + ANALYSIS_CHARS
    else:
        fixed = len(USERS[role](task, node, ""))
    room = min(window_chars, prompt_chars - fixed)
    if prompt_goal:
        room = min(room, max(GOAL_FLOOR, prompt_goal - fixed))
    return max(0, room)


def capped(build: Callable[[str], str], window: str, prompt_chars: int) -> str:
    """The user message ``build(window)`` under ``prompt_chars``: the window cut at a node's boundary where that
    suffices, else PromptTooLarge."""
    user = build(window)
    if len(user) <= prompt_chars:
        return user
    fixed = len(build(""))
    if fixed > prompt_chars:
        raise PromptTooLarge(f"prompt: {len(user):,} characters, over the cap of {prompt_chars:,} (prompt_chars); "
                             f"the reference, the selected code and the rest that cannot be cut take {fixed:,}")
    return build(cut_window(window, len(window) - (len(user) - prompt_chars)))


def cut_window(window: str, limit: int) -> str:
    """The first nodes of a rendered window that fit in ``limit`` characters, and a line saying so."""
    marker = "\n\n(more related attempts omitted to fit the prompt)"
    if len(window) <= limit:
        return window
    if limit <= len(marker):
        return ""
    head = window[: limit - len(marker)]
    cut = head.rfind("\n\n## Node ")
    return (head[:cut] if cut > 0 else "") + marker


def node_code(task: TaskInfo, node: Node) -> str:
    if _is_reference(task, node):
        return "(the reference implementation, shown above under 'Task', exactly)"
    return fenced(node.source, "python")


def format_instructions(instructions: dict[int, str]) -> str:
    return "\n".join(f"INSTRUCTION {k}: {instructions[k].strip()}" for k in sorted(instructions))


def _plan_user(task: TaskInfo, node: Node, window: str) -> str:
    return fill("user_plan", task=task_section(task), window=window, node_id=str(node.id), code=node_code(task, node))


def plan_messages(task: TaskInfo, node: Node, window: str, prompt_chars: int) -> tuple[str, str]:
    return _system("plan", task), capped(lambda w: _plan_user(task, node, w), window, prompt_chars)


def plan_retry_message(error: str, node: Node) -> str:
    return fill("plan_retry", error=error, node_id=str(node.id))


def _code_user(task: TaskInfo, node: Node, scaffold: str, instructions: str, window: str, analysis: str) -> str:
    # the scaffold of the reference is the reference: shown once
    section = task_section(task, REFERENCE_AS_SCAFFOLD if _is_reference(task, node) else None)
    return fill("user_code", task=section, window=window, node_id=str(node.id), scaffold=scaffold,
                instructions=instructions, analysis=analysis_section(node, analysis))


def code_messages(task: TaskInfo, node: Node, scaffold: str, instructions: dict[int, str], window: str,
                  prompt_chars: int, analysis: str = "") -> tuple[str, str]:
    scaffold_text, instructions_text = fenced(scaffold, "python"), format_instructions(instructions)
    user = capped(lambda w: _code_user(task, node, scaffold_text, instructions_text, w, analysis), window,
                  prompt_chars)
    return _system("code", task), user


def _debug_user(task: TaskInfo, node: Node, window: str) -> str:
    r = node.result
    log = excerpt(r.log, DEBUG_LOG_CHARS).strip()
    return fill("user_debug", task=task_section(task), window=window, node_id=str(node.id), stage=r.stage,
                intent=node.instruction.strip() or "(not recorded)", error=(r.error or "(no error message)").strip(),
                log=fenced(log, "text") if log else "(empty)", code=fenced(node.source, "python"))


def debug_messages(task: TaskInfo, node: Node, window: str, prompt_chars: int) -> tuple[str, str]:
    return _system("debug", task), capped(lambda w: _debug_user(task, node, w), window, prompt_chars)


def single_job(node: Node) -> str:
    r = node.result
    if node.is_root or r.accepted:
        return f"Make candidate {node.id} faster with one coherent optimization."
    log = excerpt(r.log, DEBUG_LOG_CHARS).strip()
    parts = [f"Candidate {node.id} failed at stage {r.stage!r}: {(r.error or 'no error message').strip()}",
             f"Its intent: {node.instruction.strip() or '(not recorded)'}"]
    if log:
        parts.append(f"Log excerpt:\n{fenced(log, 'text')}")
    parts.append("Fix it.")
    return "\n".join(parts)


def _single_user(task: TaskInfo, node: Node, window: str) -> str:
    return fill("user_single", task=task_section(task), window=window, node_id=str(node.id), job=single_job(node),
                code=node_code(task, node))


def single_messages(task: TaskInfo, node: Node, window: str, prompt_chars: int) -> tuple[str, str]:
    return _system("single", task), capped(lambda w: _single_user(task, node, w), window, prompt_chars)


USERS: dict[str, Callable[[TaskInfo, Node, str], str]] = {"plan": _plan_user, "debug": _debug_user,
                                                          "single": _single_user}
