"""IR <-> egglog: load a whole module into one e-graph, serialize it, and read choices back.

`load(module)` puts every function of a verified module (gradient declarations expanded first)
into one egglog e-graph: one e-class per value, structurally equal values shared (constants are
shared across functions), each function's results as roots. Every value's dtype and shape go
into the `dtype` / `shape` tables (see `schema`).

The extraction side works on `EGraph.serialize()`, a plain-Python view:
- `Serialized.nodes`: node id -> `ENode(op, attrs, children, eclass)`, where `op` is an IR op
  name (or "param"), `attrs` the IR attributes (as in `Stmt.attrs`; a call node also carries
  "index", the result it stands for), and `children` the operand e-class ids in order;
- `Serialized.classes`: e-class id -> node ids; `Serialized.types`: e-class id -> TensorType;
- `Serialized.roots`: function name -> result e-class ids; `Serialized.param_of`: the e-class
  of each parameter leaf -> (function, parameter).
Given a chosen node per e-class for each function, `EGraph.build(choices)` returns an
`ir.Module` that verifies. A node is usable in function F only if every parameter leaf it
reaches belongs to F (classes can hold equal terms from several functions); `usable_nodes`
computes that set and `extract_tree` is a simple tree-cost extractor built on it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Error
from ..ir.module import Function, Module, Names, Stmt
from ..ir.ops import INTS
from ..ir.types import DTYPES, TensorType
from ..ir.verifier import verify
from . import egglog_parse, egraph_pool, schema
from .egglog_native import bindings
from .in_flight import native_call


class BridgeError(Error):
    """The module cannot go into the e-graph (e.g. it still holds gradient declarations)."""


class LoadTimeout(Error):
    """Loading the module into the e-graph outlasted the deadline it was given."""


def _vec(values: tuple[int, ...] | list[int]) -> str:
    return "(vec-of " + " ".join(str(int(v)) for v in values) + ")" if values else "(vec-empty)"


def _float(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = repr(float(v))
    return text if any(c in text for c in ".en") else text + ".0"


def _list(items: list[str]) -> str:
    out = "(TNil)"
    for item in reversed(items):
        out = f"(TCons {item} {out})"
    return out


def const_term(value: Any, t: TensorType, rounded: bool = True) -> str:
    """The egglog term of `const value : t`; `rounded=False` keeps a value read from the
    e-graph as it is there (folding computes in f64, so an f32 constant may not be rounded,
    and rounding it would name a new e-class rather than its own)."""
    if t.dtype.is_float:
        # the value the program computes with (f32 rounds, 1e39 is inf), so folding cannot see
        # another one
        if rounded:
            with np.errstate(over="ignore"):
                value = float(t.dtype.np.type(value))
        negative_zero = value == 0 and math.copysign(1.0, value) < 0
        magnitude = abs(value) if negative_zero else value
        term = f'(ConstF {_float(magnitude)} "{t.dtype}" {_vec(t.shape)})'
        # egglog's f64 equality does not tell -0.0 from 0.0: a negative zero enters as the
        # negation of a positive one, or the two constants would share an e-class
        return f"({schema.ctor('neg')} {term})" if negative_zero else term
    return f'(ConstI {int(value)} "{t.dtype}" {_vec(t.shape)})'


@dataclass(frozen=True)
class ENode:
    """One e-node of the serialized e-graph, in IR terms."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    children: tuple[str, ...]
    eclass: str


@dataclass
class Serialized:
    """A plain-Python snapshot of the e-graph's tensor e-classes (see the module docstring)."""

    nodes: dict[str, ENode]
    classes: dict[str, list[str]]
    types: dict[str, TensorType]
    roots: dict[str, list[str]]
    param_of: dict[str, tuple[str, str]]
    names: dict[tuple[str, str], str] = field(default_factory=dict)  # (func, eclass) -> name


