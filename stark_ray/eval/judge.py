"""The judge: the process that decides whether a candidate is correct and how fast it is. It never imports one.

``python -m stark_ray.eval.judge --backend B ...`` is started by the service like any process of the evaluator
(:mod:`stark_ray.eval.runner`), not isolated, and starts the worker that runs the candidates (isolated when asked,
with a hot spare on a GPU). For each candidate the service sends, the judge

1. keeps the task's reference (the task is checked once: forward runs, its outputs can be compared, two calls on
   the same inputs agree);
2. has the worker ``load`` the candidate;
3. runs every trial (:mod:`stark_ray.eval.trials`): makes the inputs and the reference's outputs here, shares a
   copy of the inputs and one slot per output tensor with the worker (:mod:`stark_ray.eval.exchange`), has it
   ``run`` the candidate, and compares the slots with its own reference outputs and its copy of the inputs with
   the originals — nothing the worker says is needed to reject a wrong output, and nothing it says can make one
   pass;
4. has the worker ``time`` it against the reference (its claim: events, the profile's streams and own kernels);
5. confirms a speedup above 2x with its own wall clock (:mod:`stark_ray.eval.confirmation`);
6. ends the candidate; a worker that tampered (its fingerprint changed), broke the protocol, modified inputs,
   memoised or was not confirmed never serves another candidate.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import json
import math
import os
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend, get_backend
from stark_ray.eval.builds import serve_build
from stark_ray.eval.compare import TensorStub, Tolerances, compare_outputs, flatten_outputs
from stark_ray.eval.confirmation import confirm
from stark_ray.eval.diagnostics import describe_exception
from stark_ray.eval.exchange import ExchangeError, Outbox
from stark_ray.eval.garbage import collect, collect_after, collect_all
from stark_ray.eval.guards import nbytes_of
from stark_ray.eval.inputs import make_inputs, same_values, share_storage
from stark_ray.eval.judge_memory import JudgeMemory
from stark_ray.eval.lifetime import become_subreaper, die_with_parent
from stark_ray.eval.memory import KEPT_SHARE, Footprint, OverBudget, check_fits, meta_footprint, param_bytes, plan_for
from stark_ray.eval.noise import Measured, interval, is_noisy, measured
from stark_ray.eval.outcome import BUILDS_KEPT, build_time_out, limits_for, lost_result
from stark_ray.eval.phase_clock import PhaseClock
from stark_ray.eval.protocol import (
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
    STACK_DUMP_SIGNAL,
    WorkerRequest,
    result_from_message,
)
from stark_ray.eval.runner import MAX_REQUESTS, Reply, WorkerProcess, WorkerSpec, WorkerStartError
from stark_ray.eval.tasks import TaskError, load_reference, task_key
from stark_ray.eval.trees import decode_leaf_meta, decode_tree, encode_tree
from stark_ray.eval.trials import JudgeTask, Trial, all_trials, standard_trial, synchronize
from stark_ray.eval.verdicts import Decided, protocol_broken, tampered
from stark_ray.eval.worker_batch import LABEL, WorkerBatch
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, STAGE_RUNTIME, EvalResult, excerpt

Send = Callable[[dict[str, Any]], None]
LARGE_SPEEDUP = 10.0  # flagged (informational) above this
WORKER_FLAGS = ("no_kernel", "extra_stream", "unordered_stream")  # what the worker's profile may report
KEPT_TASKS = 32  # task references the judge keeps, as the worker does
KEPT_CPU_BYTES = 4 << 30
RESERVED_SHARE = 0.1  # after a candidate, cached blocks beyond this share of the device go back to it
LARGE_TRIAL_BYTES = 1 << 30  # before sharing a trial this large (inputs and slots), cached blocks go back to the device
_ALLOWED_LEAVES = (torch.Tensor, bool, int, float, str, type(None))
GB = 1e9
PINGS = 5  # round trips measured to a fresh worker (the least counts)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ExchangeError(f"not a time: {value!r}")
    return float(value)


class Judge:
    """Serves the service's requests inside the judge process."""

    def __init__(self, backend: Backend, worker: WorkerProcess, free_at_start: int = 0) -> None:
        self.backend = backend
        self.worker = worker
        self.tasks: OrderedDict[str, JudgeTask] = OrderedDict()
        self.round_trip_s = 0.0  # the worker's least message round trip (measure_round_trip) ...
        self.round_trip_of = -1  # ... for the process of this start (WorkerProcess.starts)
        self.memory = JudgeMemory(backend.device, free_at_start, worker)
        self.candidate_source: str | None = None  # the candidate being served, for a crash's location
        self.build_times: deque[float] = deque(maxlen=BUILDS_KEPT)  # its worker's latest builds (imports), seconds

    def release_others(self, allowance: int, clock: PhaseClock | None) -> None:
        """Before a new task's first trial: the other tasks' states down to ``allowance`` bytes, here and in the
        worker, and their memory back to the device."""
        self._drop_oldest(allowance, None)
        _release_cached(self.backend.device)
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
        leaves = flatten_outputs(first.ref)
        odd = [type(v).__name__ for _, v in leaves if not isinstance(v, _ALLOWED_LEAVES)]
        if odd or not any(isinstance(v, torch.Tensor) for _, v in leaves):
            what = odd[0] if odd else type(first.ref).__name__
            raise TaskError(f"task {name}: the reference returns {what}, which cannot be compared (a tensor, or a "
                            "tuple, list or dict of tensors and numbers)")
        if before is not None:  # the first trial: its inputs made, the reference run on a copy of them
            work = torch.cuda.max_memory_allocated() - before - 2 * first.input_bytes
            outputs = sum(nbytes_of(first.ref))
            task.footprint = Footprint(first.input_bytes, outputs, max(work, outputs), param_bytes(model))
            check_fits(name, task.footprint, self.memory.budget, measured=True)
            self._plan(task)
        made = make_inputs(task.get_inputs, first.seed, 1.0, device)  # get_inputs itself, not a kept trial's copy
        other = make_inputs(task.get_inputs, first.seed, 1.0, device)
        if not all(map(same_values, _tensors(made), _tensors(other))):
            raise TaskError(f"task {name}: get_inputs() is not deterministic under a seed (two calls differ); its "
                            "inputs must come from torch's seeded generators")
        # a get_inputs that hands out the same tensors every time: the reference never runs on them themselves
        task.fresh_inputs = not share_storage(_tensors(made), _tensors(other))
        del other
        # after the same seed, as every call of the reference and the candidate is made: a forward that draws from
        # torch's generators (a dropout in training mode) gives the same outputs, one that depends on anything else
        # does not
        again = task.run(made, first.seed, private=task.fresh_inputs)
        del made
        same = compare_outputs(again, first.ref, Tolerances.of(cfg))
        del again
        if not same.ok:
            raise TaskError(f"task {name}: the reference is not deterministic (two calls on the same inputs after "
                            f"the same seed differ: {same.problem}); its forward must depend only on its inputs and "
                            "torch's seeded generators")
        # once more without the seed (make_inputs leaves the generator past the inputs' draws): a forward that draws
        # random numbers is told apart, and its timed calls are seeded too
        drift = task.run(make_inputs(task.get_inputs, first.seed, 1.0, device), None, private=task.fresh_inputs)
        task.draws_random = not compare_outputs(drift, first.ref, Tolerances.of(cfg)).ok
        del drift
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
            _release_cached(self.backend.device)

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
        left = self.worker.sweep()
        if left:  # processes a candidate started and left running: killed, and said
            _add_line(result, f"killed {left} process(es) the candidate left running")
        healthy = self.backend.healthy()
        return {"result": asdict(result), "healthy": healthy,
                "worker": {"starts": self.worker.starts, "promotions": self.worker.promotions,
                           "start_phases": self.worker.hello.get("start_phases"),
                           "spare_ready": self.worker.spare_ready()}, **extra}

    def _out_of_memory(self, req: WorkerRequest, e: BaseException) -> EvalResult:
        self.worker.kill()  # what the worker holds goes back (a candidate may be what filled the device)
        _release_cached(self.backend.device)
        return EvalResult(compiled=req.mode == MODE_CANDIDATE, stage=STAGE_RUNTIME, flags=["out_of_memory"],
                          error=f"the device ran out of memory while the judge ran the trials "
                                f"({describe_exception(e)}); the worker was replaced")

    def _clock(self, cfg: EvalConfig, send: Send) -> PhaseClock:
        return PhaseClock(limits_for(cfg), on_enter=lambda phase: send({"phase": phase}))

    def reference(self, req: WorkerRequest, cfg: EvalConfig, send: Send) -> EvalResult:
        clock = self._clock(cfg, send)
        task = self.task(req, cfg, clock)
        try:
            msg = self._step(OP_REFERENCE, {"task_name": req.task_name, "task_source": req.task_source,
                                            "cfg": req.cfg}, clock, label="while timing the reference")
            if "failed" in msg:
                failed = result_from_message(msg["failed"])
                raise TaskError(failed.error or "the reference could not be timed")
            result = result_from_message(msg["result"])
            if task.footprint is not None and task.plan is not None:  # what the budget was measured against
                _add_line(result, f"device memory: needs {task.footprint.needs() / GB:.1f} GB of a budget of "
                                  f"{task.planned_for / GB:.1f} GB ({task.footprint.describe()}); "
                                  f"{task.plan.describe()}")
            return result
        except Decided as stop:
            if stop.recycle:
                self.worker.kill()
            raise TaskError(f"task {req.task_name}: reference {stop.result.error}") from None
        except (KeyError, TypeError) as e:
            self.worker.kill()
            raise TaskError(f"task {req.task_name}: the worker's answer was malformed ({e})") from None

    def candidate(self, req: WorkerRequest, cfg: EvalConfig, send: Send) -> EvalResult:
        clock = self._clock(cfg, send)
        task = self.task(req, cfg, clock)
        started = time.perf_counter()
        held = torch.cuda.memory_allocated() if self.backend.device == "cuda" else None
        self.candidate_source = req.candidate_source
        try:
            result = _Candidate(self, task, req, cfg, clock).evaluate()
            if self.worker.alive:  # it forgets the candidate; its fingerprint is checked once more
                self._step(OP_END, {}, clock)
        except Decided as stop:
            if stop.recycle:
                self.worker.kill()
            result = stop.result
        finally:
            self.candidate_source = None
        clock.close()
        collect_after(self.backend.device, held, task.input_bytes)  # a cycle holding a trial's gigabytes, say
        if held is not None:  # what this candidate cost the judge's device memory, and what it kept before
            self.memory.close_interval()
            _add_line(result, f"judge device memory: peak {self.memory.own_peak / GB:.2f} GB, "
                              f"{held / GB:.2f} GB held before, {torch.cuda.memory_allocated() / GB:.2f} GB after; "
                              f"judge and worker together at most {self.memory.peak / GB:.2f} GB")
        _release_cached(self.backend.device, RESERVED_SHARE)  # a large task's trials, freed: back to the device
        result.eval_s = time.perf_counter() - started
        return result

    # -- talking to the worker ------------------------------------------------------------------------------
    def measure_round_trip(self, clock: PhaseClock) -> None:
        """The least of PINGS round trips of a message to the worker (``round_trip_s``), for the process started
        last, which has not imported a candidate yet: nothing a candidate does later can lengthen the figure."""
        best = float("inf")
        for _ in range(PINGS):
            started = time.perf_counter()
            self._step(OP_PING, {}, clock)
            best = min(best, time.perf_counter() - started)
        self.round_trip_s, self.round_trip_of = best, self.worker.starts

    def _step(self, op: str, payload: dict[str, Any], clock: PhaseClock, fds: list[int] | None = None,
              label: str = "") -> dict[str, Any]:
        """One step of the worker's: its answer, checked; a Decided when it died, timed out, tampered, or the
        candidate raised (``label`` says where)."""
        fields = self.memory.fields(op)
        if op != OP_PING:  # a ping measures the bare round trip
            self.memory.close_interval()
        reply = self.worker.converse({"op": op, **payload, **fields}, clock, fds or ())
        for fd in fds or ():
            with contextlib.suppress(OSError):
                os.close(fd)
        return self.answer(reply, clock, label)

    def answer(self, reply: Reply, clock: PhaseClock, label: str) -> dict[str, Any]:
        if reply.msg is None:
            lost = lost_result(reply.phase, reply.timed_out, reply.returncode, reply.log, clock.limit(),
                               source=self.candidate_source)
            if reply.timed_out and reply.phase == PHASE_COMPILE:  # the build's time, not a stack (outcome.py)
                lost = build_time_out(lost, reply.log, clock.limit(), list(self.build_times))
            raise Decided(lost)
        msg = reply.msg
        self.memory.note(msg)
        changed = msg.get("tampered")
        if not isinstance(changed, list) or "healthy" not in msg:
            raise Decided(protocol_broken("an answer without its fingerprint"), recycle=True)
        if msg.get("healthy") is False:  # a sticky device error, or it tampered: it exits after this answer
            self.worker.close_current()
        if changed:
            raise Decided(tampered([str(c) for c in changed]), recycle=True)
        if "error" in msg:
            raise Decided(protocol_broken(str(msg["error"])[:200]), recycle=True)
        if "raised" in msg:
            raised = msg["raised"] if isinstance(msg["raised"], dict) else {}
            raise Decided(EvalResult(compiled=True, stage=STAGE_RUNTIME,
                                   error=f"{label}: {raised.get('error', '?')}"[:300],
                                   log=excerpt(str(raised.get("log", "")))), recycle=not msg.get("healthy"))
        return msg


