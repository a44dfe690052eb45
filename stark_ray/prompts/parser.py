"""Parsing what real models return — the one import the agents need.

- :func:`extract_code` — the candidate module in a reply (fences, thinking, truncation; never raises).
- :func:`parse_plan` / :func:`validate_scaffold` — the plan agent's anchored scaffold and its instructions.
- :func:`check_no_anchors` — the code agent's output must not keep any anchor marker.
- :func:`strip_anchors` — the scaffold without its markers (see :mod:`stark_ray.prompts.anchors` for exactly
  what is removed).
- :func:`extract_plan_line` — the single agent's ``PLAN: ...`` line.

Formats::

    # <<<IMPROVE BEGIN 1>>>        (marker lines; "//" instead of "#" inside C++/CUDA source strings)
    ...parent code to change...
    # <<<IMPROVE END 1>>>

    INSTRUCTION 1: what to do inside anchor 1 (may continue on the following lines)
"""

from __future__ import annotations

from stark_ray.prompts.anchors import find_markers, insert_anchors, strip_anchors
from stark_ray.prompts.extract import (
    STATUS_NO_CODE,
    STATUS_OK,
    STATUS_SYNTAX,
    STATUS_TRUNCATED,
    ParseOutcome,
    extract_code,
)
from stark_ray.prompts.instructions import extract_plan_line, parse_instructions
from stark_ray.prompts.pycode import source_defines_model_new
from stark_ray.prompts.scaffold import PlanOutcome, check_no_anchors, parse_plan, validate_scaffold

__all__ = [
    "STATUS_NO_CODE",
    "STATUS_OK",
    "STATUS_SYNTAX",
    "STATUS_TRUNCATED",
    "ParseOutcome",
    "PlanOutcome",
    "check_no_anchors",
    "extract_code",
    "extract_plan_line",
    "find_markers",
    "insert_anchors",
    "parse_instructions",
    "parse_plan",
    "source_defines_model_new",
    "strip_anchors",
    "validate_scaffold",
]
