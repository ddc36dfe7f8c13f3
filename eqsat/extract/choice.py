"""What an extraction returns, and the DAG cost of a choice of one e-node per e-class."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import Error
from .egraph import EGraph, ENode


class ExtractionError(Error):
    """No acyclic program can be extracted for the roots, or a choice is not a program."""


def topological(graph: EGraph, choice: Mapping[int, int]) -> list[int]:
    """The classes reachable from the roots under `choice`, children before parents.

    Raises ExtractionError when a reachable class has no chosen node (or one of another class)
    or when the chosen nodes form a cycle.
    """
    state: dict[int, int] = {}  # 1: on the DFS path, 2: done
    order: list[int] = []
    for root in graph.roots:
        if state.get(root) == 2:
            continue
        stack = [(root, 0)]
        state[root] = 1
        while stack:
            c, i = stack[-1]
            n = choice.get(c)
            if n is None or not 0 <= n < len(graph.nodes) or graph.nodes[n].eclass != c:
                raise ExtractionError(f"class {graph.class_ids[c]!r} is needed but has no "
                                      "chosen e-node of its own")
            kids = graph.nodes[n].children
            if i == len(kids):
                stack.pop()
                state[c] = 2
                order.append(c)
                continue
            stack[-1] = (c, i + 1)
            d = kids[i]
            s = state.get(d)
            if s == 1:
                raise ExtractionError(f"the chosen e-nodes form a cycle through class "
                                      f"{graph.class_ids[d]!r}")
            if s is None:
                state[d] = 1
                stack.append((d, 0))
    return order


def dag_cost(graph: EGraph, costs: np.ndarray, choice: Mapping[int, int]) -> float:
    """Total cost of the chosen nodes reachable from the roots, each paid once."""
    return float(sum(costs[choice[c]] for c in topological(graph, choice)))


def tree_cost(graph: EGraph, costs: np.ndarray, choice: Mapping[int, int]) -> float:
    """Cost as if every use of a value recomputed it (what a tree extractor minimises)."""
    order = topological(graph, choice)
    per: dict[int, float] = {}
    for c in order:
        n = graph.nodes[choice[c]]
        per[c] = float(costs[choice[c]]) + sum(per[d] for d in n.children)
    return float(sum(per[r] for r in graph.roots))


@dataclass(frozen=True)
class Extraction:
    """The chosen e-node of every class reachable from the roots, and what it cost to find.

    `choice` maps internal class indices to node indices; `cost` is the DAG cost; `optimal` is
    True only when an exact method proved it.
    """

    graph: EGraph = field(repr=False)
    choice: dict[int, int]
    cost: float
    method: str
    seconds: float
    optimal: bool = False

    def node(self, class_id: Hashable) -> ENode:
        """The chosen e-node of a class, by the caller's class id."""
        try:
            return self.graph.nodes[self.choice[self.graph.index[class_id]]]
        except KeyError:
            raise Error(f"class {class_id!r} is not reachable from the roots") from None

    def order(self) -> list[int]:
        """Reachable classes, operands before their users (the order to emit statements)."""
        return topological(self.graph, self.choice)