class _Candidate:
    """One candidate's way through the judge (one instance per evaluation)."""

    def __init__(self, judge: Judge, task: JudgeTask, req: WorkerRequest, cfg: EvalConfig, clock: PhaseClock) -> None:
        self.judge = judge
        self.task = task
        self.req = req
        self.cfg = cfg
        self.clock = clock
        self.tol = Tolerances.of(cfg)
        self.worst_abs = self.worst_rel = 0.0
        self.laps: list[tuple[str, float]] = []
        self.lap_t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self.lap_t))
        self.lap_t = now

    def step(self, op: str, payload: dict[str, Any], fds: list[int] | None = None, label: str = "") -> dict[str, Any]:
        return self.judge._step(op, payload, self.clock, fds, label)

    def go(self) -> Callable[[], dict[str, Any]]:
        """The confirmation batch's ``go`` (see :class:`worker_batch.Conversation`)."""
        worker = self.judge.worker
        worker.send({"op": OP_GO})  # a worker that died meanwhile: the reply says how
        reply = worker.await_reply(self.clock)
        return lambda: self.judge.answer(reply, self.clock, LABEL)

    @property
    def round_trip_s(self) -> float:
        return self.judge.round_trip_s

    def evaluate(self) -> EvalResult:
        worker = self.judge.worker
        if not worker.alive:
            worker.start()
        if self.judge.round_trip_of != worker.starts:  # a fresh process: before it imports any candidate
            self.judge.measure_round_trip(self.clock)
        worker.mark_log()
        msg = self.step(OP_LOAD, {"task_name": self.req.task_name, "task_source": self.req.task_source,
                                  "cfg": self.req.cfg, "candidate_source": self.req.candidate_source})
        if "failed" in msg:
            return result_from_message(msg["failed"])
        loaded = msg.get("loaded")
        if not isinstance(loaded, dict):
            raise Decided(protocol_broken("no answer to load"), recycle=True)
        compile_s = _number(loaded.get("compile_s", 0.0))
        self.judge.build_times.append(compile_s)
        self.laps.append(("build/import", compile_s))
        self.lap_t = time.perf_counter()
        base = {"compiled": True, "compile_s": compile_s}

        self.clock.enter(PHASE_CHECK)
        notes: list[str] = []
        special = 0
        for i, (trial, note) in enumerate(all_trials(self.task, self.cfg, self.tol)):
            if note:
                notes.append(note)
            if trial is None:
                continue
            failure = self.trial(trial)
            if not self.task.cache.holds(trial):  # its outputs go before the next trial's are made (the loop's
                trial.ref = None  # tuple still holds the trial itself then)
            del trial
            if failure is not None:
                failure.compile_s = compile_s
                return failure
            special += i >= self.cfg.trials
        self.lap("checks")

        self.clock.enter(PHASE_TIME)
        checks = (f"correct over {self.cfg.trials} trials and {special} more (blocks, sensitivity, same address) "
                  f"(max_abs_err {self.worst_abs:.3g}, rel_err {self.worst_rel:.3g})")
        base |= {"max_abs_err": self.worst_abs, "rel_err": self.worst_rel}
        started = time.monotonic()
        timed = self.timed(base)
        # the worker's findings: only those it may report (each can only keep the candidate off the leaderboard)
        flags = [f for f in WORKER_FLAGS if f in timed.get("flags", [])]
        worker_log = [f"worker: {str(line)[:300]}" for line in timed.get("log", [])][:20]
        if "rejected" in timed:
            return EvalResult(passed_checks=True, stage=STAGE_OK, error=str(timed.get("error", ""))[:300], flags=flags,
                              log=excerpt("\n".join([checks, *notes, *worker_log])), **base)
        try:
            timing = measured(timed)
            compiled_ms = None if timed.get("compiled_ms") is None else _number(timed["compiled_ms"])
        except (KeyError, TypeError, ValueError, ExchangeError) as e:
            raise Decided(protocol_broken(f"a malformed timing: {e}"), recycle=True) from None
        if is_noisy(timing.error) and self.clock.deadline - time.monotonic() > 2 * (time.monotonic() - started):
            timing, note = self.measure_again(timing, base)
            notes.append(note)
        self.lap("timing")
        ref_ms, new_ms, ref_cv, new_cv = timing.ref_ms, timing.new_ms, timing.ref_cv, timing.new_cv
        speedup = timing.speedup
        if is_noisy(timing.error):
            notes.append(f"noisy timing: the speedup is known to {interval(timing.error)} only (95%; its pairs of "
                         "calls vary that much: a busy host?)")
        log = [checks, *notes, *worker_log]
        if speedup > LARGE_SPEEDUP:
            flags.append("large_speedup")
        rejected: list[str] = [n.removeprefix("worker: ") for n in worker_log if "no kernel of its own" in n]
        if speedup > self.cfg.confirm_above:
            batch = WorkerBatch(self)
            try:
                confirmation = confirm(self.task, lambda: standard_trial(self.task, self.cfg, 0).inputs, speedup,
                                       new_ms, self.tol, batch, self.judge.memory.room())
            finally:
                batch.release()
            self.lap("confirmation")
            if confirmation.problem:
                raise Decided(EvalResult(passed_checks=False, stage=STAGE_CORRECTNESS, error=confirmation.problem[:300],
                                       log=excerpt("\n".join(log)), **base), recycle=True)
            log.append(confirmation.note)
            if not confirmation.confirmed:
                flags.append("suspicious")
                rejected.append(confirmation.note)
                self.judge.worker.kill()  # its claim was not borne out: no further candidate in this process
        log.append("evaluator time: " + ", ".join(f"{name} {s:.3f} s" for name, s in self.laps))
        warnings = str(loaded.get("warnings") or "")
        if warnings:
            log.append(warnings)
        return EvalResult(passed_checks=True, runtime_ms=new_ms, ref_runtime_ms=ref_ms, speedup=speedup, stage=STAGE_OK,
                          log=excerpt("\n".join(log)), flags=flags, error="; ".join(rejected) or None,
                          ref_compile_runtime_ms=compiled_ms, runtime_cv=new_cv, ref_runtime_cv=ref_cv,
                          speedup_err=timing.error if math.isfinite(timing.error) else None, **base)

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

    def measure_again(self, first: Measured, base: dict[str, Any]) -> tuple[Measured, str]:
        """A noisy timing measured once more: the tighter of the two is kept (its figures whole, never mixed)."""
        timed = self.timed(base, again=True)
        try:
            second = measured(timed) if "rejected" not in timed else None
        except (KeyError, TypeError, ValueError) as e:
            raise Decided(protocol_broken(f"a malformed timing: {e}"), recycle=True) from None
        if second is None:
            return first, "timing measured again: no second timing"
        kept = second if second.error < first.error else first
        return kept, (f"timing measured again (the first speedup, {first.speedup:.3g}x, was known to "
                      f"{interval(first.error)} only): {second.speedup:.3g}x {interval(second.error)}; kept the "
                      f"{'second' if kept is second else 'first'}")

    # -- one trial --------------------------------------------------------------------------------------------
    def trial(self, trial: Trial) -> EvalResult | None:
        """One trial: its inputs made and copied into shared buffers (the judge keeps no other copy: it makes them
        again to see whether the candidate changed them), the worker's call, the verdict; a same-address trial's
        second contents made once the first call is judged."""
        coming = trial.input_bytes + sum(nbytes_of(trial.ref))  # the shared copy of the inputs and the slots
        self.judge.memory.close_interval()  # the peak of making the trial apart from that of sharing it
        self.judge.memory.cap_self(coming)
        if coming + trial.input_bytes > LARGE_TRIAL_BYTES:  # the shared buffers come from the device itself
            _release_cached(self.task.device)
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
            msg = self.step(OP_RUN, {"inputs": tree, "slots": slot_specs, "fds": len(fds), "seed": trial.seed,
                                     "keep": trial.then is not None}, fds, trial.label)
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
            msg = self.step(OP_RUN, {"same": True, "seed": second.seed}, label=f"{trial.label}, second call")
            return self._verdict(msg, f"{trial.label}, second call", second_ref, slots, views, second.make)
        finally:
            self.judge.memory.close_interval()
            box.release()
            self.judge.memory.cap_self()  # the shared buffers gone: the next trial is made under the new cap

    def _write_into(self, views: list[torch.Tensor], made: list[Any]) -> None:
        """The second contents written into the shared tensors. A function of its own: no name of a loop here
        outlives it (a loop variable kept the last 6 GB input alive beside the worker's second call)."""
        contents = _tensors(made)
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
        originals = _tensors(make())  # the same values as the worker was given (under the cap its answer set)
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
        return None

    @staticmethod
    def _leaf(node: dict[str, Any], slots: dict[str, torch.Tensor]) -> Any:
        meta = decode_leaf_meta(node, set(slots))
        if meta.slot is not None:
            return slots[meta.slot]
        return TensorStub(meta.shape, meta.dtype, meta.device)


