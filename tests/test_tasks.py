"""Task files: static checks (load_task) and the reference run (check_task); every problem is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from stark_ray.eval.tasks import Task, TaskError, check_task, load_task, load_tasks

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"

GOOD = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return [2.0]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line_error(excinfo: pytest.ExceptionInfo[TaskError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message.strip() == message and message
    return message


def test_good_task_loads_without_running(tmp_path: Path) -> None:
    # get_inputs would fail if called: load_task must not run it
    path = write(tmp_path, "9_Good.py", GOOD.replace("torch.randn(8, 8)", "1 / 0"))
    task = load_task(path)
    assert task == Task(name="9_Good", path=path, source=path.read_text())


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.py", "import torch\n\nclass Model(nn.Module)\n    pass\n")
    with pytest.raises(TaskError) as e:
        load_task(path)
    assert one_line_error(e).startswith("bad.py:3: syntax error: ")


@pytest.mark.parametrize("missing", ["Model", "get_inputs", "get_init_inputs"])
def test_missing_definition(tmp_path: Path, missing: str) -> None:
    text = GOOD.replace(f"class {missing}(", "class Other(").replace(f"def {missing}(", "def other(")
    with pytest.raises(TaskError) as e:
        load_task(write(tmp_path, "t.py", text))
    message = one_line_error(e)
    assert f"missing {missing} " in message and message.startswith("t.py: ")


def test_definitions_by_assignment_or_import_count(tmp_path: Path) -> None:
    text = GOOD.replace("def get_init_inputs():\n    return [2.0]", "get_init_inputs = lambda: [2.0]")
    assert load_task(write(tmp_path, "t.py", text)).name == "t"


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TaskError) as e:
        load_task(tmp_path / "nope.py")
    assert "no such task file" in one_line_error(e)
    with pytest.raises(TaskError) as e:
        load_task(tmp_path)
    assert "is a directory" in one_line_error(e)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(TaskError) as e:
        load_task(path)
    assert "cannot read" in one_line_error(e)


def test_load_tasks_orders_by_number(tmp_path: Path) -> None:
    for name in ("10_B.py", "2_A.py", "1_C.py", "_helper.py"):
        write(tmp_path, name, GOOD)
    assert [t.name for t in load_tasks(tmp_path)] == ["1_C", "2_A", "10_B"]
    assert [t.name for t in load_tasks(tmp_path / "2_A.py")] == ["2_A"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TaskError) as e:
        load_tasks(empty)
    assert "no task files" in one_line_error(e)


def test_forward_failure_is_one_line(tmp_path: Path) -> None:
    text = GOOD.replace("return x * self.scale", "raise RuntimeError('shapes do not match\\nsecond line')")
    task = load_task(write(tmp_path, "5_Broken.py", text))
    with pytest.raises(TaskError) as e:
        check_task(task)
    assert one_line_error(e) == "task 5_Broken: reference forward failed: RuntimeError: shapes do not match"


def test_get_inputs_and_constructor_failures(tmp_path: Path) -> None:
    task = load_task(write(tmp_path, "a.py", GOOD.replace("torch.randn(8, 8)", "1 / 0")))
    with pytest.raises(TaskError) as e:
        check_task(task)
    assert one_line_error(e) == "task a: get_inputs() failed: ZeroDivisionError: division by zero"
    task = load_task(write(tmp_path, "b.py", GOOD.replace("return [2.0]", "return [1, 2]")))
    with pytest.raises(TaskError) as e:
        check_task(task)
    assert one_line_error(e).startswith("task b: Model(*get_init_inputs()) failed: TypeError: ")


def test_import_failure(tmp_path: Path) -> None:
    task = load_task(write(tmp_path, "c.py", "import no_such_module_xyz\n" + GOOD))
    with pytest.raises(TaskError) as e:
        check_task(task)
    assert one_line_error(e).startswith("task c: import failed: ModuleNotFoundError: ")


def test_example_tasks_are_valid() -> None:
    tasks = load_tasks(EXAMPLES)
    assert len(tasks) >= 6
    assert "2_FusedSwishScaleClamp" in [t.name for t in tasks]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.stem)
def test_example_task_runs(path: Path) -> None:
    import torch

    out = check_task(load_task(path))
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()
