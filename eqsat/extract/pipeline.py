"""`optimize`: differentiate, load into one e-graph, saturate, extract per function, rebuild.

The whole module goes into one e-graph, so rewrites found for one function serve every
function (a primal and its adjoint share their forward values; equal terms of different
functions share e-classes). Extraction then runs per function: at run time each function
computes its own values, so what the target pays for a function is the DAG cost of its own
program (a value shared inside it, such as a forward value the adjoint reads, is paid once).
A node is usable in a function only if every parameter it reaches is one of that function's.

Calls are priced with the callee's final cost, so callees are extracted first. Each function
keeps its input program unless the extracted one is strictly cheaper under the target's cost
model, which makes the result never costlier than the input, function by function.

`optimize` returns the Module; `optimize_with_report` also returns an `OptimizeReport` (a
Module is immutable and has no room for one).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Hashable, Mapping

import numpy as np

from ..errors import Error, ForkedProcessError
from ..ir.module import Function, Module, Names, Stmt
from ..ir.verifier import verify
from ..rules.bridge import ENode as BridgeNode
from ..rules.bridge import LoadTimeout
from ..rules.bridge import Serialized
from ..rules.egglog_native import bindings as _egglog
from ..rules.lang import RuleSet
from ..rules.runner import TIME_LIMIT, Limits, checked_limits, saturate
from .choice import Extraction
from .cost import CostModel, cost_model, function_costs, own_cost
from .egraph import FREE_OPS, EGraph, node_costs
from .report import FunctionResult, OptimizeReport, provenance

EggSmolError = _egglog.EggSmolError

# Extraction may spend this share of `Limits.seconds` (at least EXTRACT_MIN_SECONDS), split
# over the functions by their e-graph sizes; the ILP returns its greedy start when time is up.
EXTRACT_SHARE = 0.5
EXTRACT_MIN_SECONDS = 1.0
# Serializing and extracting an e-graph takes about this long per e-node (measured here on
# user rules for commutativity and associativity: 23 us at 57k e-nodes, 36 us at 193k), and
# neither can stop halfway; saturation stops growing the e-graph past what extraction's share
# of the time affords (a limit of 2 s and 10^7 nodes took 7.6 s before).
SECONDS_PER_NODE = 36e-6

# A class standing for one call statement (all its results); its node carries the callee's
# cost once, and each result's class holds a free `call_result` node that reads it.
CALL_RESULT = "call_result"


class OptimizeWarning(UserWarning):
    """The optimizer could not run a stage and kept the input program (the report says why)."""


def optimize(module: Module, rules: RuleSet | None = None, target: str | CostModel = "cpu",
             limits: Limits | None = None, method: str = "auto",
             progress: bool = False) -> Module:
    """The cheapest equivalent program found for `module` on `target`: same functions, same
    results, never costlier than the input (gradient declarations expanded)."""
    return optimize_with_report(module, rules, target, limits, method, progress)[0]


def optimize_with_report(module: Module, rules: RuleSet | None = None,
                         target: str | CostModel = "cpu", limits: Limits | None = None,
                         method: str = "auto", progress: bool = False
                         ) -> tuple[Module, OptimizeReport]:
    """`optimize`, and the report of what it did (see `eqsat.extract.report`)."""
    from ..ad import differentiate
    from ..rules import default
    from . import METHODS, validate

    if not isinstance(module, Module):
        raise Error(f"optimize takes an eqsat.Module, not {type(module).__name__}")
    if rules is not None and not isinstance(rules, RuleSet):
        raise Error(f"rules must be an eqsat.rules.RuleSet (or None for the built-in rules), "
                    f"not {type(rules).__name__}")
    limits = checked_limits(limits)
    if method not in METHODS:
        raise Error(f"unknown extraction method {method!r}; valid: {', '.join(METHODS)}")
    model = cost_model(target)
    rules = default() if rules is None else rules
    report = OptimizeReport(target=model.name, method=method)
    clock = _Clock(report, progress)

    expanded = differentiate(module)
    verify(expanded)
    before = function_costs(expanded, model)
    clock.lap("differentiate")

    def keep_input(why: str, warn: bool = True) -> tuple[Module, OptimizeReport]:
        report.notes.append(why)
        if warn:
            warnings.warn(f"optimize kept the input program: {why}", OptimizeWarning,
                          stacklevel=3)
        report.functions = [FunctionResult(f.name, before[f.name], before[f.name], True, "-",
                                           0.0, False, 0) for f in expanded.functions]
        return expanded, report

    if not expanded.functions:
        return expanded, report
    try:
        afford = extract_budget(limits) / SECONDS_PER_NODE
        eg, sat = saturate(expanded, rules, limits, progress, afford)
    except ForkedProcessError:  # no saturation can run in this process: the user must know
        raise
    except LoadTimeout as e:  # the limit as the user set it: the input is the best found
        report.stop_reason = TIME_LIMIT
        clock.lap("saturate")
        return keep_input(str(e), warn=False)
    except (Error, EggSmolError) as e:
        # an op without an e-graph encoding, or a rule set egglog rejects: the input stands
        hint = (f": a rule equated values of different types; {_suspect(rules)}"
                if "Illegal merge" in str(e) else "")
        return keep_input(f"saturation failed: {e}{hint}")
    except Exception as e:  # a bug of ours must not cost the user the program
        return keep_input(f"internal error during saturation (please report it): {e!r}")
    report.stop_reason, report.rounds = sat.stop_reason, len(sat.rounds)
    report.enodes_initial, report.enodes_final = sat.initial_nodes, sat.final_nodes
    report.fired = sat.fired
    clock.lap("saturate")
    if sat.final_nodes > max(2 * afford, sat.initial_nodes):
        # A round predicted at a few times its input grew it 300x (12k -> 3.7M e-nodes:
        # distributivity on a gradient's sums): serializing and extracting that took minutes.
        return keep_input(f"saturation's last round grew the e-graph to {sat.final_nodes} "
                          f"e-nodes, more than extraction can handle within the time limit "
                          f"(about {int(afford)})", warn=False)
    try:
        ser = eg.serialize()
    finally:
        eg.close()
    report.eclasses = len(ser.classes)
    clock.lap("serialize")

    result = _extract_all(expanded, ser, model, method, limits, before, report)
    clock.lap("extract")
    if result is not expanded and validate.affordable(expanded, result, limits.seconds):
        why = validate.disagreement(expanded, result)
        clock.lap("validate")
        if why:
            return keep_input(f"the optimized program disagreed with the input on random "
                              f"inputs ({why}); {_suspect(rules)}")
    report.fused, report.transposes = provenance(expanded, result, rules, report.fired)
    clock.lap("report")
    if progress:
        print(report, file=sys.stderr)
    return result, report


def _suspect(rules: RuleSet) -> str:
    """Who to suspect when the optimized program computes something else: a rule the user
    brought (unsound rules make exactly that), else eqsat itself."""
    from ..rules import default

    built_in = {str(r) for r in default()}
    own = [r.name for r in rules if str(r) not in built_in]
    if own:
        return (f"a rule not among the built-in ones may be unsound ({', '.join(own[:5])}"
                f"{', ...' if len(own) > 5 else ''}): eqsat.rules.check(rules) finds which")
    return "an internal error: please report it"


class _Clock:
    def __init__(self, report: OptimizeReport, progress: bool):
        self.report, self.progress, self.t = report, progress, time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.report.seconds[stage] = now - self.t
        if self.progress:
            print(f"eqsat: {stage}: {now - self.t:.3f}s", file=sys.stderr)
        self.t = now


# ---------------------------------------------------------------- extraction per function


def _extract_all(module: Module, ser: Serialized, model: CostModel, method: str,
                 limits: Limits, before: Mapping[str, float], report: OptimizeReport) -> Module:
    from . import extract

    index = _Index(ser)
    funcs = {f.name: f for f in module.functions}
    sizes = {f: max(1, len(index.usable(f))) for f in funcs}
    budget = extract_budget(limits)
    start = time.perf_counter()
    final: dict[str, float] = {}  # function -> cost of the body kept, callees as kept
    chosen: dict[str, Function] = {}
    results: dict[str, FunctionResult] = {}
    for f in module.callees_first():
        name = f.name
        left = sum(sizes[g] for g in funcs if g not in final)
        share = max(0.05, (budget - (time.perf_counter() - start)) * sizes[name] / left)
        in_cost = own_cost(f, model, final)
        t0 = time.perf_counter()
        note, ext, candidate = "", None, None
        try:
            graph = function_graph(ser, index, f, module)
            costs = node_costs(graph, model, final, FREE_OPS | {CALL_RESULT})
            ext = extract(graph, costs, method, time_limit=share)
            candidate = emit(f, graph, ext, ser, module)
        except Error as e:
            note = f"extraction failed, input kept: {e}"
        except Exception as e:  # a bug of ours must not cost the user the program
            note = f"internal error during extraction, input kept (please report it): {e!r}"
            warnings.warn(f"optimize kept @{name}: {note}", OptimizeWarning, stacklevel=3)
        seconds = time.perf_counter() - t0
        out_cost = own_cost(candidate, model, final) if candidate is not None else np.inf
        keep = not out_cost < in_cost * (1 - 1e-12)
        chosen[name] = f if keep else candidate
        final[name] = in_cost if keep else out_cost
        results[name] = FunctionResult(
            name, before[name], final[name], keep, ext.method if ext else "-", seconds,
            bool(ext and ext.optimal), len(ext.graph.nodes) if ext else 0, note)
    out = Module.of(module.name, [chosen[f.name] for f in module.functions])
    try:
        verify(out)
    except Error as e:
        # a rule produced an ill-typed program the e-graph's type tables did not catch
        report.notes.append(f"the extracted module did not verify, input kept: {e}")
        report.functions = [FunctionResult(f.name, before[f.name], before[f.name], True, "-",
                                           0.0, False, 0) for f in module.functions]
        return module
    report.functions = [results[f.name] for f in module.functions]
    return out


def extract_budget(limits: Limits) -> float:
    """The seconds extraction may take in all (EXTRACT_SHARE of the limit, at least
    EXTRACT_MIN_SECONDS)."""
    return max(EXTRACT_MIN_SECONDS, EXTRACT_SHARE * limits.seconds)


class _Index:
    """Users of each e-class and each node's distinct child classes, shared by all functions."""

    def __init__(self, ser: Serialized):
        self.ser = ser
        self.kids: dict[str, tuple[str, ...]] = {}
        self.users: dict[str, list[str]] = {}
        self.leaves: list[str] = []
        for nid, n in ser.nodes.items():
            if n.eclass not in ser.types or any(c not in ser.types for c in n.children):
                continue  # untyped: cannot be priced, so never usable
            ks = tuple(dict.fromkeys(n.children))
            self.kids[nid] = ks
            for c in ks:
                self.users.setdefault(c, []).append(nid)
            if not ks:
                self.leaves.append(nid)
        self._usable: dict[str, set[str]] = {}

    def usable(self, function: str) -> set[str]:
        """Node ids usable in `function` (as `rules.usable_nodes`, in time linear in the size)."""
        if function in self._usable:
            return self._usable[function]
        nodes = self.ser.nodes
        pending = {nid: len(ks) for nid, ks in self.kids.items()}
        ok_class: set[str] = set()
        ok: set[str] = set()
        queue = [nid for nid in self.leaves
                 if nodes[nid].op != "param" or nodes[nid].attrs[0][1] == function]
        while queue:
            nid = queue.pop()
            ok.add(nid)
            c = nodes[nid].eclass
            if c in ok_class:
                continue
            ok_class.add(c)
            for u in self.users.get(c, ()):
                pending[u] -= 1
                if pending[u] == 0:
                    queue.append(u)
        self._usable[function] = ok
        return ok