def _add_line(result: EvalResult, line: str) -> None:
    """One more line at the end of a result's log (which keeps its tail when cut)."""
    result.log = excerpt(f"{result.log}\n{line}" if result.log else line)


def _release_cached(device: str, above_share: float = 0.0) -> None:
    """Give the CUDA caching allocator's unused blocks back to the device (where it holds more than a share)."""
    if device != "cuda":
        return
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > above_share * total:
        torch.cuda.empty_cache()


def _tensors(values: Any) -> list[torch.Tensor]:
    return [v for _, v in flatten_outputs(values, "input") if isinstance(v, torch.Tensor)]




# -- the process ------------------------------------------------------------------------------------------------
def _serve_build(spec: WorkerSpec, request: dict[str, Any], seconds: float) -> dict[str, Any]:
    return serve_build(request, spec, Path(spec.build_dir), seconds)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stark_ray.eval.judge")
    p.add_argument("--backend", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--isolate-worker", action="store_true", help="the worker in namespaces of its own")
    p.add_argument("--hide", action="append", default=[], help="isolated: a path the worker does not see")
    p.add_argument("--spare-worker", action="store_true", help="keep a hot spare of the worker")
    p.add_argument("--max-requests", type=int, default=MAX_REQUESTS, help="candidates per worker process")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    die_with_parent()  # and what the worker's candidates detach stays below us (eval/lifetime.py)
    become_subreaper()
    args = _args(argv)
    sys.stdout.flush()
    ctrl = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    faulthandler.enable(all_threads=True)
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)

    def send(msg: dict[str, Any]) -> None:
        ctrl.write(json.dumps(msg) + "\n")
        ctrl.flush()

    spec = WorkerSpec(args.backend, args.build_dir, args.threads, isolate=args.isolate_worker, fd_channel=True,
                      hidden=tuple(args.hide))
    worker = WorkerProcess(spec, max_requests=args.max_requests, spare=args.spare_worker)
    if spec.isolate:  # what it builds (cpu_cpp; a build in ModelNew's __init__) is made outside (eval/builds.py)
        worker.on_build = functools.partial(_serve_build, spec)
    started: list[BaseException | None] = []

    def start_worker() -> None:  # beside our own start: torch, the device, its facts
        try:
            worker.start()
            started.append(None)
        except BaseException as e:
            started.append(e)

    begun = time.perf_counter()
    laps: dict[str, float] = {}

    def lap(name: str) -> None:
        laps[name] = round(time.perf_counter() - begun - sum(laps.values()), 3)

    starter = threading.Thread(target=start_worker, name="stark-worker-start", daemon=True)
    starter.start()
    try:
        backend = get_backend(args.backend)
        backend.prepare_judge(args.threads)
        torch.set_grad_enabled(False)
        lap("judge_prepare_s")
        hello = backend.hardware_info()
        lap("device_info_s")
    except BaseException as e:  # a host problem (no GPU): the service reports the log's last lines
        traceback.print_exc()
        print(f"judge start failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        worker.close()
        os._exit(3)
    starter.join()
    lap("worker_wait_s")
    if started and started[0] is not None:
        hello["worker_error"] = str(started[0])
    worker_phases = worker.hello.get("start_phases")
    if isinstance(worker_phases, dict):
        laps.update({f"worker_{k}": v for k, v in worker_phases.items() if isinstance(v, int | float)})
    hello["start_phases"] = laps
    free = torch.cuda.mem_get_info()[0] if backend.device == "cuda" else 0
    judge = Judge(backend, worker, free)
    collect()  # what start-up made is frozen: the collection after each candidate scans only its objects
    send({"hello": hello})
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = judge.handle(WorkerRequest.from_json(line), send)
        sys.stdout.flush()
        sys.stderr.flush()
        send(answer)
        if not answer["healthy"]:
            break
    worker.close()
    ctrl.close()
    os._exit(0)


if __name__ == "__main__":
    main()
