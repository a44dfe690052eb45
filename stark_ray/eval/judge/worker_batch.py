"""The worker's half of a confirmation batch, as the judge drives it (:class:`confirmation.CandidateSide`): the
input sets and output slots shared with the worker, its ``stage`` and ``go`` steps, and the checks of its answer
(the byte sums of the output buffers must be the judge's own: the answer cannot come before the outputs)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from stark_ray.config import EvalConfig
from stark_ray.eval.judge.batch_sets import PackedSets, on_buffer, packed_slots
from stark_ray.eval.judge.confirmation import Lent
from stark_ray.eval.judge.memory import mark, tracing
from stark_ray.eval.judge.trials import JudgeTask, synchronize
from stark_ray.eval.judge.verdicts import Decided, DeviceMemory, protocol_broken
from stark_ray.eval.measure.compare import rebuild_outputs
from stark_ray.eval.wire.exchange import TensorSpec, byte_sum, digests
from stark_ray.eval.wire.outbox import Outbox
from stark_ray.eval.wire.protocol import OP_RELEASE, OP_STAGE
from stark_ray.eval.wire.trees import encode_tree
from stark_ray.records import STAGE_OK, EvalResult

LABEL = "confirmation batch"


class Conversation(Protocol):
    """The judge's conversation with the worker about one candidate."""

    task: JudgeTask
    cfg: EvalConfig
    round_trip_s: float  # see confirmation.CandidateSide

    def step(self, op: str, payload: dict[str, Any], fds: list[int] | None = None, label: str = "") -> dict[str, Any]:
        """One step: the worker's answer, checked (a Decided where it is not one)."""
        ...

    def ping(self) -> float:
        """One round trip of a message to the worker and back, now (seconds)."""
        ...

    def go(self, seed: int | None = None) -> Callable[[], dict[str, Any]]:
        """Send ``go`` (``seed``: set i's call after seed + i) and wait for the worker's answer; returns the check of
        that answer, to be called once the clock has stopped."""
        ...

    def stopped(self) -> AbstractContextManager[None]:
        """The worker's processes stopped meanwhile."""
        ...


def _spent(spent: Any) -> str:
    """The worker's own account of its side of a round (``go``'s ``spent``), for the trace only: its word, read as
    three finite numbers or not at all (never an error of the judge's)."""
    if not (isinstance(spent, list) and len(spent) == 3):
        return "none"
    seconds = []
    for x in spent:
        if isinstance(x, bool) or not isinstance(x, int | float):
            return "none"
        try:
            value = float(x)
        except (OverflowError, ValueError):
            return "none"
        if not math.isfinite(value):
            return "none"
        seconds.append(value)
    return ", ".join(f"{what} {1e3 * x:.3f} ms" for what, x in zip(("sync", "calls launched", "sums"), seconds,
                                                                   strict=True))


