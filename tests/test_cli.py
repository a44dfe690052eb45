"""The command line as a user meets it: the real `stark` entry point in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stark_ray.config import DEFAULT_MODELS, AgentConfig, EvalConfig, SearchConfig

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks"


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def stark(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    base["COLUMNS"] = "200"  # keep rich from wrapping the one error line
    return subprocess.run([sys.executable, "-m", "stark_ray.cli", *args], capture_output=True, text=True,
                          env={**base, **(env or {})}, cwd=cwd, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture()
def cassette(tmp_path: Path) -> str:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    return str(path)


def test_syntax_error_in_task_file(tmp_path: Path, cassette: str) -> None:
    task = tmp_path / "broken.py"
    task.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x)\n        return x\n")
    line = one_error_line(stark("optimize", str(task), "--cassette", cassette, "--out", str(tmp_path)))
    assert "broken.py:3" in line and "syntax" in line


def test_task_missing_a_name(tmp_path: Path, cassette: str) -> None:
    task = tmp_path / "noinit.py"
    task.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                    "def get_inputs():\n    return [torch.randn(4)]\n")
    line = one_error_line(stark("optimize", str(task), "--cassette", cassette, "--out", str(tmp_path)))
    assert "get_init_inputs" in line


def test_task_whose_forward_fails(ray_cluster: str, tmp_path: Path, cassette: str) -> None:
    task = tmp_path / "fails.py"
    task.write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return x @ torch.ones(3, 3)\n\n"
        "def get_inputs():\n    return [torch.randn(4, 5)]\n\n"
        "def get_init_inputs():\n    return []\n")
    # on the test run's Ray (a private one per command costs a Ray start each: tests/test_local_ray.py has those)
    line = one_error_line(stark("optimize", str(task), "--cassette", cassette, "--out", str(tmp_path),
                                "--address", ray_cluster))
    assert "forward" in line and "RuntimeError" in line
    assert not list(tmp_path.glob("fails-*")), "no run directory for a task that cannot run"


def test_missing_task_file(tmp_path: Path, cassette: str) -> None:
    line = one_error_line(stark("optimize", str(tmp_path / "nope.py"), "--cassette", cassette))
    assert "nope.py" in line


def test_missing_api_key_is_one_line_before_any_work(tmp_path: Path) -> None:
    line = one_error_line(stark("optimize", str(TASKS / "1_LeakyReluScale.py"), "--out", str(tmp_path)))
    assert "OPENAI_API_KEY" in line
    line = one_error_line(stark("optimize", "--ref_path", str(TASKS / "1_LeakyReluScale.py"),
                                "--provider", "anthropic", "--out", str(tmp_path)))
    assert "ANTHROPIC_API_KEY" in line
    assert not any(tmp_path.iterdir())


def test_the_task_is_checked_before_the_key_and_the_model_follows_the_provider(tmp_path: Path) -> None:
    """A missing task file is the first thing to fix: named before a missing key. With --provider anthropic and no
    --model, the agents use the provider's default model, not OpenAI's."""
    line = one_error_line(stark("optimize", str(tmp_path / "nope.py"), "--out", str(tmp_path)))
    assert "nope.py" in line and "API_KEY" not in line
    line = one_error_line(stark("optimize", str(TASKS / "1_LeakyReluScale.py"), "--provider", "anthropic",
                                "--out", str(tmp_path)))
    assert "ANTHROPIC_API_KEY" in line and DEFAULT_MODELS["anthropic"] in line and "gpt-4o" not in line
    assert AgentConfig(provider="anthropic").model == DEFAULT_MODELS["anthropic"]
    assert AgentConfig().model == "gpt-4o" and AgentConfig(provider="anthropic", model="m").model == "m"


def test_a_dead_base_url_ends_the_run_in_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    """It spent the whole budget on connection failures and exited 0; then it was found only after the reference was
    timed (90-150 s). Now the provider check (llm/factory.py: check_provider) finds it before any work: one line, a
    non-zero exit, no run directory. (A provider lost mid-run: llm/retry.py's Reachability, test_llm_providers.py.)"""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = stark("optimize", str(TASKS / "1_LeakyReluScale.py"), "--base-url", f"http://127.0.0.1:{port}/v1",
                 "--executor", "local", "-B", "30", "-q", "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr  # a setting to fix, as a missing key is
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: the provider check failed before any work") and "reachable" in lines[0], lines
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no reference was timed, no run directory made


def test_a_kernelbench_task_by_level_and_problem(tmp_path: Path, cassette: str) -> None:
    """`stark optimize --kernelbench DIR --level 1 --problem 19` (or a part of its name), as KernelBench's own
    scripts take them; a problem that names no file or several, or a missing flag, is one line."""
    kb = tmp_path / "kb" / "KernelBench" / "level1"
    kb.mkdir(parents=True)
    source = (TASKS / "1_LeakyReluScale.py").read_text()
    for name in ("19_LeakyReluScale", "20_LeakyReluScaleTwice", "21_Other"):
        (kb / f"{name}.py").write_text(source)
    root = str(tmp_path / "kb")
    runs = tmp_path / "runs"
    for problem in ("19", "leakyreluscale"):  # by id; by a name that is one file's exactly (20's holds it too)
        proc = stark("optimize", "--kernelbench", root, "--level", "1", "--problem", problem, "--cassette",
                     cassette, "--executor", "local", "-B", "1", "-q", "--out", str(runs))
        made = sorted(p.name for p in runs.iterdir())
        assert made and made[-1].startswith("19_LeakyReluScale-"), (problem, made, proc.stderr)
        for p in runs.iterdir():
            shutil.rmtree(p)
    line = one_error_line(stark("optimize", "--kernelbench", root, "--level", "1", "--problem", "leaky"))
    assert "matches 2 tasks of level 1: 19_LeakyReluScale, 20_LeakyReluScaleTwice; give its id" in line
    line = one_error_line(stark("optimize", "--kernelbench", root, "--level", "1", "--problem", "7"))
    assert line.startswith("error: --kernelbench ") and "no task file for level1/7" in line
    line = one_error_line(stark("optimize", "--kernelbench", root, "--level", "1"))
    assert "--problem" in line
    line = one_error_line(stark("optimize", str(TASKS / "1_LeakyReluScale.py"), "--kernelbench", root, "--level",
                                "1", "--problem", "19"))
    assert "give the task once" in line


def test_campaign_takes_the_search_and_eval_options_optimize_takes(tmp_path: Path, cassette: str) -> None:
    """Each reaches its settings dataclass (a bad value is that dataclass's one line, before anything starts),
    and the help shows the dataclasses' own defaults (it said [off] for --isolate, whose default is auto)."""
    task = str(TASKS / "1_LeakyReluScale.py")
    for option, value, said in (("--n-root", "0", "n_root must be >= 1"), ("--window-chars", "10", "window_chars"),
                                ("--tolerance", "loose", "tolerance"), ("--timeout", "0", "timeout_s > 0"),
                                ("--max-debug-chain", "-1", "max_debug_chain")):
        line = one_error_line(stark("campaign", "--tasks", task, "--cassette", cassette, option, value,
                                    "--out", str(tmp_path)))
        assert said in line, (option, line)
    shown = stark("campaign", "--help", env={"COLUMNS": "400"}).stdout
    assert f"(default: {EvalConfig().isolate})" in shown and "[off]" not in shown
    for default in (SearchConfig().n_root, SearchConfig().window_chars, EvalConfig().tolerance, "runs"):
        assert f"(default: {default})" in shown, default


def test_flags_are_shown_without_a_type_in_the_help() -> None:
    """typer printed ``--quiet <bool>`` and ``--help <bool>``: a flag takes no value."""
    for command in ("optimize", "campaign", "eval", "report"):
        shown = stark(command, "--help", env={"COLUMNS": "200"}).stdout
        assert "--help" in shown and "<bool>" not in shown, command
        assert "<int>" in shown or "<path>" in shown or "<str>" in shown  # options that take one keep their type


def test_version() -> None:
    from stark_ray import __version__

    proc = stark("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"stark-ray {__version__}", proc


def test_a_campaigns_missing_kernelbench_directory_names_the_flag(tmp_path: Path) -> None:
    line = one_error_line(stark("campaign", "--kernelbench", str(tmp_path / "x"), "--out", str(tmp_path)))
    assert line.startswith(f"error: --kernelbench {tmp_path / 'x'}: no such directory"), line


@pytest.mark.skipif(_gpus() > 0, reason="checks a machine without a CUDA GPU")
def test_a_gpu_backend_on_a_machine_without_a_gpu_is_one_line_before_anything_starts(tmp_path: Path,
                                                                                   cassette: str) -> None:
    """Checked in the command itself, before Ray or an evaluator starts (they took 13-72 s to say so, and
    `stark eval` pasted traceback fragments into its line)."""
    task = str(TASKS / "1_LeakyReluScale.py")
    for args in (("eval", task, task, "--backend", "cuda"),
                 ("optimize", task, "--cassette", cassette, "--backend", "cuda_nvrtc", "--out", str(tmp_path)),
                 ("campaign", "--tasks", task, "--cassette", cassette, "--backend", "cuda", "--out", str(tmp_path))):
        line = one_error_line(stark(*args))
        assert "needs a CUDA GPU and this machine has none" in line and "Traceback" not in line, (args, line)
        assert "RuntimeError" not in line, line
    assert not any(p.name != "empty.jsonl" for p in tmp_path.iterdir())


def test_bad_settings_are_one_line(tmp_path: Path, cassette: str) -> None:
    task = str(TASKS / "1_LeakyReluScale.py")
    assert "epsilon" in one_error_line(stark("optimize", task, "--cassette", cassette, "--epsilon", "2"))
    assert "policy" in one_error_line(stark("optimize", task, "--cassette", cassette, "--policy", "random"))
    assert "ablation" in one_error_line(stark("optimize", task, "--cassette", cassette, "--ablation", "x"))
    assert "budget" in one_error_line(stark("optimize", task, "--cassette", cassette, "-B", "0"))
    assert "temperature" in one_error_line(stark("optimize", task, "--cassette", cassette,
                                                 "--temperature-plan", "-1"))
    assert "--cassette" in one_error_line(stark("optimize", task, "--cassette", cassette, "--provider", "openai"))
    assert "no task" in one_error_line(stark("optimize", "--cassette", cassette))
    assert "isolate" in one_error_line(stark("optimize", task, "--cassette", cassette, "--isolate", "maybe"))
    assert "isolate" in one_error_line(stark("eval", task, str(ROOT / "examples" / "candidates" /
                                                              "1_LeakyReluScale_fast.py"), "--isolate", "yes"))
    assert "memory_budget_gb" in one_error_line(stark("eval", task, str(ROOT / "examples" / "candidates" /
                                                                       "1_LeakyReluScale_fast.py"),
                                                      "--memory-budget", "0"))
    assert "memory_budget_gb" in one_error_line(stark("optimize", task, "--cassette", cassette, "--memory-budget",
                                                      "-4"))
    assert "compile_timeout_s must be > 0" in one_error_line(stark("optimize", task, "--cassette", cassette,
                                                                   "--compile-timeout", "0"))


def test_malformed_cassette_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "plan", "reply": "x", "prompt": "p"}\nnot json\n')
    line = one_error_line(stark("optimize", str(TASKS / "1_LeakyReluScale.py"), "--cassette", str(bad)))
    assert "bad.jsonl:2" in line


def test_unavailable_backend_bad_out_and_bad_record_are_one_line(tmp_path: Path, cassette: str) -> None:
    task = str(TASKS / "1_LeakyReluScale.py")
    assert "cuda" in one_error_line(stark("optimize", task, "--cassette", cassette, "--backend", "cuda"))
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert "--out" in one_error_line(stark("optimize", task, "--cassette", cassette, "--out", str(a_file)))
    assert "--record" in one_error_line(stark("optimize", task, "--cassette", cassette,
                                              "--record", str(tmp_path)))


def test_eval_reports_a_candidate_and_exits_by_its_verdict(tmp_path: Path) -> None:
    from scripted_replies import SLOW, WRONG

    task = str(TASKS / "1_LeakyReluScale.py")
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "wrong.py").write_text(WRONG)
    good = stark("eval", task, str(tmp_path / "slow.py"), "--trials", "2", "--json")
    assert good.returncode == 0, good.stderr
    report = json.loads(good.stdout)
    for key in ("compiled", "passed_checks", "accepted", "runtime_ms", "ref_runtime_ms", "speedup", "flags", "error"):
        assert key in report
    assert report["accepted"] and report["speedup"] < 1  # SLOW sleeps 30 ms per call
    bad = stark("eval", task, str(tmp_path / "wrong.py"), "--trials", "2")
    assert bad.returncode == 1 and "FAILED at correctness" in bad.stdout and "max_abs_err" in bad.stdout
    assert "no such task" in one_error_line(stark("eval", str(tmp_path / "nope.py"), str(tmp_path / "slow.py")))
    broken = tmp_path / "broken_task.py"
    broken.write_text("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                      "        return x @ torch.ones(3, 3)\n\ndef get_inputs():\n    return [torch.randn(4, 5)]\n\n"
                      "def get_init_inputs():\n    return []\n")
    assert "forward failed" in one_error_line(stark("eval", str(broken), str(tmp_path / "slow.py")))
    raising = tmp_path / "my_kernel.py"  # its error names the user's file, not the evaluator's candidate.py
    raising.write_text(WRONG.replace("        return torch.relu(x) * self.scale\n",
                                     "        raise ValueError('boom')\n"))
    assert "raise ValueError" in raising.read_text()
    shown = stark("eval", task, str(raising), "--trials", "2")
    assert shown.returncode == 1 and "my_kernel.py:" in shown.stdout and "candidate.py" not in shown.stdout, \
        shown.stdout


