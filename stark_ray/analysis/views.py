"""DuckDB views for analysing runs: the store's ``attempts`` and ``llm_calls``, and derived ``judged``, ``best``,
``tasks`` and ``runs``.

``connect(dir)`` accepts a run directory (it holds ``run.json`` or ``attempts/``) or a directory of run
directories (a campaign of runs, e.g. ``runs/``), whose runs are united. Everywhere ``run_id`` is the name of
the run directory. A single run keeps the live views of :func:`stark_ray.store.read.connect`; several runs are
read through it once each and held in memory.

Views (columns in ``TASK_COLUMNS`` and the docstrings of the SQL below):

- ``attempts``, ``llm_calls``: the store's rows (``records.attempt_schema`` / ``llm_call_schema``).
- ``judged``: every attempts row plus ``accepted`` (:attr:`EvalResult.accepted`: compiled, passed the checks, timed
  and not flagged ``suspicious``, ``no_kernel`` or ``unordered_stream``; flags are stored as one comma-separated
  string), ``failure`` (NULL when accepted, else the stage, or ``rejected: <flag>`` for a candidate that passed the
  checks but is kept off the leaderboard),
  ``speedup_vs_compile`` (the row's ``ref_compile_runtime_ms / runtime_ms``) and ``best_speedup_so_far`` (the
  highest speedup of an accepted candidate of the task up to this seq; NULL before the first one).
- ``best``: the best candidate per (run_id, task), as the search's leaderboard ranks them: accepted, not the
  reference, highest speedup, then lowest runtime, then earliest. Tasks without an accepted candidate have no row.
- ``tasks``: one row per (run_id, task), see :data:`TASK_COLUMNS`.
- ``runs``: one row per run directory with the settings its ``run.json`` records (NULL where it has none).
- ``devices``: one row per (run_id, device) — where attempts were evaluated (``<host>:gpu<N>`` or ``<host>:cpu``;
  ``unknown`` for rows written before the column existed): ``evaluations`` (references included),
  ``candidates``, ``tasks``, ``busy_s`` (sum of ``eval_s``), ``first_at``/``last_at`` (``recorded_at``), and for
  the search: ``search_busy_s`` (the candidates' ``eval_s``), ``span_s`` (from the first candidate's start, its
  ``recorded_at`` less its ``eval_s``, to the last candidate's row) and ``busy_share`` (search_busy_s / span_s: how
  busy the device was while the search ran). The references are timed before the search and written together,
  so they are left out of the share (counted with them, a device could be busy 128% of the time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb

from stark_ray.records import REJECTING_FLAGS
from stark_ray.store import read
from stark_ray.store.location import Location, locate

RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
TABLES = ("attempts", "llm_calls")

TASK_COLUMNS: dict[str, str] = {
    "run_id": "the run directory's name",
    "task": "the task's name (KernelBench tasks: level{N}/{id}_{Name})",
    "level": "KernelBench level from the name or the run.json path (level{N}/{id}_{Name}.py), else NULL",
    "path": "the task file as run.json records it, else NULL",
    "status": "finished | interrupted | failed | capped, from the task's summary.json, else NULL",
    "ref_runtime_ms": "PyTorch eager reference runtime (seq 0's runtime_ms)",
    "ref_compile_runtime_ms": "torch.compile(reference) runtime when measured (seq 0's, else the best row's)",
    "best_seq": "seq of the best candidate: the one the runoff named where it held one, else the search's fastest "
                "accepted (NULL without an accepted one)",
    "best_runtime_ms": "runtime of the best candidate as the search measured it",
    "best_speedup": "speedup of the best candidate vs eager (its reference timed in the same run): the runoff's "
                    "figure where it named the best (the geometric mean of its rounds), else the search's",
    "best_speedup_err": "the relative standard error of best_speedup where known (its 95% interval: about +-2x it)",
    "search_best_speedup": "the search's own highest accepted speedup (the runoff may name another node, or measure "
                           "the same one lower)",
    "best_speedup_vs_compile": "the best candidate vs torch.compile, when measured",
    "sol_ms": "the task's speed of light on its device (eval/judge/sol.py; NULL where not told, or before it was)",
    "sol_bound": "memory | compute: which floor sets the speed of light",
    "ref_sol_fraction": "speed of light / the reference's runtime (1.0: at the device's limit)",
    "best_sol_fraction": "speed of light / the best candidate's runtime",
    "best_flags": "the best candidate's informational flags (reduced_precision, faster_than_sol, large_speedup, ...), "
                  "comma-separated, else NULL",
    "runoff_node_id": "the node the runoff named best (search/runoff.py; summary.json), else NULL (no runoff, or "
                      "none of its contenders held)",
    "runoff_speedup": "that node's speedup in the runoff: its rounds' geometric mean, all taken in one sitting",
    "success": "an accepted candidate exists (EvalResult.accepted: passed the checks, timed, not flagged)",
    "attempts": "candidates evaluated (seq > 0; parse failures included, as the budget counts them)",
    "compiled_attempts": "candidates that compiled",
    "passed_checks_attempts": "candidates that passed the correctness checks (accepted, flagged or untimed)",
    "accepted_attempts": "accepted candidates",
    "rejected_attempts": "candidates that passed the checks but are flagged suspicious / no_kernel / unordered_stream",
    "attempts_to_first_accepted": "seq of the first accepted candidate (= attempts finished until then), else NULL",
    "llm_calls": "LLM calls recorded",
    "input_tokens": "prompt tokens (llm_calls rows; the attempts rows when a task has none)",
    "output_tokens": "completion tokens (same source)",
    "tokens": "input_tokens + output_tokens",
    "cost_usd": "LLM cost in USD (same source)",
}

_LEVEL_RE = r"(^|[/\\])level([0-9]+)[/\\][0-9]+_[^/\\]+$"


def run_dirs(path: str | Path | Location) -> list[Location]:
    """The run directories at ``path`` (a local path or a filesystem URI such as ``s3://bucket/runs``): itself
    when it is one, else its subdirectories that are, by name. FileNotFoundError when ``path`` does not exist,
    ValueError when it holds no run (or is not a URI pyarrow can open)."""
    p = locate(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such directory")
    if not p.is_dir():
        raise ValueError(f"{p}: not a directory (give a run directory or a directory of runs)")
    if is_run_dir(p):
        return [p]
    runs = [c for c in p.subdirs() if is_run_dir(c)]
    if not runs:
        raise ValueError(f"{p}: no run here (neither {RUN_FILE} nor attempts/ in it or in a subdirectory)")
    return runs


def is_run_dir(path: str | Path | Location) -> bool:
    loc = locate(path)
    return (loc / RUN_FILE).is_file() or (loc / "attempts").is_dir()


def connect(path: str | Path | Location) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the views ``attempts``, ``llm_calls``, ``judged``, ``best``,
    ``tasks``, ``runs`` and ``devices`` over the run(s) at ``path``."""
    runs = run_dirs(path)
    if len(runs) == 1:
        con = read.connect(runs[0])
        try:
            for table in TABLES:  # the store's live views, with run_id = the directory's name
                con.execute(f"ALTER VIEW {table} RENAME TO _store_{table}")
                con.execute(f"CREATE VIEW {table} AS SELECT * REPLACE ({_literal(runs[0].name)} AS run_id) "
                            f"FROM _store_{table}")
        except BaseException:
            con.close()
            raise
    else:
        con = duckdb.connect()
        try:
            _union(con, runs)
        except BaseException:
            con.close()
            raise
    try:
        _derived(con, runs)
    except BaseException:
        con.close()
        raise
    return con


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    """A query's result as dicts."""
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]


