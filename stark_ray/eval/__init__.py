"""Evaluation of candidates: task loading, isolated workers, correctness, timing.

Public entry points (the core never imports ray; actors wrap these):

- :mod:`stark_ray.eval.tasks`: ``Task``, ``TaskError``, ``load_task``, ``load_tasks``, ``check_task``
- :mod:`stark_ray.eval.service`: ``EvalService`` (one device: warm worker + compile pool, any task;
  ``reference``, ``evaluate``, ``evaluate_many``, ``hardware_description``, ``close``)
- :mod:`stark_ray.eval.evaluator`: ``Evaluator`` / ``make_evaluator`` (one task over a service)
- :mod:`stark_ray.eval.backends`: ``get_backend``, ``register_backend``, ``Backend``

Importing the package imports none of its modules (the names above load on first use): ``stark_ray.eval.backends``
is read by the prompts and the config without the service behind it. Nothing here imports torch: the parent side of
the evaluator never needs it.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {"Evaluator": "evaluator", "EvaluatorError": "evaluator", "make_evaluator": "evaluator",
         "EvalService": "service", "Task": "tasks", "TaskError": "tasks", "check_task": "tasks", "load_task": "tasks",
         "load_tasks": "tasks"}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
