"""Scripted model *content* for search tests: plausible replies built from what the prompt shows.

Everything downstream of the reply text (parsing, anchor validation, evaluation in a worker process) is real.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from stark_ray.llm.base import LLMRequest

REFERENCE_MARK = "(the reference implementation, shown above under 'Task', exactly)"

# Candidates for examples/tasks/1_LeakyReluScale.py, in plain torch so that no C++ build slows the tests.
# The sleeps make the ranking of correct candidates independent of timing noise: the reference (a few ms)
# is fastest, then SLOW, then SLOWER.
_HEADER = "import time\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
_INIT = ("class ModelNew(nn.Module):\n    def __init__(self, negative_slope: float, scale: float):\n"
         "        super().__init__()\n        self.negative_slope = negative_slope\n        self.scale = scale\n\n"
         "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n")
SLOW = _HEADER + _INIT + ("        time.sleep(0.03)\n"
                          "        return torch.where(x > 0, x, x * self.negative_slope) * self.scale\n")
SLOWER = _HEADER + _INIT + ("        time.sleep(0.08)\n"
                            "        return F.leaky_relu(x, self.negative_slope) * self.scale\n")
WRONG = _HEADER + _INIT + "        return torch.relu(x) * self.scale\n"
BROKEN = _HEADER + _INIT + "        return x @ x[:3]\n"


def last_user(request: LLMRequest) -> str:
    return [m.content for m in request.messages if m.role == "user"][-1]


def shown_code(request: LLMRequest) -> str:
    """The code of the selected node as the plan prompt shows it."""
    text = request.messages[0].content
    blocks = re.findall(r"(`{3,})python\n(.*?)\n\1", text, re.S)
    if REFERENCE_MARK in text:
        return blocks[0][1]  # the task section comes first
    return blocks[-1][1]


def plan_reply(request: LLMRequest) -> str:
    code = shown_code(request)
    return ("The forward is a chain of elementwise ops; fuse them.\n\n```python\n" + code +
            "\n# <<<IMPROVE BEGIN 1>>>\n# <<<IMPROVE END 1>>>\n```\n\n"
            "INSTRUCTION 1: Fuse the elementwise chain into one kernel.\n")


def code_reply(source: str) -> Callable[[LLMRequest], str]:
    return lambda request: f"Here is the implementation.\n\n```python\n{source}```\n"


def single_reply(source: str) -> Callable[[LLMRequest], str]:
    return lambda request: f"PLAN: fuse the chain.\n\n```python\n{source}```\n"