def task_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return rows(con, "SELECT * FROM tasks ORDER BY run_id, level NULLS LAST, task")


# --- internals ---------------------------------------------------------------------------------------------
def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _arrow(relation: Any) -> Any:
    """A relation as a pyarrow Table, under the method names of DuckDB 1.x and 2.x."""
    for name in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        method = getattr(relation, name, None)
        if method is not None:
            out = method()
            return out.read_all() if hasattr(out, "read_all") else out
    raise RuntimeError("this DuckDB cannot export Arrow tables")


def _union(con: duckdb.DuckDBPyConnection, runs: list[Location]) -> None:
    parts: dict[str, list[str]] = {t: [] for t in TABLES}
    for i, run in enumerate(runs):
        with read.connect(run) as one:
            for table in TABLES:
                name = f"_{table}_{i}"
                sql = f"SELECT * REPLACE ({_literal(run.name)} AS run_id) FROM {table}"
                con.register(name, _arrow(one.sql(sql)))
                parts[table].append(f"SELECT * FROM {name}")
    for table, selects in parts.items():
        con.execute(f"CREATE VIEW {table} AS " + " UNION ALL BY NAME ".join(selects))


def _derived(con: duckdb.DuckDBPyConnection, runs: list[Location]) -> None:
    con.execute("CREATE TABLE _task_info (run_id VARCHAR, task VARCHAR, path VARCHAR, status VARCHAR, "
                "runoff_node_id BIGINT, runoff_speedup DOUBLE, runoff_speedup_err DOUBLE)")
    con.execute("CREATE TABLE runs (run_id VARCHAR, run_dir VARCHAR, executor VARCHAR, provider VARCHAR, "
                "model VARCHAR, backend VARCHAR, baseline VARCHAR, policy VARCHAR, ablation VARCHAR, "
                "budget BIGINT, tasks BIGINT)")
    for run in runs:
        info, settings = _run_info(run)
        if info:
            con.executemany("INSERT INTO _task_info VALUES (?, ?, ?, ?, ?, ?, ?)", info)
        con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", settings)
    con.execute(f"CREATE MACRO _level(s) AS TRY_CAST(regexp_extract(s, {_literal(_LEVEL_RE)}, 2) AS INTEGER)")
    con.execute(_JUDGED.format(rejected=_rejected_sql()))
    con.execute(_BEST)
    con.execute(_TASKS)
    con.execute(_DEVICES)


