"""Stand-ins for ``campaign_scaling.py --simulate``: evaluators that each hold a device of their own for a fixed time
per candidate, and LLM replies that take a fixed time each, so that the driver, the TreeMemory actor, the agents and
the dispatch run for real at 1, 2, 4 or 8 devices' request rate on a machine without them.

A simulated device sleeps (it takes no CPU) for ``STARK_SIM_HOLD_S`` seconds per candidate and writes each busy
window to ``STARK_SIM_DIR/<its instance>.jsonl``, where the benchmark reads every device's busy share and idle gaps
(the rows' ``device`` column names a task's home evaluator, not the one that ran the candidate). Its results are
:func:`orchestration.instant_result`'s (a plausible speedup, one in FAIL_ONE_IN wrong), its references at once. A
reply waits ``STARK_SIM_LLM_S`` seconds, then answers as :func:`orchestration.instant_reply` does. The settings
travel in the job's environment (``ray.init``'s runtime_env), which every actor and agent worker of the run gets.

Module level and importable (``benchmarks/`` on the workers' PYTHONPATH): Ray pickles these by reference.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import ray
from orchestration import _Instant, instant_reply, instant_result

from stark_ray.config import EvalConfig
from stark_ray.eval.tasks import Task
from stark_ray.llm.base import LLMRequest
from stark_ray.llm.scripted import ScriptedClient
from stark_ray.records import EvalResult

DIR_ENV = "STARK_SIM_DIR"
HOLD_ENV = "STARK_SIM_HOLD_S"
LATENCY_ENV = "STARK_SIM_LLM_S"


def latent_reply(request: LLMRequest) -> str:
    time.sleep(float(os.environ.get(LATENCY_ENV, "0")))
    return instant_reply(request)


def latent_client() -> ScriptedClient:
    """The run's ``client_factory``: every reply after ``STARK_SIM_LLM_S`` seconds."""
    return ScriptedClient({}, model="scripted-latent", default=latent_reply)


@ray.remote
class SimulatedDevice(_Instant):
    """An evaluator whose device is busy ``STARK_SIM_HOLD_S`` seconds per candidate (one at a time, as a GPU's
    worker times one candidate at a time). No resources here: the driver sets them (.options)."""

    def __init__(self, cfg: EvalConfig) -> None:
        super().__init__(cfg)
        self.device = threading.Lock()  # the actor serves several calls at once; its device one candidate

    def evaluate(self, task: Task, source: str) -> EvalResult:
        hold = float(os.environ.get(HOLD_ENV, "1"))
        with self.device:
            began = time.time()
            time.sleep(hold)
            ended = time.time()
        with open(Path(os.environ[DIR_ENV]) / f"{self.instance}.jsonl", "a") as f:
            f.write(json.dumps([began, ended]) + "\n")
        result = instant_result(source)
        result.eval_s = hold
        return result


def busy_windows(directory: Path) -> dict[str, list[tuple[float, float]]]:
    """Each simulated device's busy windows (wall-clock seconds), by its instance."""
    return {path.stem: sorted(tuple(json.loads(line)) for line in path.read_text().splitlines() if line.strip())
            for path in sorted(directory.glob("*.jsonl"))}
