"""The judge: the process that decides whether a candidate is correct and how fast it is. It never imports one.

The judge process (:mod:`stark_ray.eval.judge.main`) is started by the service like any process of the
evaluator (:mod:`stark_ray.eval.proc.runner`), not isolated, and starts the worker that runs the candidates (isolated
when asked, with a hot spare on a GPU). For each candidate the service sends, the judge

1. keeps the task's reference (the task is checked once: forward runs, its outputs can be compared, two calls on
   the same inputs agree);
2. has the worker ``load`` the candidate (this step and the next four: :mod:`stark_ray.eval.judge.judgement`);
3. runs every trial (:mod:`stark_ray.eval.judge.trials`): makes the inputs and the reference's outputs here, shares a
   copy of the inputs and one slot per output tensor with the worker (:mod:`stark_ray.eval.wire.exchange`), has it
   ``run`` the candidate, and compares the slots with its own reference outputs and its copy of the inputs with
   the originals — nothing the worker says is needed to reject a wrong output, and nothing it says can make one
   pass;
4. has the worker ``time`` it against the reference (its claim: events, the profile's streams and own kernels);
5. confirms a speedup above 2x with its own wall clock (:mod:`stark_ray.eval.judge.confirmation`);
6. ends the candidate; a worker that tampered (its fingerprint changed), broke the protocol, modified inputs,
   memoised or was not confirmed never serves another candidate.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend
from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.judge.drift import pace, reading, slower
from stark_ray.eval.judge.judgement import Judgement, release_cached
from stark_ray.eval.judge.memory import JudgeMemory
from stark_ray.eval.judge.reference_checks import check_determinism, check_outputs
from stark_ray.eval.judge.sol import Peaks, stamp, task_sol
from stark_ray.eval.judge.trials import JudgeTask, standard_trial
from stark_ray.eval.judge.verdicts import Decided, checked_answer
from stark_ray.eval.measure.laps import Laps
from stark_ray.eval.measure.memory import (
    KEPT_SHARE,
    Footprint,
    OverBudget,
    check_fits,
    meta_footprint,
    param_bytes,
    plan_for,
)
from stark_ray.eval.proc.garbage import collect_after, collect_all
from stark_ray.eval.proc.outcome import BUILDS_KEPT, build_time_out, limits_for, lost_result
from stark_ray.eval.proc.phase_clock import PhaseClock
from stark_ray.eval.proc.runner import Reply, WorkerProcess, WorkerStartError
from stark_ray.eval.tasks import TaskError, load_reference, task_key
from stark_ray.eval.wire.exchange import ExchangeError
from stark_ray.eval.wire.protocol import (
    MODE_CANDIDATE,
    MODE_REFERENCE,
    OP_END,
    OP_PING,
    OP_REFERENCE,
    OP_RELEASE,
    PHASE_COMPILE,
    WorkerRequest,
    result_from_message,
)
from stark_ray.eval.worker.guards import nbytes_of
from stark_ray.records import STAGE_RUNTIME, EvalResult, one_line

Send = Callable[[dict[str, Any]], None]
KEPT_TASKS = 32  # task references the judge keeps, as the worker does
KEPT_CPU_BYTES = 4 << 30
RESERVED_SHARE = 0.1  # after a candidate, cached blocks beyond this share of the device go back to it
GB = 1e9
PINGS = 5  # round trips measured to a fresh worker (the least counts)


class Judge:
    """Serves the service's requests inside the judge process."""

    def __init__(self, backend: Backend, worker: WorkerProcess, free_at_start: int = 0, peaks: Peaks | None = None):
        self.backend = backend
        self.peaks = peaks  # the device's limits, for each task's speed of light (None: not told)
        self.worker = worker
        self.tasks: OrderedDict[str, JudgeTask] = OrderedDict()
        self.round_trip_s = 0.0  # the worker's least message round trip (measure_round_trip) ...
        self.round_trip_of = -1  # ... for the process of this start (WorkerProcess.starts)
        self.memory = JudgeMemory(backend.device, free_at_start, worker)
        self.candidate_source: str | None = None  # the candidate being served, for a crash's location
        self.build_times: deque[float] = deque(maxlen=BUILDS_KEPT)  # its worker's latest builds (imports), seconds
        self.seq = 0  # steps sent to the worker so far

    def release_others(self, allowance: int, clock: PhaseClock | None) -> None:
        """Before a new task's first trial: the other tasks' states down to ``allowance`` bytes, here and in the
        worker, and their memory back to the device."""
        self._drop_oldest(allowance, None)
        release_cached(self.backend.device)
        if clock is not None and self.worker.alive:
            try:
                self._step(OP_RELEASE, {"keep": allowance}, clock)
            except Decided:  # it died or misbehaved: a fresh one holds nothing
                self.worker.kill()

    # -- tasks ------------------------------------------------------------------------------------------------
    def task(self, req: WorkerRequest, cfg: EvalConfig, clock: PhaseClock | None = None) -> JudgeTask:
        """The task's reference, checked once: forward runs, returns something comparable, and is deterministic;
        its footprint measured and the memory plan chosen (a task that cannot fit the budget: OverBudget)."""
        self.memory.set_budget(cfg)
        key = task_key(req.task_source, cfg.seed)
        task = self.tasks.get(key)
        if task is not None:
            self.tasks.move_to_end(key)
            if task.footprint is not None and task.plan is not None and self.memory.budget != task.planned_for:
                check_fits(task.name, task.footprint, self.memory.budget, measured=True)  # another request's budget
                self._plan(task)
            self._tell_plan(task)
            return task
        name, device = req.task_name, self.backend.device
        self.memory.cap_self()
        try:
            module, model, init_inputs = load_reference(name, req.task_source, cfg.seed, device)
            task = JudgeTask(name, module, model, init_inputs, device, cfg.seed)
            if self.memory.budget:  # room for it first: what other tasks keep, here and in the worker
                shapes = self._check_shapes(task)
                self.release_others(plan_for(shapes, self.memory.budget).kept_others if shapes else 0, clock)
                self.memory.cap_self()
            before = self._measure_start()
            first = standard_trial(task, cfg, 0)
        except torch.OutOfMemoryError:
            if not self.memory.budget:
                raise
            raise OverBudget(f"task {name} needs more than its budget of {self.memory.budget / GB:.1f} GB: its "
                             "reference ran out of memory on its first trial") from None
        task.input_bytes = first.input_bytes
        check_outputs(name, first.ref)
        if before is not None:  # the first trial: its inputs made, the reference run on a copy of them
            work = torch.cuda.max_memory_allocated() - before - 2 * first.input_bytes
            outputs = sum(nbytes_of(first.ref))
            task.footprint = Footprint(first.input_bytes, outputs, max(work, outputs), param_bytes(model))
            check_fits(name, task.footprint, self.memory.budget, measured=True)
            self._plan(task)
        check_determinism(task, first, cfg)
        task.sol = task_sol(task.module, task.init_inputs, task.get_inputs, self.peaks)
        self.tasks[key] = task
        self._evict(key)
        self._tell_plan(task)
        return task

    def _plan(self, task: JudgeTask) -> None:
        assert task.footprint is not None
        task.plan = plan_for(task.footprint, self.memory.budget)
        task.planned_for = self.memory.budget
        task.cache.limit(task.plan.trial_cache)

    def _check_shapes(self, task: JudgeTask) -> Footprint | None:
        """OverBudget before anything large is made, where the task's shapes alone (on the meta device) show that it
        cannot fit; the footprint by shapes (None where the task cannot be made on the meta device)."""
        try:
            shapes = meta_footprint(task.module, task.init_inputs, task.get_inputs)
        except Exception:  # measured on its first trial instead
            return None
        check_fits(task.name, shapes, self.memory.budget, measured=False)
        return shapes

    def _measure_start(self) -> int | None:
        if self.backend.device != "cuda":
            return None
        self.memory.close_interval()
        return torch.cuda.memory_allocated()

    def _tell_plan(self, task: JudgeTask) -> None:
        self.memory.plan = {"plan": task.plan.to_json()} if task.plan is not None else {}

    def _evict(self, keep: str) -> None:
        current = self.tasks[keep]
        if self.backend.device != "cuda":
            limit = KEPT_CPU_BYTES
        elif current.plan is not None:  # the others' share of the budget, beside this task's own
            limit = current.held_bytes() + current.plan.kept_others
        else:
            limit = int(KEPT_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        self._drop_oldest(limit, keep)

    def _drop_oldest(self, limit: int, keep: str | None) -> None:
        """Forget the least recently used tasks beyond KEPT_TASKS or ``limit`` bytes held, never ``keep``."""
        while self.tasks:
            if len(self.tasks) <= KEPT_TASKS and sum(t.held_bytes() for t in self.tasks.values()) <= limit:
                return
            oldest = next(iter(self.tasks))
            if oldest == keep:
                return
            del self.tasks[oldest]
            collect_all()  # what of its reference is a cycle was frozen: thawed and collected
            release_cached(self.backend.device)

    # -- requests ---------------------------------------------------------------------------------------------
    def handle(self, req: WorkerRequest, send: Send) -> dict[str, Any]:
        """The answer to one request of the service (the result, and what the worker went through)."""
        cfg = EvalConfig(**req.cfg)
        extra: dict[str, Any] = {}
        self.memory.reset()
        try:
            if req.mode == MODE_REFERENCE:
                result = self.reference(req, cfg, send)
            elif req.mode == MODE_CANDIDATE:
                result = self.candidate(req, cfg, send)
            else:
                result = EvalResult.failed(STAGE_RUNTIME, f"the judge does not serve {req.mode!r} requests")
        except OverBudget as e:  # not the candidate's fault, nor the task's: this device, at this budget
            result = EvalResult.failed(STAGE_RUNTIME, str(e))
            result.flags += ["task_error", "over_budget"]
        except TaskError as e:
            result = EvalResult.failed(STAGE_RUNTIME, str(e), traceback.format_exc())
            result.flags.append("task_error")
        except WorkerStartError as e:  # the host cannot run a worker: the service says so in one line
            result = EvalResult.failed(STAGE_RUNTIME, str(e))
            extra["evaluator_error"] = str(e)
        except ExchangeError as e:
            if "OUT_OF_MEMORY" in str(e):
                result = self._out_of_memory(req, e)
            else:
                result = EvalResult.failed(STAGE_RUNTIME, f"task {req.task_name}: its inputs cannot be shared "
                                                          f"with the worker ({e})")
                result.flags.append("task_error")
        except torch.OutOfMemoryError as e:  # the device is full: not a verdict on anything
            result = self._out_of_memory(req, e)
        except Exception as e:  # a fault of the judge's own
            self.worker.kill()
            result = EvalResult.failed(STAGE_RUNTIME, f"the judge failed: {describe_exception(e)}",
                                       traceback.format_exc())
        peak = self.memory.peak_bytes()
        if peak is not None:
            result.peak_memory_gb = round(peak / GB, 3)
        stamp(result, known.sol if (known := self.tasks.get(task_key(req.task_source, cfg.seed))) else None)
        left = self.worker.sweep()
        if left:  # processes a candidate started and left running: killed, and said
            result.add_line(f"killed {left} process(es) the candidate left running")
        healthy = self.backend.healthy()
        return {"result": asdict(result), "healthy": healthy,
                "worker": {"starts": self.worker.starts, "promotions": self.worker.promotions,
                           "spares": self.worker.spares.wanted, "spare_misses": self.worker.spares.misses,
                           "start_phases": self.worker.hello.get("start_phases"),
                           "spare_ready": self.worker.spare_ready()}, **extra}

    def _out_of_memory(self, req: WorkerRequest, e: BaseException) -> EvalResult:
        self.worker.kill()  # what the worker holds goes back (a candidate may be what filled the device)
        release_cached(self.backend.device)
        return EvalResult(compiled=req.mode == MODE_CANDIDATE, stage=STAGE_RUNTIME, flags=["out_of_memory"],
                          error=f"the device ran out of memory while the judge ran the trials "
                                f"({describe_exception(e)}); the worker was replaced")

    def _clock(self, cfg: EvalConfig, send: Send) -> PhaseClock:
        return PhaseClock(limits_for(cfg), on_enter=lambda phase: send({"phase": phase}))

    def reference(self, req: WorkerRequest, cfg: EvalConfig, send: Send) -> EvalResult:
        clock = self._clock(cfg, send)
        laps = Laps()  # where a reference's seconds go, said in its log
        if self.worker.ahead:  # its worker started between requests (WorkerProcess.start_ahead)
            laps.add(*self.worker.ahead)
        task = self.task(req, cfg, clock)
        laps.lap("task")
        try:
            msg = self._time_alone(task, req, cfg, clock, laps)
            if "failed" in msg:
                failed = result_from_message(msg["failed"])
                raise TaskError(failed.error or "the reference could not be timed")
            result = result_from_message(msg["result"])
            result.kernels = one_line(result.kernels, 800) if isinstance(result.kernels, str) else None
            if task.footprint is not None and task.plan is not None:  # what the budget was measured against
                result.add_line(f"device memory: needs {task.footprint.needs() / GB:.1f} GB of a budget of "
                                  f"{task.planned_for / GB:.1f} GB ({task.footprint.describe()}); "
                                  f"{task.plan.describe()}")
            result.add_line(laps.line())
            return result
        except Decided as stop:
            if stop.recycle:
                self.worker.kill()
            raise TaskError(f"task {req.task_name}: reference {stop.result.error}") from None
        except (KeyError, TypeError) as e:
            self.worker.kill()
            raise TaskError(f"task {req.task_name}: the worker's answer was malformed ({e})") from None

    def _time_alone(self, task: JudgeTask, req: WorkerRequest, cfg: EvalConfig, clock: PhaseClock,
                    laps: Laps | None = None) -> dict[str, Any]:
        """The reference timed against itself in a worker no candidate has run in (the one that served candidates
        is ended first): the worker's answer, and the task's ``alone_ms`` (the yardstick of eval/judge/drift.py). Each
        step's seconds go on ``laps``."""
        laps = laps or Laps()
        if self.worker.alive and self.worker.served:
            self.worker.kill()
        before = self.pace(task, cfg)
        laps.lap("pace/before")
        if start := self.worker.start_lap():  # its start, said apart
            laps.add(*start)
        msg = self._step(OP_REFERENCE, {"task_name": req.task_name, "task_source": req.task_source, "cfg": req.cfg},
                         clock, label="while timing the reference")
        laps.lap("timing")  # the reference's checks and timing in the worker
        alone = msg.get("result", {}).get("runtime_ms") if isinstance(msg.get("result"), dict) else None
        task.alone_ms, task.alone_min_ms = reading(alone), reading(msg.get("fastest_ms"))
        after = self.pace(task, cfg)
        laps.lap("pace/after")
        task.alone_pace_s = slower(before, after)  # a burst on the host around the alone timing shows in one
        return msg

    def pace(self, task: JudgeTask, cfg: EvalConfig) -> float | None:
        """The judge's own pace of the reference (eval/judge/drift.py), the worker stopped meanwhile: under the memory
        budget less what the worker holds, and what it cached given back after."""
        self.memory.cap_self()
        try:
            with self.worker.stopped():
                return pace(task, cfg)
        finally:
            release_cached(self.backend.device)

    def candidate(self, req: WorkerRequest, cfg: EvalConfig, send: Send) -> EvalResult:
        clock = self._clock(cfg, send)
        task = self.task(req, cfg, clock)
        if task.alone_ms is None:  # this judge has not timed it (evicted, a resumed run, another evaluator timed it)
            quiet = PhaseClock(limits_for(cfg))  # its phases are not the candidate's: the service hears none of them
            with contextlib.suppress(Decided, KeyError, TypeError):  # no yardstick: the drift check is off for it
                self._time_alone(task, req, cfg, quiet)
            quiet.close()
        started = time.perf_counter()
        held = torch.cuda.memory_allocated() if self.backend.device == "cuda" else None
        self.candidate_source = req.candidate_source
        try:
            result = Judgement(self, task, req, cfg, clock).evaluate()
            if self.worker.alive:  # it forgets the candidate; its fingerprint is checked once more
                self._step(OP_END, {}, clock)
        except Decided as stop:
            if stop.recycle:
                self.worker.kill()
            result = stop.result
        finally:
            self.candidate_source = None
            self._retire_worker(cfg)
        clock.close()
        collect_after(self.backend.device, held, task.input_bytes)  # a cycle holding a trial's gigabytes, say
        if held is not None:  # what this candidate cost the judge's device memory, and what it kept before
            self.memory.close_interval()
            result.add_line(f"judge device memory: peak {self.memory.own_peak / GB:.2f} GB, "
                              f"{held / GB:.2f} GB held before, {torch.cuda.memory_allocated() / GB:.2f} GB after; "
                              f"judge and worker together at most {self.memory.peak / GB:.2f} GB")
        release_cached(self.backend.device, RESERVED_SHARE)  # a large task's trials, freed: back to the device
        result.eval_s = time.perf_counter() - started
        return result

    def _retire_worker(self, cfg: EvalConfig) -> None:
        """After a candidate: its worker process ends once it has served ``cfg.worker_candidates`` (on a GPU by
        default every time): whatever the candidate left in that interpreter — code objects rewritten in place,
        global hooks, a hook on the kept reference, threads, files in its private /tmp — ends with it, before any
        other candidate runs. The next request gets a fresh process (the spare, where one waits)."""
        fresh = self.backend.device == "cuda" and cfg.baseline != "compile"  # (a compiled reference: per worker)
        limit = cfg.worker_candidates or (1 if fresh else self.worker.max_requests)
        self.worker.served += 1
        if self.worker.alive and self.worker.served >= min(limit, self.worker.max_requests):
            self.worker.kill()

    # -- talking to the worker ------------------------------------------------------------------------------
    def measure_round_trip(self, clock: PhaseClock) -> None:
        """The least of PINGS round trips of a message to the worker (``round_trip_s``), for the process started
        last, which has not imported a candidate yet: nothing a candidate does later can lengthen the figure."""
        self.round_trip_s, self.round_trip_of = min(self.ping(clock) for _ in range(PINGS)), self.worker.starts

    def ping(self, clock: PhaseClock) -> float:
        """One round trip of a message to the worker (seconds)."""
        started = time.perf_counter()
        self._step(OP_PING, {}, clock)
        return time.perf_counter() - started

    def _step(self, op: str, payload: dict[str, Any], clock: PhaseClock, fds: list[int] | None = None,
              label: str = "") -> dict[str, Any]:
        """One step of the worker's: its answer, checked; a Decided when it died, timed out, tampered, or the
        candidate raised (``label`` says where)."""
        fields = self.memory.fields(op)
        if op != OP_PING:  # a ping measures the bare round trip
            self.memory.close_interval()
        seq = self.next_seq()
        reply = self.worker.converse({"op": op, "seq": seq, **payload, **fields}, clock, fds or ())
        for fd in fds or ():
            with contextlib.suppress(OSError):
                os.close(fd)
        return self.answer(reply, clock, label, seq)

    def next_seq(self) -> int:
        """The number of the next step sent to the worker (its answer carries it back)."""
        self.seq += 1
        return self.seq

    def answer(self, reply: Reply, clock: PhaseClock, label: str, seq: int) -> dict[str, Any]:
        if reply.msg is None:
            lost = lost_result(reply.phase, reply.timed_out, reply.returncode, reply.log, clock.limit(),
                               source=self.candidate_source)
            if reply.timed_out and reply.phase == PHASE_COMPILE:  # the build's time, not a stack (outcome.py)
                lost = build_time_out(lost, reply.log, clock.limit(), list(self.build_times))
            raise Decided(lost)
        self.memory.note(reply.msg)
        if reply.msg.get("healthy") is False:  # a sticky device error, or it tampered: it exits after this answer
            self.worker.close_current()
        return checked_answer(reply.msg, label, seq)