def _rejected_sql() -> str:
    """SQL: the failure label of a row that passed the checks but is kept off the leaderboard by a flag (NULL when
    none applies)."""
    whens = " ".join(f"WHEN list_contains(_flags, {_literal(f)}) THEN {_literal('rejected: ' + f)}"
                     for f in REJECTING_FLAGS)
    return f"CASE {whens} END"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _read_json(path: Location) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _run_info(run: Location) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
    """Per task (run_id, task, path, status, runoff node, runoff speedup and its error) from run.json and the
    summaries; the run's settings row."""
    record = _read_json(run / RUN_FILE) or {}
    paths: dict[str, str | None] = {}
    for t in record.get("tasks") or []:
        if isinstance(t, dict) and t.get("name"):
            paths[str(t["name"])] = str(t["path"]) if t.get("path") else None
    status: dict[str, str | None] = {}
    named: dict[str, tuple[Any, Any, Any]] = {}
    summaries = [run / SUMMARY_FILE, *(run / "tasks").find(SUMMARY_FILE)]
    for s in summaries:
        try:
            data = _read_json(s)
        except ValueError:
            continue  # a summary is a convenience: a damaged one only leaves status NULL
        if data and data.get("task"):
            status[str(data["task"])] = data.get("status")
            held = data.get("runoff")
            winner = held.get("winner") if isinstance(held, dict) else None
            if isinstance(winner, int) and not isinstance(winner, bool):  # a damaged summary leaves them NULL
                named[str(data["task"])] = (winner, _number(data.get("best_speedup")),
                                            _number(data.get("best_speedup_err")))
    info = [(run.name, name, paths.get(name), status.get(name), *named.get(name, (None, None, None)))
            for name in sorted(set(paths) | set(status))]
    search, agents, ev = (record.get(k) or {} for k in ("search", "agents", "eval"))
    # the policy that ran: the ma_only ablation is Best-of-K with repairs whatever its policy setting says
    policy = "best_of_k" if search.get("ablation") == "ma_only" else search.get("policy")
    settings = (run.name, str(run), record.get("executor"), agents.get("provider"), agents.get("model"),
                ev.get("backend"), ev.get("baseline"), policy, search.get("ablation"),
                search.get("budget"), len(record["tasks"]) if isinstance(record.get("tasks"), list) else None)
    return info, settings