def test_executor_and_resume_mistakes_get_one_line(tmp_path: Path, cassette: str) -> None:
    task = str(ROOT / "examples" / "tasks" / "1_LeakyReluScale.py")
    assert "executor" in one_error_line(stark("optimize", task, "--cassette", cassette, "--executor", "dask"))
    line = one_error_line(stark("optimize", task, "--cassette", cassette, "--executor", "local", "--parallel", "2"))
    assert "--parallel" in line
    assert "no such run directory" in one_error_line(stark("optimize", "--resume", str(tmp_path / "nope")))
    (tmp_path / "not-a-run").mkdir()  # a directory without run.json is not a run
    assert "run.json" in one_error_line(stark("optimize", "--resume", str(tmp_path / "not-a-run")))
    assert "run.json" in one_error_line(stark("optimize", "--resume", str(tmp_path), "--executor", "local"))


def test_more_evaluators_than_gpus_on_an_embedded_ray(tmp_path: Path, cassette: str) -> None:
    """No autoscaler will add GPUs to a local Ray the run started: one line, not a wait forever."""
    gpus = _gpus()
    line = one_error_line(stark("optimize", str(TASKS / "1_LeakyReluScale.py"), "--cassette", cassette,
                                "--backend", "cuda_nvrtc", "--evaluators", str(gpus + 1), "--out", str(tmp_path),
                                timeout=120))
    assert f"{gpus + 1} evaluators need {gpus + 1} GPUs and this machine has {gpus}" in line

