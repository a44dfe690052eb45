"""The data model, defined once.

A search tree is made of :class:`Node` s; each evaluated node carries an :class:`EvalResult`; every LLM call
yields an :class:`LLMUsage`. All three flatten to plain records (dicts of str/int/float/bool/None) — the same
records become Parquet rows: :func:`attempt_schema` and :func:`llm_call_schema` type exactly these fields
(plus run_id, task and seq), which tests/test_records.py keeps true.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Which agent wrote a node.
AGENT_REFERENCE = "reference"
AGENT_PLAN_CODE = "plan+code"
AGENT_DEBUG = "debug"
AGENT_SINGLE = "single"

# Where an evaluation stopped.
STAGE_OK = "ok"
STAGE_PARSE = "parse"  # the agent produced no candidate (bad reply, invalid scaffold, LLM failure)
STAGE_COMPILE = "compile"  # import / build of ModelNew failed
STAGE_RUNTIME = "runtime"  # ModelNew raised while running
STAGE_CORRECTNESS = "correctness"  # ran, but outputs differ from the reference
STAGE_TIMEOUT = "timeout"
STAGE_CRASH = "crash"  # the worker process died (segfault, abort, OOM kill)

# Flags that keep a result that passed the checks from being accepted: a speedup the judge's wall clock did not
# confirm, a candidate that launched no kernel of its own (only library ops), and one whose kernels ran on a stream
# not ordered with the caller's (its timing cannot see all of its work).
REJECTING_FLAGS = ("suspicious", "no_kernel", "unordered_stream")

LOG_LIMIT = 4000  # characters of log kept per attempt (for the debug agent and the Parquet row)


def source_digest(source: str) -> str:
    """A candidate's short name for bookkeeping (which one was running when an evaluator died)."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def excerpt(text: str, limit: int = LOG_LIMIT) -> str:
    """Keep the head and the tail of a long log: compilers put the first error early, Python the last."""
    text = text.replace("\r\n", "\n")
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head - 40
    return f"{text[:head]}\n... [{len(text) - head - tail} characters cut] ...\n{text[-tail:]}"


def one_line(text: str, limit: int = 300) -> str:
    """Collapse all whitespace (newlines included), drop what is not printable (no escape sequence a candidate
    wrote reaches a terminal) and cut to ``limit`` characters: an error message's form."""
    flat = "".join(ch for ch in " ".join(str(text).split()) if ch.isprintable())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass
