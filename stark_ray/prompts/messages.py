"""The (system, user) texts of each agent role, built from the templates, the task and a rendered window.

The selected node's code is always shown in full in the user message (the plan agent must reproduce it,
the debug agent must fix it), and the reference in the task section; the window therefore shows pointers
instead of their code, and ``window_chars`` bounds the rest.
"""

from __future__ import annotations

from stark_ray.agents.base import TaskInfo
from stark_ray.prompts.loader import fill, system_prompt
from stark_ray.prompts.render import fenced, render_window
from stark_ray.records import Node, excerpt

DEBUG_LOG_CHARS = 4000


def task_section(task: TaskInfo) -> str:
    return fill("task", name=task.name, reference=fenced(task.reference_source, "python"),
                hardware=task.hardware.strip() or "(not described)").strip()


def _is_reference(task: TaskInfo, node: Node) -> bool:
    return node.source.strip() == task.reference_source.strip()


def window_section(task: TaskInfo, node: Node, window: list[Node], window_chars: int) -> str:
    elsewhere = {node.id} | {n.id for n in window if n.is_root and _is_reference(task, n)}
    return render_window(window, node, window_chars, code_elsewhere=elsewhere)


def node_code(task: TaskInfo, node: Node) -> str:
    if _is_reference(task, node):
        return "(the reference implementation, shown above under 'Task', exactly)"
    return fenced(node.source, "python")


def format_instructions(instructions: dict[int, str]) -> str:
    return "\n".join(f"INSTRUCTION {k}: {instructions[k].strip()}" for k in sorted(instructions))


def plan_messages(task: TaskInfo, node: Node, window: list[Node], window_chars: int) -> tuple[str, str]:
    user = fill("user_plan", task=task_section(task), window=window_section(task, node, window, window_chars),
                node_id=str(node.id), code=node_code(task, node))
    return system_prompt("plan", task.backend), user


def plan_retry_message(error: str, node: Node) -> str:
    return fill("plan_retry", error=error, node_id=str(node.id))


def code_messages(task: TaskInfo, node: Node, scaffold: str, instructions: dict[int, str], window: list[Node],
                  window_chars: int) -> tuple[str, str]:
    user = fill("user_code", task=task_section(task), window=window_section(task, node, window, window_chars),
                node_id=str(node.id), scaffold=fenced(scaffold, "python"),
                instructions=format_instructions(instructions))
    return system_prompt("code", task.backend), user


def debug_messages(task: TaskInfo, node: Node, window: list[Node], window_chars: int) -> tuple[str, str]:
    r = node.result
    log = excerpt(r.log, DEBUG_LOG_CHARS).strip()
    user = fill("user_debug", task=task_section(task),
                window=window_section(task, node, window, window_chars), node_id=str(node.id), stage=r.stage,
                intent=node.instruction.strip() or "(not recorded)",
                error=(r.error or "(no error message)").strip(),
                log=fenced(log, "text") if log else "(empty)", code=fenced(node.source, "python"))
    return system_prompt("debug", task.backend), user


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


def single_messages(task: TaskInfo, node: Node, window: list[Node], window_chars: int) -> tuple[str, str]:
    user = fill("user_single", task=task_section(task),
                window=window_section(task, node, window, window_chars), node_id=str(node.id),
                job=single_job(node), code=node_code(task, node))
    return system_prompt("single", task.backend), user