# Lines of the module's program per egglog program when it is loaded (each a let or a set).
LOAD_CHUNK = 300
# The analysis ruleset run to its fixpoint (see EGraph.analyze).
_ANALYSIS = f"(run-schedule (saturate (run {schema.ANALYSIS})))"


class EGraph:
    """A module loaded into egglog: the native e-graph plus what is needed to read it back."""

    def __init__(self, module: Module, deadline: float = math.inf, rules: str = "",
                 checks: bool = True):
        if module.grad_decls:
            raise BridgeError("the module still has gradient declarations; expand them with "
                              "eqsat.differentiate before loading it into an e-graph")
        verify(module)
        self.module = module
        self.rules = rules  # the rule set program declared below the module (see add_rules)
        self.checks = checks  # whether the analysis checks types (see schema.prelude)
        self.failed = False
        self.thread = threading.get_ident()  # the only thread that may use it (see egraph_pool)
        self.native = egraph_pool.take(rules, lambda: _fresh_native(checks), _declare,
                                       _schema_name(checks))
        self.encodings = schema.encodings()
        self.lets: dict[str, tuple[str, str]] = {}  # let name -> (function, value name)
        self.root_lets: dict[str, list[str]] = {}
        # egglog parses and runs a program in time quadratic in its length (a 2,000-statement
        # module took 13 s in one program): fed in chunks, loading is linear
        lines = self._module_program().splitlines()
        for i in range(0, len(lines), LOAD_CHUNK):
            if time.perf_counter() >= deadline:
                raise LoadTimeout(f"loading the program into the e-graph took past the time "
                                  f"limit ({i} of {len(lines)} lines loaded)")
            self.run("\n".join(lines[i:i + LOAD_CHUNK]))
        # Terms inside a statement's term (the 0.0 of a -0.0 constant's neg) get their types
        # from the analysis too, not only at the first saturation: a loaded graph is typed.
        # Its outputs are kept for the saturation's report: where the rule set was declared
        # first, its analysis rules (constant folding) fire here.
        self.load_outputs = self.analyze()

    def run(self, program: str | list[Any]) -> list[Any]:
        """Run egglog program text (or egglog's command objects, `egglog_text`) on the
        e-graph; returns egglog's outputs."""
        if self.native is None:
            raise BridgeError("the e-graph was closed")
        try:
            return _declare(self.native, program)
        except BaseException:
            self.failed = True
            raise

    def add_rules(self, program: str) -> None:
        """Declare a rule set's egglog program, unless it was declared with the schema; an
        e-graph whose analysis does not check types takes no rules but its own."""
        if program != self.rules:
            if not self.checks:
                raise BridgeError("this e-graph's type analysis does not check types: it "
                                  "takes only the rules it was loaded with")
            self.run(program)

    def close(self) -> None:
        """Done with the e-graph (its serialized snapshots stay valid): its native e-graph
        goes back to the pool for the next module, unless a run on it failed or this is not
        the thread that loaded it."""
        native, self.native = self.native, None
        if native is not None and not self.failed and threading.get_ident() == self.thread:
            try:
                egraph_pool.give(native, self.rules, _declare, _schema_name(self.checks))
            except Exception:  # egglog refused the pop: the e-graph is dropped, not reused
                pass

    def analyze(self) -> list[Any]:
        """Run the analysis ruleset to its fixpoint (types of new terms, analysis rules such
        as constant folding); returns egglog's outputs."""
        return self.run(_ANALYSIS)

    def _module_program(self) -> str:
        lines: list[str] = []
        for f in self.module.functions:
            env: dict[str, str] = {}

            def bind(name: str, term: str, t: TensorType) -> None:
                let = f"$v{len(self.lets)}"
                self.lets[let] = (f.name, name)
                env[name] = let
                lines.append(f"(let {let} {term})")
                lines.append(f"(set (shape {let}) {_vec(t.shape)})")
                lines.append(f'(set (dtype {let}) "{t.dtype}")')

            for p in f.params:
                bind(p.name, f'(Param "{f.name}" "{p.name}")', p.type)
            for s in f.body:
                for i, (r, t) in enumerate(zip(s.results, s.types)):
                    bind(r, self._stmt_term(s, i, env), t)
            self.root_lets[f.name] = [env[r] for r in f.returns]
        return "\n".join(lines)

    def _stmt_term(self, s: Stmt, index: int, env: dict[str, str]) -> str:
        args = [env[o] for o in s.operands]
        attrs = s.attr
        if s.op == "const":
            return const_term(attrs["value"], s.types[0])
        if s.op == "call":
            return f'(Op_call "{attrs["callee"]}" {_list(args)} {index})'
        enc = self.encodings.get(s.op)
        if enc is None:
            raise BridgeError(f"op {s.op!r} has no e-graph encoding (no type analysis rule)")
        parts = [_list(args)] if enc.variadic else args
        for name, kind in enc.attrs:
            v = attrs[name]
            if kind in schema.ATTR_CODECS:
                v = schema.ATTR_CODECS[kind][0](v)
            parts.append(_vec(v) if kind == INTS else (json.dumps(v) if isinstance(v, str)
                                                       else str(int(v))))
        if enc.written:
            parts += [f'"{s.types[0].dtype}"', _vec(s.types[0].shape)]
        return f"({schema.ctor(s.op)} {' '.join(parts)})"

    # ------------------------------------------------------------------ reading back

    def size(self) -> int:
        """The number of tensor e-nodes (constructors of T and TList)."""
        (out,) = self.run("(print-size)")
        ctors = {"TNil", "TCons", "Param", "ConstF", "ConstI"}
        return sum(n for name, n in out.sizes if name in ctors or name.startswith("Op_"))

    def serialize(self) -> Serialized:
        """Snapshot the e-graph as plain Python (nodes, e-classes, types, roots)."""
        span = bindings.PanicSpan()
        roots = [bindings.Var(span, let) for lets in self.root_lets.values() for let in lets]
        with native_call():
            text = self.native.serialize(roots).to_json()
        data = json.loads(text)
        return _decode(data, self)

    def build(self, choices: Mapping[str, Mapping[str, str]], name: str | None = None) -> Module:
        """The module whose function F computes its results from the nodes `choices[F]` picks
        (e-class id -> node id); the result is verified."""
        return _Builder(self, choices).module(name)


