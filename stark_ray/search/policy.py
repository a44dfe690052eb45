"""Search policies: which node to expand next.

Vocabulary (STARK.md):
- *repairable*: a failed node that holds a candidate (it compiled or not, ran or not) and whose debug chain is
  shorter than ``max_debug_chain``; selecting it sends it to the debug agent.
- *expandable*: a node some agent can work on: an accepted node (plan + code) or a repairable failed one.
- *root throttling*: the root gets at most ``n_root`` children; after that it is not selectable.
- *dead branch*: a node other than the root with more than ``n_child`` children and no accepted node below it;
  it and its whole subtree are not selectable. (The root is bounded by ``n_root`` alone.)
- *full*: a node other than the root with ``n_child_max`` children (0: no cap) is not selectable itself (its
  children are): the best node cannot take the whole budget, exploitation moves on to the next best.
- *failure streak*: the node exploitation would expand has ``fail_streak`` children in a row, its latest, that
  failed: its latest repairable failed child goes to the debug agent instead (none: an expandable leaf is explored)
  — a small budget is not spent on one node's fourth child while its failed ones wait.
- *ties*: accepted nodes whose 95% intervals overlap the best's are tied with it (the interval at least
  ``SPREAD_FLOOR`` wide: one candidate evaluated three times read 1.14x, 1.34x and 1.66x, each ±3-12%); exploitation
  takes the tied node with the fewest children, then the best score.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Collection
from typing import Protocol

from stark_ray.config import SearchConfig
from stark_ray.records import Node
from stark_ray.search.selection import Selection
from stark_ray.search.tree import Tree


class Policy(Protocol):
    def select(self, tree: Tree, rng: random.Random, busy: Collection[int] = ()) -> Node | None:
        """The node to expand next, or None when nothing is left to expand (or, with expansions in flight,
        nothing until one of them comes back). ``busy``: nodes being expanded now (``--parallel``), which a
        tree policy does not offer again."""
        ...


def repairable(tree: Tree, node: Node, max_debug_chain: int) -> bool:
    return (not node.accepted and not node.is_root and tree.has_candidate(node)
            and tree.debug_chain(node.id) < max_debug_chain)


def is_dead(tree: Tree, node: Node, n_child: int) -> bool:
    return not node.is_root and len(node.children) > n_child and not any(d.accepted for d in tree.descendants(node.id))


# the least relative standard error a speedup is taken with when ties are decided: the spread between evaluations of
# one candidate, which one evaluation's interval (its paired calls) does not see
SPREAD_FLOOR = 0.05
Z95 = 1.96


def interval(node: Node) -> tuple[float, float]:
    """The node's speedup's 95% interval, at least SPREAD_FLOOR wide (the reference: exactly 1)."""
    if node.is_root:
        return 1.0, 1.0
    speedup = node.result.speedup or (1.0 / node.score if node.score > 0 else 0.0)
    err = max(node.result.speedup_err or 0.0, SPREAD_FLOOR)
    return speedup * (1 - Z95 * err), speedup * (1 + Z95 * err)


class Rules:
    """Selectability shared by the tree policies, kept up to date as the tree grows (:mod:`.selection`)."""

    def __init__(self, n_root: int = 5, n_child: int = 3, max_debug_chain: int = 2, n_child_max: int = 0,
                 fail_streak: int = 0, ties: bool = False) -> None:
        self.n_root, self.n_child, self.max_debug_chain = n_root, n_child, max_debug_chain
        self.n_child_max = n_child_max
        self.fail_streak, self.ties = fail_streak, ties

    def selection(self, tree: Tree) -> Selection:
        """The tree's selectable nodes under these rules, made once and then kept up to date by every attach."""
        key = ("selection", self.n_root, self.n_child, self.max_debug_chain, self.n_child_max)
        return tree.watch(key, lambda t: Selection(t, self.n_root, self.n_child, self.max_debug_chain,
                                                   self.n_child_max))

    def pruned(self, tree: Tree, node: Node) -> bool:
        """``node`` or one of its ancestors is a dead branch."""
        return self.selection(tree).dead_above.get(node.id, 0) > 0

    def selectable(self, tree: Tree, node: Node) -> bool:
        return self.selection(tree).selectable(node)

    def expandable_leaves(self, tree: Tree, busy: Collection[int] = ()) -> list[Node]:
        """The selectable leaves in tree order, those in ``busy`` left out."""
        return [n for n in self.selection(tree).leaf_nodes() if n.id not in busy]

    def expandable_leaf(self, tree: Tree, pick: float, busy: Collection[int] = ()) -> Node | None:
        """``expandable_leaves(tree, busy)[int(pick * len(...))]`` without making the list (None when empty)."""
        ids = self.selection(tree).leaves
        skipped = sorted(i for b in busy if (i := bisect.bisect_left(ids, b)) < len(ids) and ids[i] == b)
        free = len(ids) - len(skipped)
        if free <= 0:
            return None
        k = int(pick * free)
        for position in skipped:  # the k-th free one lies past each busy one before it
            if position <= k:
                k += 1
        return tree.nodes[ids[k]]

    def best_accepted(self, tree: Tree, busy: Collection[int] = ()) -> Node | None:
        """The best-scoring (fastest relative to the reference) selectable accepted node; the reference competes
        with a score of 1. With ``ties``: of the nodes tied with it (overlapping intervals), the one with the
        fewest children."""
        nodes = tree.nodes
        free = (nodes[i] for _, i in self.selection(tree).board if i not in busy)
        best = next(free, None)
        if best is None or not self.ties:
            return best
        low = interval(best)[0]
        tied = [best]
        for node in free:  # best first: the first whose interval lies wholly below the best's ends the ties
            if interval(node)[1] < low:
                break
            tied.append(node)
        return min(tied, key=lambda n: (len(n.children), n.score, n.id))

    def after_failures(self, tree: Tree, node: Node, busy: Collection[int] = ()) -> Node | None:
        """Where ``node``'s latest ``fail_streak`` children all failed: its latest failed child that can be repaired
        (None: no streak, or none repairable)."""
        if not self.streak(tree, node):
            return None
        nodes = tree.nodes
        latest = [nodes[c] for c in sorted(node.children)[-self.fail_streak:]]
        return next((c for c in reversed(latest) if c.id not in busy and self.selectable(tree, c)
                     and not c.children), None)

    def streak(self, tree: Tree, node: Node) -> bool:
        """Whether ``node``'s latest ``fail_streak`` children all failed."""
        if not self.fail_streak or len(node.children) < self.fail_streak:
            return False
        nodes = tree.nodes
        return not any(nodes[c].accepted for c in sorted(node.children)[-self.fail_streak:])