class EvalResult:
    """What the evaluator observed about one candidate."""

    compiled: bool = False
    passed_checks: bool = False  # ran and matched the reference on every check (whether it was then timed or not)
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    speedup: float | None = None
    stage: str = STAGE_COMPILE
    error: str | None = None  # one line: what went wrong
    log: str = ""  # excerpt of compiler / runtime output, for the debug agent
    max_abs_err: float | None = None
    rel_err: float | None = None
    flags: list[str] = field(default_factory=list)
    compile_s: float | None = None
    eval_s: float | None = None
    ref_compile_runtime_ms: float | None = None  # torch.compile(reference), same worker and run (--baseline)
    runtime_cv: float | None = None  # std / mean of the candidate's timed calls
    ref_runtime_cv: float | None = None
    # the speedup's relative standard error, from the ratios of the calls timed in pairs (eval/measure/noise.py); above
    # 0.05 the speedup is noisy (measured twice, the tighter kept)
    speedup_err: float | None = None
    device: str | None = None  # where it was evaluated: "<host>:gpu<index>" (the physical GPU) or "<host>:cpu"
    # the device's memory in use at its highest during the evaluation (GB), sampled by the judge every 5 ms: every
    # process on the device, CUDA contexts included (what nvidia-smi shows). None off the GPU.
    peak_memory_gb: float | None = None
    # the task's speed of light on this device (eval/judge/sol.py: its least bytes over the measured bandwidth, its
    # FLOPs over the peak; ms), which floor sets it ("memory" or "compute"), and speed of light / runtime (1.0: at it)
    sol_ms: float | None = None
    sol_bound: str | None = None
    sol_fraction: float | None = None
    # where one call's GPU time goes, by the profile the worker takes before timing (eval/measure/kernel_times.py): its
    # launches, then its kernels by name with their time and share. The candidate's process measured it: an
    # observation for the agents, never a verdict. None off the GPU or without a profiler.
    kernels: str | None = None
    # --profile ncu: the top kernel's Nsight Compute counters, one line (eval/ncu.py), or why there are none
    profile: str | None = None
    # the precision contract (eval/judge/precision.py): the candidate's error on the first trial over the reference's
    # own float32 error against float64 (above 32: reduced_precision), and the math modes the reference computed in
    precision_ratio: float | None = None
    math_modes: str | None = None
    # the judge's line for each informational flag it explains ("flag: line", one per line): by how much and why
    findings: str | None = None
    # the judge's lines on how it measured the claim (timed again, noisy, the reference slowed beside it, confirmed by
    # its own clock or not, capped), one per line: what the agents are told of the figures' standing
    notes: str | None = None

    @property
    def accepted(self) -> bool:
        """A success: passed the checks, was timed, and is not flagged as suspicious, as launching no kernel of its
        own or as running on an unordered stream (a REJECTING_FLAGS flag). Only accepted candidates are scored,
        searched from with the plan agent and counted as successes."""
        return (self.compiled and self.passed_checks and self.runtime_ms is not None
                and not any(f in REJECTING_FLAGS for f in self.flags))

    def add_line(self, line: str) -> None:
        """One more line at the end of the log (which keeps its tail when cut)."""
        self.log = excerpt(f"{self.log}\n{line}" if self.log else line)

    @staticmethod
    def failed(stage: str, error: str, log: str = "") -> EvalResult:
        return EvalResult(compiled=stage not in (STAGE_PARSE, STAGE_COMPILE), stage=stage, error=error,
                          log=excerpt(log))


@dataclass
class LLMUsage:
    """One LLM call: who asked, what it cost, how it went."""

    role: str
    provider: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    ok: bool = True
    error: str | None = None
    node_id: int | None = None  # the node this call produced (set once known)
    replay_entry: int | None = None  # a replayed call: the cassette entry that answered it (its index, from 0)
    # a replayed call: how its entry matched the prompt — "hash" (the same prompt), "shape" (the same up to measured
    # numbers and the hardware description) or "order" (a prompt the cassette does not hold: the role's next entry)
    replay_match: str | None = None

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_record(rec: dict[str, Any]) -> LLMUsage:
        names = {f.name for f in fields(LLMUsage)}
        return LLMUsage(**{k: v for k, v in rec.items() if k in names})


