"""Scripted model content with real kernels, for GPU runs of the Ray runtime (``tests/test_ray_gpu.py``,
``benchmarks/campaign_scaling.py``): only the LLM is a stand-in, every candidate is built, checked and timed.

* plan agent: an anchored plan around the code the prompt shows (:mod:`scripted_plans`);
* code and debug agents: one of the hand-written kernels of :mod:`candidates` for the task the prompt names, in
  the run's backend format; the variant and a name tag come from a digest of the prompt, so every distinct
  prompt gets a distinct source (a fresh build, as an LLM's reply would be). One reply in ``WRONG_ONE_IN``
  scales the kernel's output by 1.01 (a wrong result, so debug agents run too). Tasks without hand-written
  kernels get their reference renamed ``ModelNew`` (correct, flagged ``no_kernel``).

Replies depend on the request alone, so agent tasks in any Ray worker agree. Workers import this module: put
``benchmarks/`` on their PYTHONPATH (``runtime_env``).
"""

from __future__ import annotations

import time
from functools import partial

from candidates import FORMATS, render
from scripted_plans import plan_reply, prompt_tag, reference_as_candidate, task_name

from stark_ray.llm.base import LLMRequest
from stark_ray.llm.scripted import ScriptedClient

WRONG_ONE_IN = 5
_WRONG = """

_Fused = ModelNew


class ModelNew(_Fused):
    def forward(self, *args):
        return super().forward(*args) * 1.01
"""


def kernel_source(request: LLMRequest, backend: str) -> str:
    name = task_name(request)
    if name not in FORMATS:
        return reference_as_candidate(request)
    tag = prompt_tag(request)
    variants = FORMATS[name].variants
    source = render(name, int(tag[:4], 16) % len(variants), backend, tag=tag)
    return source + _WRONG if int(tag[4:8], 16) % WRONG_ONE_IN == 0 else source


def reply(request: LLMRequest, backend: str) -> str:
    if request.role == "plan":
        return plan_reply(request)
    return f"Here is the kernel.\n\n```python\n{kernel_source(request, backend)}```\n"


def kernel_client(backend: str, latency_s: float = 0.0) -> ScriptedClient:
    """A run's ``client_factory`` (bind the backend with functools.partial); each reply after ``latency_s``
    seconds (real models take 5-30 s)."""
    return ScriptedClient({}, model="scripted-kernels", default=partial(latent_reply, backend=backend,
                                                                        latency_s=latency_s))


def latent_reply(request: LLMRequest, backend: str, latency_s: float) -> str:
    if latency_s > 0:
        time.sleep(latency_s)
    return reply(request, backend)