_JUDGED = """
CREATE VIEW judged AS
SELECT * EXCLUDE (_flags),
       CASE WHEN accepted THEN NULL
            WHEN coalesce(passed_checks, false) AND runtime_ms IS NOT NULL THEN coalesce({rejected}, 'rejected')
            WHEN coalesce(passed_checks, false) THEN 'untimed'
            ELSE coalesce(stage, 'unknown') END AS failure,
       CASE WHEN runtime_ms > 0 THEN ref_compile_runtime_ms / runtime_ms END AS speedup_vs_compile,
       max(CASE WHEN accepted AND seq > 0 THEN speedup END)
           OVER (PARTITION BY run_id, task ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
           AS best_speedup_so_far
FROM (
    SELECT *,
           coalesce(compiled, false) AND coalesce(passed_checks, false) AND runtime_ms IS NOT NULL
               AND NOT list_has_any(_flags, {flags}) AS accepted
    FROM (SELECT *, string_split(coalesce(flags, ''), ',') AS _flags FROM attempts)
)
""".replace("{flags}", "[" + ", ".join(_literal(f) for f in REJECTING_FLAGS) + "]")

_BEST = """
CREATE VIEW best AS
SELECT * EXCLUDE (_rank) FROM (
    SELECT *, row_number() OVER (PARTITION BY run_id, task
                                 ORDER BY speedup DESC NULLS LAST, runtime_ms ASC NULLS LAST, seq) AS _rank
    FROM judged WHERE accepted AND seq > 0
) WHERE _rank = 1
"""

