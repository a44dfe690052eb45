"""Analysis of runs: the DuckDB views over real Parquet rows (written by RunStore), the paper's metrics computed by
hand, the Markdown report with its plots, and the ``sql`` / ``report`` commands (errors included)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from stark_ray.analysis import metrics
from stark_ray.analysis.report import PLOTS_DIR, REPORT_FILE, generate, headline, write_report
from stark_ray.analysis.views import TASK_COLUMNS, connect, rows, task_rows
from stark_ray.cli.analysis import VIEWS, report, sql
from stark_ray.records import (
    AGENT_PLAN_CODE,
    AGENT_REFERENCE,
    STAGE_COMPILE,
    STAGE_CORRECTNESS,
    STAGE_OK,
    STAGE_PARSE,
    STAGE_RUNTIME,
    EvalResult,
    LLMUsage,
    Node,
)
from stark_ray.store.parquet import safe_name
from stark_ray.store.run_store import RunStore

REPO = Path(__file__).resolve().parents[1]
T1, T2, T3 = "level1/1_Square_matmul", "17_Conv2d_Fuse", "my_task"


# --- building runs -------------------------------------------------------------------------------------------
def reference(runtime: float, compile_ms: float | None = None) -> Node:
    return Node(id=0, parent=None, depth=0, source="class Model: ...", agent=AGENT_REFERENCE,
                result=EvalResult(compiled=True, passed_checks=True, runtime_ms=runtime, ref_runtime_ms=runtime,
                                  speedup=1.0, stage=STAGE_OK, ref_compile_runtime_ms=compile_ms))


def timed(runtime: float, ref: float, compile_ms: float | None = None, flags: tuple[str, ...] = ()) -> EvalResult:
    """A candidate that compiled, was correct and was timed (flags may still reject it)."""
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=runtime, ref_runtime_ms=ref, speedup=ref / runtime,
                      stage=STAGE_OK, flags=list(flags), ref_compile_runtime_ms=compile_ms)


def wrong() -> EvalResult:
    return EvalResult(compiled=True, passed_checks=False, stage=STAGE_CORRECTNESS, error="outputs differ")


def candidate(i: int, result: EvalResult, tokens: tuple[int, int] = (300, 30), cost: float = 0.03) -> Node:
    return Node(id=i, parent=0, depth=1, source=f"class ModelNew: ...  # {i}", agent=AGENT_PLAN_CODE,
                instruction=f"try {i}", result=result, input_tokens=tokens[0], output_tokens=tokens[1],
                cost_usd=cost)


def calls() -> list[LLMUsage]:
    """The two LLM calls behind each candidate: 300 input and 30 output tokens, $0.03 together."""
    return [LLMUsage("plan", "scripted", "m", 100, 10, 0.01), LLMUsage("code", "scripted", "m", 200, 20, 0.02)]


def write_run(root: Path, run_id: str, tasks: dict[str, list[Node]], with_calls: bool = True) -> Path:
    with RunStore(root, run_id, background=False, fsync=False) as store:
        for task, nodes in tasks.items():
            for n in nodes:
                store.record(task, n, calls() if with_calls and n.id > 0 else [])
    return root / run_id


def run_a(root: Path) -> Path:
    """A Ray campaign run of three tasks: one with a torch.compile baseline, one whose level only its path tells,
    one that never gets an accepted candidate."""
    run = write_run(root, "run-a", {
        T1: [reference(10.0, 8.0),
             candidate(1, EvalResult.failed(STAGE_COMPILE, "error: expected ';'")),
             candidate(2, timed(20.0, 10.0, 8.0)),  # correct, slow: 0.5x
             candidate(3, wrong()),
             candidate(4, timed(4.0, 10.0, 8.0)),  # correct, fast: 2.5x (2.0x vs torch.compile)
             candidate(5, timed(0.1, 10.0, 8.0, ("large_speedup", "suspicious")))],  # 100x, rejected
        T2: [reference(4.0),
             candidate(1, timed(2.5, 4.0, flags=("reduced_precision",))),  # 1.6x, in less precision: accepted
             candidate(2, EvalResult.failed(STAGE_PARSE, "no code block"))],
        T3: [reference(1.0),
             candidate(1, EvalResult.failed(STAGE_RUNTIME, "illegal memory access")),
             candidate(2, timed(0.5, 1.0, flags=("no_kernel",)))],  # 2x but only library ops: rejected
    })
    record = {"tasks": [{"name": T1, "path": "/kb/KernelBench/level1/1_Square_matmul.py", "source": "..."},
                        {"name": T2, "path": "/kb/KernelBench/level2/17_Conv2d_Fuse.py", "source": "..."},
                        {"name": T3, "path": "examples/tasks/my_task.py", "source": "..."}],
              "search": {"budget": 5, "policy": "epsilon_greedy", "ablation": "none"},
              "agents": {"provider": "scripted", "model": "m"},
              "eval": {"backend": "cuda", "baseline": "compile"}, "executor": "ray"}
    (run / "run.json").write_text(json.dumps(record))
    for name, status in ((T1, "finished"), (T2, "finished"), (T3, "capped")):
        d = run / "tasks" / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"task": name, "status": status}))
    return run


def run_b(root: Path) -> Path:
    """A local run of one task: no run.json, its summary at the top, no llm_calls rows."""
    run = write_run(root, "run-b", {T1: [reference(10.0), candidate(1, timed(8.0, 10.0), (50, 5), 0.005)]},
                    with_calls=False)
    (run / "summary.json").write_text(json.dumps({"task": T1, "status": "interrupted"}))
    return run


@pytest.fixture()
def campaign(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    run_a(root)
    run_b(root)
    (root / "notes").mkdir()  # not a run: ignored
    return root


def by_task(con: Any, run_id: str | None = None) -> dict[str, dict[str, Any]]:
    return {t["task"]: t for t in task_rows(con) if run_id is None or t["run_id"] == run_id}


# --- views ---------------------------------------------------------------------------------------------------
def test_views_of_one_run(campaign: Path) -> None:
    with connect(campaign / "run-a") as con:
        cols = [d[0] for d in con.execute("SELECT * FROM tasks LIMIT 0").description]
        assert cols == list(TASK_COLUMNS)
        assert con.execute("SELECT count(*) FROM attempts").fetchone() == (12,)
        assert con.execute("SELECT count(*) FROM llm_calls").fetchone() == (18,)
        assert con.execute("SELECT DISTINCT run_id FROM attempts").fetchall() == [("run-a",)]
        t = by_task(con)
        assert set(t) == {T1, T2, T3}
        one = t[T1]
        assert (one["level"], one["path"], one["status"]) == (1, "/kb/KernelBench/level1/1_Square_matmul.py",
                                                              "finished")
        assert (one["ref_runtime_ms"], one["ref_compile_runtime_ms"]) == (10.0, 8.0)
        assert (one["best_seq"], one["best_runtime_ms"], one["success"]) == (4, 4.0, True)
        assert one["best_speedup"] == pytest.approx(2.5)
        assert one["best_speedup_vs_compile"] == pytest.approx(2.0)
        assert (one["attempts"], one["compiled_attempts"], one["accepted_attempts"], one["rejected_attempts"],
                one["attempts_to_first_accepted"]) == (5, 4, 2, 1, 2)
        assert (one["llm_calls"], one["input_tokens"], one["output_tokens"], one["tokens"]) == (10, 1500, 150, 1650)
        assert one["cost_usd"] == pytest.approx(0.15)
        two = t[T2]
        assert (two["level"], two["best_seq"], two["ref_compile_runtime_ms"], two["best_speedup_vs_compile"],
                two["attempts"], two["compiled_attempts"], two["attempts_to_first_accepted"]) == (
                    2, 1, None, None, 2, 1, 1)  # level 2 from run.json's path; parse failures did not compile
        assert two["best_speedup"] == pytest.approx(1.6)
        three = t[T3]
        assert (three["level"], three["status"], three["success"], three["best_seq"], three["best_speedup"],
                three["compiled_attempts"], three["accepted_attempts"], three["rejected_attempts"],
                three["attempts_to_first_accepted"]) == (None, "capped", False, None, None, 2, 0, 1, None)

        best = rows(con, "SELECT task, seq, accepted FROM best ORDER BY task")
        assert best == [{"task": T2, "seq": 1, "accepted": True}, {"task": T1, "seq": 4, "accepted": True}]
        judged = rows(con, "SELECT seq, accepted, failure, best_speedup_so_far AS b FROM judged WHERE task = ? "
                           "ORDER BY seq", [T1])
        assert [r["failure"] for r in judged] == [None, "compile", None, "correctness", None, "rejected: suspicious"]
        assert [r["accepted"] for r in judged] == [True, False, True, False, True, False]
        assert [r["b"] for r in judged] == [None, None, pytest.approx(0.5), pytest.approx(0.5), pytest.approx(2.5),
                                           pytest.approx(2.5)]
        failures = dict(con.execute("SELECT failure, count(*) FROM judged WHERE failure IS NOT NULL "
                                    "GROUP BY ALL").fetchall())
        assert failures == {"compile": 1, "correctness": 1, "rejected: suspicious": 1, "parse": 1, "runtime": 1,
                            "rejected: no_kernel": 1}
        assert rows(con, "SELECT run_id, backend, baseline, budget, tasks FROM runs") == [
            {"run_id": "run-a", "backend": "cuda", "baseline": "compile", "budget": 5, "tasks": 3}]


def test_views_unite_a_campaign_of_runs(campaign: Path) -> None:
    with connect(campaign) as con:
        assert con.execute("SELECT run_id, count(*) FROM attempts GROUP BY ALL ORDER BY 1").fetchall() == [
            ("run-a", 12), ("run-b", 2)]
        assert [r["run_id"] for r in rows(con, "SELECT run_id FROM runs ORDER BY 1")] == ["run-a", "run-b"]
        b = by_task(con, "run-b")[T1]
        assert (b["status"], b["success"], b["level"], b["llm_calls"], b["tokens"]) == ("interrupted", True, 1, 0, 55)
        assert b["best_speedup"] == pytest.approx(1.25)
        assert b["cost_usd"] == pytest.approx(0.005)  # no llm_calls rows: the attempts rows' figures
        assert by_task(con, "run-a")[T1]["best_speedup"] == pytest.approx(2.5)


def test_connect_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        connect(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty"):
        connect(tmp_path / "empty")


def test_a_run_without_rows_yet(tmp_path: Path) -> None:
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"tasks": [{"name": T1, "path": "x/level1/1_Square_matmul.py"}]}))
    with connect(run) as con:
        assert con.execute("SELECT count(*) FROM attempts").fetchone() == (0,)
        (t,) = task_rows(con)
        assert (t["run_id"], t["task"], t["level"], t["success"], t["attempts"], t["tokens"]) == (
            "fresh", T1, 1, False, 0, 0)
    s = metrics.summarize([t])
    assert s.eager.fast_p[0.0] == 0.0 and s.eager.geomean_speedup is None and s.eager.geomean_speedup_all == 1.0
    assert png(write_report(run).parent / PLOTS_DIR / "best_so_far.png")


def test_analysis_does_not_import_ray() -> None:
    code = ("import sys, stark_ray.analysis.report, stark_ray.analysis.plots, stark_ray.cli.analysis; "
            "sys.exit('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


# --- metrics -------------------------------------------------------------------------------------------------
def test_metrics_by_hand(campaign: Path) -> None:
    with connect(campaign / "run-a") as con:
        tasks = task_rows(con)
    s = metrics.summarize(tasks)
    e = s.eager
    assert (s.tasks, e.tasks, e.successes) == (3, 3, 2)
    assert e.fast_p == pytest.approx({0.0: 2 / 3, 1.0: 2 / 3, 1.5: 2 / 3, 2.0: 1 / 3})
    assert e.geomean_speedup == pytest.approx(2.0)  # sqrt(2.5 * 1.6)
    assert e.geomean_speedup_all == pytest.approx(4 ** (1 / 3))  # (2.5 * 1.6 * 1.0) ** (1/3)
    assert e.mean_speedup == pytest.approx(2.05)
    c = s.compile
    assert c is not None and (c.tasks, c.successes) == (1, 1)  # only T1 has a torch.compile time
    assert c.fast_p == pytest.approx({0.0: 1.0, 1.0: 1.0, 1.5: 1.0, 2.0: 0.0})  # 2.0x is not > 2
    assert c.geomean_speedup == pytest.approx(2.0)
    assert (s.attempts, s.compile_rate, s.accepted_rate) == (9, pytest.approx(7 / 9), pytest.approx(3 / 9))
    assert (s.first_accepted_mean, s.first_accepted_median) == (1.5, 1.5)
    assert (s.llm_calls, s.input_tokens, s.output_tokens, s.tokens) == (18, 2700, 270, 2970)
    assert s.cost_usd == pytest.approx(0.27)

    levels = {x.label: x for x in metrics.by_level(tasks)}
    assert list(levels) == ["level 1", "level 2", "no level", "all"]
    assert levels["level 1"].eager.fast_p[2.0] == 1.0 and levels["level 2"].eager.fast_p[2.0] == 0.0
    assert levels["no level"].eager.fast_p[0.0] == 0.0 and levels["no level"].compile is None
    assert metrics.by_run(tasks) == []


def test_metrics_over_runs_and_edge_cases(campaign: Path) -> None:
    with connect(campaign) as con:
        tasks = task_rows(con)
    s = metrics.summarize(tasks)
    assert s.eager.fast_p == pytest.approx({0.0: 3 / 4, 1.0: 3 / 4, 1.5: 2 / 4, 2.0: 1 / 4})
    assert s.eager.geomean_speedup == pytest.approx((2.5 * 1.6 * 1.25) ** (1 / 3))
    assert [r.label for r in metrics.by_run(tasks)] == ["run-a", "run-b"]
    assert metrics.fast_p([], 1.0) is None
    assert metrics.geomean([]) is None
    assert metrics.geomean([2.0, 8.0]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        metrics.geomean([0.0])
    with pytest.raises(ValueError):
        metrics.speedup({"success": True, "best_speedup": 2.0}, "nvcc")
    assert metrics.fast_p([{"success": False, "best_speedup": None}], 0.0) == 0.0
    assert metrics.fast_p([{"success": True, "best_speedup": 2.0}], 1.0, "compile") is None  # not measured


# --- report --------------------------------------------------------------------------------------------------
def png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_report(campaign: Path) -> None:
    path = write_report(campaign / "run-a")
    assert path == campaign / "run-a" / REPORT_FILE
    text = path.read_text()
    for part in ("## Against PyTorch eager", "## Against torch.compile", "| level 1 |", "| level 2 |",
                 "| no level |", "| all | 3 | 66.7% | 66.7% | 66.7% | 33.3% | 2.00x |", "rejected: suspicious",
                 "| 1.60x | — | reduced_precision |", "- best's flags:",
                 "![fast_p](report/fast_p.png)", "## Definitions"):
        assert part in text, part
    names = {"fast_p.png", "best_so_far.png", "failures.png", "cost_per_task.png"}
    trees = {f"tree_{safe_name(t)}.png" for t in (T1, T2, T3)}
    assert {p.name for p in (campaign / "run-a" / PLOTS_DIR).iterdir()} == names | trees
    assert all(png(campaign / "run-a" / PLOTS_DIR / n) for n in names | trees)
    assert "## Search trees" in text and f"![tree_{safe_name(T1)}](report/tree_{safe_name(T1)}.png)" in text


def test_a_report_draws_the_trees_of_the_best_tasks_first_and_no_cost_chart_for_a_free_run(tmp_path: Path) -> None:
    run = write_run(tmp_path, "free", {
        "slow_task": [reference(10.0), candidate(1, timed(8.0, 10.0), cost=0.0)],
        "fast_task": [reference(10.0), candidate(1, timed(2.0, 10.0), cost=0.0)],
        "failed_task": [reference(10.0), candidate(1, wrong(), cost=0.0)]}, with_calls=False)
    r = generate(run, trees=2)
    assert [Path(str(p)).name for p in r.trees] == ["tree_fast_task.png", "tree_slow_task.png"]
    assert r.trees_of == 3 and "2 of 3 tasks, the highest best speedup first" in r.path.read_text()
    assert not (run / PLOTS_DIR / "cost_per_task.png").exists()
    assert generate(run, trees=0).trees == []


def test_the_tree_picture_lays_out_a_tree_and_finds_the_best_path(tmp_path: Path) -> None:
    from stark_ray.analysis.tree_picture import PictureNode, best_path, layout, nodes_of, outcome_of, tree_picture

    rows_ = [{"seq": 0, "node_id": 0, "parent_id": None, "agent": "reference", "accepted": True, "failure": None,
              "speedup": 1.0},
             {"seq": 1, "node_id": 1, "parent_id": 0, "agent": "plan+code", "accepted": False, "failure": "compile"},
             {"seq": 2, "node_id": 2, "parent_id": 1, "agent": "debug", "accepted": True, "failure": None,
              "speedup": 1.5},
             {"seq": 3, "node_id": 3, "parent_id": 0, "agent": "plan+code", "accepted": False,
              "failure": "rejected: no_kernel", "speedup": 9.0},
             {"seq": 4, "node_id": 4, "parent_id": 2, "agent": "plan+code", "accepted": True, "failure": None,
              "speedup": 2.5},
             {"seq": 5, "node_id": 5, "parent_id": 2, "agent": "plan+code", "accepted": False,
              "failure": "correctness"},
             {"seq": 6, "node_id": 6, "parent_id": 0, "agent": "plan+code", "accepted": False, "failure": "timeout"}]
    nodes = nodes_of(rows_)
    assert [n.outcome for n in nodes] == ["reference", "build", "accepted", "rejected", "accepted", "wrong",
                                          "failed"]
    assert nodes[3].speedup is None  # a rejected node's speedup is not one to show
    assert best_path(nodes) == [0, 1, 2, 4]  # the rejected 9x is not the best
    pos = layout(nodes)
    # leaves 4, 5, 3, 6 side by side in depth-first order; each parent centred over its children
    assert [pos[i][0] for i in (4, 5, 3, 6)] == [0.0, 1.0, 2.0, 3.0]
    assert pos[2] == (0.5, 2.0) and pos[1] == (0.5, 1.0) and pos[0] == (1.75, 0.0)
    assert outcome_of({"seq": 3, "agent": "debug", "accepted": False, "failure": "untimed"}) == "failed"
    # a debug chain thousands deep is no recursion error, and a row whose parent is missing is a root of its own
    chain = [PictureNode(0, None, "reference", "reference", None)] + [
        PictureNode(i, i - 1, "debug", "wrong", None) for i in range(1, 3000)] + [
        PictureNode(5000, 4999, "plan+code", "accepted", 1.2)]
    assert layout(chain)[2999] == (0.0, 2999.0) and layout(chain)[5000] == (1.0, 0.0)
    assert png(tree_picture(nodes, tmp_path / "t.png", "a task"))
    assert best_path([PictureNode(0, None, "reference", "reference", None)]) == []


def test_the_report_command_draws_as_many_trees_as_its_default_says() -> None:
    from stark_ray.analysis.report import TREES
    from stark_ray.cli.analysis import TREES as CLI_TREES

    assert CLI_TREES == TREES


def test_report_of_a_campaign_has_runs(campaign: Path, tmp_path: Path) -> None:
    r = generate(campaign, out=tmp_path / "elsewhere")
    assert r.path == tmp_path / "elsewhere" / REPORT_FILE and len(r.plots) == 4 and r.trees
    text = r.path.read_text()
    assert "## Per run" in text and "| run-b |" in text
    assert all(png(p) for p in r.plots)
    assert not (campaign / REPORT_FILE).exists()


# --- the commands --------------------------------------------------------------------------------------------
def cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command("sql")(sql)
    app.command("report")(report)
    return app


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli(), [str(a) for a in args])


def test_sql_formats(campaign: Path) -> None:
    run = campaign / "run-a"
    query = "SELECT task, level, round(best_speedup, 3) AS speedup, success FROM tasks ORDER BY task"
    res = invoke("sql", run, query, "--format", "csv")
    assert res.exit_code == 0, res.output
    assert list(csv.reader(io.StringIO(res.stdout))) == [
        ["task", "level", "speedup", "success"], [T2, "2", "1.6", "true"], [T1, "1", "2.5", "true"],
        [T3, "", "", "false"]]
    res = invoke("sql", run, query, "-f", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[1] == {"task": T1, "level": 1, "speedup": 2.5, "success": True}
    res = invoke("sql", campaign, "SELECT run_id, count(*) AS n FROM attempts GROUP BY ALL ORDER BY 1")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["run_id", "n"] and lines[2].split() == ["run-a", "12"] and lines[-1] == "(2 rows)"


def test_sql_folds_a_table_wider_than_the_terminal(campaign: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SELECT * FROM attempts`` printed lines of 700 characters on an 80-column terminal: one row under another
    instead, each value cut to the terminal; piped to a program (no terminal, no COLUMNS), the table stays whole."""
    query = "SELECT * FROM attempts ORDER BY task, seq LIMIT 2"
    monkeypatch.delenv("COLUMNS", raising=False)
    whole = CliRunner().invoke(cli(), ["sql", str(campaign / "run-a"), query])
    assert whole.exit_code == 0 and max(map(len, whole.stdout.splitlines())) > 200  # not a terminal: unfolded
    folded = CliRunner().invoke(cli(), ["sql", str(campaign / "run-a"), query], env={"COLUMNS": "80"})
    assert folded.exit_code == 0, folded.output
    lines = folded.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and lines[0].startswith("-[ row 1 ]-")
    assert any(ln.startswith("run_id ") and ln.endswith("| run-a") for ln in lines)
    assert lines[-1].startswith("(2 rows, one under another")
    narrow = "SELECT task, seq FROM attempts ORDER BY task, seq LIMIT 1"
    kept = CliRunner().invoke(cli(), ["sql", str(campaign / "run-a"), narrow], env={"COLUMNS": "80"})
    assert kept.stdout.splitlines()[0].split() == ["task", "seq"]  # fits: a table as before


