"""The judge: the process that decides whether a candidate is correct and how fast it is. It never imports one.

The judge process (:mod:`stark_ray.eval.judge.main`) is started by the service like any process of the
evaluator (:mod:`stark_ray.eval.proc.runner`), not isolated, and starts the worker that runs the candidates (isolated
when asked, with a hot spare on a GPU). For each candidate the service sends, the judge

1. keeps the task's reference (the task is checked once: forward runs, its outputs can be compared, two calls on
   the same inputs agree);
2. has the worker ``load`` the candidate (this step and the next four: :class:`Judgement`, one per candidate);
3. runs every trial (:mod:`stark_ray.eval.judge.trials`): makes the inputs and the reference's outputs here, shares a
   copy of the inputs and one slot per output tensor with the worker (:mod:`stark_ray.eval.wire.exchange`), has it
   ``run`` the candidate, and compares the slots with its own reference outputs and its copy of the inputs with
   the originals — nothing the worker says is needed to reject a wrong output, and nothing it says can make one
   pass;
4. has the worker ``time`` it against the reference (its claim: events, the profile's streams and own kernels),
   and passes that claim through the claim stage's defences (:mod:`stark_ray.eval.judge.claim`: noise, own kernel,
   drift, ...);
5. the last of them confirms every claimed gain with its own wall clock (:mod:`stark_ray.eval.judge.confirmation`);
6. ends the candidate; a worker that tampered (its fingerprint changed), broke the protocol, modified inputs,
   memoised or was not confirmed never serves another candidate.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, replace
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend
from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.judge.claim import WORKER_FLAGS, Claim, Failed, judge_claim
from stark_ray.eval.judge.confirmation import Confirmation, confirm, unmeasured_bound
from stark_ray.eval.judge.drift import Drift, DriftCheck, pace, reading, slower
from stark_ray.eval.judge.memory import JudgeMemory, mark
from stark_ray.eval.judge.precision import Floor, float64_need, float64_too_slow, measure_floor, reduced
from stark_ray.eval.judge.reference_checks import check_determinism, check_outputs
from stark_ray.eval.judge.sol import Peaks, SpeedOfLight, stamp, task_sol
from stark_ray.eval.judge.trials import (
    AFTER_TIMING_LABEL,
    JudgeTask,
    Trial,
    after_timing_trial,
    all_trials,
    standard_inputs,
    standard_trial,
    synchronize,
    trial_label,
)
from stark_ray.eval.judge.verdicts import Decided, checked_answer, protocol_broken
from stark_ray.eval.judge.worker_batch import LABEL, WorkerBatch
from stark_ray.eval.measure.compare import TensorStub, compare_outputs, flatten_outputs, tensors_of
from stark_ray.eval.measure.inputs import nbytes_of, same_values
from stark_ray.eval.measure.kernel_times import describe, from_message
from stark_ray.eval.measure.laps import Laps
from stark_ray.eval.measure.math_modes import describe as describe_modes
from stark_ray.eval.measure.math_modes import math_modes
from stark_ray.eval.measure.memory import (
    KEPT_SHARE,
    Footprint,
    OverBudget,
    check_fits,
    meta_footprint,
    param_bytes,
    plan_for,
)
from stark_ray.eval.measure.noise import Measured, measured
from stark_ray.eval.measure.tolerance import Tolerances
from stark_ray.eval.proc.garbage import collect_after, collect_all
from stark_ray.eval.proc.outcome import BUILDS_KEPT, build_time_out, limits_for, lost_result
from stark_ray.eval.proc.phase_clock import PhaseClock
from stark_ray.eval.proc.runner import Reply, WorkerProcess, WorkerStartError
from stark_ray.eval.tasks import TaskError, load_reference, task_key
from stark_ray.eval.wire.exchange import ExchangeError
from stark_ray.eval.wire.outbox import Outbox
from stark_ray.eval.wire.protocol import (
    MODE_CANDIDATE,
    MODE_REFERENCE,
    OP_END,
    OP_GO,
    OP_LOAD,
    OP_PING,
    OP_REFERENCE,
    OP_RELEASE,
    OP_RUN,
    OP_TIME,
    PHASE_CHECK,
    PHASE_COMPILE,
    PHASE_TIME,
    WorkerRequest,
    failure_from_message,
    result_from_message,
)
from stark_ray.eval.wire.trees import decode_leaf_meta, decode_tree, encode_tree
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, STAGE_RUNTIME, EvalResult, excerpt, one_line

Send = Callable[[dict[str, Any]], None]
KEPT_TASKS = 32  # task references the judge keeps, as the worker does
KEPT_CPU_BYTES = 4 << 30
RESERVED_SHARE = 0.1  # after a candidate, cached blocks beyond this share of the device go back to it
GB = 1e9
# said in the log where a claim the judge did not bear out ended its worker (a warm one serves no more candidates)
WORKER_ENDED = "its worker ended after it: a claim not borne out, no further candidate in that process"
PINGS = 5  # round trips measured to a fresh worker (the least counts)
AFTER_TRIAL_ROOM = 3.0  # the trial after the timing runs where the time limit leaves this many trials' time
OOM_SHRINK = 4  # a confirmation batch that ran out of device memory is made again with a quarter of the room (twice)
LARGE_TRIAL_BYTES = 1 << 30  # before sharing a trial this large (inputs and slots), cached blocks go back to the device


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

    def release_others(self, allowance: int, clock: PhaseClock | None, keep: str | None = None) -> None:
        """Before a new task's first trial: the other tasks' states down to ``allowance`` bytes, here and in the
        worker (without ``clock``: here only), and their memory back to the device; never ``keep``'s."""
        self._drop_oldest(allowance, keep)
        release_cached(self.backend.device)
        if clock is not None and self.worker.alive:
            try:
                self.step(OP_RELEASE, {"keep": allowance}, clock)
            except Decided:  # it died or misbehaved: a fresh one holds nothing
                self.worker.kill()

    # -- tasks ------------------------------------------------------------------------------------------------
    def task(self, req: WorkerRequest, cfg: EvalConfig, clock: PhaseClock | None = None) -> JudgeTask:
        """The task's reference, checked once: forward runs, returns something comparable, and is deterministic;
        its footprint measured and the memory plan chosen (a task that cannot fit the budget: OverBudget, which
        says so where other processes on the GPU left less than the budget asked)."""
        self.memory.set_budget(cfg)
        try:
            return self._task(req, cfg, clock)
        except OverBudget as e:
            if self.memory.busy:
                raise OverBudget(f"{e}: {self.memory.busy}") from None
            raise

    def _task(self, req: WorkerRequest, cfg: EvalConfig, clock: PhaseClock | None) -> JudgeTask:
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
        known = self.tasks.get(task_key(req.task_source, cfg.seed))
        stamp(result, known.sol if known else None, known.alone_ms if known and req.mode == MODE_CANDIDATE else None)
        if result.passed_checks or req.mode == MODE_REFERENCE:  # what the reference's figures were computed under
            result.math_modes = describe_modes(math_modes(), self.backend.device)
        left = self.worker.sweep()
        if left:  # processes a candidate started and left running: killed, and said
            result.add_line(f"killed {left} process(es) the candidate left running")
        healthy = self.backend.healthy()
        return {"result": asdict(result), "healthy": healthy,
                "worker": {"starts": self.worker.starts, "promotions": self.worker.promotions,
                           "spares": self.worker.spares.wanted, "spare_misses": self.worker.spares.misses,
                           "spares_stopped": self.worker.spares.stopped,
                           "start_phases": self.worker.hello.get("start_phases"),
                           "spare_ready": self.worker.spare_ready()}, **extra}

    def _out_of_memory(self, req: WorkerRequest, e: BaseException) -> EvalResult:
        """The judge's own allocation failed (flag ``judge_memory``: the service evaluates the candidate again,
        :data:`stark_ray.eval.service.MEMORY_AGAIN`). Whatever may have filled the device goes back first: the
        worker (a candidate may be what filled it), the other tasks the judge keeps, its allocator's cache."""
        self.worker.kill()
        self._drop_oldest(0, keep=task_key(req.task_source, EvalConfig(**req.cfg).seed))
        release_cached(self.backend.device)
        return EvalResult(compiled=req.mode == MODE_CANDIDATE, stage=STAGE_RUNTIME,
                          flags=["out_of_memory", "judge_memory"],
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
            if "precision" not in cfg.defences_off:  # once per task, here rather than in a candidate's clock
                result.add_line(f"precision: {self.floor(task, cfg).describe()}")
                laps.lap("precision")
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
        with self.spares_paused():
            before = self.pace(task, cfg)
        laps.lap("pace/before")
        if start := self.worker.start_lap():  # its start, said apart (a spare promoted, the next one started)
            laps.add(*start)
        with self.spares_paused():
            msg = self.step(OP_REFERENCE, {"task_name": req.task_name, "task_source": req.task_source,
                                           "cfg": req.cfg}, clock, label="while timing the reference")
            laps.lap("timing")  # the reference's checks and timing in the worker
            alone = msg.get("result", {}).get("runtime_ms") if isinstance(msg.get("result"), dict) else None
            task.alone_ms, task.alone_min_ms = reading(alone), reading(msg.get("fastest_ms"))
            after = self.pace(task, cfg)
        laps.lap("pace/after")
        task.alone_pace_s = slower(before, after)  # a burst on the host around the alone timing shows in one
        return msg

    def floor(self, task: JudgeTask, cfg: EvalConfig) -> Floor:
        """The task's precision floor (eval/judge/precision.py), measured once on its first standard trial (of this
        seed and trial count: its inputs' scale depends on them), the worker stopped meanwhile, under the budget
        less what the worker holds. A floor not measured for want of room or of device memory is not kept: the
        next request may have it."""
        key = (cfg.seed, cfg.trials)
        known: Floor | None = task.floors.get(key)
        if known is not None:
            return known
        slow = float64_too_slow(task.alone_ms, self.peaks)
        if slow:
            floor = Floor(None, slow)
        else:
            self.memory.close_interval()
            self.memory.cap_self()
            try:
                with self.worker.stopped():
                    first = standard_trial(task, cfg, 0)
                    work = task.footprint.work if task.footprint is not None else sum(nbytes_of(first.ref))
                    room = self.memory.room()
                    need = float64_need(task.model, first.input_bytes, work)
                    if room is not None and need > room:
                        floor = Floor(None, f"its float64 forward needs {need / GB:.1f} GB, {room / GB:.1f} GB left "
                                            "in the budget", lasting=False)
                    else:
                        floor = measure_floor(task.model, first.make(), first.ref, first.seed, room, work,
                                              task.draws_random)
            except torch.OutOfMemoryError:
                floor = Floor(None, "its float64 forward did not fit in the device's memory", lasting=False)
            finally:
                self.memory.close_interval()
                release_cached(self.backend.device)
        if floor.lasting:
            task.floors[key] = floor
        return floor

    def spares_paused(self) -> AbstractContextManager[None]:
        """The worker's spares stopped meanwhile (:meth:`Spares.paused`) where the CPU is what is timed: a spare's
        imports beside a CPU timing slow its calls by a factor that changes as they go on. On a GPU they take one
        core of many and no device time, and back-to-back starts (a sweep) need them ready."""
        return self.worker.spares.paused() if self.backend.device == "cpu" else contextlib.nullcontext()

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
        judgement = Judgement(self, task, req, cfg, clock)
        try:
            with judgement.paused:  # the spares stopped from the timing on (Judgement.evaluate), let go on here
                result = judgement.evaluate()
            if self.worker.alive:  # it forgets the candidate; its fingerprint is checked once more
                self.step(OP_END, {}, clock)
        except Decided as stop:
            if stop.recycle:
                self.worker.kill()
            result = stop.result
        finally:
            self.candidate_source = None
            self._retire_worker(cfg)
        clock.close()
        if cfg.defences_off:  # an ablation's result, whatever its verdict: said in its row and its log
            result.flags.append("defences_off")
            result.add_line(f"defences switched off (EvalConfig.defences_off): {', '.join(sorted(cfg.defences_off))}")
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
        """After a candidate: its worker process ends once it has served ``cfg.worker_candidates`` (by default every
        time): whatever the candidate left in that interpreter — code objects rewritten in place,
        global hooks, a hook on the kept reference, threads, files in its private /tmp — ends with it, before any
        other candidate runs. The next request gets a fresh process (the spare, where one waits)."""
        limit = cfg.candidates_per_worker() or self.worker.max_requests
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
        self.step(OP_PING, {}, clock)
        return time.perf_counter() - started

    def step(self, op: str, payload: dict[str, Any], clock: PhaseClock, fds: list[int] | None = None,
              label: str = "") -> dict[str, Any]:
        """One step of the worker's: its answer, checked; a Decided when it died, timed out, tampered, or the
        candidate raised (``label`` says where)."""
        fields = self.memory.fields(op)
        if op != OP_PING:  # a ping measures the bare round trip
            self.memory.close_interval()
            mark(f"step {op}" + (f" ({label})" if label else ""))
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
                               source=self.candidate_source, oom_killed=reply.oom_killed)
            if reply.timed_out and reply.phase == PHASE_COMPILE:  # the build's time, not a stack (outcome.py)
                lost = build_time_out(lost, reply.log, clock.limit(), list(self.build_times))
            raise Decided(lost)
        self.memory.note(reply.msg)
        if reply.msg.get("healthy") is False:  # a sticky device error, or it tampered: it exits after this answer
            self.worker.close_current()
        return checked_answer(reply.msg, label, seq)