_TASKS = """
CREATE VIEW tasks AS
WITH ref AS (
    SELECT run_id, task, any_value(runtime_ms) AS ref_runtime_ms,
           any_value(ref_compile_runtime_ms) AS ref_compile_runtime_ms, any_value(sol_ms) AS sol_ms,
           any_value(sol_bound) AS sol_bound, any_value(sol_fraction) AS ref_sol_fraction
    FROM judged WHERE seq = 0 GROUP BY run_id, task
), cand AS (
    SELECT run_id, task,
           count(*) FILTER (WHERE seq > 0) AS attempts,
           count(*) FILTER (WHERE seq > 0 AND coalesce(compiled, false)) AS compiled_attempts,
           count(*) FILTER (WHERE seq > 0 AND coalesce(passed_checks, false)) AS passed_checks_attempts,
           count(*) FILTER (WHERE seq > 0 AND accepted) AS accepted_attempts,
           count(*) FILTER (WHERE seq > 0 AND failure LIKE 'rejected%') AS rejected_attempts,
           min(seq) FILTER (WHERE seq > 0 AND accepted) AS attempts_to_first_accepted,
           sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens, sum(cost_usd) AS cost_usd
    FROM judged GROUP BY run_id, task
), calls AS (
    SELECT run_id, task, count(*) AS llm_calls, sum(input_tokens) AS input_tokens,
           sum(output_tokens) AS output_tokens, sum(cost_usd) AS cost_usd
    FROM llm_calls GROUP BY run_id, task
), named AS (  -- the runoff's choice where it made one (an accepted node of the search), else the search's best
    SELECT j.* FROM judged j JOIN _task_info i ON j.run_id = i.run_id AND j.task = i.task
                                                AND j.node_id = i.runoff_node_id
    WHERE j.accepted AND j.seq > 0
), chosen AS (
    SELECT * FROM named
    UNION ALL BY NAME
    SELECT * FROM best WHERE (run_id, task) NOT IN (SELECT (run_id, task) FROM named)
), keys AS (
    SELECT run_id, task FROM _task_info
    UNION SELECT run_id, task FROM attempts
    UNION SELECT run_id, task FROM llm_calls
)
SELECT k.run_id, k.task,
       coalesce(_level(k.task), _level(i.path)) AS level,
       i.path, i.status,
       ref.ref_runtime_ms,
       coalesce(ref.ref_compile_runtime_ms, b.ref_compile_runtime_ms) AS ref_compile_runtime_ms,
       b.seq AS best_seq, b.runtime_ms AS best_runtime_ms,
       CASE WHEN n.seq IS NOT NULL THEN coalesce(i.runoff_speedup, b.speedup) ELSE b.speedup END AS best_speedup,
       CASE WHEN n.seq IS NULL THEN b.speedup_err WHEN i.runoff_speedup IS NOT NULL THEN i.runoff_speedup_err
            ELSE b.speedup_err END AS best_speedup_err,
       s.speedup AS search_best_speedup,
       coalesce(b.speedup_vs_compile,
                CASE WHEN b.runtime_ms > 0 THEN ref.ref_compile_runtime_ms / b.runtime_ms END)
           AS best_speedup_vs_compile,
       ref.sol_ms, ref.sol_bound, ref.ref_sol_fraction, b.sol_fraction AS best_sol_fraction,
       nullif(b.flags, '') AS best_flags,
       i.runoff_node_id, i.runoff_speedup,
       b.seq IS NOT NULL AS success,
       coalesce(c.attempts, 0) AS attempts,
       coalesce(c.compiled_attempts, 0) AS compiled_attempts,
       coalesce(c.passed_checks_attempts, 0) AS passed_checks_attempts,
       coalesce(c.accepted_attempts, 0) AS accepted_attempts,
       coalesce(c.rejected_attempts, 0) AS rejected_attempts,
       c.attempts_to_first_accepted,
       coalesce(calls.llm_calls, 0) AS llm_calls,
       CAST(CASE WHEN calls.llm_calls > 0 THEN calls.input_tokens ELSE coalesce(c.input_tokens, 0) END AS BIGINT)
           AS input_tokens,
       CAST(CASE WHEN calls.llm_calls > 0 THEN calls.output_tokens ELSE coalesce(c.output_tokens, 0) END AS BIGINT)
           AS output_tokens,
       CAST(CASE WHEN calls.llm_calls > 0 THEN calls.input_tokens + calls.output_tokens
                 ELSE coalesce(c.input_tokens + c.output_tokens, 0) END AS BIGINT) AS tokens,
       CAST(CASE WHEN calls.llm_calls > 0 THEN calls.cost_usd ELSE coalesce(c.cost_usd, 0) END AS DOUBLE)
           AS cost_usd
FROM keys k
LEFT JOIN _task_info i USING (run_id, task)
LEFT JOIN ref USING (run_id, task)
LEFT JOIN cand c USING (run_id, task)
LEFT JOIN calls USING (run_id, task)
LEFT JOIN chosen b USING (run_id, task)
LEFT JOIN named n USING (run_id, task)
LEFT JOIN best s USING (run_id, task)
"""

_DEVICES = """
CREATE VIEW devices AS
SELECT run_id, device, evaluations, candidates, tasks, busy_s, search_busy_s, first_at, last_at, span_s,
       CASE WHEN span_s > 0 THEN search_busy_s / span_s END AS busy_share
FROM (
    SELECT run_id, coalesce(device, 'unknown') AS device, count(*) AS evaluations,
           count(*) FILTER (WHERE seq > 0) AS candidates, count(DISTINCT task) AS tasks,
           CAST(sum(coalesce(eval_s, 0)) AS DOUBLE) AS busy_s,
           CAST(sum(coalesce(eval_s, 0)) FILTER (WHERE seq > 0) AS DOUBLE) AS search_busy_s,
           min(recorded_at) AS first_at, max(recorded_at) AS last_at,
           max(epoch(recorded_at)) FILTER (WHERE seq > 0)
             - min(epoch(recorded_at) - coalesce(eval_s, 0)) FILTER (WHERE seq > 0) AS span_s
    FROM attempts GROUP BY ALL
)
"""