@pytest.mark.parametrize(("args", "says"), [
    (("sql", "{missing}", "SELECT 1"), "no such directory"),
    (("sql", "{empty}", "SELECT 1"), "no run here"),
    (("sql", "{run}", "SELEC task FROM tasks"), "Parser Error"),
    (("sql", "{run}", "SELECT * FROM nope"), "Catalog Error"),
    (("sql", "{run}", "SELECT 1", "--format", "xml"), "unknown format 'xml'"),
    (("report", "{missing}"), "no such directory"),
])
def test_commands_fail_in_one_line(campaign: Path, tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    (tmp_path / "empty").mkdir()
    places = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "run": campaign / "run-a"}
    res = invoke(*(a.format(**places) for a in args))
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.stderr
    assert "Traceback" not in res.output and res.stdout == ""


def test_report_command(campaign: Path) -> None:
    res = invoke("report", campaign / "run-a")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"report: {campaign / 'run-a' / REPORT_FILE}"
    assert lines[1].startswith("3 tasks: success (fast_0) 66.7% (2/3), fast_1 66.7%, fast_1.5 66.7%, fast_2 33.3%")
    assert lines[2] == "geomean speedup vs eager 2.00x over successful tasks, 1.59x over all tasks (failure = 1.0)"
    assert lines[3].startswith("vs torch.compile (1 of 3 tasks measured): fast_1 100.0%")


