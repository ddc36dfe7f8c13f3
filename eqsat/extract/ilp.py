"""Exact DAG extraction as an integer program, solved by HiGHS (the copy scipy ships).

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

import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..extension import load_extension
from ..rules.in_flight import native_call
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

    def columns(self, n_vars: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The matrix in compressed-column form: column starts, row indices, values."""
        cols = np.asarray(self.c, dtype=np.int64)
        order = np.argsort(cols, kind="stable")
        start = np.zeros(n_vars + 1, dtype=np.int64)
        np.cumsum(np.bincount(cols, minlength=n_vars), out=start[1:])
        return (start, np.asarray(self.r, dtype=np.int64)[order],
                np.asarray(self.v, dtype=float)[order])


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
    comp = _strong_components(k, src, dst)
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
    x, optimal = _solve(obj, rows, lb, ub, integrality, remaining)
    if x is None:
        return _fallback(greedy, t0)
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
    return Extraction(graph, choice, cost, "ilp", time.perf_counter() - t0, optimal=optimal)


def _fallback(greedy: Extraction, t0: float) -> Extraction:
    return Extraction(greedy.graph, greedy.choice, greedy.cost, "greedy (ilp gave no better)",
                      time.perf_counter() - t0)


def _strong_components(k: int, src: list[int], dst: list[int]) -> list[int]:
    """The strongly connected component of each of `k` vertices (Tarjan's algorithm, without
    recursion), for the edges src[i] -> dst[i]."""
    succ: list[list[int]] = [[] for _ in range(k)]
    for a, b in zip(src, dst):
        succ[a].append(b)
    index = [-1] * k
    low = [0] * k
    comp = [-1] * k
    on_stack = [False] * k
    stack: list[int] = []
    counter = n_comp = 0
    for root in range(k):
        if index[root] != -1:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            if i < len(succ[v]):
                work[-1] = (v, i + 1)
                w = succ[v][i]
                if index[w] == -1:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
    return comp


def _highs() -> Any:
    """scipy's compiled HiGHS module, loaded by itself: `import scipy.optimize` (what `milp`
    needs) imports every solver and scipy.linalg, ~0.3 s on each cold optimize, while this
    one extension module loads in milliseconds. None where that does not work (another scipy
    layout): then `milp` is used."""
    try:
        return load_extension("scipy.optimize._highspy._core")
    except Exception:
        return None


_STDOUT_LOCK = threading.RLock()


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):
        pass


def _stdout_onto_stderr() -> int | None:
    """Point file descriptor 1 at stderr; returns a copy of the old one (None: no stdout)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
        _flush_c_stdio()
        saved = os.dup(1)
    except (OSError, ValueError):
        return None
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr: leave stdout as it is
        os.close(saved)
        return None
    return saved


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 points at stderr for the duration. The HiGHS that scipy ships prints
    a debug line with printf on some problems whatever its output options say, and
    `eqsat opt in.eqir > out.eqir` wrote it into the program text."""
    with _STDOUT_LOCK:
        saved = _stdout_onto_stderr()
        try:
            yield
        finally:
            if saved is not None:
                _flush_c_stdio()
                os.dup2(saved, 1)
                os.close(saved)


def _solve(obj: np.ndarray, rows: _Rows, lb: np.ndarray, ub: np.ndarray,
           integrality: np.ndarray, time_limit: float) -> tuple[np.ndarray | None, bool]:
    """Minimise obj @ x subject to the rows and bounds, the marked variables integer: a
    feasible x (None if none was found in time) and whether it is proven optimal.

    HiGHS releases the GIL while it solves: the solve is a `native_call`, so that the
    interpreter's exit waits for it (a daemon thread back from HiGHS during finalization was
    ended inside its C++ frames, aborting the process)."""
    with native_call(), _stdout_to_stderr():
        return _solve_quietly(obj, rows, lb, ub, integrality, time_limit)


def _solve_quietly(obj: np.ndarray, rows: _Rows, lb: np.ndarray, ub: np.ndarray,
                   integrality: np.ndarray, time_limit: float) -> tuple[np.ndarray | None, bool]:
    n = len(obj)
    start, index, value = rows.columns(n)
    h = _highs()
    if h is not None:
        try:
            return _solve_core(h, obj, (start, index, value), rows, lb, ub, integrality,
                               time_limit)
        except Exception:
            pass  # an API this code does not know: the public solver below
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csc_array

    a = csc_array((value, index, start), shape=(len(rows.lb), n))
    res = milp(obj, constraints=LinearConstraint(a, np.array(rows.lb), np.array(rows.ub)),
               integrality=integrality, bounds=Bounds(lb, ub),
               options={"time_limit": time_limit, "mip_rel_gap": 1e-9, "disp": False})
    return res.x, res.status == 0


def _solve_core(h: Any, obj: np.ndarray, matrix: tuple[np.ndarray, np.ndarray, np.ndarray],
                rows: _Rows, lb: np.ndarray, ub: np.ndarray, integrality: np.ndarray,
                time_limit: float) -> tuple[np.ndarray | None, bool]:
    # what scipy.optimize.milp does with the same options, minus its input checks
    n, m = len(obj), len(rows.lb)
    lp = h.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = m
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = m
    lp.a_matrix_.format_ = h.MatrixFormat.kColwise
    lp.col_cost_ = np.asarray(obj, dtype=float)
    lp.col_lower_ = np.asarray(lb, dtype=float)
    lp.col_upper_ = np.asarray(ub, dtype=float)
    lp.row_lower_ = np.asarray(rows.lb, dtype=float)
    lp.row_upper_ = np.asarray(rows.ub, dtype=float)
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = matrix
    lp.integrality_ = [h.HighsVarType(int(i)) for i in integrality]
    highs = h._Highs()
    for key, val in (("output_flag", False), ("log_to_console", False),
                     ("time_limit", float(time_limit)), ("mip_rel_gap", 1e-9)):
        if highs.setOptionValue(key, val) == h.HighsStatus.kError:
            raise RuntimeError(f"HiGHS rejected option {key}")
    if highs.passModel(lp) == h.HighsStatus.kError:
        raise RuntimeError("HiGHS rejected the model")
    if highs.run() == h.HighsStatus.kError:
        return None, False
    status = highs.getModelStatus()
    stopped = (h.HighsModelStatus.kTimeLimit, h.HighsModelStatus.kIterationLimit,
               h.HighsModelStatus.kSolutionLimit)
    if status != h.HighsModelStatus.kOptimal and (
            status not in stopped or highs.getInfo().objective_function_value == h.kHighsInf):
        return None, False
    x = np.array(highs.getSolution().col_value, dtype=float)
    return (x, status == h.HighsModelStatus.kOptimal) if len(x) == n else (None, False)