@dataclass
class Node:
    """One node of a search tree. The root is the reference; every other node is one evaluated candidate."""

    id: int
    parent: int | None
    depth: int
    source: str
    agent: str
    instruction: str = ""  # what the agent was asked to do (plan instructions, or the debug intent)
    scaffold: str | None = None  # the plan agent's anchored scaffold, when there was one
    result: EvalResult = field(default_factory=EvalResult)
    children: list[int] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def accepted(self) -> bool:
        """Its result is accepted (:attr:`EvalResult.accepted`)."""
        return self.result.accepted

    @property
    def score(self) -> float:
        """Lower is better: runtime relative to the reference timed in the same worker run (1/speedup, so
        drift of the host between runs cancels out); the reference itself scores 1. +inf when not accepted."""
        if not self.result.accepted:
            return math.inf
        if self.is_root:
            return 1.0
        if self.result.speedup:
            return 1.0 / self.result.speedup
        return math.inf if self.result.runtime_ms is None else self.result.runtime_ms

    # --- plain records -------------------------------------------------------------------------------
    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "node_id": self.id,
            "parent_id": self.parent,
            "depth": self.depth,
            "agent": self.agent,
            "instruction": self.instruction,
            "scaffold": self.scaffold,
            "source": self.source,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
        }
        r = asdict(self.result)
        r["flags"] = ",".join(self.result.flags)
        rec.update(r)
        return rec

    @staticmethod
    def from_record(rec: dict[str, Any]) -> Node:
        res_names = {f.name for f in fields(EvalResult)}
        res = {k: rec[k] for k in res_names if k in rec}
        if "passed_checks" not in rec and "correct" in rec:  # a row recorded before the column's rename
            res["passed_checks"] = rec["correct"]
        flags = res.get("flags") or ""
        res["flags"] = [f for f in flags.split(",") if f] if isinstance(flags, str) else list(flags)
        return Node(
            id=int(rec["node_id"]),
            parent=None if rec.get("parent_id") is None else int(rec["parent_id"]),
            depth=int(rec["depth"]),
            source=rec["source"],
            agent=rec["agent"],
            instruction=rec.get("instruction") or "",
            scaffold=rec.get("scaffold"),
            result=EvalResult(**res),
            input_tokens=int(rec.get("input_tokens") or 0),
            output_tokens=int(rec.get("output_tokens") or 0),
            cost_usd=float(rec.get("cost_usd") or 0.0),
        )


# --- Arrow schemas (pyarrow imported lazily so the core stays light) --------------------------------------
def attempt_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("task", pa.string()),
            ("seq", pa.int64()),  # order in which the attempt finished (0 = the reference)
            ("recorded_at", pa.timestamp("us", tz="UTC")),  # when the store took the row
            ("node_id", pa.int64()),
            ("parent_id", pa.int64()),
            ("depth", pa.int64()),
            ("agent", pa.string()),
            ("instruction", pa.string()),
            ("scaffold", pa.string()),
            ("source", pa.string()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("cost_usd", pa.float64()),
            ("compiled", pa.bool_()),
            ("passed_checks", pa.bool_()),  # EvalResult.passed_checks (runs before 2026-12 called it "correct")
            ("runtime_ms", pa.float64()),
            ("ref_runtime_ms", pa.float64()),
            ("speedup", pa.float64()),
            ("stage", pa.string()),
            ("error", pa.string()),
            ("log", pa.string()),
            ("max_abs_err", pa.float64()),
            ("rel_err", pa.float64()),
            ("flags", pa.string()),
            ("compile_s", pa.float64()),
            ("eval_s", pa.float64()),
            ("ref_compile_runtime_ms", pa.float64()),
            ("runtime_cv", pa.float64()),
            ("ref_runtime_cv", pa.float64()),
            ("speedup_err", pa.float64()),
            ("device", pa.string()),
            ("peak_memory_gb", pa.float64()),
            ("sol_ms", pa.float64()),
            ("sol_bound", pa.string()),
            ("sol_fraction", pa.float64()),
            ("kernels", pa.string()),
            ("profile", pa.string()),
            ("precision_ratio", pa.float64()),
            ("math_modes", pa.string()),
            ("findings", pa.string()),
            ("notes", pa.string()),
        ]
    )


# Columns renamed since runs were first recorded: table -> {new name: old name}. Readers take the old column where
# a file has no new one, so older runs stay readable (and resumable).
RENAMED_COLUMNS: dict[str, dict[str, str]] = {"attempts": {"passed_checks": "correct"}}


def llm_call_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("task", pa.string()),
            ("seq", pa.int64()),
            ("role", pa.string()),
            ("provider", pa.string()),
            ("model", pa.string()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("cost_usd", pa.float64()),
            ("latency_s", pa.float64()),
            ("ok", pa.bool_()),
            ("error", pa.string()),
            ("node_id", pa.int64()),
            ("replay_entry", pa.int64()),
            ("replay_match", pa.string()),
        ]
    )
