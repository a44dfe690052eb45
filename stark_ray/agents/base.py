"""What every agent takes and returns. Agents are stateless: prompt in, parsed result out."""

from __future__ import annotations

from dataclasses import dataclass, field

from stark_ray.records import LLMUsage


@dataclass(frozen=True)
class TaskInfo:
    """What the prompts need to know about the task being optimized."""

    name: str
    reference_source: str  # the task file: class Model, get_inputs, get_init_inputs
    backend: str  # a backend's name (stark_ray/eval/backends)
    hardware: str = ""  # a few lines describing the target device (filled by the evaluator)
    light: str = ""  # the task's speed of light there, its math modes, the tolerance (prompts/terms.py)
    device: str = ""  # where candidates run, "cuda" or "cpu" (the evaluator's word; "": the backend's usual device)


@dataclass
class AgentResult:
    """The outcome of one agent step. ``source`` is None when the step produced no usable candidate."""

    source: str | None
    instruction: str = ""  # recorded on the new node: the plan's instructions, or the debug intent
    scaffold: str | None = None  # the plan agent's anchored scaffold
    error: str | None = None  # one line, e.g. "plan: instruction names anchor 4, which the scaffold lacks"
    usage: list[LLMUsage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.source is not None and self.error is None
