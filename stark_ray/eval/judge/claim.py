"""The judge's verdict on a timed claim: the worker's timing of a candidate, passed through the claim stage's rows of
the defence table (:mod:`stark_ray.eval.defences`) in their order, each one check of one interface.

The worker ran the candidate and timed it in its own process: its figures are the candidate's *claim*. Each defence
reads the :class:`Claim` and what the judgement can do for it (:class:`Judging`: time again, confirm by the judge's
clock, pace the reference) and returns :class:`Finding`\\ s; :func:`judge_claim` applies them in order. A finding is
one of: ``reject`` (kept off the leaderboard, with why: it passed its checks but is no success), ``fail`` (a wrong
output in the judge's own batch: a correctness failure, the worker replaced), ``cap`` (the speedup counts for no
more than a bound), ``record`` (the judge's figure stands for the worker's), ``flag``, ``note``, and ``timing`` (a
new measurement replaces the claim's). Verdict facts travel as fields of the worker's answer (its ``flags`` and
``findings``), never as its log's text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from stark_ray.eval.defences import CLAIM, DEFENCES
from stark_ray.eval.judge.confirmation import LOW_CLAIM, Confirmation, unmeasured_bound
from stark_ray.eval.judge.drift import Drift
from stark_ray.eval.judge.sol import SpeedOfLight, beyond_light
from stark_ray.eval.measure.noise import Z95, Measured, interval, is_noisy, kept
from stark_ray.records import REJECTING_FLAGS

LARGE_SPEEDUP = 10.0  # flagged (informational) above this
# what the worker's profile may report (its answer's "flags"): the informational ones are taken as they come (with
# their lines, library_compute's shown in the result's findings), no_kernel is own_kernel's to act on,
# unordered_stream comes with the worker's rejection (an early end)
WORKER_FLAGS = ("no_kernel", "extra_stream", "unordered_stream", "library_compute")
INFORMATIONAL = ("extra_stream", "library_compute")
REJECT, FAIL, CAP, RECORD, FLAG, NOTE, TIMING = "reject", "fail", "cap", "record", "flag", "note", "timing"


@dataclass(frozen=True)
class Finding:
    """What one defence found: its ``kind`` (above), a line for the log (and the error where it rejects or fails), a
    flag, and the figures a cap, a record or a new timing sets."""

    kind: str
    line: str = ""
    flag: str | None = None
    speedup: float | None = None  # cap, record: the speedup of record
    ref_ms: float | None = None  # record: the reference's time it is taken against
    timing: Measured | None = None  # timing: the measurement that stands now
    measured: bool = False  # cap: a bound read from the measurement itself (its spread and error still stand)


@dataclass
class Claim:
    """A candidate's timed claim as the defences see it, and its figures of record as they stand so far."""

    timing: Measured
    worker_flags: list[str]  # what the worker's profile reported (no_kernel, extra_stream)
    findings: dict[str, str]  # the worker's line for each of its flags
    worker_log: list[str]  # the worker's notes, each prefixed "worker: "
    speedup: float = 0.0
    ref_ms: float = 0.0
    new_ms: float = 0.0
    new_cv: float | None = None
    error: float | None = None
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    drift: Drift | None = None  # the reference ran slower beside the candidate than alone: its claim is in doubt
    recycle: bool = False  # its worker must not serve another candidate
    explained: dict[str, str] = field(default_factory=dict)  # an informational flag's line, by flag (the result's)
    told: list[str] = field(default_factory=list)  # the judge's own lines on its measurement (the result's notes)

    def __post_init__(self) -> None:
        self.take(self.timing)

    def take(self, timing: Measured) -> None:
        """The figures of record from a measurement of the worker's."""
        self.timing = timing
        self.speedup, self.ref_ms, self.new_ms = timing.speedup, timing.ref_ms, timing.new_ms
        self.new_cv = timing.new_cv
        self.error = timing.error if math.isfinite(timing.error) else None


class Judging(Protocol):
    """What a claim's defences may ask of the judgement in progress."""

    confirm_above: float
    light: SpeedOfLight | None  # the task's speed of light on a device whose limits are known (None: not judged)

    def can_time_again(self) -> bool:
        """Whether the clock leaves time to have the worker time both sides once more."""
        ...

    def time_again(self) -> Measured | None:
        """The worker's timing once more (None: it gave no second timing)."""
        ...

    def drift(self, ref_ms: float, ref_min_ms: float | None, speedup: float) -> Drift | None:
        """The reference's drift beside the candidate against its time alone (None: not slowed, or no yardstick)."""
        ...

    def confirm(self, speedup: float, new_ms: float, strict: bool) -> Confirmation:
        """The judge's wall-clock confirmation of a claimed speedup."""
        ...

    def passed(self, name: str) -> None:
        """Defence ``name``'s turn is over (switched off or not): where the judgement's seconds went is said so."""
        ...


Check = Callable[[Claim, Judging], list[Finding]]