class WorkerBatch:
    def __init__(self, conversation: Conversation) -> None:
        self.talk = conversation
        # the least of the round trips measured before the worker loaded a candidate (none can lengthen them) and
        # those measured beside the rounds (:meth:`run`): one measured at another moment, on a busier host, would
        # take too much off the candidate's rounds (a 1.0x candidate measured at 2.5x on a loaded CI box)
        self.round_trip_s = conversation.round_trip_s
        self.box = Outbox()
        self.packed: PackedSets | None = None  # the shared input sets (the judge's views, and its staging)
        self.source: PackedSets | None = None  # the reference side's sets, whose staging a round fills
        self.slots: list[dict[str, TensorSpec]] = []  # each set's slots: where each output goes
        self.views: list[list[torch.Tensor]] = []  # the judge's views of each set's slots
        self.like: Any = None

    def stopped(self) -> AbstractContextManager[None]:
        return self.talk.stopped()

    def stage(self, sets: PackedSets, like: Any, k: int, graph: bool) -> bool:
        self.like = like  # the structure of the outputs
        template = sets.sets[0]
        self.packed = packed = PackedSets(self.box, template, k, staging=sets)
        self.source = sets
        trees = [encode_tree(template, _spec_feeder(specs), prefix="input") for specs in packed.specs]
        groups: list[list[dict[str, Any]]] = []
        for slots in packed_slots(self.box, self.like, k):
            self.slots.append({path: spec for path, spec, _ in slots})
            self.views.append([view for _, _, view in slots])
            groups.append([{"path": path, **spec.to_json()} for path, spec, _ in slots])
        fds = self.box.fds()
        with _batch_memory():
            staged = self.talk.step(OP_STAGE, {"sets": trees, "slots": groups, "fds": len(fds), "graph": graph},
                                    fds, LABEL)
        if staged.get("staged") != k:
            raise Decided(protocol_broken("the batch was not staged"), recycle=True)
        return bool(staged.get("graph"))

    def run(self, seed: int | None = None) -> tuple[float, list[Any], str | None]:
        task, packed, source = self.talk.task, self.packed, self.source
        assert packed is not None and source is not None
        self.round_trip_s = min(self.round_trip_s, self.talk.ping())
        self.box.poison_slots()
        if not packed.shares_staging(source):  # the judge's private staging: the worker sees the values only once
            for mine, theirs in zip(packed.staged, source.staged, strict=True):  # the clock runs
                for view, value in zip(mine, theirs, strict=True):
                    view.copy_(value)
        synchronize(task)
        started = time.perf_counter()
        packed.write()
        synchronize(task)
        check = self.talk.go(seed)
        wall = time.perf_counter() - started
        with _batch_memory():
            done = check().get("done")
        if not isinstance(done, dict) or not isinstance(done.get("digests"), list):
            raise Decided(protocol_broken("no answer to go"), recycle=True)
        if tracing():  # outside the clock (the step itself is not marked: a mark inside would slow this side only)
            mark(f"go answered after {1e3 * wall:.3f} ms; the worker's word: {_spent(done.get('spent'))}")
        synchronize(task)
        # one copy of the slots, and its byte sums against the answer's: the outputs compared are those the worker
        # answered for, whatever its GPU work writes into the shared slots afterwards (a kernel left running could
        # put right outputs there after the answer, for the judge's reading of them)
        number = {id(b): n for n, b in enumerate(self.box.buffers)}
        copies = {number[id(b)]: b.data.clone() for b in self.box.slot_buffers}
        sums = torch.stack([byte_sum(c) for c in copies.values()]).tolist() if copies else []
        if sums != done["digests"]:
            raise Decided(EvalResult(compiled=True, passed_checks=True, stage=STAGE_OK, flags=["suspicious"],
                                     error="suspicious: the worker answered before its outputs were final"),
                          recycle=True)
        if packed.changed():
            return wall, [], "the candidate modified its inputs"
        outs = [rebuild_outputs(self.like, {p: on_buffer(copies[spec.buffer], spec) for p, spec in specs.items()})
                for specs in self.slots]
        return wall, outs, None

    def lend(self) -> Lent:
        assert self.packed is not None, "staged first"
        return Lent(self.packed, self.views, lambda: digests(self.box.slot_buffers),
                    [b.data for b in self.box.buffers])

    def release(self) -> None:
        self.views = []
        self.box.release()

    def unstage(self) -> None:
        """The worker's mappings of the batch's buffers let go (a step; after :meth:`release`, once the rounds are
        over). The device's memory of a shared buffer goes back only once every process that maps it has let it go:
        a worker unmapped its last batch at its next ``stage``, after the judge had made the next batch's buffers,
        and at its end. A lean batch of 8.6 GB inputs was so held twice for a moment: 44.4 GB of a 40 GB budget
        (``48_Mean_reduction_over_a_dimension``, its claim measured again), the judge's account saying 34.4 GB."""
        if self.packed is not None:
            self.packed = None
            self.talk.step(OP_RELEASE, {"batch": True}, None, "letting the confirmation batch go")


@contextlib.contextmanager
def _batch_memory() -> Iterator[None]:
    """The device running out of memory on the worker's side of the batch is the batch's size, which the judge chose
    (level3/5_AlexNet's batch at 40 GB left the worker 6.9 GB, and it ran out): torch.OutOfMemoryError, as on the
    judge's side (a smaller batch, or unconfirmed), never the candidate's failure."""
    try:
        yield
    except DeviceMemory as e:
        if e.recycle:  # the worker said it is unhealthy (or it ran out of the host's memory): it is gone
            raise
        raise torch.OutOfMemoryError(f"the worker's side: {e.result.error}") from None


def _spec_feeder(specs: list[TensorSpec]) -> Callable[[torch.Tensor, str], dict[str, Any]]:
    """``encode_tree``'s callback for one packed set: each tensor's spec, in order."""
    it = iter(specs)
    return lambda t, path: {"spec": next(it).to_json()}