class Judgement:
    """One candidate's way through the judge (one instance per evaluation)."""

    def __init__(self, judge: Judge, task: JudgeTask, req: WorkerRequest, cfg: EvalConfig, clock: PhaseClock) -> None:
        self.judge = judge
        self.task = task
        self.req = req
        self.cfg = cfg
        self.clock = clock
        self.tol = Tolerances.of(cfg)
        self.worst_abs = self.worst_rel = 0.0
        self.laps = Laps()
        self.drift_check: DriftCheck | None = None
        self.timing_started = 0.0  # when the worker's timing began (monotonic)
        self.base: dict[str, Any] = {}  # what every result of this candidate says (its build, its errors)
        self.confirming = False  # the judge's clock was asked
        self.errors: dict[str, float] = {}  # the normalized error of each trial it passed, by the trial's label
        self.paused = contextlib.ExitStack()  # what the timing holds until the verdict (the spares stopped)

    def step(self, op: str, payload: dict[str, Any], fds: list[int] | None = None, label: str = "") -> dict[str, Any]:
        return self.judge.step(op, payload, self.clock, fds, label)

    def in_step(self) -> None:
        """After a failed load, the worker's next answer must be the one to a ping whose token is chosen now; any
        other (its real answer, behind one the candidate forged on its channel) and the worker is replaced, so that
        the next candidate is not judged on a stale answer."""
        token = secrets.token_hex(8)
        try:
            answered = self.step(OP_PING, {"token": token}).get("pong") == token
        except Decided:
            answered = False
        if not answered:
            self.judge.worker.kill()

    def go(self, seed: int | None = None) -> Callable[[], dict[str, Any]]:
        """The confirmation batch's ``go`` (see :class:`worker_batch.Conversation`)."""
        worker = self.judge.worker
        seq = self.judge.next_seq()
        # a worker that died meanwhile: the reply says how
        worker.send({"op": OP_GO, "seq": seq} | ({"seed": seed} if seed is not None else {}))
        reply = worker.await_reply(self.clock)
        return lambda: self.judge.answer(reply, self.clock, LABEL, seq)

    @property
    def round_trip_s(self) -> float:
        return self.judge.round_trip_s

    def ping(self) -> float:
        """One round trip to the worker now (see :class:`worker_batch.Conversation`)."""
        return self.judge.ping(self.clock)

    def stopped(self) -> AbstractContextManager[None]:
        """The worker's processes stopped while the judge measures its own side (see :class:`Conversation`)."""
        return self.judge.worker.stopped()

    def evaluate(self) -> EvalResult:
        worker = self.judge.worker
        if worker.ahead:  # its worker, started between requests (WorkerProcess.start_ahead)
            self.laps.add(*worker.ahead)
        if start := worker.start_lap():  # its start, in the request
            self.laps.add(*start)
        if self.judge.round_trip_of != worker.starts:  # a fresh process: before it imports any candidate
            self.judge.measure_round_trip(self.clock)
        worker.mark_log()
        msg = self.step(OP_LOAD, {"task_name": self.req.task_name, "task_source": self.req.task_source,
                                  "cfg": self.req.cfg, "candidate_source": self.req.candidate_source})
        if "failed" in msg:  # a failure, and no more (a candidate can write to the worker's channel)
            self.in_step()
            return failure_from_message(msg["failed"])
        loaded = msg.get("loaded")
        if not isinstance(loaded, dict):
            raise Decided(protocol_broken("no answer to load"), recycle=True)
        compile_s = _number(loaded.get("compile_s", 0.0))
        self.judge.build_times.append(compile_s)
        self.laps.add("build/import", compile_s)
        base = {"compiled": True, "compile_s": compile_s}

        self.clock.enter(PHASE_CHECK)
        checks_started = time.monotonic()
        notes: list[str] = []
        special = 0
        for trial, note in all_trials(self.task, self.cfg, self.tol):
            if note:
                notes.append(note)
            if trial is None:
                continue
            trial_special = trial.special
            failure = self.trial(trial)
            if not self.task.cache.holds(trial):  # its outputs go before the next trial's are made (the loop's
                trial.ref = None  # tuple still holds the trial itself then)
            del trial
            if failure is not None:
                failure.compile_s = compile_s
                return failure
            special += trial_special
        self.laps.lap("checks")

        off = frozenset(self.cfg.defences_off)
        trials_s = time.monotonic() - checks_started  # what one trial takes, about: the after-timing one's allowance
        per_trial_s = trials_s / max(1, self.cfg.trials + special)

        self.clock.enter(PHASE_TIME)
        self.paused.enter_context(self.judge.spares_paused())  # to the verdict: the worker's timing, the judge's rounds
        checks = (f"correct over {self.cfg.trials} trials and {special} more (blocks, sensitivity, same address) "
                  f"(max_abs_err {self.worst_abs:.3g}, rel_err {self.worst_rel:.3g})")
        base |= {"max_abs_err": self.worst_abs, "rel_err": self.worst_rel}
        # its first pace now: before the worker times the candidate
        self.drift_check = DriftCheck(self.task, lambda: self.judge.pace(self.task, self.cfg)) if "drift" not in off \
            else None
        self.timing_started = time.monotonic()
        timed = self.timed(base)
        self.laps.lap("timing")
        self.base = base
        # the worker's findings: only those it may report (each can only keep the candidate off the leaderboard)
        reported = timed.get("flags")
        worker_flags = [f for f in WORKER_FLAGS if isinstance(reported, list) and f in reported]
        worker_log = [f"worker: {str(line)[:300]}" for line in timed.get("log", [])][:20]
        if "rejected" not in timed and "after_timing_trial" not in off:
            # correct once timed as well: the judge's own trial again, within the timing's time limit (the clock
            # only moves forward) where it leaves a few trials' worth: never a timeout of the judge's making
            if self.clock.deadline - time.monotonic() > AFTER_TRIAL_ROOM * per_trial_s + self.round_trip_s:
                trial = after_timing_trial(self.task, self.cfg)
                failure = self.trial(trial)
                if not self.task.cache.holds(trial):
                    trial.ref = None
                del trial
                if failure is not None:
                    failure.compile_s = compile_s
                    raise Decided(failure, recycle=True)
            else:
                notes.append("no trial after the timing: the timing's time limit leaves too little for one")
            self.laps.lap("trial/after")
        trial_flags: list[str] = []
        explained: dict[str, str] = {}
        if "precision" not in off:  # on the first trial and the one after the timing: which one, none can tell
            ratio, line = self.precision()
            base["precision_ratio"] = ratio
            if line.startswith("reduced_precision: "):
                trial_flags.append("reduced_precision")
                explained["reduced_precision"] = line.removeprefix("reduced_precision: ")
            notes.append(line)
            self.laps.lap("precision")
        if "rejected" in timed:
            return EvalResult(passed_checks=True, stage=STAGE_OK, error=str(timed.get("error", ""))[:300],
                              flags=trial_flags + worker_flags, findings=_lines(explained),
                              log=excerpt("\n".join([checks, *notes, *worker_log])), **base)
        reported_findings = timed.get("findings") if isinstance(timed.get("findings"), dict) else {}
        findings = {f: str(reported_findings[f])[:300] for f in worker_flags if reported_findings.get(f)}
        try:
            claim = Claim(measured(timed), worker_flags, findings, worker_log, flags=trial_flags,
                          explained=explained)
            compiled_ms = None if timed.get("compiled_ms") is None else _number(timed["compiled_ms"])
        except (KeyError, TypeError, ValueError, ExchangeError) as e:
            raise Decided(protocol_broken(f"a malformed timing: {e}"), recycle=True) from None
        try:
            judge_claim(claim, self, off)
        except Failed as e:
            raise Decided(EvalResult(passed_checks=False, stage=STAGE_CORRECTNESS, error=str(e)[:300],
                                     log=excerpt("\n".join([checks, *notes, *claim.notes])), **base),
                          recycle=True) from None
        if claim.recycle:
            self.judge.worker.kill()  # its claim was not borne out: no further candidate in this process
            claim.notes.append(WORKER_ENDED)
        log = [checks, *notes, *claim.notes, self.laps.line()]
        warnings = str(loaded.get("warnings") or "")
        if warnings:
            log.append(warnings)
        breakdown = from_message(timed)  # the worker's profile of one call: shown to the agents, never a verdict
        return EvalResult(passed_checks=True, runtime_ms=claim.new_ms, ref_runtime_ms=claim.ref_ms,
                          speedup=claim.speedup, stage=STAGE_OK, log=excerpt("\n".join(log)), flags=claim.flags,
                          findings=_lines(claim.explained), notes="\n".join(claim.told) or None,
                          error="; ".join(claim.rejected)[:600] or None, kernels=breakdown and describe(breakdown),
                          ref_compile_runtime_ms=compiled_ms, runtime_cv=claim.new_cv,
                          ref_runtime_cv=claim.timing.ref_cv, speedup_err=claim.error, **base)

    # -- what the claim's defences ask of the judgement (claim.Judging) ----------------------------------------
    @property
    def confirm_above(self) -> float:
        return self.cfg.confirm_above

    @property
    def light(self) -> SpeedOfLight | None:
        peaks = self.judge.peaks  # a device the table knows (a probe's figure alone, the CPU's under load, is none)
        return self.task.sol if peaks is not None and peaks.source.startswith("table") else None

    def can_time_again(self) -> bool:
        """Time left for a second timing: twice what the first took."""
        now = time.monotonic()
        return self.clock.deadline - now > 2 * (now - self.timing_started)

    def time_again(self) -> Measured | None:
        self.laps.lap("claim")
        timed = self.timed(self.base, again=True)
        self.laps.lap("timing/again")
        try:
            return measured(timed) if "rejected" not in timed else None
        except (KeyError, TypeError, ValueError) as e:
            raise Decided(protocol_broken(f"a malformed timing: {e}"), recycle=True) from None

    def drift(self, ref_ms: float, ref_min_ms: float | None, speedup: float) -> Drift | None:
        return self.drift_check.slowed(ref_ms, ref_min_ms, speedup) if self.drift_check is not None else None

    def confirm(self, speedup: float, new_ms: float, strict: bool) -> Confirmation:
        self.confirming = True
        return self.confirmed(speedup, new_ms, strict)

    def passed(self, name: str) -> None:
        if name == "confirmation" and self.confirming:  # the drift's pace now and the judge's batch
            self.laps.lap("confirmation")

    def _seed(self, seed: int) -> dict[str, Any]:
        """What a run step says of the seed: the trial's where the reference draws random numbers (the candidate must
        draw the same), else nothing — a generator freshly seeded with a trial's small seed told a candidate that it
        was being judged (a red team's: correct only then, half its output zero in real use)."""
        return {"seed": seed} if self.task.draws_random else {}

    def timed(self, base: dict[str, Any], again: bool = False) -> dict[str, Any]:
        """The worker's timing of the candidate against the reference (a Decided when its outputs differed)."""
        # a forward that draws random numbers: each timed call of either side after the same seed
        timed = self.step(OP_TIME, {"seed": self.cfg.seed} if self.task.draws_random else {},
                          label="while timing again" if again else "while timing").get("timed")
        if not isinstance(timed, dict):
            raise Decided(protocol_broken("no answer to time"), recycle=True)
        if "mismatch" in timed:
            raise Decided(EvalResult(passed_checks=False, stage=STAGE_CORRECTNESS, error=str(timed["mismatch"])[:300],
                                   **base), recycle=True)
        return timed

    def confirmed(self, speedup: float, new_ms: float, strict: bool = False) -> Confirmation:
        """The judge's wall-clock confirmation of ``speedup``. One that does not bear it out is measured once more
        where the clock leaves time for it, its rounds pooled with the first's (both of the judge's readings over
        all six, the lower counting: confirmation.Reading): a busy host that slowed one batch is given its due, and
        a candidate is given no second draw — the reference's fastest round only gets faster with more of them, and
        the lower of two readings is never above either."""
        earlier: Confirmation | None = None
        share = 1  # of the room the budget leaves: a batch that did not fit the device is made smaller
        graphs = True
        graphs_wrong = ""  # where the judge's own graph of the reference was wrong: how
        while True:
            started = time.monotonic()
            batch = WorkerBatch(self)
            room = self.judge.memory.room()
            try:
                confirmation = confirm(self.task, lambda: standard_inputs(self.task, self.cfg, 0), speedup,
                                       new_ms, self.tol, batch, None if room is None else self._room_share(share),
                                       earlier.walls if earlier is not None else None, strict,
                                       above=speedup > unmeasured_bound(self.cfg.confirm_above),
                                       make_room=self.make_room if share == 1 else None, graphs=graphs)
            except (torch.OutOfMemoryError, ExchangeError) as e:  # the judge's own batch: never the candidate's fault
                if isinstance(e, ExchangeError) and "OUT_OF_MEMORY" not in str(e):
                    raise
                batch.release()
                self._let_go(batch)
                release_cached(self.task.device)
                why = f"the judge's batch did not fit in the device's memory ({describe_exception(e)[:160]})"
                if earlier is not None:  # its second measurement: the first's stands
                    return replace(earlier, note=f"{earlier.note}; measured again: {why}")
                late = self.clock.deadline - time.monotonic() < 2 * (time.monotonic() - started)
                if room is None or share >= OOM_SHRINK ** 2 or late:
                    return Confirmation(False, f"not confirmed by the judge's wall clock: {why}", unfit=True)
                share *= OOM_SHRINK  # fewer sets, the same measurement
                continue
            except Decided:  # the worker's doing (died, timed out, broke the protocol): nothing more asked of it
                raise
            except Exception:  # the judge's own (its reference failed, say): the worker's mappings go all the same
                with contextlib.suppress(Decided):
                    self._let_go(batch)
                raise
            finally:
                batch.release()
            self._let_go(batch)  # before anything more is made: the next batch, or what comes after the confirmation
            if confirmation.graph_wrong is not None and graphs:
                # the judge's own graph of the reference disagreed with its forward on the same inputs (a forward
                # that rebinds tensors its module holds replays on memory it let go): the machine's doing, measured
                # again call by call; never for an output of the candidate's that a sound graph bore out
                graphs, graphs_wrong = False, confirmation.graph_wrong
                if self.clock.deadline - time.monotonic() < 2 * (time.monotonic() - started):
                    return Confirmation(False, "not confirmed by the judge's wall clock: its CUDA graph of the "
                                               f"reference was wrong ({graphs_wrong[:160]}), and no time was left to "
                                               "measure it call by call", unfit=True)
                continue
            if graphs_wrong:
                confirmation = replace(confirmation, note=f"{confirmation.note} (the judge's CUDA graph of the "
                                                          f"reference was wrong: {graphs_wrong[:160]}; call by call)")
            if earlier is not None:
                first = earlier.wall_speedup or 0.0
                return replace(confirmation, note=f"measured again, its rounds pooled with the first's: "
                                                  f"{confirmation.note} (the first alone: {first:.2f}x)")
            if confirmation.settled:
                return confirmation
            if self.clock.deadline - time.monotonic() < 2 * (time.monotonic() - started):
                return replace(confirmation, note=f"{confirmation.note}; no time left to measure it again")
            earlier = confirmation

    def _let_go(self, batch: WorkerBatch) -> None:
        """The worker's mappings of ``batch``'s buffers let go (:meth:`WorkerBatch.unstage`), where its process is
        still there (a step to a process gone would start another)."""
        if self.judge.worker.alive:
            batch.unstage()

    def _room_share(self, share: int) -> Callable[[], int | None]:
        """What the budget leaves now, or ``1 / share`` of it (a batch that did not fit is made smaller)."""
        def now() -> int | None:
            left = self.judge.memory.room()
            return None if left is None else left // share
        return now

    def make_room(self) -> int | None:
        """Room for a confirmation batch that would not otherwise hold enough sets: what is kept only to go faster
        goes — the worker's timing sets (made again where it times once more) and the other tasks it keeps, the
        judge's kept trials and other tasks — and the room the budget leaves then. A 6 GB task's batch found none
        for one set with the worker holding its two timing sets (13 GB) and the judge its trials."""
        self.step(OP_RELEASE, {"keep": 0, "sets": True}, label="making room for the confirmation batch")
        self.task.cache.clear()
        key = next((k for k, t in self.judge.tasks.items() if t is self.task), None)
        self.judge.release_others(0, None, keep=key)  # here only: the worker was asked above
        self.judge.memory.cap_self()
        return self.judge.memory.room()

    # -- the precision contract (eval/judge/precision.py) ---------------------------------------------------
    def precision(self) -> tuple[float | None, str]:
        """The candidate's error on the first trial over the task's floor (None: not known), and the line that
        says so (``reduced_precision: ...`` where it is beyond the contract)."""
        floor = self.judge.floor(self.task, self.cfg)  # measured with the reference where it was timed alone
        seen = [e for label in (trial_label(0, self.cfg.trials), AFTER_TIMING_LABEL) if (e := self.errors.get(label))
                is not None]
        error = max(seen) if seen else None
        if floor.error is None or error is None:
            return None, floor.describe()
        ratio = float(f"{error / floor.error:.4g}") if floor.error > 0 else None
        line = reduced(error, floor)
        if line is not None:
            return ratio, f"reduced_precision: {line}"
        return ratio, f"precision: within the contract ({floor.describe()}; the candidate's {error:.2g})"

    # -- one trial --------------------------------------------------------------------------------------------
    def trial(self, trial: Trial) -> EvalResult | None:
        """One trial: its inputs made and copied into shared buffers (the judge keeps no other copy: it makes them
        again to see whether the candidate changed them), the worker's call, the verdict; a same-address trial's
        second contents made once the first call is judged."""
        coming = trial.input_bytes + sum(nbytes_of(trial.ref))  # the shared copy of the inputs and the slots
        self.judge.memory.close_interval()  # the peak of making the trial apart from that of sharing it
        self.judge.memory.cap_self(coming)
        if coming + trial.input_bytes > LARGE_TRIAL_BYTES:  # the shared buffers come from the device itself
            release_cached(self.task.device)
        self.judge.memory.room_for_shared(coming + trial.input_bytes)  # and the inputs made to be copied
        box = Outbox()
        try:
            views: list[torch.Tensor] = []  # the worker's copy of each input tensor

            def on_input(t: torch.Tensor, path: str) -> dict[str, Any]:
                spec, view = box.place(t)
                views.append(view)
                return {"spec": spec.to_json()}

            tree = encode_tree(trial.make(), on_input, prefix="input")  # made, copied, dropped
            slots, slot_specs = self._slots(box, trial.ref)
            fds = box.fds()
            second = trial.then is not None
            msg = self.step(OP_RUN, {"inputs": tree, "slots": slot_specs, "fds": len(fds), **self._seed(trial.seed),
                                     "keep": second, "earlier": second and self.earlier_fits(trial)}, fds,
                            trial.label)
            failure = self._verdict(msg, trial.label, trial.ref, slots, views, trial.make)
            if failure is not None or trial.then is None:
                return failure
            trial.ref = None  # judged: not held while the second contents and their outputs are made
            second = trial.then()  # the same tensors, new contents
            made = second.make()
            self._write_into(views, made)
            # the reference on the judge's own set, never on the shared tensors (the candidate's process can write
            # them); it may change that set: the shared copy was written first
            second_ref = second.reference(self.task, made)
            del made
            box.poison_slots()
            synchronize(self.task)
            msg = self.step(OP_RUN, {"same": True, **self._seed(second.seed)}, label=f"{trial.label}, second call")
            return self._verdict(msg, f"{trial.label}, second call", second_ref, slots, views, second.make)
        finally:
            self.judge.memory.close_interval()
            box.release()
            self.judge.memory.cap_self()  # the shared buffers gone: the next trial is made under the new cap

    def earlier_fits(self, trial: Trial) -> bool:
        """Whether the worker may keep the same-address trial's first outputs through its second call (to see that
        the second leaves them as they were: the defence ``earlier_output``): one more output set beside the
        evaluation's least need, within the budget."""
        fp, budget = self.task.footprint, self.judge.memory.budget
        return not budget or fp is None or fp.needs() + fp.outputs <= budget

    def _write_into(self, views: list[torch.Tensor], made: list[Any]) -> None:
        """The second contents written into the shared tensors. A function of its own: no name of a loop here
        outlives it (a loop variable kept the last 6 GB input alive beside the worker's second call)."""
        contents = tensors_of(made)
        if len(contents) != len(views):
            raise TaskError(f"task {self.task.name}: get_inputs() gave two structures for one task")
        for view, t in zip(views, contents, strict=True):
            view.copy_(t)

    def _slots(self, box: Outbox, ref: Any) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
        slots: dict[str, torch.Tensor] = {}
        specs: list[dict[str, Any]] = []
        for path, leaf in flatten_outputs(ref):
            if isinstance(leaf, torch.Tensor):
                spec, view = box.slot(tuple(leaf.shape), leaf.dtype, "cpu" if leaf.device.type == "cpu" else "cuda")
                slots[path] = view
                specs.append({"path": path, **spec.to_json()})
        return slots, specs

    def _verdict(self, msg: dict[str, Any], label: str, ref: Any, slots: dict[str, torch.Tensor],
                 views: list[torch.Tensor], make: Callable[[], list[Any]]) -> EvalResult | None:
        """The judge's verdict on one call: None when it passed."""
        ran = msg.get("ran")
        if not isinstance(ran, dict):
            raise Decided(protocol_broken("no answer to run"), recycle=True)
        problem = ran.get("problem")  # the worker's own finding (an alias, a subclass): it can only reject
        if problem:
            return EvalResult(compiled=True, stage=STAGE_CORRECTNESS, error=f"{label}: {str(problem)[:250]}",
                              log=str(problem)[:1000])
        synchronize(self.task)
        originals = tensors_of(make())  # the same values as the worker was given (under the cap its answer set)
        changed = len(originals) != len(views) or not all(map(same_values, views, originals))
        del originals
        if changed:
            return EvalResult(compiled=True, stage=STAGE_CORRECTNESS,
                              error=f"{label}: the candidate modified its inputs")
        try:
            out = decode_tree(ran.get("outputs"), lambda node: self._leaf(node, slots))
        except ExchangeError as e:
            raise Decided(protocol_broken(str(e)), recycle=True) from None
        c = compare_outputs(out, ref, self.tol)
        if not c.ok:
            return EvalResult(compiled=True, stage=STAGE_CORRECTNESS, error=f"{label}: {c.problem}",
                              log=f"{label}: {c.problem}", max_abs_err=c.max_abs_err, rel_err=c.rel_err)
        self.worst_abs, self.worst_rel = max(self.worst_abs, c.max_abs_err), max(self.worst_rel, c.rel_err)
        self.errors.setdefault(label, c.rel_err)
        return None

    @staticmethod
    def _leaf(node: dict[str, Any], slots: dict[str, torch.Tensor]) -> Any:
        meta = decode_leaf_meta(node, set(slots))
        if meta.slot is not None:
            return slots[meta.slot]
        return TensorStub(meta.shape, meta.dtype, meta.device)


def _lines(explained: dict[str, str]) -> str | None:
    """The result's ``findings``: one ``flag: line`` per explained flag (None: none)."""
    return "\n".join(f"{flag}: {line}" for flag, line in explained.items()) or None


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ExchangeError(f"not a time: {value!r}")
    return float(value)


def release_cached(device: str, above_share: float = 0.0) -> None:
    """Give the CUDA caching allocator's unused blocks back to the device (where it holds more than a share)."""
    if device != "cuda":
        return
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > above_share * total:
        torch.cuda.empty_cache()
