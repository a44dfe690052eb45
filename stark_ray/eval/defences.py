"""The evaluator's defences, one row each: what each stops, where it runs, in which stage of a candidate's way, and
whether it can be switched off (``EvalConfig.defences_off``, for tests and ablations: a result judged with a defence
off carries the flag ``defences_off`` and says which in its log).

Only the judge's rows can be switched off. A switch inside the worker would live in the process the candidate runs
in, one more thing for it to flip (a candidate reaches the worker's objects through its frames); the worker's rows
always run.

The stages run in this order for every candidate: ``load`` (the import, in the worker), ``trials`` (the judge's
correctness trials), ``timing`` (the worker's interleaved timing), ``claim`` (the judge's pipeline over the worker's
timing: :mod:`stark_ray.eval.judge.claim`, its rows applied in the order listed here), ``after`` (what follows the
verdict). Within the claim stage each row is one check of the same interface (``check(claim, ctx) -> findings``: a
rejection, a cap, a flag, a note or the judge's figure of record).

This module is data only: no torch, nothing of the judge's or the worker's, so that both processes, the service and
docs/evaluator.md's table (checked by tests/test_defences.py) read the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

LOAD, TRIALS, TIMING, CLAIM, AFTER = "load", "trials", "timing", "claim", "after"
STAGES = (LOAD, TRIALS, TIMING, CLAIM, AFTER)
JUDGE, WORKER = "judge", "worker"


@dataclass(frozen=True)
class Defence:
    """One defence: its name (``EvalConfig.defences_off`` takes it), its stage, the process it runs in, the class of
    cheat or fault it stops, and whether it can be switched off."""

    name: str
    stage: str
    process: str
    stops: str
    switchable: bool = True


DEFENCES: tuple[Defence, ...] = (
    Defence("fingerprint", LOAD, WORKER,
            "a candidate that patches torch, the timer or the evaluator's own code in its process (`tampered`; "
            "checked after every step)", switchable=False),
    Defence("host_memory", LOAD, WORKER,
            "a candidate that fills the host's memory (the host's OOM killer taking a process of the run, or a fill "
            "swapping into the time limit): the candidate's process is held to `worker_memory_gb` (RLIMIT_DATA), "
            "an allocation past it fails in the candidate's call, said as out of memory (`out_of_memory`); shared "
            "mappings and child processes are not counted (the kernel's OOM killer, said as such, is the backstop)",
            switchable=False),
    Defence("standard_trials", TRIALS, JUDGE,
            "wrong outputs on fresh seeded inputs the judge makes and compares itself", switchable=False),
    Defence("inputs_unchanged", TRIALS, JUDGE,
            "a candidate that writes its inputs (the judge's copy made again and compared)", switchable=False),
    Defence("output_form", TRIALS, WORKER,
            "outputs aliasing an input, tensor subclasses, outputs on the wrong device", switchable=False),
    Defence("earlier_output", TRIALS, WORKER,
            "one output buffer handed out by every call, or an earlier output written later (a caller keeping two "
            "outputs has the first overwritten): the same-address trial's first outputs kept through its second "
            "call and found unchanged (where one more output set fits the budget)", switchable=False),
    Defence("poisoned_memory", TRIALS, WORKER,
            "outputs left partly unwritten (the allocator's next blocks filled with NaN bytes in the worker; the "
            "judge fills its slots so too)", switchable=False),
    Defence("blocks_trial", TRIALS, JUDGE,
            "a kernel that computes on part of its input and extrapolates"),
    Defence("sensitivity_trial", TRIALS, JUDGE,
            "a kernel that ignores or samples part of its input"),
    Defence("same_address_trial", TRIALS, JUDGE,
            "an output cache keyed by the input's address"),
    Defence("precision", TRIALS, JUDGE,
            "arithmetic of less precision than the task's (TF32, float16 or bfloat16 on a float32 task) within the "
            "tolerance: an error far above the reference's own float32 error against float64 (`reduced_precision`)"),
    Defence("reference_seal", TIMING, WORKER,
            "a hook, patch or swapped part of the reference the candidate is timed beside (`tampered`; checked "
            "after every step)", switchable=False),
    Defence("process_state", TIMING, WORKER,
            "global state left set to slow the reference (threads, grad, modes, profile functions)",
            switchable=False),
    Defence("timed_outputs", TIMING, WORKER,
            "a memoised or racy output in the timed calls (each checked against the reference's of its round)",
            switchable=False),
    Defence("l2_flush", TIMING, WORKER,
            "data kept in the L2 cache from one timed call to the next: the cache flushed before each call, its "
            "persisting lines (a candidate's access-policy window) reset to normal first", switchable=False),
    Defence("stream_order", TIMING, WORKER,
            "kernels on a stream that does not wait for the caller's, run outside the timing window "
            "(`unordered_stream`); work on streams in order is timed up to a device-wide sync (`extra_stream`)",
            switchable=False),
    Defence("library_compute", TIMING, WORKER,
            "a library op doing the work behind a token kernel of its own (cuBLAS or cuDNN after two cast kernels, "
            "a subclass calling the reference's forward): half the profiled call's GPU time in kernels not of its "
            "own, or a quarter in a library's matrix products or convolutions (`library_compute`, informational)",
            switchable=False),
    Defence("after_timing_trial", TIMING, JUDGE,
            "a candidate correct through the trials and wrong once timed (a count of calls, a state the timed calls "
            "filled): one more trial of the judge's on fresh inputs after the timing"),
    Defence("noise", CLAIM, JUDGE,
            "a speedup too noisy to trust: measured once more, the lower-speedup or steadier reading kept; a gain "
            "still noisy counts only as far as its 95% interval shows (its low end, at least 1x)"),
    Defence("own_kernel", CLAIM, JUDGE,
            "a candidate that launched no kernel of its own, only library ops (`no_kernel`: off the leaderboard)"),
    Defence("large_speedup", CLAIM, JUDGE, "a speedup above 10x: flagged for a look (`large_speedup`)"),
    Defence("drift", CLAIM, JUDGE,
            "a reference slowed beside the candidate (a thread, queued work): its claim then measured by the judge, "
            "strictly, and held to the reference's time in the judge's rounds against the candidate's own"),
    Defence("confirmation", CLAIM, JUDGE,
            "a claim above `confirm_above` the judge's own wall clock does not bear out (its figure recorded, "
            "`suspicious` where neither reading comes to half a claim above 2x), or cannot measure (`unconfirmed`, "
            "capped)"),
    Defence("speed_of_light", CLAIM, JUDGE,
            "a runtime below the task's memory floor (its inputs and outputs moved once) or the compute floor of "
            "the reference's FLOPs at its dtype's peak (`faster_than_sol`, saying which and by how much)"),
    Defence("fresh_worker", AFTER, JUDGE,
            "what a candidate left in its interpreter deciding a later candidate's verdict (a worker per candidate, "
            "on every device; EvalConfig.worker_candidates above 1 trades it for speed)", switchable=False),
)

BY_NAME = {d.name: d for d in DEFENCES}


def check_off(names: tuple[str, ...] | list[str]) -> None:
    """ValueError (one line) for a name in ``names`` that is no defence, or one that cannot be switched off."""
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"defences_off: no defence named {', '.join(map(repr, unknown))} "
                         f"(the defences: {', '.join(BY_NAME)})")
    fixed = [n for n in names if not BY_NAME[n].switchable]
    if fixed:
        raise ValueError(f"defences_off: {', '.join(map(repr, fixed))} cannot be switched off")
