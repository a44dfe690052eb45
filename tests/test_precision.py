"""The precision contract (stark_ray/eval/judge/precision.py) on the CPU: a task's floor is its float32 reference's
error against float64; float32 arithmetic of another order stays within the contract, TF32-, float16- and
bfloat16-rounded arithmetic does not; tasks the contract cannot judge say why."""

from __future__ import annotations

import torch
import torch.nn as nn

from stark_ray.eval.judge.precision import ANY, FACTOR, LEAST, measure_floor, reduced
from stark_ray.eval.measure.compare import compare_outputs
from stark_ray.eval.measure.math_modes import describe, math_modes


class Matmul(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


def tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to TF32's 10-bit mantissa (what a TF32 tensor core reads)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return compare_outputs(out, ref, ANY).rel_err


def test_float32_arithmetic_is_within_the_contract_and_reduced_mantissas_are_not() -> None:
    torch.manual_seed(0)
    model, x = Matmul(512), torch.randn(256, 512)
    ref = model(x)
    floor = measure_floor(model, [x.clone()], ref, seed=0, room=None, work=0, draws_random=False)
    assert floor.error is not None and 0 < floor.error < 1e-6, floor
    w = model.w.detach()
    blocked = sum(x[:, i:i + 64] @ w[i:i + 64] for i in range(0, 512, 64))  # another order of summation
    assert isinstance(blocked, torch.Tensor)
    assert reduced(error(blocked, ref), floor) is None
    for name, cheat in (("tf32", tf32(x) @ tf32(w)), ("fp16", x.half().float() @ w.half().float()),
                        ("bf16", x.bfloat16().float() @ w.bfloat16().float())):
        line = reduced(error(cheat, ref), floor)
        assert line is not None and "the reference's own float32 error against float64" in line, name


def test_an_exact_float32_task_is_judged_against_the_least_bound() -> None:
    x = torch.randn(1 << 16)
    relu = nn.ReLU()
    floor = measure_floor(relu, [x.clone()], relu(x), seed=0, room=None, work=0, draws_random=False)
    assert floor.error == 0.0 and floor.bound == LEAST
    assert reduced(error(relu(x.half()).float(), relu(x)), floor) is not None  # half precision: ~1e-4
    assert FACTOR * 1e-9 < LEAST


def test_what_the_contract_cannot_judge_is_said() -> None:
    x = torch.randn(64)
    assert "no floating output" in measure_floor(nn.Identity(), [x.long()], x.long(), 0, None, 0, False).describe()
    assert "float64" in measure_floor(nn.Identity(), [x.double()], x.double(), 0, None, 0, False).why
    drop = nn.Dropout(0.5)
    assert "random" in measure_floor(drop, [x], drop(x), 0, None, 0, True).why
    big = Matmul(256)
    tight = measure_floor(big, [torch.randn(8, 256)], big(torch.randn(8, 256)), 0, room=1000, work=0,
                          draws_random=False)
    assert tight.error is None and "left in the budget" in tight.why


def test_the_math_modes_are_read_and_said() -> None:
    modes = math_modes()
    assert modes.get("matmul_tf32") is False  # torch's default, which neither process changes
    assert describe(modes).startswith("matmul TF32 off")
    assert describe(modes, "cpu") == "float32 matmul precision highest"  # on the CPU only what applies there


def test_a_float64_forward_too_slow_for_its_device_is_not_measured() -> None:
    from stark_ray.eval.judge.precision import float64_too_slow
    from stark_ray.eval.judge.sol import Peaks

    h100 = Peaks("H100", {"fp64": 67e12, "fp32": 67e12}, 3e12)
    l40s = Peaks("L40S", {"fp64": 1.4e12, "fp32": 91.6e12}, 0.86e12)
    assert float64_too_slow(500.0, h100) == "" and float64_too_slow(None, l40s) == ""
    assert float64_too_slow(500.0, l40s).startswith("its float64 forward would take about 33 s")
    assert float64_too_slow(100.0, l40s) == ""  # 6.5 s: measured
