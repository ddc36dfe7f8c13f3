"""Cost models per target and extraction of the cheapest program from an e-graph.

`extract(graph, costs)` picks one e-node per e-class reachable from the roots, minimising DAG
cost (each chosen node paid once however many users it has): exactly with an integer program
when the e-graph is small enough, else greedily.

`optimize(module, rules, target, limits)` runs the whole pipeline (differentiate, saturate,
extract per function, rebuild) and returns a Module never costlier than the input;
`optimize_with_report` also returns an `OptimizeReport` (print it for tables). `dot.compare_dot`
draws a program before and after as Graphviz text.
"""

from __future__ import annotations

import numpy as np

from ..errors import Error
from .choice import Extraction, ExtractionError, dag_cost, topological, tree_cost
from .cost import (CUDA, TARGETS, CostModel, Roofline, Work, cost_model, function_costs,
                   module_cost, register_work, work)
from .egraph import FREE_OPS, EGraph, ENode, node_costs
from .greedy import extract_greedy, extract_tree
from .ilp import extract_ilp

METHODS = ("auto", "greedy", "ilp", "tree")

# Above this many e-nodes the ILP rarely finishes in seconds (PITFALLS: 13 s at 700 nodes
# without component splitting): "auto" goes greedy.
ILP_MAX_NODES = 2000


def extract(graph: EGraph, costs: np.ndarray, method: str = "auto",
            time_limit: float = 5.0) -> Extraction:
    """Choose a node for every class reachable from `graph.roots`, minimising DAG cost.

    `method`: "ilp" (exact within `time_limit`, greedy as fallback), "greedy", "tree" (tree
    cost, as egglog's extractor) or "auto" (ilp for small e-graphs, else greedy).
    """
    costs = np.asarray(costs, dtype=float)
    if costs.shape != (len(graph.nodes),):
        raise Error(f"extract needs one cost per e-node ({len(graph.nodes)}), got shape "
                    f"{costs.shape}")
    if not np.all(np.isfinite(costs)) or np.any(costs < 0):
        raise Error("e-node costs must be finite and non-negative")
    if method == "auto":
        method = "ilp" if len(graph.nodes) <= ILP_MAX_NODES else "greedy"
    if method == "ilp":
        return extract_ilp(graph, costs, time_limit=time_limit)
    if method == "greedy":
        return extract_greedy(graph, costs, time_limit=time_limit)
    if method == "tree":
        return extract_tree(graph, costs)
    raise Error(f"unknown extraction method {method!r}; valid: {', '.join(METHODS)}")


# optimize() builds on extract(), so it is imported after it
from .pipeline import OptimizeWarning, optimize, optimize_with_report  # noqa: E402
from .report import OptimizeReport  # noqa: E402

__all__ = [
    "OptimizeReport", "OptimizeWarning", "optimize", "optimize_with_report",
    "CUDA", "ILP_MAX_NODES", "METHODS", "TARGETS", "CostModel", "EGraph", "ENode", "Extraction",
    "ExtractionError", "FREE_OPS", "Roofline", "Work", "cost_model", "dag_cost", "extract",
    "extract_greedy", "extract_ilp", "extract_tree", "function_costs", "module_cost",
    "node_costs", "register_work", "topological", "tree_cost", "work",
]