def noise(claim: Claim, ctx: Judging) -> list[Finding]:
    """A speedup known to less than ±10% (95%) is measured once more; which of the two stands is
    :func:`stark_ray.eval.measure.noise.kept`'s rule. One still noisy says so, and its gain counts only as far as
    its interval shows (:func:`shown_gain`)."""
    found: list[Finding] = []
    first = claim.timing
    if is_noisy(first.error) and ctx.can_time_again():
        second = ctx.time_again()
        if second is None:
            found.append(Finding(NOTE, "timing measured again: no second timing"))
        else:
            stands = kept(first, second)
            found.append(Finding(TIMING, f"timing measured again (the first speedup, {first.speedup:.3g}x, was "
                                         f"known to {interval(first.error)} only): {second.speedup:.3g}x "
                                         f"{interval(second.error)}; kept the "
                                         f"{'second' if stands is second else 'first'}", timing=stands))
            first = stands
    if is_noisy(first.error):
        found.append(Finding(NOTE, f"noisy timing: the speedup is known to {interval(first.error)} only (95%; its "
                                   "pairs of calls vary that much: a busy host?)"))
        bound = shown_gain(first.speedup, first.error)
        if bound < first.speedup:  # a figure of record other than the worker's claim (a candidate that blinded
            # the worker's checks and made its own noise would otherwise leave its patches to the next): as a record
            # of the judge's, its worker serves no other candidate
            claim.recycle = True
            found.append(Finding(CAP, f"a noisy gain counts as far as its interval shows: the {first.speedup:.2f}x "
                                      f"measured counts as {bound:.2f}x", speedup=bound, measured=True))
    return found


def shown_gain(speedup: float, error: float) -> float:
    """What of a gain a noisy measurement shows: the low end of its 95% interval, never below 1x (a loss stands as
    measured). A busy host's noise inflates a ratio as readily as it deflates it, and the larger draw is the one a
    search keeps: on a loaded 2-core CI box a thread that slows the reference beside it (really 1.0x) claimed 1.51x
    ±49%, and the judge's clock, as loaded, read 2.08x; an honest 1.0x read 1.51x, then 2.67x."""
    if not speedup > 1.0 or not math.isfinite(error):
        return speedup
    return min(speedup, max(1.0, speedup * (1.0 - Z95 * error)))


def own_kernel(claim: Claim, ctx: Judging) -> list[Finding]:
    """A candidate whose profiled call launched no kernel of its own (only library ops) is off the leaderboard."""
    if "no_kernel" not in claim.worker_flags:
        return []
    return [Finding(REJECT, claim.findings.get("no_kernel") or "no kernel of its own was launched", flag="no_kernel")]


def large_speedup(claim: Claim, ctx: Judging) -> list[Finding]:
    """A claim above LARGE_SPEEDUP is flagged for a look (informational)."""
    return [Finding(FLAG, flag="large_speedup")] if claim.speedup > LARGE_SPEEDUP else []


def drift(claim: Claim, ctx: Judging) -> list[Finding]:
    """The reference's time beside the candidate against its time alone (:mod:`stark_ray.eval.judge.drift`): a
    reference slowed beside it puts the claim in doubt (the confirmation then measures it, strictly)."""
    found = ctx.drift(claim.ref_ms, claim.timing.ref_min_ms, claim.speedup)
    if found is None:
        return []
    claim.drift = found
    return [Finding(NOTE, found.note)]


def confirmation(claim: Claim, ctx: Judging) -> list[Finding]:
    """A claim above ``confirm_above`` (any gain, by default; any gain too where the reference drifted) measured by
    the judge's own clock, where the reference runs in the judge's process with the worker stopped and the two take
    turns at the same moments; none for a claim already off the leaderboard."""
    strict = claim.drift is not None
    if claim.rejected or not (claim.speedup > ctx.confirm_above or (strict and claim.speedup > 1.0)):
        return []
    c = ctx.confirm(claim.speedup, claim.new_ms, strict)
    if c.problem:
        return [Finding(FAIL, c.problem)]
    found = [Finding(NOTE, c.note)]
    if c.unfit:  # a claim the judge could not measure counts for no more than what stands unmeasured (the
        # candidate's memory decides what room is left: never a free pass)
        cap = 1.0 if strict else unmeasured_bound(ctx.confirm_above)
        found.append(Finding(FLAG, flag="unconfirmed"))
        if claim.speedup > cap:
            found.append(Finding(CAP, f"unconfirmed: the worker's {claim.speedup:.2f}x counts as {cap:.2f}x",
                                 speedup=cap))
    elif not c.confirmed:
        found.append(Finding(REJECT, c.note, flag="suspicious"))  # its worker serves no other candidate
    elif c.record is not None:  # the judge's figure, the lower, is the speedup of record, against the reference's
        # time alone (its time beside this candidate is what was in doubt)
        found.append(Finding(RECORD, speedup=c.record,
                             ref_ms=claim.drift.alone_ms if claim.drift is not None else claim.ref_ms))
        # the worker's figure not borne out (a busy host, or a worker whose clock or checks the candidate reached:
        # blinded, a cheat recorded at the judge's 1.01x left its patches to the next candidate, which passed a
        # same-address trial it fails): its worker serves no other candidate
        claim.recycle = True
    if strict and c.confirmed:
        found += held_to_the_reference_now(claim, c)
    return found


