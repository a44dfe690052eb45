"""The ``stark`` command line: one module per command (``optimize``, ``eval``, ``doctor``, ``campaign``, and
``analysis``: ``sql``, ``report``), registered on the app of :mod:`~stark_ray.cli.app`, which also holds what they
share (one error line for a user's mistake); :mod:`~stark_ray.cli.places` checks the paths a user gives,
:mod:`~stark_ray.cli.progress` is the live view. :mod:`~stark_ray.cli.main` is the entry point.
"""
