"""The judge's own measurement of a speedup: wall-clock time around a batch of calls, measured outside the worker.

The worker's figures (CUDA events, or ``time.perf_counter`` on the CPU) are taken in the process that imported the
candidate, which can patch them, hide work on other streams or answer from a cache. So a speedup above
``EvalConfig.confirm_above`` (1 by default: every claimed gain) is measured again by the judge:

- K input sets, K chosen so that the candidate's batch lasts BATCH_TARGET_MS by its own claimed time (a claim too
  fast only makes the batch longer; at least MIN_SETS, at most MAX_SETS, and as many as the judge makes in half a
  second), within a memory budget. Both sides get K input sets and K sets of output buffers, packed one after
  another on a buffer for each (:meth:`Outbox.pack`; the candidate's are shared with the worker: its slots),
  filled first with the
  first standard trial's inputs. The candidate's round also holds a message to the worker and its answer, which
  the reference's does not: with at most 64 sets (a 1 ms batch of 15 us calls) a Triton kernel at 5.97x was
  measured at 3.83x in one run and 2.86x in the next, and flagged; 256 sets make that share four times smaller;
- on a GPU, both sides capture the whole batch (every set once, each output copied into its buffer) as a CUDA
  graph, where both can: a replay runs the kernels back to back, so the host's time per call (Python, launches),
  which the worker's timing leaves out by design, stays out of this figure too. Where either side cannot be
  captured, both run the batch call by call; a reference whose forward rebinds a tensor its module holds is never
  captured (its replay would write memory it let go), and a batch wrong as graphs where the judge's own graph
  disagrees with its reference called once more is measured again call by call (the judge's doing, not the
  candidate's);
- then three rounds, each with fresh input sets (seeds no one knew), the two sides taking turns to go first. The
  fresh values go first into a private staging copy of the buffers (one for both sides: their buffers have the
  same layout); a round starts the judge's clock, copies the staging into the input buffers (one copy per buffer;
  so nothing could be computed before), runs the batch (the candidate's: ``go`` to the worker) and ends when a
  byte sum of each buffer of outputs has been read back: the worker's answer carries its sums, which must equal
  the judge's own over the slots, so it cannot come before the outputs exist;
- the outputs must match the reference's at tolerance, and the inputs must be unchanged;
- writing the inputs, copying the outputs into their buffers and summing them cost both sides the same: the judge
  measures that on its own buffers and takes it off both (leaving at least a fifth of either); the candidate's
  rounds also hold a message to the worker and its answer, whose least time the judge measured on that worker
  before it imported any candidate (so none can lengthen it) and takes off them (on an H200 a Triton batch of 111
  calls of 11 us ran ~0.6 ms longer than its kernels). The batch speedup is the lower of two readings: the ratio
  of each side's fastest round, and the median over rounds of the ratio of one round's two batches (a burst of
  load that spans one side's rounds moves a round's two batches together: :class:`Reading`). It confirms the
  worker's speedup when it is at least AGREEMENT (half) of it, or 10x by itself (a call of
  microseconds carries host noise that compresses very large ratios; the worker's figure is then the one
  reported, so a speedup that is really above 10x may be overstated). Else the judgement measures it once more
  (a new batch, fresh inputs; where its clock leaves time: a busy host can slow one batch) and decides on the six
  rounds pooled (both readings over all six), not on a second draw. Where only the lower reading falls short, the
  lower is the figure of record (a busy host parts the two); a claim neither bears out is flagged ``suspicious``
  and kept off the leaderboard, except one of 2x or less, which gets the judge's figure (:func:`verdict`).

A set too large for this batch (not one set fits the memory left: `36_RMSNorm_`, 7.5 GB in and out, on an 80 GB
card) is measured in a lean batch of one set, call by call, holding two copies of its inputs and two of its outputs
instead of three: the reference side has no buffers of its own (it runs on the staging, and its rounds write the
staging into the worker's shared inputs and its outputs into the worker's slots, the same bytes into the same
memory as the candidate's round, faulted in first with the worker stopped); since the worker can read what those
writes leave there, the reference is timed on a fresh draw of its own, never the one the candidate's next round is
given, and its outputs on the candidate's draw are computed after the candidate's answer, outside both clocks.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from stark_ray.eval.judge.batch_sets import PackedSets, packed_slots
from stark_ray.eval.judge.memory import mark
from stark_ray.eval.judge.trials import JudgeTask, synchronize
from stark_ray.eval.measure.compare import compare_outputs, flatten_outputs, rebuild_outputs
from stark_ray.eval.measure.inputs import clone_all, make_inputs, map_tensors, nbytes_of
from stark_ray.eval.measure.memory import GB
from stark_ray.eval.measure.timing import capture_graph
from stark_ray.eval.measure.tolerance import Tolerances
from stark_ray.eval.wire.exchange import digests, touch
from stark_ray.eval.wire.outbox import Outbox

AGREEMENT = 0.5  # the worker's figure stands when the judge's gain (speedup - 1) is at least this share of its ...
CONFIRMED_BY_ITSELF = 10.0  # ... or the judge's speedup this large by itself; the judge's own figure stands when it
# is at least AGREEMENT of the worker's speedup; below that the claim is suspicious
LOW_CLAIM = 2.0  # a precise claim this small is held to the judge's figure (half the claim is no speedup at all)
NEAR = 0.9  # a claim of LOW_CLAIM or less stands where the judge measured this much of it; a judge's figure this
# close to the claim stands without a second measurement (where it is lower)
# the judge's figure can stand for the worker's where its batch ran as CUDA graphs or its calls took this long: a
# batch of calls of microseconds, call by call, carries host costs the worker's timing leaves out (an honest 1.16x
# affine map of 4096 floats, 9 us a call on the CPU, measured 0.62x)
PRECISE_CALL_S = 1e-4
BATCH_TARGET_MS = 10.0  # the candidate's batch lasts about this long, by its own claim
MAX_SETS = 256  # packed on two buffers per side: a call of 15 us makes a batch of ~4 ms
# at least this many where memory and time allow: a claim stretched by a busy host (5.5 ms for a 0.8 ms kernel)
# asked for 2, and a round of 2 calls is mostly the fixed costs taken off it, whose noise then decides
MIN_SETS = 8
MIN_ROUND_MS = 1000.0  # ... where a round of both sides lasts at most this long by the claim (slow calls: fewer)
MAKE_BUDGET_S = 0.5  # at most this long to make one round's fresh input sets, above the least number of sets ...
# ... which only a task whose sets take longer than this to make goes below: a round of a few calls is mostly the
# fixed costs taken off it, and their noise decides (a burst while one set was made asked for 2 sets of a 1 ms call)
MAKE_CAP_S = 2.0
MAKE_SAMPLES = 3  # sets made to tell how long one takes (the least counts: a busy host only ever adds time)
ROUNDS = 3  # the fastest of each side counts: load on the host only ever adds time
OVERHEAD_FLOOR = 0.2  # the cost taken off leaves at least this share of a side's batch
CUDA_BUDGET_SHARE = 0.125  # of the device's memory, for a batch's inputs and outputs (all copies)
CPU_BUDGET_BYTES = 1 << 30


@dataclass(frozen=True)
class Walls:
    """The rounds of a confirmation: each side's batch seconds, the fixed costs measured beside them, the batch."""

    ref: list[float]
    cand: list[float]
    overheads: list[float]
    k: int
    lean: bool = False  # the lean batch of one set (:func:`confirm`): a second confirmation takes the same


