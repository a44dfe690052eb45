"""The defence table (stark_ray/eval/defences.py) and the judge's claim stage (stark_ray/eval/judge/claim.py): every
row named once and documented, the claim's defences applied in the table's order, and each one tested alone on a
hand-made claim (the machinery around them — the worker's timing, the judge's batch — is tested through real
processes in tests/test_integrity.py, tests/test_timing_cheats.py and tests/test_confirmation_cheats.py, where a
defence switched off lets its cheat through)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stark_ray.config import EvalConfig
from stark_ray.eval import defences
from stark_ray.eval.judge import claim as claims
from stark_ray.eval.judge.claim import Claim, Failed, judge_claim
from stark_ray.eval.judge.confirmation import Confirmation
from stark_ray.eval.judge.drift import Drift
from stark_ray.eval.judge.sol import SpeedOfLight
from stark_ray.eval.measure.noise import Measured

DOCS = Path(__file__).resolve().parents[1] / "docs" / "evaluator.md"


def timing(speedup: float, error: float = 0.01, ref_ms: float = 1.0) -> Measured:
    return Measured(ref_ms, ref_ms / speedup, 0.01, 0.01, error, ref_ms * 0.95)


@dataclass
class Judging:
    """A judgement's side of the claim stage, scripted: what the worker's second timing says, whether the reference
    drifted, what the judge's clock measures; and what was asked of it."""

    confirm_above: float = EvalConfig.confirm_above
    again: Measured | None = None
    time_left: bool = True
    drifted: Drift | None = None
    confirmation: Confirmation | None = field(default_factory=lambda: Confirmation(True, "confirmed by the judge"))
    light: SpeedOfLight | None = None
    asked: list[str] = field(default_factory=list)

    def can_time_again(self) -> bool:
        return self.time_left

    def time_again(self) -> Measured | None:
        self.asked.append("time_again")
        return self.again

    def drift(self, ref_ms: float, ref_min_ms: float | None, speedup: float) -> Drift | None:
        self.asked.append("drift")
        return self.drifted

    def confirm(self, speedup: float, new_ms: float, strict: bool) -> Confirmation:
        self.asked.append(f"confirm strict={strict}")
        assert self.confirmation is not None
        return self.confirmation

    def passed(self, name: str) -> None:
        self.asked.append(f"passed {name}")


def claim_of(speedup: float, error: float = 0.01, flags: tuple[str, ...] = (), log: tuple[str, ...] = (),
             findings: dict[str, str] | None = None, ref_ms: float = 1.0) -> Claim:
    return Claim(timing(speedup, error, ref_ms), list(flags), findings or {}, [f"worker: {line}" for line in log])


# -- the table ---------------------------------------------------------------------------------------------------
def test_every_defence_has_one_row_a_known_stage_and_the_claim_rows_their_checks() -> None:
    names = [d.name for d in defences.DEFENCES]
    assert len(names) == len(set(names))
    assert all(d.stage in defences.STAGES and d.process in (defences.JUDGE, defences.WORKER)
               for d in defences.DEFENCES)
    claim_rows = [d.name for d in defences.DEFENCES if d.stage == defences.CLAIM]
    assert list(claims.ORDER) == claim_rows and set(claims.CHECKS) == set(claim_rows)
    # the stages in their order: a row's place says when it runs
    stages = [defences.STAGES.index(d.stage) for d in defences.DEFENCES]
    assert stages == sorted(stages)


