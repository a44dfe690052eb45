"""The judge: the trusted process that decides. It never imports a candidate, and nothing here is imported by the
worker (:mod:`stark_ray.eval.worker`).

Where a verdict is decided: :mod:`.judge` (the Judge and one candidate's way through it: load, trials, timing),
the trials it makes (:mod:`.trials`, :mod:`.perturbations`, :mod:`.input_key`), the reference's checks
(:mod:`.reference_checks`), the confirmation of a claimed speedup by its own clock (:mod:`.confirmation`,
:mod:`.worker_batch`, :mod:`.batch_sets`), the drift of the reference beside a candidate (:mod:`.drift`), what ends
a candidate early (:mod:`.verdicts`), its account of device memory (:mod:`.memory`), the task's speed of light
(:mod:`.sol`); :mod:`.main` is the process (``python -m stark_ray.eval.judge.main``)."""