@dataclass(frozen=True)
class Confirmation:
    confirmed: bool
    note: str  # one line for the log (and the error, when not confirmed)
    wall_speedup: float | None = None
    problem: str | None = None  # the candidate's batch outputs (or inputs) were wrong: a correctness failure
    walls: Walls | None = None  # its rounds, for a second confirmation to pool with its own
    record: float | None = None  # the judge's speedup, where it stands instead of the worker's (bore out less)
    unfit: bool = False  # not measured: not one batch set fits the memory the budget leaves
    claim: float | None = None  # the worker's speedup
    # the reference's time per call by the judge's clock (its rounds' median, the fixed costs off), with the worker
    # stopped: where its batch ran call by call, calls long enough to tell; what a claim in doubt is held to
    # (claim.held_to_the_reference_now)
    ref_call_ms: float | None = None
    # the judge's own CUDA graph of the reference gave another output than its forward called once more on the same
    # inputs (the machine's doing, not the candidate's: measured again call by call)
    graph_wrong: str | None = None

    @property
    def settled(self) -> bool:
        """Nothing to measure again: the worker's figure borne out (or the judge's standing within NEAR of it), a
        wrong output, or no room to measure."""
        near = self.record is not None and self.claim is not None and self.record >= NEAR * self.claim
        return (self.confirmed and (self.record is None or near)) or self.problem is not None or self.unfit


class CandidateSide(Protocol):
    """The worker's half of the batch, driven by the judge."""

    round_trip_s: float  # the least time of a message to the worker and back, measured before it loaded a candidate

    def stopped(self) -> AbstractContextManager[None]:
        """The worker's processes stopped meanwhile (the judge's own side is measured then)."""
        ...

    def stage(self, sets: PackedSets, like: Any, k: int, graph: bool) -> bool:
        """Share K input sets (laid out and filled as the reference side's ``sets``, whose staging they share) and
        their slots (shaped as the outputs ``like``); with ``graph``, ask for a captured batch. Whether the worker
        captured one."""
        ...

    def run(self, seed: int | None = None) -> tuple[float, list[Any], str | None]:
        """Start the clock, write the staged values (the reference side's staging, filled for the round) into the
        shared inputs, run the batch: (seconds, the outputs per set (copies), a problem with them or with the
        inputs)."""
        ...

    def lend(self) -> Lent:
        """The staged batch's shared buffers, for the reference side of a lean batch to do the same writes on."""
        ...


@dataclass(frozen=True)
class Lent:
    """What the worker's side of a lean batch lends the reference's side (:func:`confirm`), so that each side's round
    writes the same bytes into the same memory: the shared input sets (written from the reference side's staging),
    the judge's views of the output slots, and the byte sums over the slots' buffers."""

    sets: PackedSets
    slots: list[list[torch.Tensor]]
    sums: Callable[[], None]
    buffers: list[torch.Tensor]  # every shared buffer's bytes (the inputs' and the slots')


