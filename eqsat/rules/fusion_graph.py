"""The serialized e-graph as the fusion pass reads it: elementwise kernels (operand e-classes
and a body) in canonical form, each e-class's kernels, what its operands read through
(constants as literals, broadcasts as their smaller source), and its types."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..ir.fused import body_flops, domain
from ..ir.ops import OpTypeError
from ..ir.scalar_expr import (App, Arg, Expr, Lit, body_cost, body_op_names, elementwise_body,
                              substitute)
from ..ir.types import TensorType
from .bridge import ENode, Serialized

MAX_OPERANDS = 8
MAX_FORMS = 2  # per e-class, the largest map kernels used as consumers and as producers


@dataclass(frozen=True)
class Kernel:
    """An elementwise computation: operand e-classes and a body over them."""

    operands: tuple[str, ...]
    body: Expr


def body_size(e: Expr) -> int:
    """The number of ops applied in a body."""
    n, stack = 0, [e]
    while stack:
        x = stack.pop()
        if isinstance(x, App):
            n += 1
            stack.extend(x.args)
    return n


def canonical(operands: tuple[str, ...], body: Expr, fixed: int = 0) -> Kernel:
    """The kernel with equal operands merged and the rest numbered by first use (pre-order);
    the first `fixed` operands keep their places (a matmul_epi's product)."""
    order = list(operands[:fixed])
    index = {c: i for i, c in enumerate(order)}
    mapping: dict[int, Expr] = {i: Arg(i) for i in range(fixed)}
    stack = [body]
    while stack:
        e = stack.pop()
        if isinstance(e, Arg) and e.index not in mapping:
            c = operands[e.index]
            if c not in index:
                index[c] = len(order)
                order.append(c)
            mapping[e.index] = Arg(index[c])
        elif isinstance(e, App):
            stack.extend(reversed(e.args))
    if tuple(order) == operands and all(a.index == i for i, a in mapping.items()):
        return Kernel(operands, body)  # already canonical: substituting would rebuild it
    return Kernel(tuple(order), substitute(body, mapping))


class FusionGraph:
    """The serialized e-graph, indexed for the pass."""

    def __init__(self, ser: Serialized):
        self.ser = ser
        self.types = ser.types
        self.elementwise = body_op_names()
        self.existing = {(n.eclass, n.op, n.attrs, n.children) for n in ser.nodes.values()}
        self._all: dict[str, list[tuple[frozenset[str], float]]] = {}
        self._through: dict[str, Expr | str] = {}
        self._normal: dict[tuple, tuple[Kernel, str]] = {}
        self._kernels: dict[str, list[Kernel]] = {}

    def nodes(self, c: str) -> Iterator[ENode]:
        for nid in self.ser.classes.get(c, ()):
            yield self.ser.nodes[nid]

    def core(self, c: str) -> list[Kernel]:
        """The elementwise ops of class c as kernels."""
        return [Kernel(n.children, elementwise_body(n.op)) for n in self.nodes(c)
                if n.op in self.elementwise]

    def dominated(self, c: str, k: Kernel) -> bool:
        """Whether class c has a kernel reading no more operands with no costlier body (ops
        weighed by their element_cost: mul($0, $0) beats pow($0, 2.0); what is the same along
        a row counted once per row, as the cost model does): it is never costlier under a
        roofline (one launch each, no more bytes or flops), so `k` is waste. This also stops
        inlining around cycles (x = neg(neg(x)) after `neg_neg`)."""
        if c not in self._all:
            forms = self.core(c) + [Kernel(n.children, dict(n.attrs)["body"])
                                    for n in self.nodes(c) if n.op == "map"]
            self._all[c] = [(frozenset(j.operands), self._flops(c, j)) for j in forms]
        ops, cost = frozenset(k.operands), self._flops(c, k)
        return any(o <= ops and s <= cost for o, s in self._all[c])

    def _flops(self, c: str, k: Kernel) -> float:
        ins = self.typed(k.operands)
        if ins is None or c not in self.types:
            return body_cost(k.body)
        return body_flops(k.body, ins, self.types[c].shape)

    def kernels(self, c: str) -> list[Kernel]:
        """The elementwise ops of class c as kernels, then its MAX_FORMS largest maps (once per
        class: the pass asks again for every kernel reading c)."""
        if c not in self._kernels:
            self._kernels[c] = self._find_kernels(c)
        return self._kernels[c]

    def _find_kernels(self, c: str) -> list[Kernel]:
        core, maps = [], []
        for n in self.nodes(c):
            if n.op in self.elementwise:
                core.append(Kernel(n.children, elementwise_body(n.op)))
            elif n.op == "map":
                maps.append(Kernel(n.children, dict(n.attrs)["body"]))
        maps.sort(key=lambda k: (-body_size(k.body), len(k.operands)))
        return core + maps[:MAX_FORMS]

    def through(self, c: str) -> Expr | str:
        """A constant operand's literal, or the smallest value a broadcast operand reads, or
        the class itself."""
        if c not in self._through:
            self._through[c] = self._read_through(c)
        return self._through[c]

    def _read_through(self, c: str) -> Expr | str:
        best = c
        for n in self.nodes(c):
            if n.op == "const":
                return Lit(dict(n.attrs)["value"])
            if n.op == "broadcast":
                x = n.children[0]
                if x in self.types and self.types[x].size < self.types[best].size:
                    best = x
        return best

    def normal(self, k: Kernel, keep: tuple[int, ...] | None = None) -> tuple[Kernel, str]:
        """The canonical kernel with constants inlined and broadcasts read through (both
        always pay: fewer bytes read, nothing recomputed); `keep` is a map_reduce's index
        space, which must not shrink. Also names the rule that changed it most."""
        key = (k, keep)
        if key not in self._normal:
            self._normal[key] = self._normalize(k, keep)
        return self._normal[key]

    def _normalize(self, k: Kernel, keep: tuple[int, ...] | None) -> tuple[Kernel, str]:
        rule = ""
        for _ in range(MAX_OPERANDS * 4):
            mapping: dict[int, Expr] = {}
            ops = list(k.operands)
            for i, c in enumerate(k.operands):
                if c not in self.types:
                    continue
                new = self.through(c)
                if isinstance(new, Lit):
                    mapping[i] = new
                    rule = rule or "fuse_constant"
                elif new != c:
                    trial = ops[:i] + [new] + ops[i + 1:]
                    if keep is not None and not same_domain(self, trial, keep):
                        continue
                    ops = trial
                    rule = "fuse_broadcast"
            if not mapping and ops == list(k.operands):
                break
            k = Kernel(tuple(ops), substitute(k.body, mapping) if mapping else k.body)
        return canonical(k.operands, k.body), rule

    def producers(self, c: str) -> Iterator[Kernel]:
        """What an operand of class c can be inlined as: its elementwise kernels (none for a
        constant, which `normal` inlines as a literal)."""
        if not isinstance(self.through(c), Lit):
            yield from self.kernels(c)

    def typed(self, cs: tuple[str, ...]) -> list[TensorType] | None:
        ts = [self.types.get(c) for c in cs]
        return None if any(t is None for t in ts) else ts  # type: ignore[return-value]


def same_domain(g: FusionGraph, operands: list[str], shape: tuple[int, ...]) -> bool:
    """Whether `operands` broadcast together to exactly `shape` (a map_reduce's index space)."""
    ts = g.typed(tuple(operands))
    try:
        return ts is not None and domain(ts) == tuple(shape)
    except OpTypeError:
        return False
