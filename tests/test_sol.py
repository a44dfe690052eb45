"""The speed-of-light arithmetic on the example tasks: FLOPs and bytes against hand counts, the bound, the table,
and the CPU's probes (what the ``cpu_cpp`` backend uses)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stark_ray.eval.judge.sol import (
    Demand,
    Peaks,
    count_demand,
    host_bandwidth,
    known_peaks,
    matmul_rate,
    probe_peaks,
    speed_of_light,
)
from stark_ray.eval.tasks import load_reference

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"
F32 = 4


def demand_of(name: str) -> Demand:
    path = EXAMPLES / f"{name}.py"
    module, _, init_inputs = load_reference(name, path.read_text(), 0, "cpu")
    return count_demand(module, init_inputs)


def test_elementwise_work_is_its_bytes_and_no_flops() -> None:
    d = demand_of("1_LeakyReluScale")  # one 2048 x 2048 float input, an output like it, no parameters
    assert d.flops == {} and (d.input_bytes, d.output_bytes, d.param_bytes) == (2048 * 2048 * F32,) * 2 + (0,)


def test_a_linear_layer_counts_its_matrix_product_and_its_weights() -> None:
    d = demand_of("3_LinearGelu")  # x 512 x 1024 @ W^T (1024 x 1024) + b, then GELU
    assert d.flops == {"fp32": 2 * 512 * 1024 * 1024}
    assert d.input_bytes == 512 * 1024 * F32 and d.output_bytes == 512 * 1024 * F32
    assert d.param_bytes == (1024 * 1024 + 1024) * F32


def test_a_convolution_counts_every_output_point_and_the_pooled_output() -> None:
    d = demand_of("4_Conv2dReluMaxPool")  # 8 x 16 x 64 x 64 -> conv 3x3 to 32 channels -> 2x2 max pool
    assert d.flops == {"fp32": 2 * 8 * 32 * 64 * 64 * 16 * 3 * 3}
    assert d.input_bytes == 8 * 16 * 64 * 64 * F32 and d.output_bytes == 8 * 32 * 32 * 32 * F32
    assert d.param_bytes == (32 * 16 * 3 * 3 + 32) * F32


def test_the_bound_is_the_larger_floor_and_the_fraction_is_sol_over_runtime() -> None:
    h200 = Peaks("NVIDIA H200", {"fp32": 67e12, "bf16": 989e12}, bandwidth=4.0e12)
    memory = speed_of_light(Demand({}, 4_000_000_000, 4_000_000_000, 0), h200)
    assert memory.bound == "memory" and memory.ms == pytest.approx(2.0) and memory.compute_ms == 0
    assert memory.fraction(4.0) == pytest.approx(0.5) and memory.fraction(None) is None
    compute = speed_of_light(Demand({"fp32": 67 * 10**12, "bf16": 989 * 10**9}, 4_000_000, 0, 0), h200)
    assert compute.bound == "compute" and compute.ms == pytest.approx(1001.0)  # 1 s of fp32 and 1 ms of bf16
    assert "compute-bound: speed of light 1e+03 ms" in compute.describe()
    assert h200.flop_rate("int8") == 67e12  # no figure for it: the float32 peak


def test_a_forward_that_needs_values_gives_a_lower_bound_said_as_such(tmp_path: Path) -> None:
    source = (EXAMPLES / "1_LeakyReluScale.py").read_text().replace(
        "return F.leaky_relu(x, self.negative_slope) * self.scale",
        "return x[: int(x.sum().item() > 0) + 1] * self.scale")
    module, _, init_inputs = load_reference("needs_values", source, 0, "cpu")
    d = count_demand(module, init_inputs)
    assert not d.outputs_known and d.output_bytes == 0 and d.input_bytes == 2048 * 2048 * F32
    sol = speed_of_light(d, Peaks("cpu", {"fp32": 1e11}, 1e10))
    assert sol.lower_bound_only and "at least" in sol.describe()


@pytest.mark.parametrize(("name", "fp32", "bf16", "gbs"), [
    ("NVIDIA H200", 67, 989, 4800), ("NVIDIA H100 80GB HBM3", 67, 989, 3350), ("NVIDIA H100 PCIe", 51, 756, 2000),
    ("NVIDIA A100-SXM4-40GB", 19.5, 312, 1555), ("NVIDIA A100-SXM4-80GB", 19.5, 312, 2039),
    ("NVIDIA L40S", 91.6, 362, 864), ("NVIDIA B200", 80, 2250, 8000), ("NVIDIA H200 NVL", 60, 835, 4800),
])
def test_the_table_knows_the_usual_gpus_by_their_names(name: str, fp32: float, bf16: float, gbs: float) -> None:
    known = known_peaks(name)
    assert known is not None
    flops, bandwidth = known
    assert (flops["fp32"], flops["bf16"], bandwidth) == (fp32 * 1e12, bf16 * 1e12, gbs * 1e9)


def test_an_unknown_device_and_the_cpu_are_probed() -> None:
    assert known_peaks("NVIDIA GeForce GT 710") is None
    assert known_peaks("NVIDIA GH200 480GB") is None and known_peaks("NVIDIA RTX A1000") is None  # whole words
    rate, bandwidth = matmul_rate("cpu", "fp32", size=256, seconds=0.05), host_bandwidth(16 << 20, seconds=0.05)
    assert rate > 1e6 and bandwidth > 1e6  # a FLOP/s and a bytes/s figure, whatever this host's load
    peaks = probe_peaks("cpu", bandwidth, "cpu", size=256, seconds=0.05)
    assert peaks.source == "probe" and set(peaks.flops) == {"fp32"} and peaks.bandwidth == bandwidth


def test_the_device_limits_are_said_with_the_probes_disagreement() -> None:
    """What a speed of light is made of, one line (the judge's hello, ``stark eval``): a probe well under the
    table's figure (a throttled or shared GPU) replaces it and says so."""
    import stark_ray.eval.judge.sol as sol

    original = sol.matmul_rate
    try:
        sol.matmul_rate = lambda device, dtype, size=None, seconds=0.2: 100e12 if dtype == "bf16" else 60e12
        peaks = probe_peaks("cuda", 4.1e12, "NVIDIA H200")
    finally:
        sol.matmul_rate = original
    line = peaks.describe()
    assert line.startswith("NVIDIA H200: bandwidth 4.1 TB/s; bf16 100 TFLOP/s, fp16 100 TFLOP/s, fp32 67 TFLOP/s, "
                           "fp64 67 TFLOP/s, fp8 1.98e+03 TFLOP/s (table, checked by a probe; bf16: the probe's "
                           "100 TFLOP/s, under 50% of the table's 989, is used)"), line
    assert "\n" not in line


def test_counting_a_6_gb_task_allocates_nothing() -> None:
    """KernelBench's level-1 sizes are counted from shapes alone (the meta device)."""
    source = (EXAMPLES / "1_LeakyReluScale.py").read_text().replace("torch.randn(2048, 2048)",
                                                                      "torch.randn(4096, 393216)")
    module, _, init_inputs = load_reference("big", source, 0, "cpu")
    d = count_demand(module, init_inputs)
    assert d.input_bytes == 4096 * 393216 * F32 == d.output_bytes


def test_the_demand_counts_the_parameters_of_the_model_the_evaluator_builds() -> None:
    """Counted on Model(*init_inputs), the model the evaluator builds (here a LayerNorm's weight and bias)."""
    path = EXAMPLES / "6_ResidualLayerNorm.py"
    module, model, init_inputs = load_reference("6_ResidualLayerNorm", path.read_text(), 0, "cpu")
    d = count_demand(module, init_inputs)
    assert d.param_bytes == 2 * 1024 * F32 == sum(p.numel() * F32 for p in model.parameters())
    assert d.input_bytes == 2 * 4096 * 1024 * F32 and d.output_bytes == 4096 * 1024 * F32 and d.flops == {}


def test_stark_eval_says_how_far_from_the_speed_of_light_both_sides_are() -> None:
    from stark_ray.cli.eval import eval_report
    from stark_ray.records import STAGE_OK, EvalResult

    result = EvalResult(compiled=True, passed_checks=True, runtime_ms=2.0, ref_runtime_ms=4.0, speedup=2.0,
                        stage=STAGE_OK, sol_ms=1.0, sol_bound="memory", sol_fraction=0.5)
    assert "  speed of light 1.0000 ms (memory-bound): 50.0% of it, the reference's 25.0%" in eval_report(
        "t", "c.py", result)
    said = eval_report("t", "c.py", result, "cpu: bandwidth 0.01 TB/s; fp32 0.1 TFLOP/s (probe)")
    assert "  from the device's limits: cpu: bandwidth 0.01 TB/s; fp32 0.1 TFLOP/s (probe)" in said


def test_a_run_whose_tasks_stopped_at_their_speed_of_light_resumes_as_finished(tmp_path: Path) -> None:
    """A resume does not start evaluators for tasks that stopped at ``--stop-at-sol`` (their summary says how close
    the best came); ``--stop-at-sol 0`` or a higher share continues them."""
    import json

    from stark_ray.config import AgentConfig, EvalConfig, SearchConfig
    from stark_ray.eval.tasks import Task
    from stark_ray.run.resume import Resumed, _best_sol_fraction
    from stark_ray.store.location import locate

    (tmp_path / "summary.json").write_text(json.dumps({"task": "t", "best_sol_fraction": 0.93}))
    share = _best_sol_fraction(locate(tmp_path))
    assert share == 0.93 and _best_sol_fraction(locate(tmp_path / "none")) is None

    def finished(stop_at_sol: float, light: float | None) -> bool:
        search = SearchConfig(budget=5, stop_at_sol=stop_at_sol)
        return Resumed([Task("t", tmp_path / "t.py", "")], search, AgentConfig(), EvalConfig(), {"t": 2},
                       light={} if light is None else {"t": light}).finished

    assert finished(0.9, share) and not finished(0.95, share) and not finished(0.0, share)
    assert not finished(0.9, None) and not finished(0.9, 3.0)  # beyond 1.1: not taken at its word


def test_the_cpus_peak_is_an_upper_bound_and_a_share_comes_from_the_paired_ratio(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe on a busy host read 31 GFLOP/s where torch alone reached 94, and an honest candidate ran at 130% of the
    speed of light: the CPU's float32 peak is its cores x clock x its ISA's FLOPs per cycle where the host tells its
    clock (never less than the probe), and a candidate's share is SOL x its speedup / the reference alone."""
    from types import SimpleNamespace

    from stark_ray.eval import hardware
    from stark_ray.eval.judge.sol import SpeedOfLight, cpu_peaks, stamp

    monkeypatch.setattr(hardware, "cpu_clock_ghz", lambda: 2.5)
    monkeypatch.setattr(hardware, "_cpu_flags", lambda: ["avx", "avx2", "fma", "sse2"])
    assert hardware.cpu_peak_flops(2) == 2 * 2.5e9 * 32
    busy = Peaks("cpu", {"fp32": 31e9}, 10e9, "probe")
    bound = cpu_peaks(busy)
    assert bound.flops["fp32"] >= 2.5e9 * 32 and bound.bandwidth == 10e9 and "ISA" in bound.source
    monkeypatch.setattr(hardware, "cpu_clock_ghz", lambda: None)  # no clock told: the probe's figure stands
    assert cpu_peaks(busy) is busy
    sol = SpeedOfLight(memory_ms=0.1, compute_ms=1.0)
    loaded = SimpleNamespace(runtime_ms=0.77, speedup=1.3)  # timed beside the reference on a busy host
    stamp(loaded, sol)
    assert loaded.sol_fraction == pytest.approx(1.0 / 0.77, rel=1e-3)  # absolute times of two loads: 130%
    stamp(loaded, sol, alone_ms=2.0)  # the reference alone (quiet): 2.0 ms; the pair's ratio 1.3
    assert loaded.sol_fraction == pytest.approx(1.0 * 1.3 / 2.0, rel=1e-3)
