"""The worker: the untrusted process that imports and runs candidates. Nothing it reports can make a wrong output
pass (the judge compares); it never imports the judge (:mod:`stark_ray.eval.judge`).

:mod:`.main` is the process (``python -m stark_ray.eval.worker.main``: a device worker, a compile-pool worker or a
builder); :mod:`.host` serves the judge's steps; :mod:`.timing` profiles and times a candidate against its warm
reference (:mod:`.warm_reference`, sealed by :mod:`.reference_seal`), reading its streams (:mod:`.streams`) and its
own kernels (:mod:`.kernel_sources`); :mod:`.guards` is the fingerprint and the output checks; :mod:`.shared_views`
the judge's buffers as tensors; :mod:`.private_places` where a candidate writes; :mod:`.builds` and
:mod:`.build_log` its builds; :mod:`.ncu_target` the process Nsight Compute watches."""