def selectable_from_scratch(tree: Tree, rules: Rules) -> tuple[list[Node], list[Node]]:
    """The definition :class:`Selection` keeps up to date, computed from the whole tree (for tests): (selectable
    leaves in tree order, selectable accepted nodes best first)."""
    def selectable(node: Node) -> bool:
        if node.is_root and len(node.children) >= rules.n_root:
            return False
        if not node.is_root and rules.n_child_max and len(node.children) >= rules.n_child_max:
            return False
        if not (node.accepted or repairable(tree, node, rules.max_debug_chain)):
            return False
        return not any(is_dead(tree, n, rules.n_child) for n in [node, *tree.ancestors(node.id)])

    leaves = [n for n in tree.leaves() if selectable(n)]
    board = sorted((n for n in tree if n.accepted and selectable(n)), key=lambda n: (n.score, n.id))
    return leaves, board


class EpsilonGreedy:
    """STARK's adapted ε-greedy: exploit the best correct node, or with probability ε explore a uniformly
    chosen expandable leaf. When nothing is selectable any more the root is offered again (past its throttle)
    rather than ending the search with budget left."""

    def __init__(self, epsilon: float = 0.3, rules: Rules | None = None) -> None:
        self.epsilon = epsilon
        self.rules = rules or Rules()

    def select(self, tree: Tree, rng: random.Random, busy: Collection[int] = ()) -> Node | None:
        # two draws whatever the tree (each selection has a random state of its own: search.memory.selection_rng)
        explore, pick = rng.random() < self.epsilon, rng.random()
        leaf = self.rules.expandable_leaf(tree, pick, busy)
        if explore and leaf is not None:
            return leaf
        best = self.rules.best_accepted(tree, busy)
        if best is not None and self.rules.streak(tree, best):  # repair one of its failures, else explore
            return self.rules.after_failures(tree, best, busy) or (leaf if leaf is not None else best)
        if best is not None:
            return best
        if leaf is not None:
            return leaf
        return None if tree.root.id in busy else tree.root


class Greedy(EpsilonGreedy):
    """Always the best correct node (ε = 0); failed leaves are repaired only when nothing correct is left."""

    def __init__(self, rules: Rules | None = None) -> None:
        super().__init__(epsilon=0.0, rules=rules)


class BestOfK:
    """K independent samples from the root, no feedback between them (KernelBench's sampling agent).

    With ``repair`` (the ``ma_only`` ablation) a failed sample is handed to the debug agent along its own
    chain before the next sample is drawn. ``k = 0`` draws samples until the budget is spent.
    """

    def __init__(self, k: int = 0, repair: bool = False, max_debug_chain: int = 2) -> None:
        self.k, self.repair, self.max_debug_chain = k, repair, max_debug_chain

    def select(self, tree: Tree, rng: random.Random, busy: Collection[int] = ()) -> Node | None:
        """Samples are independent: the root is offered to every worker at once."""
        if self.repair and tree.evaluated:
            latest = tree[len(tree) - 1]
            if latest.id not in busy and repairable(tree, latest, self.max_debug_chain):
                return latest
        if self.k and len(tree.root.children) >= self.k:
            return None
        return tree.root


def rules_of(search: SearchConfig) -> Rules:
    """The shared selectability rules a run's settings ask for."""
    return Rules(n_root=search.n_root, n_child=search.n_child, max_debug_chain=search.max_debug_chain,
                 n_child_max=search.n_child_max, fail_streak=search.fail_streak, ties=search.ties)


# Every policy by the name --policy gives it, and how it is made. A new policy is a class with ``select`` (the
# Policy protocol above) and one entry here; the CLI's help and checks and both executors take it from this table
# (docs/architecture.md, "Adding a search policy").
POLICY_FACTORIES: dict[str, Callable[[SearchConfig], Policy]] = {
    "epsilon_greedy": lambda search: EpsilonGreedy(search.epsilon, rules_of(search)),
    "greedy": lambda search: Greedy(rules_of(search)),
    "best_of_k": lambda search: BestOfK(k=search.k, repair=False),
}
POLICIES = tuple(POLICY_FACTORIES)


def policy_factory(name: str) -> Callable[[SearchConfig], Policy]:
    """How the policy called ``name`` is made. ValueError, one line naming the policies, for a name the table does
    not hold (the command line checks ``--policy`` with it before any work)."""
    factory = POLICY_FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_FACTORIES)}")
    return factory


def make_policy(search: SearchConfig) -> Policy:
    """The policy a run's ``SearchConfig`` asks for. The ``ma_only`` ablation means agents + Best-of-K whatever
    its ``policy`` says (a name the table does not hold is refused all the same)."""
    factory = policy_factory(search.policy)
    if search.ablation == "ma_only":
        return BestOfK(k=search.k, repair=True, max_debug_chain=search.max_debug_chain)
    return factory(search)
