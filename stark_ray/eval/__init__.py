"""Evaluation of candidates: task loading, isolated workers, correctness, timing.

Public entry points (the core never imports ray; actors wrap these):

- :mod:`stark_ray.eval.tasks`: ``Task``, ``TaskError``, ``load_task``, ``load_tasks``, ``check_task``
- :mod:`stark_ray.eval.service`: ``EvalService`` (one device: warm worker + compile pool, any task;
  ``reference``, ``evaluate``, ``evaluate_many``, ``hardware_description``, ``close``)
- :mod:`stark_ray.eval.evaluator`: ``Evaluator`` / ``make_evaluator`` (one task over a service)
- :mod:`stark_ray.eval.backends`: ``get_backend``, ``register_backend``, ``Backend``

Imports here stay light (no torch): the parent side of the evaluator never needs it.
"""

from stark_ray.eval.evaluator import Evaluator, EvaluatorError, make_evaluator
from stark_ray.eval.service import EvalService
from stark_ray.eval.tasks import Task, TaskError, check_task, load_task, load_tasks

__all__ = ["EvalService", "Evaluator", "EvaluatorError", "Task", "TaskError", "check_task", "load_task", "load_tasks",
           "make_evaluator"]