def load(module: Module, deadline: float = math.inf, rules: str = "",
         checks: bool = True) -> EGraph:
    """Load every function of a verified module (no gradient declarations) into an e-graph
    where the rule set program `rules` is declared; `LoadTimeout` past `deadline` (a
    `time.perf_counter` value). `checks=False`: the type analysis computes types without
    checking them (`schema.prelude`), only for `rules` of rules all declared well-typed."""
    return EGraph(module, deadline, rules, checks)


def _schema_name(checks: bool) -> str:
    return "checked" if checks else "unchecked"


def _fresh_native(checks: bool = True) -> Any:
    native = bindings.EGraph()
    _declare(native, schema.prelude(checks))
    return native


def _declare(native: Any, program: str | list[Any]) -> list[Any]:
    with native_call():
        commands = (egglog_parse.parse(native, program) if isinstance(program, str)
                    else program)
        return native.run_program(*commands)


# ---------------------------------------------------------------- serialized JSON -> Python


def _decode(data: dict, eg: EGraph) -> Serialized:
    raw = data["nodes"]
    kinds = {c: d.get("type") for c, d in data.get("class_data", {}).items()}
    by_class: dict[str, list[str]] = {}
    for nid, n in raw.items():
        by_class.setdefault(n["eclass"], []).append(nid)

    decoded: dict[str, Any] = {}  # shapes and strings repeat: each class is decoded once

    def prim(cid: str) -> Any:
        if cid not in decoded:
            decoded[cid] = _prim(cid)
        return decoded[cid]

    def _prim(cid: str) -> Any:
        node = raw[by_class[cid][0]]
        sort, op = kinds.get(cid), node["op"]
        if sort == "i64":
            return int(op)
        if sort == "f64":
            return {"NaN": math.nan, "inf": math.inf, "-inf": -math.inf}.get(op) or float(op)
        if sort == "String":
            return json.loads(op)
        if sort == "IntVec":
            return tuple(prim(raw[c]["eclass"]) for c in node["children"])
        raise Error(f"unexpected primitive sort {sort!r} in the serialized e-graph")

    def tlist(cid: str) -> tuple[str, ...]:
        out: list[str] = []
        while True:
            node = raw[by_class[cid][0]]
            if node["op"] == "TNil":
                return tuple(out)
            head, rest = node["children"]
            out.append(raw[head]["eclass"])
            cid = raw[rest]["eclass"]

    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    nodes: dict[str, ENode] = {}
    classes: dict[str, list[str]] = {}
    param_of: dict[str, tuple[str, str]] = {}
    for nid, n in raw.items():
        op, kids = n["op"], [raw[c]["eclass"] for c in n["children"]]
        if op in ("shape", "dtype"):
            (shapes if op == "shape" else dtypes)[kids[0]] = prim(n["eclass"])
            continue
        enode = _enode(op, kids, n["eclass"], eg, prim, tlist)
        if enode is None:
            continue
        nodes[nid] = enode
        classes.setdefault(enode.eclass, []).append(nid)
        if enode.op == "param":
            param_of[enode.eclass] = (enode.attrs[0][1], enode.attrs[1][1])
    types = {c: TensorType(DTYPES[dtypes[c]], tuple(shapes[c])) for c in classes
             if c in shapes and c in dtypes}
    let_class = {}
    for cid, d in data.get("class_data", {}).items():
        for let in (d.get("let") or "").split(","):
            if let.strip():
                let_class[let.strip()] = cid
    roots = {f: [let_class[let] for let in lets] for f, lets in eg.root_lets.items()}
    names = {}
    for let, (f, value) in eg.lets.items():
        if let in let_class:
            names.setdefault((f, let_class[let]), value)
    return Serialized(nodes, classes, types, roots, param_of, names)