def test_stark_sql_names_every_view_there_is(campaign: Path) -> None:
    """`stark sql --help` lists the views from cli_analysis.VIEWS (named there: no duckdb at start-up): the same
    set as a connection makes, for one run and for a directory of runs."""
    for where in (campaign / "run-a", campaign):
        with connect(where) as con:
            made = {r["table_name"] for r in rows(con, "SELECT table_name FROM information_schema.tables")
                    if not r["table_name"].startswith("_")}
        assert made == set(VIEWS), where


def test_devices_view_and_report_section(tmp_path: Path) -> None:
    """Where each attempt was evaluated (``device``) and when it was recorded (``recorded_at``): per device the
    evaluations, tasks and busy seconds, as a view and as the report's Devices section."""
    def on(device: str, eval_s: float, result: EvalResult) -> EvalResult:
        result.device, result.eval_s = device, eval_s
        return result

    nodes = {}
    for k, task in enumerate(("t-a", "t-b", "t-c")):
        dev = "h:gpu0" if k != 1 else "h:gpu1"
        ref = reference(10.0)
        ref.result = on(dev, 0.5, ref.result)
        nodes[task] = [ref, candidate(1, on(dev, 1.0, timed(5.0, 10.0))), candidate(2, on(dev, 2.0, wrong()))]
    run = write_run(tmp_path, "run-d", nodes)
    with connect(run) as con:
        got = rows(con, "SELECT device, evaluations, candidates, tasks, busy_s, search_busy_s, "
                        "span_s > 0 AND busy_share > 0 AS spans, first_at <= last_at AS ordered FROM devices "
                        "ORDER BY device")
    assert got == [
        {"device": "h:gpu0", "evaluations": 6, "candidates": 4, "tasks": 2, "busy_s": 7.0, "search_busy_s": 6.0,
         "spans": True, "ordered": True},
        {"device": "h:gpu1", "evaluations": 3, "candidates": 2, "tasks": 1, "busy_s": 3.5, "search_busy_s": 3.0,
         "spans": True, "ordered": True},
    ]
    text = write_report(run).read_text()
    assert "## Devices" in text
    assert "| run-d | h:gpu0 | 2 | 6 | 7.0 |" in text and "| run-d | h:gpu1 | 1 | 3 | 3.5 |" in text


