"""Hand-built trees for the search tests, and a stand-in for a task's evaluator."""

from __future__ import annotations

from stark_ray.records import AGENT_DEBUG, AGENT_PLAN_CODE, STAGE_COMPILE, STAGE_OK, STAGE_PARSE, EvalResult
from stark_ray.search.tree import Tree


def ok(runtime_ms: float, ref_ms: float = 10.0) -> EvalResult:
    return EvalResult(compiled=True, passed_checks=True, runtime_ms=runtime_ms, ref_runtime_ms=ref_ms,
                      speedup=ref_ms / runtime_ms, stage=STAGE_OK)


class StandInEvaluator:
    """A task's evaluator as the search drives it, answered in the test's process: the reference in 1 ms, every
    candidate accepted at 2x. A test's stand-in overrides what it is about."""

    def __enter__(self) -> StandInEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def reference(self) -> EvalResult:
        return EvalResult(compiled=True, passed_checks=True, runtime_ms=1.0, stage=STAGE_OK)

    def evaluate(self, source: str) -> EvalResult:
        return ok(0.5, 1.0)

    def hardware_description(self) -> str:
        return "a stand-in"

    def device_kind(self) -> str:
        return "cpu"


def bad(stage: str = STAGE_COMPILE) -> EvalResult:
    return EvalResult.failed(stage, f"{stage} failed", "log line")


def reference_tree() -> Tree:
    return Tree.with_reference("class Model: ...", ok(10.0))


def add(tree: Tree, parent: int, result: EvalResult, agent: str = AGENT_PLAN_CODE) -> int:
    source = "" if result.stage == STAGE_PARSE else f"class ModelNew: ...  # child of {parent}"
    return tree.add(parent, source, agent, result, instruction=f"from {parent}").id


def hand_built() -> Tree:
    """
    0 (ref, 10 ms)
    ├── 1 ok 8 ms
    │   ├── 4 ok 5 ms
    │   │   └── 9 ok 4 ms
    │   ├── 5 compile error
    │   │   └── 8 debug: ok 6 ms
    │   └── 6 ok 7 ms
    ├── 2 compile error
    │   └── 10 debug: ok 9 ms
    └── 3 ok 12 ms
        └── 7 ok 11 ms
    """
    t = reference_tree()
    add(t, 0, ok(8.0))          # 1
    add(t, 0, bad())            # 2
    add(t, 0, ok(12.0))         # 3
    add(t, 1, ok(5.0))          # 4
    add(t, 1, bad())            # 5
    add(t, 1, ok(7.0))          # 6
    add(t, 3, ok(11.0))         # 7
    add(t, 5, ok(6.0), AGENT_DEBUG)   # 8
    add(t, 4, ok(4.0))          # 9
    add(t, 2, ok(9.0), AGENT_DEBUG)   # 10
    return t
