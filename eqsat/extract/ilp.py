"""Exact DAG extraction as an integer program (scipy.optimize.milp, HiGHS).

Variables: x_n (node n chosen), y_c (class c needed), and an order t_c for the classes of
each strongly connected component of the class graph. Constraints:

    y_root = 1;   sum(x_n for n in c) = y_c;   x_n <= y_d for each child class d of n;
    t_c >= t_d + 1 - M (1 - x_n)   for n in c, d a child of n in c's component (M its size)

Minimise sum(cost_n x_n). Edges between different components can never close a cycle, so only
the (usually few) cyclic parts of the e-graph get order variables; self-loop nodes are dropped.
The greedy answer bounds the objective from above and is returned whenever the solver does not
beat it in time.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components

from .choice import Extraction, ExtractionError, dag_cost
from .egraph import EGraph
from .greedy import extract_greedy, tree_choice


def _candidates(graph: EGraph, feasible_class: list[bool]) -> tuple[list[int], list[int]]:
    """Classes reachable from the roots through nodes that can be part of a program, and
    those nodes (self-loops and nodes over impossible classes left out)."""
    nodes = graph.nodes
    ok = [all(feasible_class[d] for d in n.children) and n.eclass not in n.children
          for n in nodes]
    seen = set(graph.roots)
    stack = list(seen)
    while stack:
        c = stack.pop()
        for i in graph.class_nodes[c]:
            if ok[i]:
                for d in nodes[i].children:
                    if d not in seen:
                        seen.add(d)
                        stack.append(d)
    classes = sorted(seen)
    cand = [i for c in classes for i in graph.class_nodes[c] if ok[i]]
    return classes, cand


class _Rows:
    """Sparse constraint rows, accumulated as COO triples."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, cols: list[int], vals: list[float], lb: float, ub: float) -> None:
        row = len(self.lb)
        self.r.extend([row] * len(cols))
        self.c.extend(cols)
        self.v.extend(vals)
        self.lb.append(lb)
        self.ub.append(ub)

    def constraint(self, n_vars: int) -> LinearConstraint:
        a = coo_matrix((self.v, (self.r, self.c)), shape=(len(self.lb), n_vars)).tocsr()
        return LinearConstraint(a, np.array(self.lb), np.array(self.ub))


def extract_ilp(graph: EGraph, costs: np.ndarray, time_limit: float = 10.0,
                greedy: Extraction | None = None) -> Extraction:
    """The DAG-cost optimum of all roots at once, or the greedy answer when the solver cannot
    prove better within `time_limit` seconds. `optimal` says whether it was proven."""
    t0 = time.perf_counter()
    costs = np.asarray(costs, dtype=float)
    if greedy is None:
        greedy = extract_greedy(graph, costs, time_limit=min(1.0, time_limit / 4))
    sel, _ = tree_choice(graph, costs)
    classes, cand = _candidates(graph, [s != -1 for s in sel])
    col_x = {n: i for i, n in enumerate(cand)}
    col_y = {c: len(cand) + i for i, c in enumerate(classes)}
    n_vars = len(cand) + len(classes)

    # strongly connected components of the class graph restricted to candidate nodes
    local = {c: i for i, c in enumerate(classes)}
    src = [local[graph.nodes[n].eclass] for n in cand for _ in graph.nodes[n].children]
    dst = [local[d] for n in cand for d in graph.nodes[n].children]
    k = len(classes)
    adj = csr_matrix((np.ones(len(src)), (src, dst)), shape=(k, k))
    _, comp = connected_components(adj, directed=True, connection="strong")
    comp_size = np.bincount(comp, minlength=k) if k else np.zeros(0, dtype=int)
    col_t: dict[int, int] = {}
    for c in classes:
        if comp_size[comp[local[c]]] > 1:
            col_t[c] = n_vars
            n_vars += 1

    rows = _Rows()
    for c in classes:
        xs = [col_x[n] for n in graph.class_nodes[c] if n in col_x]
        rows.add(xs + [col_y[c]], [1.0] * len(xs) + [-1.0], 0.0, 0.0)
    for n in cand:
        node = graph.nodes[n]
        c = node.eclass
        for d in set(node.children):
            rows.add([col_x[n], col_y[d]], [1.0, -1.0], -np.inf, 0.0)
            if c in col_t and d in col_t and comp[local[c]] == comp[local[d]]:
                m = float(comp_size[comp[local[c]]])
                rows.add([col_t[c], col_t[d], col_x[n]], [1.0, -1.0, -m], 1.0 - m, np.inf)

    # scale costs to O(1): HiGHS's tolerances are absolute, our costs are microseconds
    scale = float(np.max(costs[cand])) if cand and np.max(costs[cand]) > 0 else 1.0
    obj = np.zeros(n_vars)
    obj[: len(cand)] = costs[cand] / scale
    # the greedy answer's cost is an upper bound: it prunes the branch-and-bound tree early
    bound = greedy.cost / scale
    rows.add(list(range(len(cand))), list(obj[: len(cand)]), -np.inf, bound * (1 + 1e-9) + 1e-9)

    lb = np.zeros(n_vars)
    ub = np.ones(n_vars)
    for r in graph.roots:
        lb[col_y[r]] = 1.0
    integrality = np.zeros(n_vars)
    integrality[: len(cand) + len(classes)] = 1
    for c, j in col_t.items():
        ub[j] = float(comp_size[comp[local[c]]] - 1)

    remaining = time_limit - (time.perf_counter() - t0)
    if remaining <= 0:
        return _fallback(greedy, t0)
    res = milp(obj, constraints=rows.constraint(n_vars), integrality=integrality,
               bounds=Bounds(lb, ub),
               options={"time_limit": remaining, "mip_rel_gap": 1e-9, "disp": False})
    if res.x is None:
        return _fallback(greedy, t0)
    x = res.x
    choice: dict[int, int] = {}
    stack = list(graph.roots)
    while stack:
        c = stack.pop()
        if c in choice:
            continue
        opts = [n for n in graph.class_nodes[c] if n in col_x]
        if not opts:
            return _fallback(greedy, t0)
        n = max(opts, key=lambda i: x[col_x[i]])
        choice[c] = n
        stack.extend(graph.nodes[n].children)
    try:
        cost = dag_cost(graph, costs, choice)
    except ExtractionError:  # rounding gave a cycle: trust the greedy answer
        return _fallback(greedy, t0)
    if cost > greedy.cost * (1 + 1e-9):
        return _fallback(greedy, t0)
    return Extraction(graph, choice, cost, "ilp", time.perf_counter() - t0,
                      optimal=res.status == 0)


def _fallback(greedy: Extraction, t0: float) -> Extraction:
    return Extraction(greedy.graph, greedy.choice, greedy.cost, "greedy (ilp gave no better)",
                      time.perf_counter() - t0)
