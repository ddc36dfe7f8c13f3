"""A plain e-graph for extraction, independent of egglog.

E-classes are numbered 0..n-1 internally; the ids a caller uses (egglog's class names, IR value
names, anything hashable) are kept in `class_ids` and translated once, in the constructor.
Each e-node has an op, attributes, the classes of its operands and the class it belongs to.
Function parameters are leaves of op `param` (any op in `FREE_OPS` costs nothing).

>>> from eqsat.ir.types import DType
>>> t = DType.f32[4]
>>> g = EGraph([("x", "param", {"name": "x"}, []), ("y", "neg", {}, ["x"]),
...             ("y", "mul", {}, ["y", "one"]), ("one", "const", {"value": 1.0}, [])],
...            types={"x": t, "y": t, "one": t}, roots=["y"])
>>> len(g.nodes), g.num_classes, g.roots
(4, 3, (1,))
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Error
from ..ir.types import TensorType

# Ops whose nodes cost nothing: values that exist before the program runs.
FREE_OPS = frozenset({"param"})

ClassType = TensorType | tuple[TensorType, ...]


@dataclass(frozen=True, slots=True)
class ENode:
    """One e-node: `op(children...)` with attributes, a member of class `eclass`."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    children: tuple[int, ...]
    eclass: int

    @property
    def attr(self) -> dict[str, Any]:
        """The attributes as a dict."""
        return dict(self.attrs)


def _attrs(a: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> tuple[tuple[str, Any], ...]:
    if a is None:
        return ()
    items = a.items() if isinstance(a, Mapping) else a
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in items)


class EGraph:
    """E-classes of e-nodes with types and roots, frozen once built.

    `nodes` is a sequence of `(class_id, op, attrs, child_class_ids)`; `types` maps class ids to
    their TensorType (a tuple of them for a multi-result class; may be omitted when costs are
    given directly); `roots` are the class ids the program returns (repeats allowed).
    """

    def __init__(self, nodes: Iterable[tuple[Hashable, str, Any, Sequence[Hashable]]],
                 types: Mapping[Hashable, ClassType] | None = None,
                 roots: Sequence[Hashable] = ()):
        raw = list(nodes)
        self.class_ids: list[Hashable] = []
        self.index: dict[Hashable, int] = {}
        for cid, *_ in raw:
            if cid not in self.index:
                self.index[cid] = len(self.class_ids)
                self.class_ids.append(cid)
        built: list[ENode] = []
        members: list[list[int]] = [[] for _ in self.class_ids]
        for i, (cid, op, attrs, children) in enumerate(raw):
            kids = []
            for ch in children:
                if ch not in self.index:
                    raise Error(f"e-node {i} ({op} in class {cid!r}) has child class {ch!r}, "
                                "which has no e-nodes")
                kids.append(self.index[ch])
            built.append(ENode(str(op), _attrs(attrs), tuple(kids), self.index[cid]))
            members[self.index[cid]].append(i)
        self.nodes: tuple[ENode, ...] = tuple(built)
        self.class_nodes: tuple[tuple[int, ...], ...] = tuple(tuple(m) for m in members)
        bad = [r for r in roots if r not in self.index]
        if bad:
            raise Error(f"root class {bad[0]!r} has no e-nodes")
        self.roots: tuple[int, ...] = tuple(self.index[r] for r in roots)
        self.types: tuple[ClassType | None, ...] | None = None
        if types is not None:
            missing = [c for c in self.class_ids if c not in types]
            if missing:
                raise Error(f"class {missing[0]!r} has no type ({len(missing)} classes lack one)")
            self.types = tuple(types[c] for c in self.class_ids)

    @property
    def num_classes(self) -> int:
        """Number of e-classes."""
        return len(self.class_ids)

    def __repr__(self) -> str:
        return (f"<EGraph: {len(self.nodes)} nodes, {self.num_classes} classes, "
                f"{len(self.roots)} roots>")

    def class_type(self, c: int) -> ClassType:
        """The type of class `c` (internal index)."""
        if self.types is None:
            raise Error("this e-graph was built without class types; give `types` to price it")
        return self.types[c]


def _flat(t: ClassType) -> tuple[TensorType, ...]:
    return t if isinstance(t, tuple) else (t,)


def node_costs(graph: EGraph, model: Any, callee_costs: Mapping[str, float] | None = None,
               free_ops: frozenset[str] = FREE_OPS) -> np.ndarray:
    """Each node's own cost in seconds under `model` (a CostModel), from the class types.

    A `call` node adds `callee_costs[callee]` (the callee's whole cost) to its own.
    """
    out = np.zeros(len(graph.nodes))
    memo: dict[tuple, float] = {}
    for i, n in enumerate(graph.nodes):
        if n.op in free_ops:
            continue
        ins = tuple(t for ch in n.children for t in _flat(graph.class_type(ch)))
        outs = _flat(graph.class_type(n.eclass))
        # many nodes share op, attributes and types (every add of two f32[128,10], ...)
        key = (n.op, n.attrs, ins, outs)
        if key not in memo:
            c = model.stmt_cost(n.op, n.attr, ins, outs)
            if n.op == "call":
                callee = n.attr.get("callee")
                if callee_costs is None or callee not in callee_costs:
                    raise Error(f"call of @{callee}: its cost is unknown (pass callee_costs)")
                c += callee_costs[callee]
            memo[key] = c
        out[i] = memo[key]
    return out
