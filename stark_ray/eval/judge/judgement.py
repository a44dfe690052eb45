"""One candidate's judgement inside the judge process: steps 2-6 of the list in :mod:`stark_ray.eval.judge.judge` (load,
the trials, the timing, the confirmation), one :class:`Judgement` per evaluation. The judge keeps the task's
reference and talks to the worker; a judgement uses both."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.judge.confirmation import Confirmation, confirm
from stark_ray.eval.judge.drift import DriftCheck
from stark_ray.eval.judge.trials import JudgeTask, Trial, all_trials, standard_trial, synchronize
from stark_ray.eval.judge.verdicts import Decided, protocol_broken
from stark_ray.eval.judge.worker_batch import LABEL, WorkerBatch
from stark_ray.eval.measure.compare import TensorStub, Tolerances, compare_outputs, flatten_outputs
from stark_ray.eval.measure.inputs import same_values
from stark_ray.eval.measure.kernel_times import describe, from_message
from stark_ray.eval.measure.laps import Laps
from stark_ray.eval.measure.noise import Measured, interval, is_noisy, kept, measured
from stark_ray.eval.proc.phase_clock import PhaseClock
from stark_ray.eval.tasks import TaskError
from stark_ray.eval.wire.exchange import ExchangeError
from stark_ray.eval.wire.outbox import Outbox
from stark_ray.eval.wire.protocol import (
    OP_GO,
    OP_LOAD,
    OP_PING,
    OP_RUN,
    OP_TIME,
    PHASE_CHECK,
    PHASE_TIME,
    WorkerRequest,
    failure_from_message,
)
from stark_ray.eval.wire.trees import decode_leaf_meta, decode_tree, encode_tree
from stark_ray.eval.worker.guards import nbytes_of
from stark_ray.records import STAGE_CORRECTNESS, STAGE_OK, EvalResult, excerpt

if TYPE_CHECKING:
    from stark_ray.eval.judge.judge import Judge

LARGE_SPEEDUP = 10.0  # flagged (informational) above this
WORKER_FLAGS = ("no_kernel", "extra_stream", "unordered_stream")  # what the worker's profile may report
LARGE_TRIAL_BYTES = 1 << 30  # before sharing a trial this large (inputs and slots), cached blocks go back to the device


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

    def step(self, op: str, payload: dict[str, Any], fds: list[int] | None = None, label: str = "") -> dict[str, Any]:
        return self.judge._step(op, payload, self.clock, fds, label)

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

        self.clock.enter(PHASE_TIME)
        checks = (f"correct over {self.cfg.trials} trials and {special} more (blocks, sensitivity, same address) "
                  f"(max_abs_err {self.worst_abs:.3g}, rel_err {self.worst_rel:.3g})")
        base |= {"max_abs_err": self.worst_abs, "rel_err": self.worst_rel}
        # its first pace now: before the worker times the candidate
        drift = DriftCheck(self.task, lambda: self.judge.pace(self.task, self.cfg))
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
        self.laps.lap("timing")
        ref_ms, new_ms, ref_cv, new_cv = timing.ref_ms, timing.new_ms, timing.ref_cv, timing.new_cv
        speedup = timing.speedup
        if is_noisy(timing.error):
            notes.append(f"noisy timing: the speedup is known to {interval(timing.error)} only (95%; its pairs of "
                         "calls vary that much: a busy host?)")
        log = [checks, *notes, *worker_log]
        if speedup > LARGE_SPEEDUP:
            flags.append("large_speedup")
        rejected: list[str] = [n.removeprefix("worker: ") for n in worker_log if "no kernel of its own" in n]
        error = timing.error if math.isfinite(timing.error) else None
        drifted = drift.slowed(ref_ms, timing.ref_min_ms, speedup)
        slowed = drifted is not None
        if drifted is not None:  # the candidate runs in the worker: its claim is its word where the reference slowed
            log.append(drifted.note)
        if (speedup > self.cfg.confirm_above or (slowed and speedup > 1.0)) and not rejected:
            # (one with no kernel of its own is off the board); a claim the slowed reference put in doubt: strict
            confirmation = self.confirmed(speedup, new_ms, strict=slowed)
            self.laps.lap("confirmation")
            if confirmation.problem:
                raise Decided(EvalResult(passed_checks=False, stage=STAGE_CORRECTNESS, error=confirmation.problem[:300],
                                       log=excerpt("\n".join(log)), **base), recycle=True)
            log.append(confirmation.note)
            if confirmation.unfit:  # a claim the judge could not measure counts for no more than it asks to see
                flags.append("unconfirmed")  # (the candidate's memory decides what room is left: never a free pass)
                cap = 1.0 if slowed else self.cfg.confirm_above
                if speedup > cap:
                    log.append(f"unconfirmed: the worker's {speedup:.2f}x counts as {cap:.2f}x")
                    speedup, new_ms, new_cv, error = cap, ref_ms / cap, None, None
            elif not confirmation.confirmed:
                flags.append("suspicious")
                rejected.append(confirmation.note)
                self.judge.worker.kill()  # its claim was not borne out: no further candidate in this process
            elif confirmation.record is not None:  # the judge's figure, the lower, is the speedup of record,
                # against the reference's time alone (its time beside this candidate is what was in doubt)
                ref_ms = drifted.alone_ms if drifted is not None else ref_ms
                speedup, new_ms, new_cv, error = confirmation.record, ref_ms / confirmation.record, None, None
        log.append(self.laps.line())
        warnings = str(loaded.get("warnings") or "")
        if warnings:
            log.append(warnings)
        breakdown = from_message(timed)  # the worker's profile of one call: shown to the agents, never a verdict
        return EvalResult(passed_checks=True, runtime_ms=new_ms, ref_runtime_ms=ref_ms, speedup=speedup, stage=STAGE_OK,
                          log=excerpt("\n".join(log)), flags=flags, error="; ".join(rejected)[:600] or None,
                          kernels=breakdown and describe(breakdown),
                          ref_compile_runtime_ms=compiled_ms, runtime_cv=new_cv, ref_runtime_cv=ref_cv,
                          speedup_err=error, **base)

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
        while True:
            started = time.monotonic()
            batch = WorkerBatch(self)
            try:
                confirmation = confirm(self.task, lambda: standard_trial(self.task, self.cfg, 0).inputs, speedup,
                                       new_ms, self.tol, batch, self.judge.memory.room(),
                                       earlier.walls if earlier is not None else None, strict,
                                       above=speedup > self.cfg.confirm_above)
            finally:
                batch.release()
            if earlier is not None:
                first = earlier.wall_speedup or 0.0
                return replace(confirmation, note=f"measured again, its rounds pooled with the first's: "
                                                  f"{confirmation.note} (the first alone: {first:.2f}x)")
            if confirmation.settled:
                return confirmation
            if self.clock.deadline - time.monotonic() < 2 * (time.monotonic() - started):
                return replace(confirmation, note=f"{confirmation.note}; no time left to measure it again")
            earlier = confirmation

    def measure_again(self, first: Measured, base: dict[str, Any]) -> tuple[Measured, str]:
        """A noisy timing measured once more; which of the two stands is :func:`noise.kept`'s rule (its figures
        whole, never mixed)."""
        timed = self.timed(base, again=True)
        try:
            second = measured(timed) if "rejected" not in timed else None
        except (KeyError, TypeError, ValueError) as e:
            raise Decided(protocol_broken(f"a malformed timing: {e}"), recycle=True) from None
        if second is None:
            return first, "timing measured again: no second timing"
        stands = kept(first, second)
        return stands, (f"timing measured again (the first speedup, {first.speedup:.3g}x, was known to "
                        f"{interval(first.error)} only): {second.speedup:.3g}x {interval(second.error)}; kept the "
                        f"{'second' if stands is second else 'first'}")

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
            msg = self.step(OP_RUN, {"inputs": tree, "slots": slot_specs, "fds": len(fds), **self._seed(trial.seed),
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
            msg = self.step(OP_RUN, {"same": True, **self._seed(second.seed)}, label=f"{trial.label}, second call")
            return self._verdict(msg, f"{trial.label}, second call", second_ref, slots, views, second.make)
        finally:
            self.judge.memory.close_interval()
            box.release()
            self.judge.memory.cap_self()  # the shared buffers gone: the next trial is made under the new cap

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
        return None

    @staticmethod
    def _leaf(node: dict[str, Any], slots: dict[str, torch.Tensor]) -> Any:
        meta = decode_leaf_meta(node, set(slots))
        if meta.slot is not None:
            return slots[meta.slot]
        return TensorStub(meta.shape, meta.dtype, meta.device)


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


def tensors_of(values: Any) -> list[torch.Tensor]:
    return [v for _, v in flatten_outputs(values, "input") if isinstance(v, torch.Tensor)]