def function_graph(ser: Serialized, index: _Index, f: Function, module: Module) -> EGraph:
    """The extraction e-graph of one function: its usable nodes reachable from its results.

    A call node becomes a `call` node in a class of its own (one per callee and arguments,
    typed by the callee's results) and a free `call_result` node per result reading it, so a
    call whose several results are used is paid once.
    """
    usable = index.usable(f.name)
    members: dict[str, list[str]] = {}
    for nid in usable:
        members.setdefault(ser.nodes[nid].eclass, []).append(nid)
    roots = ser.roots[f.name]
    missing = [r for r in roots if r not in members]
    if missing:
        raise Error(f"result e-class {missing[0]} of @{f.name} has no usable e-node")
    seen: set[str] = set(roots)
    stack = list(roots)
    rows: list[tuple[Hashable, str, object, tuple]] = []
    types: dict[Hashable, object] = {}
    calls: set[Hashable] = set()
    while stack:
        c = stack.pop()
        types[c] = ser.types[c]
        for nid in sorted(members[c]):
            n: BridgeNode = ser.nodes[nid]
            if n.op == "call":
                attrs = dict(n.attrs)
                callee = attrs["callee"]
                inv = ("call", callee, n.children)
                if inv not in calls:
                    calls.add(inv)
                    rows.append((inv, "call", (("callee", callee),), n.children))
                    types[inv] = tuple(module[callee].result_types)
                rows.append((c, CALL_RESULT, (("index", attrs["index"]),), (inv,)))
            else:
                rows.append((c, n.op, n.attrs, n.children))
            for k in n.children:
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
    return EGraph(rows, types, roots)