def test_rows_without_a_device_are_unknown_and_left_out_of_the_report(campaign: Path) -> None:
    with connect(campaign / "run-a") as con:
        assert rows(con, "SELECT device, evaluations FROM devices") == [{"device": "unknown", "evaluations": 12}]
    assert "## Devices" not in write_report(campaign / "run-a").read_text()


def test_the_speed_of_light_reaches_the_tasks_view_and_the_report(tmp_path: Path) -> None:
    """Each row's speed of light (as the judge stamps it) gives the task's bound, the reference's and the best
    candidate's fractions, and a report section per level; a run recorded before it has none and no section."""
    def lit(node: Node, sol_ms: float, bound: str) -> Node:
        r = node.result
        r.sol_ms, r.sol_bound = sol_ms, bound
        r.sol_fraction = sol_ms / r.runtime_ms if r.runtime_ms else None
        return node

    root = tmp_path / "runs"
    write_run(root, "lit", {
        T1: [lit(reference(10.0), 5.0, "memory"), lit(candidate(1, timed(8.0, 10.0)), 5.0, "memory"),
             lit(candidate(2, timed(6.0, 10.0)), 5.0, "memory"), lit(candidate(3, wrong()), 5.0, "memory")],
        "level2/5_Gemm": [lit(reference(4.0), 0.4, "compute"), lit(candidate(1, timed(2.0, 4.0)), 0.4, "compute")],
    })
    with connect(root / "lit") as con:
        tasks = by_task(con)
    one, two = tasks[T1], tasks["level2/5_Gemm"]
    assert (one["sol_ms"], one["sol_bound"], one["ref_sol_fraction"], one["best_sol_fraction"]) == (
        5.0, "memory", 0.5, pytest.approx(5.0 / 6.0))  # the best is the 6 ms one
    assert (two["sol_bound"], two["ref_sol_fraction"], two["best_sol_fraction"]) == ("compute", 0.1, 0.2)
    overall = metrics.light(list(tasks.values()))
    assert overall == metrics.Light(2, 1, pytest.approx(0.3), pytest.approx((5.0 / 6.0 + 0.2) / 2), 1, 1)
    text = generate(root / "lit", tmp_path / "report").path.read_text()
    assert "## Speed of light" in text and "| level 1 | 1 | 1 | 50.0% | 83.3% | 1 | 1 |" in text
    assert "| level 2 | 1 | 0 | 10.0% | 20.0% | 0 | 0 |" in text

    old = write_run(root, "unlit", {T1: [reference(10.0), candidate(1, timed(8.0, 10.0))]})
    with connect(old) as con:
        assert by_task(con)[T1]["sol_ms"] is None
    assert "## Speed of light" not in generate(old, tmp_path / "old").path.read_text()