def held_to_the_reference_now(claim: Claim, c: Confirmation) -> list[Finding]:
    """A claim in doubt (its reference ran slower beside it than alone) counts for no more than the reference's time
    now — a call in the judge's rounds, the worker stopped — against the candidate's own time in the worker: what
    the drift check doubted is the reference's time beside the candidate, not the candidate's. Two readings must
    bear the claim out then, not one: on a loaded CI box the judge's batches read a spinner (really 1.0x) at 1.50x,
    the candidate's calls there at half the time the worker had timed them, while the judge's reference took 29.0
    ms a call and the candidate 30.06 ms in the worker (0.97x). Only for a standing figure of LOW_CLAIM or less:
    the two times are of different kinds, and under load the worker's calls run slower than the batch's."""
    ref, new = c.ref_call_ms, claim.timing.new_ms  # the candidate's time as measured (a cap before moves claim.new_ms)
    if ref is None or not math.isfinite(ref) or ref <= 0 or not new > 0:
        return []
    standing = min(claim.speedup, c.record) if c.record is not None else claim.speedup
    bound = ref / new
    if bound >= standing or standing > LOW_CLAIM:  # above it the judge's batch decides, as for any claim: under load
        return []  # the worker's calls run slower than the batch's (an honest fused 3.35x by the batch, 7.2 ms a call
        # in the worker and 3.6 ms in the batch, would have counted 1.72x); what a reference slowed beside the
        # candidate lends it is at most the slowdown, and a claim of 2x or less is where that decides
    claim.recycle = True  # a figure of record other than the worker's claim (see confirmation above)
    return [Finding(CAP, f"held to the reference's time now: it took {ref:.4g} ms a call in the judge's rounds (the "
                         f"worker stopped), the candidate {new:.4g} ms in the worker: {bound:.2f}x counts",
                    speedup=bound, ref_ms=ref)]


def speed_of_light(claim: Claim, ctx: Judging) -> list[Finding]:
    """A runtime of record below the task's speed of light (:func:`stark_ray.eval.judge.sol.beyond_light`: which
    floor, by how much) is flagged ``faster_than_sol`` (informational: algebra can beat the reference's FLOPs
    honestly); only on a device whose limits come from its datasheet, checked by a probe (a probe's figure under
    load is no bound)."""
    if ctx.light is None or claim.rejected:
        return []
    line = beyond_light(ctx.light, claim.new_ms)
    return [] if line is None else [Finding(FLAG, line, flag="faster_than_sol")]


CHECKS: dict[str, Check] = {"noise": noise, "own_kernel": own_kernel, "large_speedup": large_speedup,
                            "drift": drift, "confirmation": confirmation, "speed_of_light": speed_of_light}
ORDER = tuple(d.name for d in DEFENCES if d.stage == CLAIM)


class Failed(Exception):
    """A defence found the candidate wrong (its batch's outputs, in the judge's confirmation)."""


def judge_claim(claim: Claim, ctx: Judging, off: frozenset[str] = frozenset()) -> Claim:
    """The claim through every claim-stage defence not switched ``off``, in the table's order, after the worker's own
    report (its lines, its informational flags); a ``fail`` raises :class:`Failed`."""
    claim.notes += claim.worker_log
    claim.flags += [f for f in INFORMATIONAL if f in claim.worker_flags]
    claim.explained |= {f: claim.findings[f] for f in INFORMATIONAL if f in claim.worker_flags and f in claim.findings}
    for name in ORDER:
        if name not in off:
            for f in CHECKS[name](claim, ctx):
                apply(claim, f)
        ctx.passed(name)
    return claim


def apply(claim: Claim, f: Finding) -> None:
    """One finding's effect on the claim."""
    if f.kind == FAIL:
        raise Failed(f.line)
    if f.kind == TIMING:
        assert f.timing is not None
        claim.take(f.timing)
    if f.flag:
        claim.flags.append(f.flag)
        if f.kind == FLAG and f.line:
            claim.explained[f.flag] = f.line
    if f.kind == REJECT:  # off the leaderboard by its flag (EvalResult.accepted reads the flags)
        if f.flag not in REJECTING_FLAGS:
            raise ValueError(f"a rejection must carry one of {REJECTING_FLAGS}, not {f.flag!r}")
        claim.rejected.append(f.line)
        claim.recycle = claim.recycle or f.flag == "suspicious"
    elif f.line:
        claim.notes.append(f.line)
        if f.kind in (NOTE, TIMING, CAP):
            claim.told.append(f.line)
    if f.kind in (CAP, RECORD):
        assert f.speedup is not None
        ref_ms = f.ref_ms if f.ref_ms is not None else claim.ref_ms
        claim.speedup, claim.ref_ms, claim.new_ms = f.speedup, ref_ms, ref_ms / f.speedup
        if not f.measured:
            claim.new_cv = claim.error = None
