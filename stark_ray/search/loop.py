"""Algorithm 1 of STARK: select, expand (plan -> code, or debug), evaluate, attach — until the budget is spent."""

from __future__ import annotations

from collections.abc import Callable

from stark_ray.agents.base import AgentResult
from stark_ray.records import EvalResult, Node
from stark_ray.search.memory import TaskSearch, no_candidate
from stark_ray.search.policy import Policy
from stark_ray.search.team import Team
from stark_ray.search.tree import Tree

Evaluate = Callable[[str], EvalResult]
OnAttempt = Callable[[Node, AgentResult], None]


def search(tree: Tree, policy: Policy, team: Team, evaluate: Evaluate, budget: int,
           seed: int, on_attempt: OnAttempt | None = None, stop_at_sol: float = 0.0) -> Node | None:
    """Grow ``tree`` to ``budget`` evaluated attempts (or until its best candidate runs at ``stop_at_sol`` of the
    task's speed of light, where that is > 0) and return the best correct candidate (or None).

    A failed node that the policy selects goes to the debug agent (policies only offer failed nodes that are
    worth repairing); a correct one gets a grounded instruction from the plan agent, which the code agent
    implements. An agent step that yields no candidate still costs one attempt, so a broken model cannot
    loop forever. One expansion at a time, in this process (the Ray executor runs the same TaskSearch).
    """
    state = TaskSearch("task", tree, policy, team, budget, seed, stop_at_sol=stop_at_sol)
    while (ticket := state.next()) is not None:
        step = team.run(ticket.request)
        result = evaluate(step.source) if step.ok and step.source else no_candidate(step)
        child = state.add(ticket, step, result)
        if on_attempt is not None:
            on_attempt(child, step)
    return tree.best()