def set_count(task: JudgeTask, claimed_ms: float, sample: list[Any], sample_out: Any, make_s: float = 0.0,
              room: int | None = None, speedup: float = 1.0) -> int:
    """Input sets per batch: :func:`wanted_sets`, within :func:`sets_in` the memory budget (0: not one fits)."""
    per_set, fixed = set_bytes(sample, sample_out, _work(task))
    return max(0, min(MAX_SETS, wanted_sets(claimed_ms, make_s, speedup), sets_in(task, per_set, fixed, room)))


def wanted_sets(claimed_ms: float, make_s: float = 0.0, speedup: float = 1.0) -> int:
    """Input sets per batch by time: the candidate's claimed time times this is about BATCH_TARGET_MS, and at least
    MIN_SETS where a round of both sides (the reference's calls ``speedup`` times the claim) stays within
    MIN_ROUND_MS; few enough that making a round's fresh sets (``make_s`` each) takes at most MAKE_BUDGET_S (but not
    fewer than the least, unless making those takes longer than MAKE_CAP_S)."""
    least = min(MIN_SETS, int(MIN_ROUND_MS / max(claimed_ms * (1.0 + max(speedup, 0.0)), 1e-3)))
    wanted = max(least, math.ceil(BATCH_TARGET_MS / max(claimed_ms, 1e-3)))
    if make_s > 0:
        floor = min(least, max(1, int(MAKE_CAP_S / make_s)))
        wanted = min(wanted, max(floor, int(MAKE_BUDGET_S / make_s)))
    return min(MAX_SETS, wanted)


def set_bytes(sample: list[Any], sample_out: Any, work: int = 0, lean: bool = False) -> tuple[int, int]:
    """(bytes of one batch set, bytes the batch holds beside its sets). A set: its inputs three times (each side's
    buffers and the staging, which the round's fresh values go into one set at a time) and its outputs three times
    (the reference side's buffers, the slots and the copy of them read back; the reference's are compared where
    they are); in a ``lean`` batch (:func:`confirm`) its inputs twice (the staging, which the reference runs on, and
    the shared buffers) and its outputs twice (the slots and their copy). Beside the sets (the template held
    already, and counted as such): one set of inputs more (the template's copy for the forward that shapes the
    outputs, then the set being made: never both at once) and a forward on each side, its ``work`` (the
    reference's, measured on its first trial: outputs and intermediates) or at least its outputs (the outputs'
    structure is kept without their memory; a lean batch's reference outputs are its forward's own, compared where
    they are). With each forward counted by its outputs only, `level3/5_AlexNet`'s worker was left 6.9 GB beside
    its batch at 40 GB and ran out (1.1 GB asked, 5.8 GB allocated)."""
    return batch_bytes(sum(nbytes_of(sample)), sum(nbytes_of(sample_out)), work, lean)


def batch_bytes(inputs: int, outputs: int, work: int = 0, lean: bool = False) -> tuple[int, int]:
    """:func:`set_bytes` of a set of ``inputs`` bytes whose outputs take ``outputs`` bytes."""
    copies = 2 if lean else 3
    return copies * (inputs + outputs), inputs + 2 * max(outputs, work)


def _work(task: JudgeTask) -> int:
    footprint = getattr(task, "footprint", None)
    return footprint.work if footprint is not None else 0