def test_docs_list_every_defence_in_the_tables_order() -> None:
    """docs/evaluator.md's defence table: one row per defence, named as in the code, in the same order."""
    section = DOCS.read_text().split("## The defence table", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|(?:[^|\n]*\|){3} (yes|no) \|", section, flags=re.M)
    assert rows == [(d.name, "yes" if d.switchable else "no") for d in defences.DEFENCES]


def test_a_defence_switched_off_is_named_and_checked() -> None:
    defences.check_off(["confirmation", "drift"])
    with pytest.raises(ValueError, match="no defence named 'confirmaton'"):
        defences.check_off(["confirmaton"])
    with pytest.raises(ValueError, match="'standard_trials' cannot be switched off"):
        defences.check_off(["standard_trials"])
    # a switch in the worker would be one more thing the candidate's process could flip: only the judge's rows
    assert {d.name for d in defences.DEFENCES if d.switchable} <= {d.name for d in defences.DEFENCES
                                                                   if d.process == defences.JUDGE}
    assert EvalConfig(defences_off="drift").defences_off == ("drift",)  # type: ignore[arg-type]


# -- each claim defence alone ------------------------------------------------------------------------------------
def test_noise_times_a_noisy_claim_again_and_keeps_the_lower_of_two_noisy_readings() -> None:
    ctx = Judging(again=timing(1.2, error=0.2))
    c = claim_of(1.9, error=0.2)
    judge_claim(c, ctx, frozenset(defences.BY_NAME) - {"noise"})
    assert ctx.asked[0] == "time_again" and any("kept the second" in n for n in c.notes)
    assert any("noisy timing" in n for n in c.notes)
    # the second's 1.2x, known to ±39%, shows no gain: it counts as 1x, its error still said
    assert c.speedup == pytest.approx(1.0) and c.error == pytest.approx(0.2) and c.recycle
    steady = claim_of(1.9, error=0.01)
    judge_claim(steady, Judging(), frozenset(defences.BY_NAME) - {"noise"})
    assert steady.speedup == pytest.approx(1.9) and steady.notes == []
    hurried = Judging(time_left=False)  # no time left: no second timing, the first said noisy
    noisy = claim_of(1.9, error=0.2)
    judge_claim(noisy, hurried, frozenset(defences.BY_NAME) - {"noise"})
    assert "time_again" not in hurried.asked and any("noisy timing" in n for n in noisy.notes)


def test_a_noisy_gain_counts_as_far_as_its_interval_shows_and_a_loss_as_measured() -> None:
    """A still-noisy claim (the host's noise, or the candidate's own: a thread it left spinning) is recorded at the
    low end of its 95% interval, never below 1x; a steady one, or a loss, as measured. On a loaded CI box a spinning
    thread that slows the reference beside it (really 1.0x) claimed 1.51x ±49% and the judge's clock read 2.08x."""
    off = frozenset(defences.BY_NAME) - {"noise"}
    cases = [(1.51, 0.25, 1.0), (4.34, 0.1, 4.34 * (1 - 1.96 * 0.1)), (0.75, 0.2, 0.75), (1.9, 0.01, 1.9),
             (1.04, 0.06, 1.0)]
    for speedup, error, stands in cases:
        c = claim_of(speedup, error=error)
        judge_claim(c, Judging(again=timing(speedup, error=error)), off)
        assert c.speedup == pytest.approx(stands), (speedup, error, c.notes)
        assert c.ref_ms == pytest.approx(1.0) and c.new_ms == pytest.approx(1.0 / stands)
        capped = stands < speedup
        assert any("counts as" in n for n in c.notes) == capped == c.recycle, c.notes
    # the cap comes before the judge's clock: a gain the noise could make is none to confirm
    ctx = Judging(again=timing(1.51, error=0.25))
    c = claim_of(1.51, error=0.25)
    judge_claim(c, ctx, frozenset())
    assert not any(a.startswith("confirm") for a in ctx.asked) and c.speedup == pytest.approx(1.0)


def test_a_rejection_carries_a_flag_that_keeps_it_off_the_leaderboard() -> None:
    """EvalResult.accepted reads the flags: a rejection without one would be a success with an error line."""
    c = claim_of(3.0)
    with pytest.raises(ValueError, match="must carry one of"):
        claims.apply(c, claims.Finding(claims.REJECT, "rejected", flag="large_speedup"))


def test_own_kernel_reads_the_workers_flag_never_its_words() -> None:
    no_kernel = claim_of(1.5, flags=("no_kernel",), findings={"no_kernel": "no kernel of its own (only: at::mm)"})
    judge_claim(no_kernel, Judging(), frozenset())
    assert no_kernel.rejected == ["no kernel of its own (only: at::mm)"] and "no_kernel" in no_kernel.flags
    # a log line that says the same words, without the flag, decides nothing (and a flag without a line still does)
    worded = claim_of(1.5, log=("no kernel of its own was launched (only: at::mm)",))
    judge_claim(worded, Judging(), frozenset())
    assert worded.rejected == [] and "no_kernel" not in worded.flags
    bare = claim_of(1.5, flags=("no_kernel",))
    judge_claim(bare, Judging(), frozenset())
    assert bare.rejected == ["no kernel of its own was launched"]


def test_large_speedup_is_a_flag_and_nothing_more() -> None:
    c = claim_of(12.0)
    judge_claim(c, Judging(), frozenset(defences.BY_NAME) - {"large_speedup"})
    assert c.flags == ["large_speedup"] and c.rejected == [] and c.speedup == pytest.approx(12.0)


def test_a_drifted_reference_makes_any_gain_go_to_the_judges_clock_strictly() -> None:
    ctx = Judging(drifted=Drift(0.8, "the reference ran at 1.0 ms beside this candidate, 1.25x its 0.8 ms alone"),
                  confirmation=Confirmation(True, "speedup confirmed", record=1.1, claim=1.5))
    c = claim_of(1.5)
    judge_claim(c, ctx, frozenset())
    assert "confirm strict=True" in ctx.asked
    # the judge's figure stands, against the reference's time alone (its time beside the candidate was in doubt)
    assert c.speedup == pytest.approx(1.1) and c.ref_ms == pytest.approx(0.8) and c.new_ms == pytest.approx(0.8 / 1.1)
    undrifted = Judging(confirm_above=2.0, confirmation=Confirmation(True, "speedup confirmed"))
    judge_claim(claim_of(1.5), undrifted, frozenset())
    assert not any(a.startswith("confirm") for a in undrifted.asked)  # under confirm_above 2, no drift: no clock


def test_a_claim_in_doubt_is_held_to_the_references_time_in_the_judges_rounds() -> None:
    """CI's spinner: its reference 1.46x slower beside it than alone, the judge's batch read 1.50x (the candidate's
    calls there at half its worker's time), yet the judge's reference took 29.0 ms a call with the worker stopped
    against the candidate's 30.06 ms in the worker: that is what counts. Not without a drift, nor where the
    judge's figure is not precise (no time a call given), nor above the standing figure."""
    spinner = Confirmation(True, "speedup confirmed by the judge's wall clock: 1.50x", 1.50, claim=1.46,
                           ref_call_ms=29.0)
    c = claim_of(1.46, ref_ms=43.92)
    assert c.new_ms == pytest.approx(30.08, rel=1e-3)
    judge_claim(c, Judging(drifted=Drift(30.07, "the reference ran at 43.92 ms beside this candidate"),
                           confirmation=spinner), frozenset())
    assert c.speedup == pytest.approx(29.0 / c.new_ms) and c.ref_ms == pytest.approx(29.0) and c.recycle
    assert any(line.startswith("held to the reference's time now") for line in c.told), c.told
    undoubted = claim_of(1.46, ref_ms=43.92)
    judge_claim(undoubted, Judging(confirmation=spinner), frozenset())
    assert undoubted.speedup == pytest.approx(1.46) and not undoubted.recycle
    drifted = Drift(30.07, "slowed")
    imprecise = claim_of(1.46, ref_ms=43.92)
    judge_claim(imprecise, Judging(drifted=drifted, confirmation=Confirmation(True, "confirmed", 1.5, claim=1.46)),
                frozenset())
    assert imprecise.speedup == pytest.approx(1.46)
    # an honest 3x whose reference drifted under load, its reference as fast in the judge's rounds: unchanged
    honest = claim_of(3.0, ref_ms=3.0)
    judge_claim(honest, Judging(drifted=drifted, confirmation=Confirmation(True, "confirmed", 2.9, claim=3.0,
                                                                           ref_call_ms=3.2)), frozenset())
    assert honest.speedup == pytest.approx(3.0) and not honest.recycle
    # after a noisy gain's cap (which moves the candidate's time of record): its measured time is what counts
    capped = claim_of(1.6, error=0.06, ref_ms=1.6)  # counts as 1.41x by its interval
    judge_claim(capped, Judging(time_left=False, drifted=drifted,
                                confirmation=Confirmation(True, "confirmed", 1.5, claim=1.6, ref_call_ms=1.4)),
                frozenset())
    assert capped.speedup == pytest.approx(1.4), capped.notes
    # above 2x the judge's batch decides: under load the worker's calls run slower than the batch's (an honest fused
    # kernel confirmed at 3.35x, 7.16 ms a call in the worker, its reference 12.31 ms in the judge's rounds)
    fused = claim_of(3.35, ref_ms=3.35 * 7.156)
    judge_claim(fused, Judging(drifted=drifted, confirmation=Confirmation(True, "confirmed", 3.35, claim=3.35,
                                                                          ref_call_ms=12.31)), frozenset())
    assert fused.speedup == pytest.approx(3.35) and not fused.recycle
    # below the judge's own lower figure already: the record stands
    recorded = claim_of(1.8, ref_ms=1.8)
    judge_claim(recorded, Judging(drifted=drifted, confirmation=Confirmation(True, "its figure stands", 1.1,
                                                                             record=1.1, claim=1.8,
                                                                             ref_call_ms=1.5)), frozenset())
    assert recorded.speedup == pytest.approx(1.1)


def test_by_default_every_claimed_gain_goes_to_the_judges_clock() -> None:
    """A candidate that slows the reference in its own process (a spinning thread) was accepted at 1.52x on CI with
    no drift seen: its time alone had been measured under as much load. The judge's clock, where the reference runs
    in the judge's process with the worker stopped and the two take turns, is the check no candidate dodges, and
    by default it measures every claimed gain; no gain, no clock."""
    default = EvalConfig.confirm_above
    assert default == 1.0
    ctx = Judging(confirm_above=default, confirmation=Confirmation(True, "the judge's figure stands", record=1.02,
                                                                     claim=1.52))
    c = claim_of(1.52)
    judge_claim(c, ctx, frozenset())
    assert "confirm strict=False" in ctx.asked and c.speedup == pytest.approx(1.02)
    slower = Judging(confirm_above=default, confirmation=Confirmation(True, "confirmed"))
    judge_claim(claim_of(0.97), slower, frozenset())
    assert not any(a.startswith("confirm") for a in slower.asked)
    # a claim the judge could not measure (no batch set fits) counts for what stands unmeasured: 2x, or
    # confirm_above where higher — never 0 (confirm_above 0, the sweep's --confirm, once capped it at 0x)
    for above, cap in ((default, 2.0), (0.0, 2.0), (3.0, 3.0)):
        unfit = claim_of(5.0)
        judge_claim(unfit, Judging(confirm_above=above, confirmation=Confirmation(False, "no room", unfit=True)),
                    frozenset())
        assert unfit.speedup == pytest.approx(cap) and "unconfirmed" in unfit.flags, (above, unfit.speedup)


def test_the_confirmation_rejects_caps_fails_or_records() -> None:
    def judged(confirmation: Confirmation, speedup: float = 5.0, drifted: Drift | None = None) -> Claim:
        c = claim_of(speedup)
        judge_claim(c, Judging(confirmation=confirmation, drifted=drifted), frozenset())
        return c

    suspicious = judged(Confirmation(False, "suspicious: 5.0x by the worker's timing but 0.9x by the judge's"))
    assert "suspicious" in suspicious.flags and suspicious.rejected and suspicious.recycle
    unfit = judged(Confirmation(False, "no room", unfit=True))
    assert "unconfirmed" in unfit.flags and unfit.speedup == pytest.approx(2.0) and not unfit.rejected
    unfit_drifted = judged(Confirmation(False, "no room", unfit=True), drifted=Drift(1.0, "slowed"))
    assert unfit_drifted.speedup == pytest.approx(1.0)
    with pytest.raises(Failed, match="batch output"):
        judged(Confirmation(False, "", problem="batch output 3 differs"))
    confirmed = judged(Confirmation(True, "speedup confirmed by the judge's wall clock: 4.9x"))
    assert confirmed.speedup == pytest.approx(5.0) and confirmed.rejected == [] and confirmed.flags == []
    # the judge's figure recorded for the worker's: the worker that claimed more serves no other candidate (its clock
    # or its checks may be the candidate's)
    parted = judged(Confirmation(True, "the judge's wall clock read 2.40x to 3.70x", record=2.4, claim=5.0))
    assert parted.speedup == pytest.approx(2.4) and parted.recycle and not parted.rejected and parted.flags == []
    assert not confirmed.recycle
    # a claim already off the leaderboard is not measured
    off_board = claim_of(5.0, flags=("no_kernel",))
    ctx = Judging(confirmation=Confirmation(False, "suspicious"))
    judge_claim(off_board, ctx, frozenset())
    assert not any(a.startswith("confirm") for a in ctx.asked) and "suspicious" not in off_board.flags


def test_the_pipeline_runs_the_rows_in_the_tables_order_and_skips_those_off() -> None:
    ctx = Judging(drifted=Drift(1.0, "slowed"), confirmation=Confirmation(False, "suspicious: not borne out"))
    c = claim_of(3.0, flags=("extra_stream",), log=("its kernels use 1 more stream(s)",))
    judge_claim(c, ctx, frozenset())
    assert [a for a in ctx.asked if a.startswith("passed")] == [f"passed {n}" for n in claims.ORDER]
    assert c.flags == ["extra_stream", "suspicious"]
    assert c.notes[0] == "worker: its kernels use 1 more stream(s)"  # the worker's report first, then the defences
    ctx_off = Judging(drifted=Drift(1.0, "slowed"), confirmation=Confirmation(False, "suspicious"))
    free = claim_of(3.0)
    judge_claim(free, ctx_off, frozenset({"confirmation", "drift"}))
    assert "drift" not in ctx_off.asked and not any(a.startswith("confirm") for a in ctx_off.asked)
    assert free.speedup == pytest.approx(3.0) and free.rejected == []


def test_speed_of_light_flags_a_runtime_below_either_floor_and_says_which() -> None:
    """The physics row: below the memory floor (inputs and outputs moved once) is the hard bound, below the compute
    floor of the reference's FLOPs is reduced precision or algebra; within the margin, nothing."""
    gemm = SpeedOfLight(memory_ms=0.06, compute_ms=2.0, io_ms=0.06)  # 1.0 ms of reference: a float32 GEMM
    half = claim_of(8.0, ref_ms=2.4)  # 0.3 ms: 6.7x under its compute floor
    judge_claim(half, Judging(light=gemm, confirmation=Confirmation(True, "confirmed")), frozenset())
    assert half.flags == ["faster_than_sol"] and not half.rejected and half.speedup == pytest.approx(8.0)
    line = half.explained["faster_than_sol"]
    assert "6.67x below the compute floor" in line and "less precision" in line
    copy = SpeedOfLight(memory_ms=1.0, compute_ms=0.0, io_ms=1.0)  # an elementwise task: 1 ms to move its bytes
    sampled = claim_of(1.6, ref_ms=1.2)  # 0.75 ms: below the memory floor
    judge_claim(sampled, Judging(light=copy), frozenset())
    assert "below the memory floor" in sampled.explained["faster_than_sol"]
    near = claim_of(1.3, ref_ms=1.2)  # 0.92 ms: within the model's margin of the floor
    judge_claim(near, Judging(light=copy), frozenset())
    assert near.flags == [] and near.explained == {}
    unknown = claim_of(1.6, ref_ms=1.2)  # a device whose limits are not known: no bound to break
    judge_claim(unknown, Judging(light=None), frozenset())
    assert unknown.flags == []
    judged_off = claim_of(1.6, ref_ms=1.2)
    judge_claim(judged_off, Judging(light=copy), frozenset({"speed_of_light"}))
    assert judged_off.flags == []


def test_library_compute_is_the_workers_informational_flag_with_its_line() -> None:
    """A library doing the work behind kernels of its own: the worker's profile says so (the share and the kernels),
    the judge takes the flag and its line as they come, and nothing else follows from it."""
    from stark_ray.eval.worker.kernel_sources import library_compute
    from stark_ray.eval.worker.streams import Launch

    casts = [Launch("f32_to_f16_kernel", 7, 0.0, 10.0), Launch("f32_to_f16_kernel", 7, 10.0, 20.0),
             Launch("f16_to_f32_kernel", 7, 300.0, 320.0)]
    gemm = Launch("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", 7, 20.0, 300.0)
    own = {"f32_to_f16_kernel", "f16_to_f32_kernel"}
    line = library_compute([*casts, gemm], own)
    assert line is not None and line.startswith("88% of its kernels' GPU time") and "sm90_xmma_gemm" in line
    assert "a library does the arithmetic" in line
    assert library_compute(casts, own) is None  # its own kernels do the work
    assert library_compute([gemm, Launch("Memcpy DtoD", 7, 0.0, 500.0)], set()) is None  # no kernel: no_kernel's
    epilogue = [Launch("gelu_bias_kernel", 7, 0.0, 30.0), Launch("Memset (Device)", 7, 30.0, 90.0),
                Launch("ampere_sgemm_128x64_nn", 7, 90.0, 110.0)]
    assert library_compute(epilogue, {"gelu_bias_kernel"}) is not None  # 40% of the code's time in an SGEMM
    small = [Launch("gelu_bias_kernel", 7, 0.0, 30.0), Launch("Memset (Device)", 7, 30.0, 90.0),
             Launch("elementwise_kernel", 7, 90.0, 99.0)]
    assert library_compute(small, {"gelu_bias_kernel"}) is None  # copies and fills are not code; a small torch op
    c = claim_of(7.9, flags=("library_compute",), findings={"library_compute": line})
    judge_claim(c, Judging(confirmation=Confirmation(True, "confirmed")), frozenset())
    assert "library_compute" in c.flags and c.explained["library_compute"] == line and not c.rejected


def _stub_judgement(device: str) -> Any:
    """What Judgement.confirmed reads of itself: 16 GB of room, no deadline."""
    import types

    from stark_ray.eval.judge.judge import Judgement

    stub = types.SimpleNamespace(
        task=types.SimpleNamespace(device=device), cfg=EvalConfig(), tol=None, round_trip_s=0.0,
        judge=types.SimpleNamespace(memory=types.SimpleNamespace(room=lambda: 16 << 30),
                                    worker=types.SimpleNamespace(alive=True)),
        clock=types.SimpleNamespace(deadline=float("inf")), make_room=lambda: 16 << 30,
        _room_share=lambda share: lambda: (16 << 30) // share)
    stub._let_go = lambda batch: Judgement._let_go(stub, batch)  # type: ignore[arg-type]
    return stub


def test_a_confirmation_batch_that_does_not_fit_the_device_is_made_smaller_then_unconfirmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's own batch running out of device memory is never the candidate's failure: it is made again with
    a quarter of the room, and where that does not fit either, the claim is unconfirmed (capped), not failed."""

    import torch

    from stark_ray.eval.judge import judge as judge_module

    rooms: list[int | None] = []

    def full(task, make, speedup, new_ms, tol, batch, room, *rest, **kw):  # type: ignore[no-untyped-def]
        rooms.append(room())
        if len(rooms) < 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return Confirmation(True, "speedup confirmed by the judge's wall clock: 7.8x")

    monkeypatch.setattr(judge_module, "confirm", full)
    judgement = _stub_judgement("cpu")
    c = judge_module.Judgement.confirmed(judgement, 7.9, 0.3)  # type: ignore[arg-type]
    assert c.confirmed and rooms == [16 << 30, 4 << 30, 1 << 30]
    def never_fits(*args, **kw):  # type: ignore[no-untyped-def]
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(judge_module, "confirm", never_fits)
    never = judge_module.Judgement.confirmed(judgement, 7.9, 0.3)  # type: ignore[arg-type]
    assert never.unfit and not never.confirmed and "did not fit in the device's memory" in never.note


def test_the_workers_mappings_of_a_batch_go_before_the_next_batch_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared buffer's device memory goes back once every process that maps it has let it go. The worker unmapped
    a batch at its next ``stage``, after the judge had made the next batch's buffers: a claim measured again on
    `48_Mean_reduction_over_a_dimension` (a lean batch of 8.6 GB inputs) held both for a moment, 44.4 GB of a 40 GB
    budget on an H100 (session 42's trace). Each batch is now let go on both sides before anything more is made."""
    from stark_ray.eval.judge import judge as judge_module
    from stark_ray.eval.wire.protocol import OP_RELEASE

    events: list[str] = []

    class Recorded(judge_module.WorkerBatch):
        def __init__(self, talk: Any) -> None:
            super().__init__(talk)
            events.append("made")

        def release(self) -> None:
            events.append("released")
            super().release()

        def unstage(self) -> None:
            events.append("unstaged")
            super().unstage()

    steps: list[tuple[str, dict[str, Any]]] = []
    judgement = _stub_judgement("cpu")
    judgement.step = lambda op, payload, fds=None, label="": steps.append((op, payload)) or {}

    def staged_then_not_borne_out(task, make, speedup, new_ms, tol, batch, *rest, **kw):  # type: ignore[no-untyped-def]
        batch.packed = object()  # staged (its worker maps the buffers)
        return Confirmation(False, "not borne out", wall_speedup=1.0, claim=speedup, record=1.0)

    monkeypatch.setattr(judge_module, "WorkerBatch", Recorded)
    monkeypatch.setattr(judge_module, "confirm", staged_then_not_borne_out)
    judge_module.Judgement.confirmed(judgement, 3.0, 0.3)  # type: ignore[arg-type]
    assert events == ["made", "released", "unstaged", "made", "released", "unstaged"], events
    assert steps == [(OP_RELEASE, {"batch": True})] * 2
    batch = Recorded(judgement)
    batch.unstage()  # never staged: nothing to ask of the worker
    assert len(steps) == 2

    def staged_then_the_judges_failure(task, make, speedup, new_ms, tol, batch, *rest, **kw):  # type: ignore[no-untyped-def]
        batch.packed = object()
        raise RuntimeError("the judge's reference failed")

    monkeypatch.setattr(judge_module, "confirm", staged_then_the_judges_failure)
    with pytest.raises(RuntimeError):
        judge_module.Judgement.confirmed(judgement, 3.0, 0.3)  # type: ignore[arg-type]
    assert len(steps) == 3 and steps[-1] == (OP_RELEASE, {"batch": True})
    judgement.judge.worker.alive = False  # a step to a process gone would start another
    monkeypatch.setattr(judge_module, "confirm", staged_then_not_borne_out)
    judge_module.Judgement.confirmed(judgement, 3.0, 0.3)  # type: ignore[arg-type]
    assert len(steps) == 3


def test_a_batch_wrong_by_the_judges_own_graph_is_measured_again_call_by_call_before_it_is_the_candidates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture is the judge's choice: a batch whose reference graph gave other outputs than the reference's
    forward on the same inputs (level3/33_VanillaRNN, the reference's own forward, at 40 GB on an H100: "set 8:
    values differ") is measured again call by call; a candidate's wrong output against a sound graph is its own
    failure, with no second batch."""

    from stark_ray.eval.judge import judge as judge_module

    asked: list[bool] = []
    wrong = "confirmation batch, set 8: output: values differ"

    def graphs_wrong(task, make, speedup, new_ms, tol, batch, room, *rest, graphs=True, **kw):  # type: ignore[no-untyped-def]
        asked.append(graphs)
        if graphs:
            return Confirmation(False, wrong, problem=wrong, graph_wrong="set 8: output: values differ")
        return Confirmation(True, "speedup confirmed by the judge's wall clock: 3.1x", wall_speedup=3.1, claim=3.2)

    monkeypatch.setattr(judge_module, "confirm", graphs_wrong)
    judgement = _stub_judgement("cuda")
    c = judge_module.Judgement.confirmed(judgement, 3.2, 0.3)  # type: ignore[arg-type]
    assert asked == [True, False] and c.confirmed and c.problem is None
    assert "the judge's CUDA graph of the reference was wrong" in c.note and "set 8" in c.note

    def candidate_wrong(*args, graphs=True, **kw):  # type: ignore[no-untyped-def]
        asked.append(graphs)
        return Confirmation(False, wrong, problem=wrong)  # the judge's graph bore its reference out

    asked.clear()
    monkeypatch.setattr(judge_module, "confirm", candidate_wrong)
    c = judge_module.Judgement.confirmed(judgement, 3.2, 0.3)  # type: ignore[arg-type]
    assert asked == [True] and c.problem == wrong and not c.confirmed


def test_the_reference_side_tells_its_own_wrong_output_from_a_right_one() -> None:
    """What decides whether a batch wrong as CUDA graphs is the judge's doing: the reference's forward once more on
    the staged values of the set, against what the batch gave for it."""
    import torch

    from stark_ray.eval.judge.confirmation import ReferenceSide
    from stark_ray.eval.judge.trials import JudgeTask
    from stark_ray.eval.measure.tolerance import Tolerances

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0

    task = JudgeTask("t", None, Scale(), [], "cpu", 0)
    side = ReferenceSide(task, [torch.randn(16)], 2, want_graph=False)
    try:
        values = [torch.randn(16), torch.randn(16)]
        made = iter([[v] for v in values])
        side.packed.fill(lambda: next(made))
        _, outs = side.run()
        tol = Tolerances.of(EvalConfig())
        assert side.graph_wrong(1, outs[1], tol) is None
        assert "set 2" in (side.graph_wrong(1, outs[1] + 1.0, tol) or "")
    finally:
        side.release()


def test_a_forward_that_rebinds_its_state_is_never_captured_by_the_judge() -> None:
    """A recurrent cell that rebinds its hidden state in forward would replay, as a graph, on the memory of the
    tensor it let go at its capture (which later allocations reuse); one that keeps its tensors is captured."""
    import torch

    from stark_ray.eval.judge.confirmation import same_binding, tensor_attributes

    class Cell(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.zeros(2, 4)
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.hidden = torch.tanh(self.lin(torch.cat((x, self.hidden), dim=1)))
            return self.hidden * 2

    cell, lin = Cell(), torch.nn.Linear(4, 4)
    before = tensor_attributes(cell)
    cell(torch.rand(2, 4))
    assert not same_binding(before, tensor_attributes(cell))
    before = tensor_attributes(lin)
    lin(torch.rand(2, 4))
    assert same_binding(before, tensor_attributes(lin))


def test_the_device_running_out_of_memory_on_the_workers_side_of_the_batch_is_the_batchs_size() -> None:
    """The worker says what it raised was the device's memory (level3/5_AlexNet at 40 GB: "confirmation batch:
    OutOfMemoryError", recorded as the candidate's runtime failure): in a trial that is decided as any raise, in the
    confirmation batch it is torch.OutOfMemoryError, which makes the batch smaller (or the claim unconfirmed)."""
    import torch

    from stark_ray.eval.judge.verdicts import Decided, DeviceMemory, checked_answer
    from stark_ray.eval.judge.worker_batch import _batch_memory

    answer = {"seq": 3, "tampered": [], "healthy": True,
              "raised": {"error": "OutOfMemoryError: CUDA out of memory", "device_memory": True}}
    with pytest.raises(DeviceMemory) as raised:
        checked_answer(answer, "confirmation batch", 3)
    assert isinstance(raised.value, Decided) and not raised.value.recycle
    with pytest.raises(torch.OutOfMemoryError, match="the worker's side"), _batch_memory():
        checked_answer(answer, "confirmation batch", 3)
    other = {**answer, "raised": {"error": "RuntimeError: boom"}}
    with pytest.raises(Decided) as raised, _batch_memory():
        checked_answer(other, "confirmation batch", 3)
    assert not isinstance(raised.value, DeviceMemory)


def test_the_judges_own_lines_on_its_measurement_are_told_and_the_workers_are_not() -> None:
    # the agents were never told that a speedup was timed again, confirmed, or measured beside a slowed reference
    ctx = Judging(drifted=Drift(0.8, "the reference ran at 1.0 ms beside this candidate, 1.25x its 0.8 ms alone"),
                  confirmation=Confirmation(True, "speedup confirmed by the judge's wall clock: 1.10x", record=1.1,
                                            claim=1.5))
    c = claim_of(1.5, log=("reference: 1.0 ms",))
    judge_claim(c, ctx, frozenset())
    assert c.told == ["the reference ran at 1.0 ms beside this candidate, 1.25x its 0.8 ms alone",
                      "speedup confirmed by the judge's wall clock: 1.10x"]
    capped = claim_of(5.0)
    judge_claim(capped, Judging(confirmation=Confirmation(False, "no room", unfit=True)), frozenset())
    assert capped.told == ["no room", "unconfirmed: the worker's 5.00x counts as 2.00x"]