def test_the_runs_view_names_the_policy_that_ran(tmp_path: Path) -> None:
    """An ma_only run is Best-of-K whatever its policy setting says; the runs view said epsilon_greedy."""
    from stark_ray.analysis.views import _run_info
    from stark_ray.store.location import locate

    run = tmp_path / "run-m"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"tasks": [{"name": T1}], "search": {"policy": "epsilon_greedy",
                                                                                   "ablation": "ma_only"}}))
    _, settings = _run_info(locate(run))
    assert "best_of_k" in settings and "epsilon_greedy" not in settings


def test_the_named_best_is_the_runoffs_and_every_figure_follows_it(tmp_path: Path) -> None:
    """The runoff named node 2 (measured again at 2.1x); the search had ranked node 1 first (2.5x, noisy): the tasks
    view, the metrics and the report name node 2 at the runoff's figure, and keep the search's own beside it."""
    first, second = timed(4.0, 10.0), timed(5.0, 10.0)
    first.speedup_err, second.speedup_err = 0.08, 0.01
    run = write_run(tmp_path, "r", {T3: [reference(10.0), candidate(1, first), candidate(2, second)]})
    (run / "summary.json").write_text(json.dumps({"task": T3, "status": "finished", "best_node": 2,
                                                  "best_speedup": 2.1, "best_speedup_err": 0.02,
                                                  "runoff": {"winner": 2, "entries": []}}))
    with connect(run) as con:
        [t] = task_rows(con)
    assert (t["best_seq"], t["best_speedup"], t["best_speedup_err"]) == (2, 2.1, 0.02)
    assert t["search_best_speedup"] == 2.5 and t["runoff_node_id"] == 2 and t["best_runtime_ms"] == 5.0
    assert metrics.summarize([t]).eager.geomean_speedup == pytest.approx(2.1)
    text = generate(run).path.read_text()
    assert "| 2.10x ±3.9% |" in text  # the tasks table: the runoff's figure and its interval
    assert "## Attempts" in text and "| 1 | 1 ← 0 | plan+code | accepted | 2.50x ±16% |" in text