def _enode(op: str, kids: list[str], eclass: str, eg: EGraph, prim: Callable,
           tlist: Callable) -> ENode | None:
    if op == "Param":
        return ENode("param", (("function", prim(kids[0])), ("name", prim(kids[1]))), (), eclass)
    if op in ("ConstF", "ConstI"):
        value, dt = prim(kids[0]), prim(kids[1])
        if dt == "bool":
            value = bool(value)
        return ENode("const", (("value", value),), (), eclass)
    if op == "Op_call":
        attrs = (("callee", prim(kids[0])), ("index", prim(kids[2])))
        return ENode("call", attrs, tlist(kids[1]), eclass)
    ir_op = schema.op_of_ctor(op)
    enc = eg.encodings.get(ir_op) if ir_op else None
    if enc is None:
        return None  # TList cells and helper tables are not tensor nodes
    pos = 1 if enc.variadic else enc.n_operands
    children = tlist(kids[0]) if enc.variadic else tuple(kids[:pos])
    attrs = tuple((name, _decode_attr(kind, prim(kids[pos + i])))
                  for i, (name, kind) in enumerate(enc.attrs))
    return ENode(ir_op, attrs, children, eclass)


def _decode_attr(kind: str, value: Any) -> Any:
    codec = schema.ATTR_CODECS.get(kind)
    return codec[1](value) if codec else value


# ---------------------------------------------------------------- choices -> Module


def usable_nodes(ser: Serialized, function: str) -> set[str]:
    """Node ids usable in `function`: those that reach no other function's parameters."""
    ok_class: set[str] = set()
    ok: set[str] = set()
    changed = True
    while changed:
        changed = False
        for nid, n in ser.nodes.items():
            if nid in ok:
                continue
            if n.op == "param":
                good = n.attrs[0][1] == function
            else:
                good = all(c in ok_class for c in n.children)
            if good:
                ok.add(nid)
                ok_class.add(n.eclass)
                changed = True
    return ok


