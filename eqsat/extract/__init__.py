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

# Above this many e-nodes "auto" goes greedy: within AUTO_ILP_SECONDS the ILP is still in its
# root node's cuts there (HiGHS needed over 3 s for them at 1780 nodes). The function e-graphs
# of 7 mid-size models (LSTMs of 1-8 steps, GRUs, VAEs, value_and_grad): none of 9 over 1000
# nodes (1048-2124) got a better program or a proof in 0.5 s, each 0.5 s spent for nothing;
# of 41 under 600, 35 were proven optimal within 0.4 s and 9 beat greedy (by 0.001-6.9%).
ILP_MAX_NODES = 1000
# ...and gives the ILP this long at most: the greedy answer (with its compound moves) is the
# ILP's bound and usually its optimum; a program whose optimality the ILP cannot prove quickly
# spent the whole budget for nothing (a 20-line f32 loss: 2.5 s, none better than greedy).
# method="ilp" takes the whole time limit.
AUTO_ILP_SECONDS = 0.5


def extract(graph: EGraph, costs: np.ndarray, method: str = "auto",
            time_limit: float = 5.0) -> Extraction:
    """Choose a node for every class reachable from `graph.roots`, minimising DAG cost.

    `method`: "ilp" (exact within `time_limit`, greedy as fallback), "greedy", "tree" (tree
    cost, as egglog's extractor) or "auto" (ilp for small e-graphs, for at most
    AUTO_ILP_SECONDS, else greedy).
    """
    costs = np.asarray(costs, dtype=float)
    if costs.shape != (len(graph.nodes),):
        raise Error(f"extract needs one cost per e-node ({len(graph.nodes)}), got shape "
                    f"{costs.shape}")
    if not np.all(np.isfinite(costs)) or np.any(costs < 0):
        raise Error("e-node costs must be finite and non-negative")
    if method == "auto":
        if len(graph.nodes) <= ILP_MAX_NODES:
            return extract_ilp(graph, costs, time_limit=min(time_limit, AUTO_ILP_SECONDS))
        method = "greedy"
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
