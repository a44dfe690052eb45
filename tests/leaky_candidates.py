"""Hand-written candidates for the example task ``1_LeakyReluScale`` as source text, and a quick ``cpu_cpp`` service
to judge them: the honest model, with a slot for what a hostile candidate does first in ``forward`` and one for a
factor its output is multiplied by (1 when honest)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from stark_ray.config import EvalConfig
from stark_ray.eval.service import EvalService

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "1_LeakyReluScale.py"

MODEL = """
class ModelNew(torch.nn.Module):
    def __init__(self, negative_slope, scale):
        super().__init__()
        self.negative_slope, self.scale = negative_slope, scale

    def forward(self, x):
        {forward}
        return torch.nn.functional.leaky_relu(x, self.negative_slope) * self.scale{factor}
"""


@contextlib.contextmanager
def quick_service(build_dir: str, isolate: str = "off") -> Iterator[EvalService]:
    """A cpu_cpp service with few timing rounds (these tests judge correctness and what is left behind; with 3, noise
    on a busy host made an honest candidate of speedup 1 look 2-3x faster and fail its confirmation), unisolated
    by default: its candidates write down what they did where the test reads it."""
    with EvalService(EvalConfig(backend="cpu_cpp", build_dir=build_dir, timing_trials=11, warmup=2,
                                isolate=isolate)) as s:
        yield s