def extract_tree(ser: Serialized, cost: Callable[[ENode], float] | None = None
                 ) -> dict[str, dict[str, str]]:
    """Per function, the node of least tree cost for every e-class (default cost: 1 per node)."""
    cost = cost or (lambda n: 1.0)
    out = {}
    for f in ser.roots:
        usable = usable_nodes(ser, f)
        best: dict[str, tuple[float, str]] = {}
        changed = True
        while changed:
            changed = False
            for nid in usable:
                n = ser.nodes[nid]
                if any(c not in best for c in n.children):
                    continue
                total = cost(n) + sum(best[c][0] for c in n.children)
                if n.eclass not in best or total < best[n.eclass][0]:
                    best[n.eclass] = (total, nid)
                    changed = True
        out[f] = {c: nid for c, (_, nid) in best.items()}
    return out


class _Builder:
    def __init__(self, eg: EGraph, choices: Mapping[str, Mapping[str, str]]):
        self.eg = eg
        self.ser = eg.serialize()
        self.choices = choices

    def module(self, name: str | None) -> Module:
        funcs = [self.function(f) for f in self.eg.module.functions]
        m = Module.of(name or self.eg.module.name, funcs)
        return verify(m)

    def function(self, f: Function) -> Function:
        ser, choice = self.ser, self.choices.get(f.name, {})
        env: dict[str, str] = {}  # e-class -> value name
        for p in f.params:
            for cid, owner in ser.param_of.items():
                if owner == (f.name, p.name):
                    env[cid] = p.name
        fresh_names = Names(set(env.values()))
        body: list[Stmt] = []
        calls: dict[tuple[str, tuple[str, ...]], list[str]] = {}

        def fresh(cid: str) -> str:
            return fresh_names.fresh(ser.names.get((f.name, cid), f"e{len(fresh_names.taken)}"))

        def pick(cid: str) -> ENode:
            nid = choice.get(cid)
            if nid is None or nid not in ser.nodes or ser.nodes[nid].eclass != cid:
                raise Error(f"no usable node chosen for e-class {cid} in @{f.name}")
            return ser.nodes[nid]

        for root in ser.roots[f.name]:
            stack = [(root, False)]
            while stack:
                cid, expanded = stack.pop()
                if cid in env:
                    continue
                node = pick(cid)
                if node.op == "param":
                    raise Error(f"e-class {cid} chosen in @{f.name} is a parameter of "
                                f"@{node.attrs[0][1]}")
                if not expanded:
                    stack.append((cid, True))
                    stack += [(c, False) for c in reversed(node.children) if c not in env]
                    continue
                if any(c not in env for c in node.children):
                    raise Error(f"the choice for @{f.name} is cyclic at e-class {cid}")
                operands = tuple(env[c] for c in node.children)
                attrs = dict(node.attrs)
                if node.op == "call":
                    key = (attrs["callee"], node.children)
                    sig = self.eg.module[attrs["callee"]]
                    if key not in calls:
                        calls[key] = [fresh(cid if i == attrs["index"] else f"{cid}#{i}")
                                      for i in range(len(sig.result_types))]
                        body.append(Stmt(tuple(calls[key]), "call", operands,
                                         (("callee", attrs["callee"]),), sig.result_types))
                    env[cid] = calls[key][attrs["index"]]
                    continue
                name = fresh(cid)
                env[cid] = name
                body.append(Stmt((name,), node.op, operands, node.attrs, (ser.types[cid],)))
        returns = tuple(env[c] for c in ser.roots[f.name])
        return Function(f.name, f.params, f.result_types, tuple(body), returns)


def roundtrip(module: Module) -> Module:
    """Load a module and extract it again with the tree-cost extractor (no rewriting)."""
    eg = load(module)
    return eg.build(extract_tree(eg.serialize()))