def emit(f: Function, graph: EGraph, ext: Extraction, ser: Serialized, module: Module) -> Function:
    """The function `f` computing its results with the nodes `ext` chose (children first)."""
    names: dict[int, str] = {}
    params = {p.name for p in f.params}
    fresh_names = Names(params)
    body: list[Stmt] = []
    results_of: dict[int, tuple[str, ...]] = {}
    # name a call's results after the classes that read them
    result_class = {(n.children[0], n.attr["index"]): n.eclass for n in graph.nodes
                    if n.op == CALL_RESULT}

    def fresh(c: int) -> str:
        cid = graph.class_ids[c]
        base = ser.names.get((f.name, cid), "") if isinstance(cid, str) else ""
        return fresh_names.fresh(base or f"v{len(fresh_names.taken)}")

    for c in ext.order():
        node = graph.nodes[ext.choice[c]]
        attrs = node.attrs
        if node.op == "param":
            name = dict(attrs)["name"]
            if name not in params:
                raise Error(f"e-class {graph.class_ids[c]} chosen in @{f.name} is a parameter "
                            "of another function")
            names[c] = name
            continue
        if node.op == CALL_RESULT:
            names[c] = results_of[node.children[0]][dict(attrs)["index"]]
            continue
        operands = tuple(names[k] for k in node.children)
        if node.op == "call":
            sig = module[dict(attrs)["callee"]].result_types
            results_of[c] = tuple(fresh(result_class.get((c, i), c)) for i in range(len(sig)))
            body.append(Stmt(results_of[c], "call", operands, attrs, sig))
            continue
        names[c] = fresh(c)
        body.append(Stmt((names[c],), node.op, operands, attrs, (graph.class_type(c),)))
    returns = tuple(names[r] for r in graph.roots)
    return Function(f.name, f.params, f.result_types, tuple(body), returns)
