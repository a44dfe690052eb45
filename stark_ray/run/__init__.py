"""A run: the driver over the core (search, agents, eval) and its run directory.

- :mod:`~stark_ray.run.local`: the local executor (one task in this process, no Ray: tests, debugging);
- :mod:`~stark_ray.run.ray_driver`: the Ray executor's driver (tasks' trees in the TreeMemory actor, agent calls
  and evaluations on actors; its start, its loop, evaluator deaths carried out and the live view; each expansion
  a generator, :mod:`~stark_ray.run.work` what it waits for, :mod:`~stark_ray.run.room` how much work is asked
  for), with :mod:`~stark_ray.run.placement` (starting and joining Ray, the actors),
  :mod:`~stark_ray.run.dispatch` (which evaluator times which candidate), :mod:`~stark_ray.run.evaluator_deaths`
  (what an evaluator that died costs) and :mod:`~stark_ray.run.mirror` (the driver's copy of the trees);
- :mod:`~stark_ray.run.directory`: the run directory both write alike (``run.json``, summaries, best kernels);
  :mod:`~stark_ray.run.summary` and :mod:`~stark_ray.run.reporter`: what a run says at its end and as it goes;
- :mod:`~stark_ray.run.resume` (what ``--resume`` may change), :mod:`~stark_ray.run.campaign` (many tasks: the
  caps on spend) and :mod:`~stark_ray.run.local_ray` (a private Ray for one run).
"""
