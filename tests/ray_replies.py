"""Scripted model content for the Ray runtime tests: stateless (a reply depends on the request alone), so that
agent calls in any worker process agree. Candidates are the plain-torch ones of scripted_replies."""

from __future__ import annotations

import hashlib
import os
import re
from functools import partial
from pathlib import Path
from typing import Any

from scripted_replies import SLOW, SLOWER, WRONG, code_reply, last_user, plan_reply

from stark_ray.llm.base import LLMRequest
from stark_ray.llm.replay import prompt_shape
from stark_ray.llm.scripted import ScriptedClient

# imported by the evaluator's worker, whose parent is the judge, whose parent is the Evaluator actor's process: it
# kills that process (the judge's parent, read from /proc)
KILLER = ("import os\nimport signal\n\nimport torch\nimport torch.nn as nn\n\n"
          "_stat = open(f'/proc/{os.getppid()}/stat').read()\n"
          "os.kill(int(_stat[_stat.rfind(')') + 2:].split()[1]), signal.SIGKILL)\n\n\nclass ModelNew(nn.Module):\n"
          "    def __init__(self, negative_slope: float, scale: float):\n        super().__init__()\n\n"
          "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return x\n")


# imported by the worker: writes the Evaluator actor's pid (the judge's parent) where the test waits for it, then
# holds the worker for a minute: the test kills that actor from outside while this candidate is being evaluated
HELD = ("import os\nimport time\n\nimport torch\nimport torch.nn as nn\n\n"
        "_stat = open(f'/proc/{os.getppid()}/stat').read()\n"
        "_tmp = MARKER + '.tmp'\nopen(_tmp, 'w').write(_stat[_stat.rfind(')') + 2:].split()[1])\n"
        "os.replace(_tmp, MARKER)\ntime.sleep(60)\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, negative_slope: float, scale: float):\n        super().__init__()\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return x\n")


def _pick(request: LLMRequest, choices: tuple[str, ...]) -> str:
    """By the prompt's shape, as replay matches it (numbers masked: measured runtimes, spreads and speedups differ
    from run to run, in value and in form)."""
    digest = hashlib.sha256(prompt_shape(last_user(request)).encode()).digest()
    return choices[digest[0] % len(choices)]


def _first(marker: str) -> bool:
    """True for the first caller over all processes (the marker file is made once)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def reply(request: LLMRequest, killer_marker: str | None = None, held_marker: str | None = None) -> str:
    if request.role == "plan":
        return plan_reply(request)
    if killer_marker is not None and _first(killer_marker):  # the first code reply only
        return code_reply(KILLER)(request)
    if held_marker is not None and _first(held_marker + ".asked"):
        return code_reply(f"MARKER = {held_marker!r}\n" + HELD)(request)
    return code_reply(_pick(request, (SLOW, SLOWER, WRONG)))(request)


def client(killer_marker: str | None = None, held_marker: str | None = None) -> ScriptedClient:
    return ScriptedClient({}, default=partial(reply, killer_marker=killer_marker, held_marker=held_marker))


def killer_client_factory(marker: Path) -> partial[ScriptedClient]:
    return partial(client, str(marker))


def held_client_factory(marker: Path) -> partial[ScriptedClient]:
    """The first code reply is HELD (it writes the evaluator actor's pid to ``marker``), the rest as usual."""
    return partial(client, None, str(marker))


def echo_reply(request: LLMRequest) -> str:
    """Any task: the plan anchors the code shown; the code agent returns the reference itself as ModelNew
    (correct by construction, about as fast)."""
    if request.role == "plan":
        return plan_reply(request)
    blocks = re.findall(r"(`{3,})python\n(.*?)\n\1", "\n".join(m.content for m in request.messages), re.S)
    source = next(b for _, b in blocks if "class Model(" in b or "class ModelNew(" in b)
    source = re.sub(r"^\s*# <<<IMPROVE (BEGIN|END) \d+>>>\n", "", source + "\n", flags=re.M)
    source = source.replace("class Model(", "class ModelNew(").replace("super(Model, self)", "super(ModelNew, self)")
    return f"Here it is.\n\n```python\n{source}```\n"


def echo_client() -> ScriptedClient:
    return ScriptedClient({}, default=echo_reply)


def paced_evaluator_cls(speedup: float | None = None, hold: str | None = None, hold_after: int = 0) -> Any:
    """The orchestration benchmark's instant evaluator (results from a hash of the source: the same in every run),
    a quarter second per candidate; with ``speedup``, every candidate is correct at that speedup. With ``hold`` (a
    path), every evaluation after the first ``hold_after`` waits while that file exists: a test kills the run
    there, at a known attempt, whatever the machine's load."""
    import time
    from dataclasses import replace
    from pathlib import Path

    import orchestration
    import ray

    @ray.remote
    class PacedEvaluator(orchestration._Instant):  # type: ignore[misc]
        evaluated = 0

        def evaluate(self, task: Any, source: str) -> Any:
            self.evaluated += 1
            time.sleep(0.25)
            while hold is not None and self.evaluated > hold_after and Path(hold).exists():
                time.sleep(0.1)
            if speedup is None:
                return orchestration.instant_result(source)
            ref = orchestration.reference_result()
            return replace(ref, runtime_ms=ref.runtime_ms / speedup, speedup=speedup)

    return PacedEvaluator


# correct and slow to check (each call sleeps 0.6 s): the live view's test sees its evaluation's steps
SLEEPY = SLOW.replace("time.sleep(0.03)", "time.sleep(0.6)")


def sleepy_reply(request: LLMRequest) -> str:
    return plan_reply(request) if request.role == "plan" else code_reply(SLEEPY)(request)


def sleepy_client() -> ScriptedClient:
    return ScriptedClient({}, default=sleepy_reply)