def test_a_task_run_again_counts_once_per_run_and_is_said_with_its_spread(tmp_path: Path) -> None:
    """Nine runs of one task read as "9 tasks" with no spread: the headline counts task-runs and distinct tasks, and
    a table gives the task's figure over its runs with a 95% interval."""
    root = tmp_path / "runs"
    for i, ms in enumerate((4.0, 5.0, 4.5)):
        write_run(root, f"seed{i}", {T3: [reference(10.0), candidate(1, timed(ms, 10.0))]})
    write_run(root, "seed3", {T3: [reference(10.0), candidate(1, wrong())]})
    r = generate(root)
    assert (r.overall.tasks, r.overall.distinct_tasks, r.overall.runs) == (4, 1, 4)
    assert headline(r.overall)[0].startswith("4 task-runs (1 distinct tasks, in 4 runs; a task run again counts once")
    [x] = r.repeats
    assert (x.task, x.runs, x.successes, x.least, x.most) == (T3, 4, 3, 2.0, 2.5)
    assert x.geomean_speedup == pytest.approx((2.5 * 2.0 * 10 / 4.5) ** (1 / 3))
    assert x.low is not None and x.high is not None and x.low < 2.0 and x.high > 2.5  # t with 2 degrees of freedom
    text = r.path.read_text()
    assert "## Tasks run more than once" in text and f"| {T3} | 4 | 3 | 2.23x | " in text
    assert "1 tasks (4 task-runs) in 4 run(s)" in text