def sets_in(task: JudgeTask, per_set: int, fixed: int, room: int | None) -> int:
    """How many batch sets of ``per_set`` bytes, beside ``fixed`` (:func:`set_bytes`), the memory holds: ``room``,
    what the evaluation's budget leaves (else a share of the device, or CPU_BUDGET_BYTES)."""
    if room is not None:
        budget = room
    elif task.device == "cuda":
        budget = int(CUDA_BUDGET_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    else:
        budget = CPU_BUDGET_BYTES
    return max(0, (budget - fixed) // max(per_set, 1))


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    return [t for _, t in flatten_outputs(value) if isinstance(t, torch.Tensor)]


def tensor_attributes(model: Any) -> dict[tuple[int, str], torch.Tensor]:
    """The tensor each tensor attribute of ``model`` and its submodules is bound to (parameters and buffers
    included): what a forward that rebinds its state changes (:func:`same_binding`)."""
    if not isinstance(model, torch.nn.Module):
        return {}
    found: dict[tuple[int, str], torch.Tensor] = {}
    for i, m in enumerate(model.modules()):
        for where in (vars(m), m._parameters, m._buffers):
            for name, value in where.items():
                if isinstance(value, torch.Tensor):
                    found[(i, name)] = value
                elif isinstance(value, list | tuple | dict) and not isinstance(value, torch.nn.Module):
                    items = value.items() if isinstance(value, dict) else enumerate(value)
                    for key, item in items:  # a state kept in a list or a dict of tensors, one level down
                        if isinstance(item, torch.Tensor):
                            found[(i, f"{name}[{key!r}]")] = item
    return found


def same_binding(a: dict[tuple[int, str], torch.Tensor], b: dict[tuple[int, str], torch.Tensor]) -> bool:
    """The same attributes bound to the same tensor objects (held by ``a``: none freed and its address reused)."""
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


class ReferenceSide:
    """The reference's half of the batch, in the judge: its own input and output buffers, and a graph of it. In a
    ``lean`` batch (:func:`confirm`) its input buffers are the staging itself and it has no output buffers: each of
    its rounds writes its staging into the worker's shared inputs and its outputs into the worker's slots (the same
    bytes into the same memory as the candidate's round, so the fixed costs stay alike), lent by the worker's side
    (:attr:`lent`) once staged; never as a graph."""

    def __init__(self, task: JudgeTask, template: list[Any], k: int, want_graph: bool, lean: bool = False) -> None:
        self.task = task
        self.lean = lean
        self.lent: Lent | None = None
        # the same kind of memory as the worker's (a memfd, the driver's VMM): on the CPU, pages of shared memory
        # are not those of a private heap, and a streaming kernel notices
        self.box = Outbox()
        self.packed = PackedSets(self.box, template, k, direct=lean)
        self.inputs = self.packed.sets
        before = tensor_attributes(task.model)
        with torch.no_grad():
            out = task.model(*clone_all(template))
        # the outputs' structure, shapes and dtypes, holding no memory (a 6.4 GB output held through the batch was
        # what the default budget lacked for one set of 23_Softmax on an H100: 64.4 GB for one, 60.9 GB left)
        self.like = map_tensors(out, lambda t: torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape))
        del out
        # a forward that rebinds a tensor of its module (a recurrent cell's state: level3/33_VanillaRNN) replays, as
        # a graph, on the memory of the tensor it let go at its capture, which the judge's next allocations reuse
        want_graph = want_graph and same_binding(before, tensor_attributes(task.model)) and not lean
        del before
        self.outputs = [] if lean else [[view for _, _, view in slots]
                                        for slots in packed_slots(self.box, self.like, k)]
        for b in self.box.buffers:
            touch(b.data)
        # the judge's own batch: its memory sampler's thread may read the device meanwhile (judge_memory.py)
        self.graph = capture_graph(self._body, "thread_local") if want_graph and task.device == "cuda" else None

    def release(self) -> None:
        self.graph = None
        self.inputs, self.outputs, self.lent = [], [], None
        self.box.release()

    def _targets(self) -> list[list[torch.Tensor]]:
        """Where each set's outputs are copied: this side's buffers, or in a lean batch the worker's slots."""
        if not self.lean:
            return self.outputs
        assert self.lent is not None, "a lean batch's reference side runs once the worker's side is staged"
        return self.lent.slots

    def _fault_in(self) -> None:
        """A lean batch's shared buffers faulted in before this side's clock, the worker stopped: the worker holds
        their file descriptors and could drop their pages between its rounds (``MADV_REMOVE`` on a memfd), so that
        the judge's writes fault inside the reference's clock and its fixed costs (64 MB: 22 ms resident, 142 ms
        dropped, on the dev CPU)."""
        if self.lean:
            assert self.lent is not None
            for data in self.lent.buffers:
                touch(data)

    def _write(self) -> None:
        if self.lean:
            assert self.lent is not None
            self.lent.sets.write()  # this side's staging into the worker's shared inputs, as the candidate's round
        else:
            self.packed.write()

    def _body(self, seed: int | None = None) -> None:
        with torch.no_grad():
            for i, (inputs, outs) in enumerate(zip(self.inputs, self._targets(), strict=True)):
                if seed is not None:  # a reference that draws random numbers: set i's call after seed + i
                    torch.manual_seed(seed + i)
                for buf, t in zip(outs, tensor_leaves(self.task.model(*inputs)), strict=True):
                    buf.copy_(t)

    def _sums(self) -> None:
        if self.lean:
            assert self.lent is not None
            self.lent.sums()
        else:
            digests(self.box.slot_buffers)

    def expected(self, seed: int | None = None) -> list[Any]:
        """The reference's outputs on the values staged now, one per set, outside any clock (a lean batch's
        comparison: the candidate's round had this draw, the reference's timed round one of its own)."""
        found = []
        with torch.no_grad():
            for i, inputs in enumerate(self.inputs):
                if seed is not None:
                    torch.manual_seed(seed + i)
                found.append(self.task.model(*inputs))
        return found

    def graph_wrong(self, i: int, replayed: Any, tol: Tolerances) -> str | None:
        """Whether this side's graph gave set ``i`` other outputs (``replayed``) than the reference's forward called
        once more on the set's values as staged (private to the judge): what differs, or None. Only then is a batch
        wrong as CUDA graphs the judge's doing; a candidate's output that differs from a graph borne out so is its
        own."""
        try:
            with torch.no_grad():
                again = self.task.model(*self.packed.staged_set(i))
        except torch.OutOfMemoryError:  # no room to tell: the graph stands (never a way out of a wrong output)
            return None
        c = compare_outputs(again, replayed, tol)
        return None if c.ok else f"set {i + 1}: {c.problem}"

    def run(self, seed: int | None = None) -> tuple[float, list[Any]]:
        """(wall seconds, the outputs per set: views of this side's own buffers, valid until its next run or
        :meth:`overhead`), on the staged values; ``seed``: set i's call after seed + i."""
        self._fault_in()
        synchronize(self.task)
        started = time.perf_counter()
        self._write()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body(seed)
        self._sums()
        wall = time.perf_counter() - started
        mark(f"the reference's round: {1e3 * wall:.3f} ms")
        if self.lean:  # its outputs went into the worker's slots: the comparison's are :meth:`expected`'s
            return wall, []
        return wall, [self._outputs(i) for i in range(len(self.outputs))]

    def overhead(self) -> float:
        """What writing the inputs, copying the outputs into their buffers and summing them cost without the calls
        (seconds): the same on both sides, the slots being the same kind of memory as these buffers."""
        targets = self._targets()
        sources = [torch.zeros_like(buf) for buf in targets[0]]  # as a forward's outputs: made (and their pages
        # touched) before the clock
        self._fault_in()
        synchronize(self.task)
        started = time.perf_counter()
        self._write()
        for outs in targets:
            for buf, t in zip(outs, sources, strict=True):
                buf.copy_(t)
        self._sums()
        spent = time.perf_counter() - started
        del sources
        mark(f"the fixed costs: {1e3 * spent:.3f} ms")
        return spent

    def _outputs(self, i: int) -> Any:
        """Set ``i``'s outputs, in this side's own buffers (private to the judge; written again only by this side's
        next run, after this round's comparison)."""
        paths = [p for p, t in flatten_outputs(self.like) if isinstance(t, torch.Tensor)]
        return rebuild_outputs(self.like, dict(zip(paths, self.outputs[i], strict=True)))


def confirm(task: JudgeTask, make_template: Callable[[], list[Any]], event_speedup: float, claimed_ms: float,
            tol: Tolerances, candidate: CandidateSide, room: Callable[[], int | None] | None = None,
            earlier: Walls | None = None, strict: bool = False, above: bool = True,
            make_room: Callable[[], int | None] | None = None, graphs: bool = True) -> Confirmation:
    """Measure the candidate's speedup with the judge's own clock (see the module's docstring): the batch's sets
    filled first with ``make_template()``'s values; ``room()``: the bytes the memory budget leaves now (None: no
    budget, a share of the device), asked once the template is made (held, so not counted again); ``make_room``:
    gives back what the evaluation keeps only to go faster and says the room then, asked where fewer than the sets
    wanted (or MIN_SETS) fit (before the template is made, where the task's footprint tells so:
    :func:`_room_early`); ``earlier``: the rounds of a confirmation that did not bear the claim out, pooled with
    these (the same batch size; the readings over all the rounds count);
    ``strict``: the claim is in doubt, ``above``: it is above what stands unmeasured, :func:`unmeasured_bound`
    (see :func:`verdict`); ``graphs``: False runs the batch call by call whatever the sides could capture."""
    made_room = ""
    before = (_room_early(task, room, claimed_ms, event_speedup)
              if earlier is None and make_room is not None and room is not None else None)
    if before is not None and make_room is not None:
        left = make_room()
        make_room = None  # asked once
        if left is not None:
            made_room = _given_back(before, left)
    mark("confirmation: the room asked first" if made_room else "confirmation: the template next")
    template = make_template()
    mark("confirmation: the template made")
    lean = False
    if earlier is not None:
        k, lean = earlier.k, earlier.lean
    else:
        make_s = math.inf
        began = time.perf_counter()
        for _ in range(MAKE_SAMPLES):
            started = time.perf_counter()
            make_inputs(task.get_inputs, secrets.randbits(31), 1.0, task.device)
            synchronize(task)
            make_s = min(make_s, time.perf_counter() - started)
            if time.perf_counter() - began > MAKE_BUDGET_S:
                break
        mark("confirmation: a set's making timed")
        out = task.run(template, task.seed)
        i, o = sum(nbytes_of(template)), sum(nbytes_of(out))
        del out
        mark("confirmation: the outputs shaped")
        per_set, fixed = batch_bytes(i, o, _work(task))
        lean_set, _ = batch_bytes(i, o, _work(task), lean=True)
        wanted = wanted_sets(claimed_ms, make_s, event_speedup)
        left = room() if room is not None else None  # the template held (the output made above given back)
        fits = sets_in(task, per_set, fixed, left)
        if fits < min(wanted, MIN_SETS) and make_room is not None and left is not None:
            before, left = left, make_room()
            if left is not None:
                fits = sets_in(task, per_set, fixed, left)
                made_room = _given_back(before, left)
        k = max(0, min(wanted, fits))
        if k == 0:  # the lean batch: one set, a copy less of its inputs and of its outputs
            k = min(1, sets_in(task, lean_set, fixed, left))
            lean = k == 1
            if k == 0:
                shown = "" if left is None else f", {left / GB:.1f} GB left"
                return Confirmation(False, "not confirmed by the judge's wall clock: not one batch set of this task "
                                           f"fits the memory the budget leaves ({(lean_set + fixed) / GB:.1f} GB for "
                                           f"one{shown}; a larger --memory-budget measures it)", unfit=True)
    # a reference that draws random numbers: call by call, each after its own seed on both sides, and compared
    ref = ReferenceSide(task, template, k, want_graph=graphs and not task.draws_random, lean=lean)
    del template  # the sets hold its values: not a copy more through the rounds
    mark(f"confirmation: the reference side made ({k} set(s){', lean' if lean else ''})")
    try:
        found = (_lean_rounds if lean else _rounds)(task, event_speedup, tol, candidate, ref, k, earlier, strict,
                                                    above)
    finally:
        ref.release()
    return replace(found, note=f"{found.note}; {made_room}") if made_room else found


def _room_early(task: JudgeTask, room: Callable[[], int | None], claimed_ms: float, speedup: float) -> int | None:
    """Whether to ask for room before the batch's template is made: where the task's footprint (measured with its
    reference) says fewer than MIN_SETS sets would fit beside it now. Making the template, sampling how long a set
    takes and shaping the outputs hold the template, a transient set and a copy beside what the evaluation keeps to
    go faster (the worker's timing sets, kept trials), which the room gives back. The room now where it should be
    asked first, else None; asked where the later check would ask (fewer than the sets wanted, at most MIN_SETS: the
    time to make a set, not known yet, only lowers what is wanted). (`48_Mean_reduction_over_a_dimension`'s 44.4 GB
    of a 40 GB budget, which this was first written for, came from elsewhere: the worker still mapping the first
    batch when a second was made, :meth:`worker_batch.WorkerBatch.unstage`.)"""
    footprint = getattr(task, "footprint", None)
    if footprint is None:
        return None
    left = room()
    if left is None:
        return None
    per_set, fixed = batch_bytes(footprint.inputs, footprint.outputs, footprint.work)
    least = min(wanted_sets(claimed_ms, 0.0, speedup), MIN_SETS)
    return left if sets_in(task, per_set, fixed + footprint.inputs, left) < least else None  # + the template


def _given_back(before: int, left: int) -> str:
    return (f"{max(0, left - before) / GB:.1f} GB given back for the batch (what the evaluation keeps to go faster: "
            "the worker's timing sets, kept trials and other tasks)")


def _compare_round(outs: list[Any], refs: list[Any], tol: Tolerances) -> tuple[int, Confirmation] | None:
    """The first set whose outputs differ, and the failed confirmation it makes."""
    for i, (out, expected) in enumerate(zip(outs, refs, strict=True)):
        c = compare_outputs(out, expected, tol)
        if not c.ok:
            problem = f"confirmation batch, set {i + 1}: {c.problem}"
            return i, Confirmation(False, problem, problem=problem)
    return None


def _rounds(task: JudgeTask, event_speedup: float, tol: Tolerances, candidate: CandidateSide, ref: ReferenceSide,
            k: int, earlier: Walls | None = None, strict: bool = False, above: bool = True) -> Confirmation:
    # a graph only where the judge captured the reference (the worker's word alone is not enough)
    graph = bool(candidate.stage(ref.packed, ref.like, k, graph=ref.graph is not None)) and ref.graph is not None
    mark("confirmation: the worker side staged")
    if ref.graph is not None and not graph:  # the same way on both sides
        ref.graph = None
    ref_walls: list[float] = [*earlier.ref] if earlier else []
    cand_walls: list[float] = [*earlier.cand] if earlier else []
    overheads: list[float] = [*earlier.overheads] if earlier else []
    for r in range(ROUNDS):
        ref.packed.fill(lambda: make_inputs(task.get_inputs, secrets.randbits(31), 1.0, task.device))
        mark("confirmation: a fresh draw staged")
        seed = secrets.randbits(30) if task.draws_random else None  # told to the worker with go, on its clock
        # first in the round (it writes the reference side's output buffers, which its run below writes again);
        # the first round's comes before any call of the candidate's, and the least of the three counts: work a
        # worker leaves running after an answer can only slow a later sample
        with candidate.stopped():  # the judge's own side: nothing of the worker's runs beside it
            overheads.append(ref.overhead())
        refs: list[Any] = []
        outs: list[Any] = []
        for side in ("ref", "cand") if r % 2 == 0 else ("cand", "ref"):
            if side == "ref":
                with candidate.stopped():
                    wall, refs = ref.run(seed)
                ref_walls.append(wall)
            else:
                wall, outs, problem = candidate.run(seed)
                if problem:
                    problem = f"confirmation batch: {problem}"
                    return Confirmation(False, problem, problem=problem)
                cand_walls.append(wall)
        failed = _compare_round(outs, refs, tol)
        if failed is not None:
            i, found = failed
            wrong = ref.graph_wrong(i, refs[i], tol) if graph else None
            return replace(found, graph_wrong=wrong) if wrong is not None else found
        del refs, outs
    return _decide(task, event_speedup, candidate, Walls(ref_walls, cand_walls, overheads, k), graph, strict, above)


def _lean_rounds(task: JudgeTask, event_speedup: float, tol: Tolerances, candidate: CandidateSide,
                 ref: ReferenceSide, k: int, earlier: Walls | None = None, strict: bool = False,
                 above: bool = True) -> Confirmation:
    """The rounds of a lean batch (one set, call by call; :func:`confirm`). The reference side has no buffers of its
    own to write into: its round writes into the worker's shared inputs and slots, which the worker can read, so it
    runs on a fresh draw of its own, never the one the candidate's round is then given (which the worker would have
    seen before its clock); the reference's outputs on the candidate's draw are computed after the candidate's
    answer, outside both clocks, and compared. A reference whose time depends on its values is timed on values of
    the same kind, not the same values."""
    candidate.stage(ref.packed, ref.like, k, graph=False)
    ref.lent = candidate.lend()
    mark("confirmation: the worker side staged")
    # both sides' rounds write from one staging (a staging of the worker side's own would be a copy uncounted)
    assert ref.lent.sets.shares_staging(ref.packed), "a lean batch's sides share the reference side's staging"
    ref_walls: list[float] = [*earlier.ref] if earlier else []
    cand_walls: list[float] = [*earlier.cand] if earlier else []
    overheads: list[float] = [*earlier.overheads] if earlier else []

    def fresh() -> int | None:
        ref.packed.fill(lambda: make_inputs(task.get_inputs, secrets.randbits(31), 1.0, task.device))
        mark("confirmation: a fresh draw staged")
        return secrets.randbits(30) if task.draws_random else None

    for r in range(ROUNDS):
        with candidate.stopped():  # the staging holds a draw already used (or the template, which the worker has)
            overheads.append(ref.overhead())
        for side in ("ref", "cand") if r % 2 == 0 else ("cand", "ref"):
            seed = fresh()
            if side == "ref":
                with candidate.stopped():
                    wall, _ = ref.run(seed)
                ref_walls.append(wall)
                continue
            wall, outs, problem = candidate.run(seed)
            if problem:
                problem = f"confirmation batch: {problem}"
                return Confirmation(False, problem, problem=problem)
            cand_walls.append(wall)
            failed = _compare_round(outs, ref.expected(seed), tol)
            if failed is not None:
                return failed[1]
            del outs
    walls = Walls(ref_walls, cand_walls, overheads, k, lean=True)
    return _decide(task, event_speedup, candidate, walls, False, strict, above)


def _decide(task: JudgeTask, event_speedup: float, candidate: CandidateSide, walls: Walls, graph: bool,
            strict: bool, above: bool) -> Confirmation:
    """The verdict on a batch's rounds (:func:`verdict`), with the line that says how they were measured."""
    k, ref_walls, cand_walls = walls.k, walls.ref, walls.cand
    trip = max(0.0, candidate.round_trip_s)  # only the candidate's rounds carry a message to the worker and back
    reading = read_walls(walls, trip)
    how = "as CUDA graphs" if graph else "call by call"
    if walls.lean:
        how += (" (a lean batch of one set, without buffers of the reference's own: the reference timed on fresh "
                "inputs of its own, compared on the candidate's)")
    calls = (f"{len(cand_walls)}x{k} call(s) {how} on fresh inputs, {1e3 * reading.cand_s / k:.3g} ms per call; "
             f"fastest rounds {1e3 * min(ref_walls):.3g} ms (reference) and {1e3 * min(cand_walls):.3g} ms (of which "
             f"{1e3 * reading.overhead:.3g} ms writing, copying and summing and {1e3 * trip:.2g} ms the message round "
             f"trip){reading.note()}"
             + ("; each call after a seed of its own, alike on both sides" if task.draws_random else ""))
    precise = graph or reading.cand_s / k >= PRECISE_CALL_S
    found = verdict(event_speedup, reading.speedup, calls, walls, strict, precise=precise, above=above,
                    upper=reading.upper)
    # call by call, as the worker times each call (a graph's replay runs the calls back to back, without the gaps
    # and the flushed caches of the worker's calls: a time a call of another kind)
    return replace(found, ref_call_ms=1e3 * reading.ref_median_s / k) if precise and not graph else found


@dataclass(frozen=True)
class Reading:
    """What the judge reads from its rounds: the fixed costs taken off, each side's fastest round, and the ratio of
    the two sides' rounds taken in pairs (the two batches of one round ran moments apart)."""

    overhead: float
    ref_s: float  # the fastest reference round, the fixed costs off
    cand_s: float  # the fastest candidate round, the fixed costs and the round trip off
    paired: float  # the median over rounds of reference / candidate, each round's costs off alike
    ref_median_s: float = math.nan  # the reference's median round, the fixed costs off

    @property
    def fastest(self) -> float:
        return self.ref_s / self.cand_s if self.cand_s > 0 else math.inf

    @property
    def speedup(self) -> float:
        """The lower of the two readings. The fastest rounds are what each side costs with nothing beside it, and
        no candidate can slow every one of the judge's rounds (work it leaves queued on a GPU slows the round after
        its own); but a burst of load on the host that spans all of one side's rounds and spares one of the
        other's, with the fixed costs taken off, reads as a factor of several (a 1.0x matmul claiming 5x was
        confirmed at 2.5x on a loaded CI box). The pairs, each round's two batches moments apart, move together
        under such a burst; a lone slowed pair does not move their median. A claim must hold on both."""
        return min(self.fastest, self.paired)

    @property
    def upper(self) -> float:
        """The higher of the two readings: a claim above it too is borne out by neither (:func:`verdict`)."""
        return max(self.fastest, self.paired)

    def note(self) -> str:
        if self.paired >= self.fastest:
            return ""
        return (f"; the rounds in pairs read {self.paired:.2f}x against the fastest rounds' {self.fastest:.2f}x: "
                f"the lower counts")


def read_walls(walls: Walls, trip: float) -> Reading:
    """The judge's :class:`Reading` of its rounds (``trip``: the least round trip of a message to the worker)."""
    overhead = min(walls.overheads)

    def net_ref(s: float) -> float:
        return max(s - overhead, OVERHEAD_FLOOR * s)

    def net_cand(s: float) -> float:
        return max(s - overhead - trip, OVERHEAD_FLOOR * s)

    ratios = [net_ref(r) / net_cand(c) if net_cand(c) > 0 else math.inf
              for r, c in zip(walls.ref, walls.cand, strict=True)]  # a round adds one of each
    return Reading(overhead, net_ref(min(walls.ref)), net_cand(min(walls.cand)),
                   statistics.median(ratios) if ratios else math.inf,
                   statistics.median(net_ref(r) for r in walls.ref) if walls.ref else math.nan)


def unmeasured_bound(confirm_above: float) -> float:
    """The most a claim counts for where the judge's clock cannot tell (calls too short for it, or no batch set
    fits the memory left): LOW_CLAIM, or ``EvalConfig.confirm_above`` where that is higher."""
    return max(confirm_above, LOW_CLAIM)


def verdict(claim: float, wall: float, calls: str = "", walls: Walls | None = None, strict: bool = False,
            precise: bool = True, above: bool = True, upper: float | None = None) -> Confirmation:
    """The worker's ``claim`` against the judge's ``wall`` speedup. A claim above LOW_CLAIM stands where the judge
    measured at least AGREEMENT of it (or CONFIRMED_BY_ITSELF), else it is suspicious (but see ``upper``). A
    precise claim of LOW_CLAIM or less, or a ``strict`` one (in doubt: its reference ran slower beside the candidate
    than alone), is held to the judge's figure: it stands where the judge measured NEAR of it and at least
    AGREEMENT of its gain (a claim of 2x or less inflated inside the worker, where the candidate runs, is no more
    than the judge's clock saw, whose reference the candidate cannot slow: a spinner's 1.51x read 1.29x there);
    where the judge measured less, the judge's figure stands — for a strict claim above LOW_CLAIM only down to
    AGREEMENT of the claim, below which it is suspicious (again, see ``upper``). A claim of LOW_CLAIM or less is
    never suspicious: its record is the judge's figure whatever it is, so flagging it would keep nothing of the
    claim off the leaderboard.

    ``wall`` is the judge's lower reading (:attr:`Reading.speedup`), ``upper`` its higher one: a claim is suspicious
    only where both fall below AGREEMENT of it; where only the lower does, the lower is recorded. A busy host parts
    the two readings (an honest 5.57x read 2.57x in pairs and 3.72x by its fastest rounds beside three spinning
    processes, and was flagged), a cheat's claim is above both (80% of its time hidden: ~1x by either); and a
    figure of record is never more than the lower one, so nothing the candidate can move is credited.

    All only where the judge's figure is ``precise``: where it is not (calls of microseconds, call by call), a claim
    ``above`` what stands unmeasured (:func:`unmeasured_bound`) is held to AGREEMENT of it, and one below it
    stands."""
    held = strict or (precise and claim <= LOW_CLAIM)  # held to the judge's figure, not to half of the claim
    how = f" ({calls})" if calls else ""
    confirmed = Confirmation(True, f"speedup confirmed by the judge's wall clock: {wall:.2f}x{how}", wall,
                             walls=walls, claim=claim)
    if not precise and not above:
        return replace(confirmed, note=f"the judge's wall clock measured {wall:.2f}x, of calls too short for it to "
                                       f"tell: the worker's {claim:.2f}x stands{how}")
    high = max(wall, upper) if upper is not None else wall
    read = f"{wall:.2f}x to {high:.2f}x" if f"{high:.2f}" != f"{wall:.2f}" else f"only {wall:.2f}x"
    if not held or not precise:
        if wall >= min(AGREEMENT * claim, CONFIRMED_BY_ITSELF):
            return confirmed
        if precise and high >= AGREEMENT * claim:  # the readings part: the lower stands, not the claim
            return Confirmation(True, f"the judge's wall clock read {read} of the worker's {claim:.2f}x: its "
                                      f"figure stands, the lower{how}", wall, walls=walls, record=wall, claim=claim)
    elif wall >= CONFIRMED_BY_ITSELF or (wall - 1.0 >= AGREEMENT * (claim - 1.0) and wall >= NEAR * claim):
        return confirmed
    elif wall >= AGREEMENT * claim:
        return Confirmation(True, f"the judge's wall clock bore out {wall:.2f}x of the worker's {claim:.2f}x: its "
                                  f"figure stands{how}", wall, walls=walls, record=wall, claim=claim)
    elif claim <= LOW_CLAIM or high >= AGREEMENT * claim:  # the judge's figure is all it gets
        return Confirmation(True, f"the judge's wall clock read {read} of the worker's {claim:.2f}x: its figure "
                                  f"stands{how}", wall, walls=walls, record=wall, claim=claim)
    return Confirmation(False, f"suspicious: {claim:.2f}x by the worker's timing but {wall:.2f}x by the judge's "
                               f"wall clock{how}", wall, walls=walls, claim=claim)
