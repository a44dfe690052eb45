"""Inside the worker: the process that imports candidates, runs them where the judge asks, and times them.

Nothing here decides whether a candidate is correct: the worker runs it on inputs the judge shared and copies its
outputs into the judge's slots (:mod:`stark_ray.eval.wire.exchange`); the judge compares them with reference outputs it
computed itself (:mod:`stark_ray.eval.judge.judge`). What the worker measures — the interleaved timing of the candidate
against its own copy of the reference, the profile of one call (its kernels, their streams) — the judge takes as
the candidate's claim: every claimed gain is confirmed by the judge's own wall clock, and every claim here can
only reject a candidate, never accept one.

Per candidate the judge sends ``load``, one ``run`` per trial, ``time``, possibly ``stage``/``go`` (the confirmation),
``end``; ``reference`` times the reference alone. The fingerprint and the reference's seal are checked after each
step: a change ends the worker after its answer."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.backends import Backend, declared
from stark_ray.eval.diagnostics import compiler_log, describe_exception
from stark_ray.eval.loader import import_source
from stark_ray.eval.measure.inputs import nbytes_of
from stark_ray.eval.measure.laps import Laps
from stark_ray.eval.measure.memory import KEPT_SHARE, Plan, apply_cap, give_back_cached
from stark_ray.eval.measure.process_state import ProcessState
from stark_ray.eval.measure.timing import capture_graph
from stark_ray.eval.proc.garbage import collect_after, collect_all, in_use
from stark_ray.eval.tasks import TaskError, load_reference, task_key
from stark_ray.eval.wire.exchange import SharedBuffer, TensorSpec, digests, touch
from stark_ray.eval.wire.protocol import (
    OP_END,
    OP_GO,
    OP_LOAD,
    OP_PING,
    OP_REFERENCE,
    OP_RELEASE,
    OP_RUN,
    OP_STAGE,
    OP_TIME,
    PHASE_COMPILE,
    PHASE_SETUP,
    PHASE_TIME,
    recv_fds,
)
from stark_ray.eval.worker.build_log import LogTail, candidate_frame, compile_failure
from stark_ray.eval.worker.guards import (
    Fingerprint,
    earlier_problem,
    imports_dynamo_ahead,
    output_print,
    output_problem,
    poison,
    settle_torch,
)
from stark_ray.eval.worker.kernel_sources import KernelSources, python_kernel_names
from stark_ray.eval.worker.private_places import places_now, private_places, restore_places
from stark_ray.eval.worker.shared_views import fill_slots, inputs_on, map_buffers, slots_on, specs_of
from stark_ray.eval.worker.streams import warm_profiler
from stark_ray.eval.worker.timing import Timing, time_candidate, time_reference
from stark_ray.eval.worker.warm_reference import WarmReference, on_device
from stark_ray.records import STAGE_COMPILE, STAGE_CORRECTNESS, STAGE_RUNTIME, EvalResult, excerpt

Send = Callable[[dict[str, Any]], None]
KEPT_TASKS = 32  # task references a worker keeps at most (a campaign worker moves from task to task) ...
KEPT_CPU_BYTES = 4 << 30  # ... while what they hold stays under this on the CPU, and on a GPU under the plan's


@dataclass
class Loaded:
    """The candidate the worker holds between ``load`` and ``end``."""

    model: Any
    state: WarmReference
    cfg: EvalConfig
    source: str
    compile_s: float
    buffers: list[SharedBuffer] = field(default_factory=list)  # mapped for the step in progress
    inputs: list[Any] = field(default_factory=list)
    slots: dict[str, torch.Tensor] = field(default_factory=dict)  # by the path of the output they are for
    staged: list[tuple[list[Any], dict[str, torch.Tensor]]] = field(default_factory=list)
    slot_buffers: list[SharedBuffer] = field(default_factory=list)  # the staged batch's, in the judge's order
    graph: Any = None  # the staged batch captured as a CUDA graph
    earlier: tuple[Any, list[tuple[int, int]]] | None = None  # a call's outputs and their print, for the next call
    memory_before: int | None = None  # the device memory in use before its import (eval/proc/garbage.py)


class CandidateHost:
    """Serves the judge's steps inside one worker process."""

    def __init__(self, backend: Backend, sock: socket.socket | None) -> None:
        self.backend = backend
        self.sock = sock
        self.tasks: OrderedDict[str, WarmReference] = OrderedDict()
        self.declared = declared(type(backend))  # what the backends offered need of a worker (caches, kernels)
        self.sources = KernelSources()
        self.sources.install()
        backend.record_kernels(self.sources)
        self.fingerprint: Fingerprint | None = None
        # torch's own patches: now, or as a candidate imports them
        settle_torch(lambda: self.fingerprint, ahead=imports_dynamo_ahead(backend.device))
        if backend.device == "cuda":
            warm_profiler()
        self.fingerprint = Fingerprint()  # after our own hooks and torch's own patches
        self.state = ProcessState.taken()  # set up, no candidate yet: the state the reference is timed in
        self.current: Loaded | None = None
        self.count = 0
        self.healthy = True
        self.plan: Plan | None = None  # the memory plan of the task in progress, as the judge sent it
        self.home = Path.cwd()
        self.places = places_now(self.declared.cache_vars)  # the worker's own, put back after each candidate

    # -- tasks ------------------------------------------------------------------------------------------------
    def warm_reference(self, name: str, source: str, cfg: EvalConfig) -> WarmReference:
        key = task_key(source, cfg.seed)
        state = self.tasks.get(key)
        if state is not None:
            self.tasks.move_to_end(key)
            return state
        device = self.backend.device
        module, model, init_inputs = load_reference(name, source, cfg.seed, device)
        state = WarmReference(name, module, model, init_inputs, device, cfg.seed)
        self.tasks[key] = state
        self.evict(key)
        return state

    def evict(self, keep: str | None, limit: int | None = None) -> int:
        """Forget the least recently used tasks beyond KEPT_TASKS or the memory they may hold (``limit``, by default
        the kept budget), never ``keep``; how many went."""
        budget = self._kept_budget() if limit is None else limit
        dropped = 0
        while self.tasks:
            held = sum(s.held_bytes() for s in self.tasks.values())
            if len(self.tasks) <= KEPT_TASKS and held <= budget:
                break
            oldest = next(iter(self.tasks))
            if oldest == keep:
                break
            del self.tasks[oldest]
            dropped += 1
            collect_all()  # what of its state is a cycle was frozen: thawed and collected
            if self.backend.device == "cuda":
                torch.cuda.empty_cache()  # what it held goes back to the device, for the judge and the next task
        return dropped

    def _kept_budget(self) -> int:
        if self.backend.device != "cuda":
            return KEPT_CPU_BYTES
        if self.plan is not None and self.tasks:  # the others' share of the budget, beside the current task's own
            return next(reversed(self.tasks.values())).held_bytes() + self.plan.kept_others
        return int(KEPT_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)

    def _budget(self, msg: dict[str, Any]) -> None:
        """The judge's word on memory for this step: a cap on this process's allocator and the task's plan."""
        mem = msg.get("memory")
        if self.backend.device != "cuda" or not isinstance(mem, dict):
            return
        if isinstance(mem.get("cap"), int):
            apply_cap(int(mem["cap"]))
        if "plan" in mem:
            self.plan = Plan.from_json(mem["plan"])

    def _sets(self, state: WarmReference) -> list[list[Any]]:
        return state.timing_sets(self.plan.timing_sets if self.plan is not None else None)

    def _after_timing(self, state: WarmReference) -> None:
        """Timing sets the plan does not keep go (and their memory back to the device, for the judge's trials)."""
        if self.plan is not None and not self.plan.keep_sets:
            state.release_sets()
            torch.cuda.empty_cache()

    def _memory_report(self) -> dict[str, int]:
        give_back_cached()  # the judge's turn next
        return {"reserved": torch.cuda.memory_reserved(), "peak": torch.cuda.max_memory_reserved()}

    # -- steps ------------------------------------------------------------------------------------------------
    def handle(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        """The answer to one step of the judge's."""
        op = msg.get("op")
        steps: dict[str, Callable[[dict[str, Any], Send], dict[str, Any]]] = {
            OP_REFERENCE: self.reference, OP_LOAD: self.load, OP_RUN: self.run, OP_TIME: self.time,
            OP_STAGE: self.stage, OP_GO: self.go, OP_END: self.end, OP_RELEASE: self.release}
        if op == OP_PING:
            return {"pong": msg.get("token", True), "tampered": [], "healthy": self.healthy}
        step = steps.get(str(op))
        if step is None or (op not in (OP_REFERENCE, OP_LOAD, OP_END, OP_RELEASE) and self.current is None):
            return {"error": f"unexpected step {op!r}"}
        if self.backend.device == "cuda" and op != OP_GO:
            torch.cuda.reset_peak_memory_stats()  # this step's peak, for the judge
        try:
            self._budget(msg)
            answer = step(msg, send)
        except TaskError as e:
            answer = {"failed": asdict(_task_failure(str(e)))}
        except BaseException as e:  # anything a candidate raised out of a step: its own failure
            answer = {"raised": {"error": describe_exception(e) + candidate_frame(e.__traceback__),
                                 "log": excerpt(traceback.format_exc()), "host_memory": out_of_host_memory(e),
                                 "device_memory": isinstance(e, torch.OutOfMemoryError)}}
        if op == OP_GO:  # the judge's clock runs until this answer: the checks come with the next step's
            answer["tampered"] = []
            answer["healthy"] = True
            return answer
        if self.tasks and op != OP_RELEASE:
            self.evict(next(reversed(self.tasks)))
        changed = self.fingerprint.changed() + [n for t in self.tasks.values() if t.seal for n in t.seal.broken()]
        self.healthy = not changed and self.backend.healthy()
        answer["tampered"] = changed
        answer["healthy"] = self.healthy
        if self.backend.device == "cuda" and self.healthy:
            answer["memory"] = self._memory_report()
        return answer

    def reference(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        cfg = EvalConfig(**msg["cfg"])
        send({"phase": PHASE_SETUP})
        laps = Laps()  # where the worker's seconds went: said in the log
        state = self.warm_reference(str(msg["task_name"]), str(msg["task_source"]), cfg)
        laps.lap("setup")
        send({"phase": PHASE_TIME})
        try:
            result, fastest = time_reference(state, self._timing(state, cfg), laps)
            result.add_line(laps.line("worker time"))
            return {"result": asdict(result), "fastest_ms": fastest}
        finally:
            self._after_timing(state)

    def load(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        self._forget()
        private = tempfile.mkdtemp(prefix="req-", dir=self.home)
        os.chdir(private)  # the candidate's private directory, to its end (removed then, with all it wrote)
        cfg = EvalConfig(**msg["cfg"])
        send({"phase": PHASE_SETUP})
        state = self.warm_reference(str(msg["task_name"]), str(msg["task_source"]), cfg)
        before = in_use(self.backend.device)
        send({"phase": PHASE_COMPILE})
        self.count += 1
        tail = LogTail()
        tail.mark()
        started = time.perf_counter()
        source = str(msg.get("candidate_source") or "")
        self.sources.reset()
        name = f"stark_candidate_{self.count}"
        # from its import to its end (the task's files stay the worker's)
        private_places(private, self.declared.cache_vars)
        try:
            cand = import_source(source, name, Path.cwd(), "candidate.py")
            if self.fingerprint.changed():  # before ModelNew runs anything: the answer says what changed
                return {"failed": asdict(EvalResult(compiled=True, stage=STAGE_CORRECTNESS))}
            model_cls = getattr(cand, "ModelNew", None)
            if model_cls is None:
                return {"failed": asdict(EvalResult.failed(STAGE_COMPILE, "the candidate defines no ModelNew"))}
            torch.manual_seed(cfg.seed)  # same seed as the reference: same parameters, in the same order
            model = on_device(model_cls(*copy.deepcopy(state.init_inputs)), state.device)
            self.backend.synchronize()
        except BaseException as e:  # SystemExit included: the candidate is never allowed to end the worker
            failed = compile_failure(e, tail.since_mark(), started)
            failed.flags = [f for f in failed.flags if f != "build_error"]  # only the compile pool needs it
            return {"failed": asdict(failed)}
        finally:
            sys.modules.pop(name, None)
        compile_s = time.perf_counter() - started
        output = tail.since_mark()
        self.current = Loaded(model, state, cfg, source, compile_s, memory_before=before)
        return {"loaded": {"compile_s": compile_s, "warnings": compiler_log(output) if "warning:" in output else ""}}

    def run(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        """One call of the candidate on the judge's inputs; its outputs copied into the judge's slots."""
        cur = self.current
        assert cur is not None
        if not msg.get("same"):  # else: the same input tensors (and slots) as the last run, with new contents
            cur.inputs, cur.slots, cur.buffers = self._attach(msg["inputs"], msg["slots"], int(msg["fds"]),
                                                              cur.buffers)
        earlier, cur.earlier = cur.earlier, None  # the previous call's outputs, where the judge asked to keep them
        poison([t.numel() * t.element_size() for t in cur.slots.values()], cur.state.device)  # unwritten: NaN
        if isinstance(seed := msg.get("seed"), int):  # the judge's, where its reference draws random numbers
            torch.manual_seed(seed)
        try:
            with torch.no_grad():
                raw = cur.model(*cur.inputs)
                self.backend.synchronize()
                problem = output_problem(raw, cur.inputs, cur.state.device)
                if problem is None and earlier is not None:
                    problem = earlier_problem(earlier[0], earlier[1], raw)
                del earlier
                tree = fill_slots(raw, cur.slots)
                self.backend.synchronize()
                if msg.get("earlier") and problem is None:  # kept to see that the next call leaves it as it is
                    cur.earlier = (raw, output_print(raw))
            del raw
        finally:
            if not msg.get("keep"):  # no second call on these tensors (or the call raised): the judge's buffers are
                # its own again (a mapping kept here would keep their memory after the judge let them go)
                self._release(cur.buffers)
                cur.inputs, cur.slots, cur.buffers = [], {}, []
        return {"ran": {"outputs": tree, "problem": problem}}

    def time(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        """Time the candidate against the reference here (:func:`~stark_ray.eval.worker.timing.time_candidate`)."""
        cur = self.current
        assert cur is not None
        cur.earlier = None  # the trials are over (a same-address trial whose first call failed kept one)
        send({"phase": PHASE_TIME})

        def defined() -> set[str]:  # the kernels its source defines, as recorded at its build or read from it
            if self.sources.recorded:
                return self.sources.names()
            return python_kernel_names(cur.source, self.declared.kernel_definitions)

        seed = msg.get("seed")
        try:
            return {"timed": time_candidate(cur.model, cur.state, defined, self._timing(cur.state, cur.cfg),
                                            seed if isinstance(seed, int) else None)}
        finally:
            self._after_timing(cur.state)

    def stage(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        """Map the input sets and slots of a confirmation batch (outside the judge's clock); with ``graph``, capture
        the batch as a CUDA graph (None where it cannot be: the batch then runs call by call)."""
        cur = self.current
        assert cur is not None
        self._unstage(cur)
        fds = recv_fds(self._channel(), int(msg["fds"]))
        bufs = map_buffers(fds, [TensorSpec.from_json(s) for group in msg["slots"] for s in group] +
                         specs_of(msg["sets"]))
        cur.buffers = list(bufs.values())
        with self._unstaged_on_raise(cur):
            cur.slot_buffers = [bufs[i] for i in sorted({int(s["buffer"]) for group in msg["slots"] for s in group})]
            for buf in cur.buffers:  # page faults now, not inside the judge's clock
                touch(buf.data)
            for tree, slot_specs in zip(msg["sets"], msg["slots"], strict=True):
                cur.staged.append((inputs_on(tree, bufs), slots_on(slot_specs, bufs)))
            if msg.get("graph") and cur.state.device == "cuda":
                cur.graph = capture_graph(lambda: self._batch(cur))
            self.backend.synchronize()
        return {"staged": len(cur.staged), "graph": cur.graph is not None}

    def _unstage(self, cur: Loaded) -> None:
        """The confirmation batch's graph, views and mappings let go."""
        self._release(cur.buffers)
        cur.buffers, cur.staged, cur.slot_buffers, cur.graph = [], [], [], None

    @contextlib.contextmanager
    def _unstaged_on_raise(self, cur: Loaded) -> Iterator[None]:
        """A batch step that raised (the device out of memory, say) lets its batch go at once: the judge makes a
        smaller one next, and the mappings of this one would hold the device's memory until then."""
        try:
            yield
        except BaseException:
            self._unstage(cur)
            if self.backend.device == "cuda":
                torch.cuda.empty_cache()
            raise

    @staticmethod
    def _batch(cur: Loaded, seed: int | None = None) -> None:
        with torch.no_grad():  # a reference that draws random numbers: set i's call after seed + i, as the judge's
            for i, (inputs, slots) in enumerate(cur.staged):
                if seed is not None:
                    torch.manual_seed(seed + i)
                fill_slots(cur.model(*inputs), slots)

    def go(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        """The staged batch (its graph replayed, or every set once), then byte sums of the slots back (the judge
        checks them against its slots: the answer cannot come before the outputs exist)."""
        cur = self.current
        assert cur is not None
        with self._unstaged_on_raise(cur):
            began = time.perf_counter()
            self.backend.synchronize()
            synced = time.perf_counter()
            if cur.graph is not None:
                cur.graph.replay()
            else:  # with the judge's seed where its reference draws random numbers
                self._batch(cur, seed if isinstance(seed := msg.get("seed"), int) and not isinstance(seed, bool)
                            else None)
            launched = time.perf_counter()
            sums = digests(cur.slot_buffers)
            # where the worker's side of a round went, in its own words (host seconds: the sync before, the calls
            # until launched, the sums until the outputs were final): the judge only traces them, never counts them
            spent = [synced - began, launched - synced, time.perf_counter() - launched]
            return {"done": {"digests": sums, "spent": spent}}

    def release(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        """Before the judge makes a new task's first trial: the states of the tasks kept here down to ``keep`` bytes
        (least recently used first), and what they held back to the device. With ``sets`` (room for a confirmation
        batch): the current candidate's task is kept, its timing sets go (made again where it is timed once more).
        With ``batch``: only the confirmation batch's mappings go (the judge has let the buffers go; their memory
        goes back to the device once both processes have)."""
        cur = self.current
        if msg.get("batch"):  # the confirmation batch's mappings only: the judge has let its buffers go
            if cur is not None:
                self._unstage(cur)
            if self.backend.device == "cuda":
                torch.cuda.empty_cache()
            return {"released": []}
        if msg.get("sets") and cur is not None:
            cur.state.release_sets()
            name = next((n for n, t in self.tasks.items() if t is cur.state), None)
            dropped = self.evict(name, int(msg.get("keep", 0)))
        else:
            dropped = self.evict(None, int(msg.get("keep", 0)))
        if self.backend.device == "cuda":
            torch.cuda.empty_cache()
        return {"released": dropped}

    def end(self, msg: dict[str, Any], send: Send) -> dict[str, Any]:
        self._forget()
        return {"ended": True}

    # -- helpers ----------------------------------------------------------------------------------------------
    def _forget(self) -> None:
        cur, self.current = self.current, None
        if cur is not None:
            cur.graph = cur.staged = None  # type: ignore[assignment]
            self._release(cur.buffers)
            sets = cur.state.input_sets
            before, task_bytes = cur.memory_before, sum(nbytes_of(sets[0])) if sets else 0  # one input set
            del cur
            # its module and class are cycles: what it allocated goes now where that may be much (eval/proc/garbage.py)
            collect_after(self.backend.device, before, task_bytes)
        restore_places(self.places)
        here = Path.cwd()
        if here != self.home:
            os.chdir(self.home)
            shutil.rmtree(here, ignore_errors=True)

    @staticmethod
    def _release(buffers: list[SharedBuffer]) -> None:
        for b in buffers:
            b.release()

    def _channel(self) -> socket.socket:
        if self.sock is None:
            raise RuntimeError("this worker has no descriptor channel")
        return self.sock

    def _attach(self, tree: Any, slot_specs: list[dict[str, Any]], count: int, old: list[SharedBuffer]
                ) -> tuple[list[Any], dict[str, torch.Tensor], list[SharedBuffer]]:
        self._release(old)
        fds = recv_fds(self._channel(), count)
        bufs = map_buffers(fds, [TensorSpec.from_json(s) for s in slot_specs] + specs_of([tree]))
        return inputs_on(tree, bufs), slots_on(slot_specs, bufs), list(bufs.values())

    def _timing(self, state: WarmReference, cfg: EvalConfig) -> Timing:
        return Timing(self.backend, cfg, lambda: self._sets(state),
                      cfg.timing_trials or self.backend.default_timing_trials(), self.state)


def out_of_host_memory(e: BaseException) -> bool:
    """The allocation failed for the host's memory (this process's limit, RLIMIT_DATA, or the host's own): Python's
    MemoryError, or torch's CPU allocator's error (ENOMEM: a RuntimeError saying it cannot allocate)."""
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


def _task_failure(error: str) -> EvalResult:
    result = EvalResult.failed(STAGE_RUNTIME, error)
    result.flags.append("task_error")
    return result
