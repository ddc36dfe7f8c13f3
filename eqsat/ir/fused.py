"""Fused-kernel and layout ops: `map`, `map_reduce`, `matmul_t`, `matmul_epi`.

Optimization makes them (fusion and layout rules); they print, parse, verify and interpret like
every core op, and `unfuse` expands each back into core ops (for AD and for backends without a
kernel of their own). Their bodies are scalar expressions (`scalar_expr`):

    %y = map %x, %w, %b, body=tanh(add(mul($0, $1), $2)) : f32[1024]
    %s = map_reduce %x, %y, body=mul(sub($0, $1), sub($0, $1)), reduce=sum, axes=[1] : f32[128]
    %c = matmul_t %a, %b, ta=1, tb=0 : f32[64,32]
    %h = matmul_epi %x, %w, %bias, ta=0, tb=0, body=relu(add($0, $1)) : f32[128,10]
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .module import Function, Module, Stmt
from .ops import (INT, INTS, OPS, Attrs, OpDef, OpTypeError, _axes, _written, broadcastable,
                  ops_in, register)
from .parser import ATTR_PARSERS
from .printer import ATTR_FORMATTERS
from .scalar_expr import (MAX_DEPTH, App, Arg, Expr, Lit, body_args, body_cost, body_op_names,
                          check_body, depth, eval_body, fold, format_body, lit_value,
                          operand_roles, read_body)
from .types import DType, TensorType, shape_problem

# Attribute kinds of this module: a scalar body, and the name of a reduction op.
BODY = "body"
REDUCER = "reducer"


def _read_reducer(p: Any, name: str) -> str:
    tok = p.tok
    choices = sorted(ops_in("reduce"))
    if tok.kind != "ident" or tok.text not in choices:
        raise p.error(f"expected a reduction ({', '.join(choices)}) for {name!r}, found "
                      f"{tok.describe()}")
    return p.next().text


def format_body_attr(body: Any) -> str:
    """A body as printed in a statement (a malformed Python-built one prints as its repr, so
    the verifier can point at it)."""
    return format_body(body) if isinstance(body, (Arg, Lit, App)) else repr(body)


ATTR_FORMATTERS[BODY] = format_body_attr
ATTR_PARSERS[BODY] = read_body
ATTR_FORMATTERS[REDUCER] = str
ATTR_PARSERS[REDUCER] = _read_reducer


# ---------------------------------------------------------------- type rules


def _to_result(ins: Sequence[TensorType], shape: tuple[int, ...], op: str, first: int = 0) -> None:
    for i in range(first, len(ins)):
        if not broadcastable(ins[i].shape, shape):
            raise OpTypeError(f"{op}: operand {i} ({ins[i]}) does not broadcast to the result "
                              f"shape [{','.join(map(str, shape))}] (numpy's right-aligned rule)",
                              operand=i)


def _same_dtype(d: DType, want: DType, op: str) -> None:
    if d != want:
        raise OpTypeError(f"{op}'s body computes {d}, but the result type says {want}",
                          attr="body")


def _infer_map(ins: Sequence[TensorType], attrs: Attrs, written: TensorType | None) -> TensorType:
    t = _written(written, "map")
    _to_result(ins, t.shape, "map")
    d = check_body(attrs["body"], [x.dtype for x in ins], t.dtype, "map body")
    _same_dtype(d, t.dtype, "map")
    return t


def domain(ins: Sequence[TensorType], op: str = "map_reduce") -> tuple[int, ...]:
    """The shape all inputs broadcast to (numpy's rule): the index space of a map_reduce."""
    shape: tuple[int, ...] = ()
    for i, x in enumerate(ins):
        try:
            shape = tuple(np.broadcast_shapes(shape, x.shape))
        except ValueError:
            raise OpTypeError(f"{op}: operand {i} ({x}) does not broadcast with the operands "
                              f"before it (shape [{','.join(map(str, shape))}])",
                              operand=i) from None
        problem = shape_problem(shape)
        if problem:
            raise OpTypeError(f"{op}: the broadcast inputs are too large: {problem}", operand=i)
    return shape


def compute_dtype(operands: Sequence[TensorType]) -> DType:
    """The dtype a fused body's arithmetic runs in, for costing: its widest operand's (f32
    where it reads none)."""
    return max((t.dtype for t in operands), key=lambda d: d.itemsize, default=DType.f32)


def body_flops(body: Any, operands: Sequence[TensorType], shape: Sequence[int]) -> float:
    """Flops of a fused kernel's body evaluated at every point of `shape`, its operands
    broadcast to it: subterms reading no operand that varies along the last axis cost once per
    row (generated loops hoist them out of the innermost loop: a layer norm's 1/sqrt(var + eps)
    is not recomputed per element). The body computes in its widest operand's dtype."""
    if not isinstance(body, (Arg, Lit, App)):
        return _flops(body, operands, shape)
    return _flops_cached(body, tuple(operands), tuple(shape))


@functools.lru_cache(maxsize=1 << 14)
def _flops_cached(body: Expr, operands: tuple[TensorType, ...], shape: tuple[int, ...]
                  ) -> float:
    # the fusion pass weighs each form of a class again in every round, and the cost model
    # weighs it again for every function that can use it (2.2x in a VAE's optimize)
    return _flops(body, operands, shape)


def _flops(body: Any, operands: Sequence[TensorType], shape: Sequence[int]) -> float:
    size = math.prod(shape)
    inner = shape[-1] if shape else 1
    varying = [i for i, t in enumerate(operands) if inner > 1 and t.shape[-1:] == (inner,)]
    dtype = compute_dtype(operands)
    per_element = body_cost(body, varying, dtype)
    per_row = body_cost(body, None, dtype) - per_element
    return per_element * size + (per_row * (size // inner) if inner else 0.0)


# Signatures are enumerated over at most this many independently typed groups of inputs.
MAX_SIGNATURE_GROUPS = 5
Signature = tuple[tuple[DType | None, ...], DType]


@functools.lru_cache(maxsize=1024)
def body_signatures(body: Expr, n: int, expect: str | None = None) -> tuple[Signature, ...]:
    """Every assignment of dtypes to the `n` inputs of `body` under which it types, and the
    dtype it then computes; an input the body does not read is None (any dtype). `expect`
    says what types a constant nothing else fixes, as the op holding the body does: None
    (a map_reduce: nothing, such a body does not type), "result" (a map: its written dtype,
    which the body must compute; a signature per such dtype) or "first" (a matmul_epi: its
    product's, input 0). The body's type rule as a finite table, for the e-graph,
    which cannot run `check_body`. Empty for a malformed body, or one with more than
    MAX_SIGNATURE_GROUPS groups: the operands of one op (conditions aside) share a dtype in
    every elementwise op of the table, so inputs are enumerated per such group, and
    check_body judges each candidate (an op allowing mixed dtypes would lose signatures, so
    a rule would apply less, never wrongly)."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    def walk(e: Expr) -> int | None:  # the input whose dtype `e` computes in, if any
        if isinstance(e, Arg):
            return e.index
        if isinstance(e, Lit):
            return None
        conds, same = operand_roles(e.op)
        inputs = [walk(a) for a in e.args]
        peers = [i for i, c in zip(inputs, conds) if i is not None and not c]
        for i in peers[1:]:
            parent[find(i)] = find(peers[0])
        return peers[0] if same and peers else None

    if depth(body) > MAX_DEPTH or _body_malformed(body, n):
        return ()
    walk(body)
    used = set(body_args(body))
    if expect == "first" and n:
        used.add(0)  # the product's dtype types the constants even where $0 is not read
    groups = sorted({find(i) for i in used})
    if len(groups) > MAX_SIGNATURE_GROUPS:
        return ()
    out = []
    for choice in itertools.product(list(DType), repeat=len(groups)):
        pick = dict(zip(groups, choice))
        dtypes = [pick[find(i)] if i in used else DType.f32 for i in range(n)]
        ins = tuple(d if i in used else None for i, d in enumerate(dtypes))
        expected = {None: [None], "result": list(DType), "first": dtypes[:1]}[expect]
        for want in expected:
            try:
                result = check_body(body, dtypes, want)
            except OpTypeError:
                continue
            if expect != "result" or result is want:
                out.append((ins, result))
    return tuple(out)


def _body_malformed(e: Expr, n: int) -> bool:
    """Whether `e` applies an op no body may, with the wrong arity, or reads $i >= n."""
    allowed = body_op_names()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Arg) and x.index >= n:
            return True
        if isinstance(x, App):
            if x.op not in allowed or len(x.args) != OPS[x.op].arity:
                return True
            stack.extend(x.args)
    return False


def _infer_map_reduce(ins: Sequence[TensorType], attrs: Attrs,
                      written: TensorType | None) -> TensorType:
    reduce = attrs["reduce"]
    if reduce not in ops_in("reduce"):
        raise OpTypeError(f"map_reduce: {reduce!r} is not a reduction "
                          f"({', '.join(sorted(ops_in('reduce')))})", attr="reduce")
    shape = domain(ins)
    d = check_body(attrs["body"], [x.dtype for x in ins], None, "map_reduce body")
    axes = _axes(attrs, "axes", len(shape), "map_reduce")
    if reduce == "sum" and not d.is_numeric:
        raise OpTypeError(f"map_reduce: sum needs a numeric body; this one computes {d}",
                          attr="reduce")
    if reduce != "sum" and any(shape[a] == 0 for a in axes):
        raise OpTypeError(f"map_reduce: {reduce} over an axis of length 0 has no identity",
                          attr="axes")
    return TensorType(d, tuple(n for i, n in enumerate(shape) if i not in axes))


def _flag(attrs: Attrs, name: str, op: str) -> bool:
    v = attrs[name]
    if isinstance(v, bool) or v not in (0, 1):
        raise OpTypeError(f"{op}: {name} is 0 or 1 (transpose that operand or not), got {v!r}",
                          attr=name)
    return bool(v)


def _swap(t: TensorType) -> TensorType:
    return t.with_shape(t.shape[:-2] + (t.shape[-1], t.shape[-2]))


def _product(ins: Sequence[TensorType], attrs: Attrs, op: str) -> TensorType:
    """The type of op(a) @ op(b), by the core matmul's own rule."""
    if len(ins) < 2:
        raise OpTypeError(f"{op} needs two operands a and b, got {len(ins)}")
    ta, tb = _flag(attrs, "ta", op), _flag(attrs, "tb", op)
    a, b = ins[0], ins[1]
    a = _swap(a) if ta and a.rank >= 2 else a
    b = _swap(b) if tb and b.rank >= 2 else b
    try:
        return OPS["matmul"].infer([a, b], {}, None)
    except OpTypeError as e:
        raise OpTypeError(f"{op} (ta={int(ta)}, tb={int(tb)}): {e.message}",
                          operand=e.operand) from None


def _infer_matmul_t(ins: Sequence[TensorType], attrs: Attrs,
                    written: TensorType | None) -> TensorType:
    return _product(ins, attrs, "matmul_t")


def _infer_matmul_epi(ins: Sequence[TensorType], attrs: Attrs,
                      written: TensorType | None) -> TensorType:
    p = _product(ins, attrs, "matmul_epi")
    _to_result(ins, p.shape, "matmul_epi", first=2)
    d = check_body(attrs["body"], [p.dtype] + [x.dtype for x in ins[2:]], p.dtype,
                   "matmul_epi body")
    return p.with_dtype(d)


# ---------------------------------------------------------------- numpy semantics


def _maybe_t(x: np.ndarray, flag: int) -> np.ndarray:
    # A contiguous copy, as the core transpose makes: results match the unfused program bitwise.
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)) if flag else x


def _impl_map(a: list[np.ndarray], attrs: Attrs, t: TensorType) -> np.ndarray:
    return np.broadcast_to(eval_body(attrs["body"], a, t.dtype, t.shape), t.shape).copy()


def _impl_map_reduce(a: list[np.ndarray], attrs: Attrs, t: TensorType) -> np.ndarray:
    shape = np.broadcast_shapes(*(x.shape for x in a))
    values = np.broadcast_to(eval_body(attrs["body"], a, None, shape), shape).copy()
    return OPS[attrs["reduce"]].impl([values], {"axes": attrs["axes"]}, t)


def _impl_matmul_t(a: list[np.ndarray], attrs: Attrs, t: TensorType) -> np.ndarray:
    return np.matmul(_maybe_t(a[0], attrs["ta"]), _maybe_t(a[1], attrs["tb"]))


def _impl_matmul_epi(a: list[np.ndarray], attrs: Attrs, t: TensorType) -> np.ndarray:
    p = _impl_matmul_t(a, attrs, t)
    values = eval_body(attrs["body"], [p] + a[2:], DType.of(p.dtype), p.shape)
    return np.broadcast_to(values, p.shape).copy()


_FUSED = frozenset({"fused", "differentiable"})

register(OpDef(
    "map", "fused", None, _infer_map, _impl_map, attrs=(("body", BODY),),
    traits=_FUSED | {"written_type"},
    doc="an elementwise kernel: `map %x, %y, body=add(mul($0, $1), 0.5) : f32[4,8]`; $i is the "
        "i-th operand's element, each operand broadcasts to the written shape (numpy's rule); "
        "the body's dtype is the written dtype"))
register(OpDef(
    "map_reduce", "fused", None, _infer_map_reduce, _impl_map_reduce,
    attrs=(("body", BODY), ("reduce", REDUCER), ("axes", INTS)), traits=_FUSED,
    doc="a reduction (sum, max or min over axes) of a body: `map_reduce %x, %y, "
        "body=mul($0, $1), reduce=sum, axes=[1] : f32[128]`; the operands broadcast together "
        "(numpy's rule) to the domain that the axes index"))
register(OpDef(
    "matmul_t", "layout", 2, _infer_matmul_t, _impl_matmul_t,
    attrs=(("ta", INT), ("tb", INT)), traits=frozenset({"layout", "differentiable"}),
    doc="op(a) @ op(b), op swapping the last two axes where ta / tb is 1: "
        "`matmul_t %a, %b, ta=1, tb=0 : f32[64,32]`"))
register(OpDef(
    "matmul_epi", "fused", None, _infer_matmul_epi, _impl_matmul_epi,
    attrs=(("ta", INT), ("tb", INT), ("body", BODY)), traits=_FUSED,
    doc="a matmul_t with an elementwise epilogue: `matmul_epi %a, %b, %bias, ta=0, tb=0, "
        "body=relu(add($0, $1)) : f32[128,10]`; $0 is the product's element, $1.. the extra "
        "operands', which broadcast to the product's shape (numpy's rule)"))


# ---------------------------------------------------------------- expansion into core ops

Value = tuple[str, TensorType]


class _Emitter:
    """Core statements for one fused statement, with fresh names and shared equal values."""

    def __init__(self, target: str, taken: set[str]):
        self.target = target
        self.taken = taken
        self.stmts: list[Stmt] = []
        self.memo: dict[tuple, str] = {}
        self.k = 0

    def fresh(self) -> str:
        while True:
            name = f"{self.target}.{self.k}"
            self.k += 1
            if name not in self.taken:
                self.taken.add(name)
                return name

    def emit(self, op: str, operands: tuple[str, ...], attrs: tuple, t: TensorType) -> Value:
        key = (op, operands, repr(attrs), t)  # repr: keeps 0.0 and -0.0 apart, nan with nan
        if key not in self.memo:
            self.memo[key] = name = self.fresh()
            self.stmts.append(Stmt((name,), op, operands, attrs, (t,)))
        return self.memo[key], t

    def broadcast(self, v: Value, shape: tuple[int, ...]) -> Value:
        if v[1].shape == shape:
            return v
        return self.emit("broadcast", (v[0],), (), v[1].with_shape(shape))

    def body(self, body: Any, inputs: list[Value], shape: tuple[int, ...],
             expected: DType | None) -> Value:
        """The body's core ops over `inputs`, every value at `shape`."""
        used = body_args(body)
        args = [self.broadcast(v, shape) if i in used else v for i, v in enumerate(inputs)]

        def lit(node: Any, d: DType) -> Value:
            return self.emit("const", (), (("value", lit_value(node, d)),), TensorType(d, shape))

        def app(node: Any, values: list[Value]) -> Value:
            t = OPS[node.op].infer([v[1] for v in values], {}, None)
            return self.emit(node.op, tuple(v[0] for v in values), (), t)

        return fold(body, args, lambda v: v[1].dtype, lit, app, expected)

    def matmul(self, a: Value, b: Value, ta: int, tb: int) -> Value:
        def op(v: Value, flag: int) -> Value:
            if not flag:
                return v
            perm = tuple(range(v[1].rank - 2)) + (v[1].rank - 1, v[1].rank - 2)
            return self.emit("transpose", (v[0],), (("perm", perm),), _swap(v[1]))

        a, b = op(a, ta), op(b, tb)
        return self.emit("matmul", (a[0], b[0]), (), OPS["matmul"].infer([a[1], b[1]], {}, None))

    def finish(self, v: Value) -> list[Stmt]:
        """Name the final value after the fused statement's result."""
        if self.stmts and self.stmts[-1].results[0] == v[0]:
            last = self.stmts.pop()
            self.stmts.append(Stmt((self.target,), last.op, last.operands, last.attrs, last.types))
        else:  # the result is an input or an earlier value: a same-shape broadcast copies it
            self.stmts.append(Stmt((self.target,), "broadcast", (v[0],), (), (v[1],)))
        return self.stmts


def _unfuse_map(em: _Emitter, s: Stmt, ins: list[Value]) -> Value:
    return em.body(s.attr["body"], ins, s.type.shape, s.type.dtype)


def _unfuse_map_reduce(em: _Emitter, s: Stmt, ins: list[Value]) -> Value:
    v = em.body(s.attr["body"], ins, domain([t for _, t in ins]), None)
    return em.emit(s.attr["reduce"], (v[0],), (("axes", tuple(s.attr["axes"])),), s.type)


def _unfuse_matmul_t(em: _Emitter, s: Stmt, ins: list[Value]) -> Value:
    return em.matmul(ins[0], ins[1], s.attr["ta"], s.attr["tb"])


def _unfuse_matmul_epi(em: _Emitter, s: Stmt, ins: list[Value]) -> Value:
    p = em.matmul(ins[0], ins[1], s.attr["ta"], s.attr["tb"])
    return em.body(s.attr["body"], [p] + ins[2:], p[1].shape, p[1].dtype)


# op name -> expansion into core ops; a later fused op adds its entry here.
EXPANSIONS: dict[str, Callable[[_Emitter, Stmt, list[Value]], Value]] = {
    "map": _unfuse_map,
    "map_reduce": _unfuse_map_reduce,
    "matmul_t": _unfuse_matmul_t,
    "matmul_epi": _unfuse_matmul_epi,
}


def unfuse(stmt: Stmt, types: Mapping[str, TensorType], taken: set[str] | None = None
           ) -> list[Stmt]:
    """Core statements computing what a fused statement of a verified function computes.

    `types` gives the operands' types; new names (`%r.0`, `%r.1`, ...) avoid `types`' keys and
    `taken`, which is updated. The last statement defines the fused statement's result. Any
    other statement comes back unchanged, as a one-element list.
    """
    expand = EXPANSIONS.get(stmt.op)
    if expand is None:
        return [stmt]
    taken = taken if taken is not None else set()
    taken.update(types, stmt.results, stmt.operands)
    em = _Emitter(stmt.results[0], taken)
    return em.finish(expand(em, stmt, [(o, types[o]) for o in stmt.operands]))


Selector = Callable[[Stmt, Mapping[str, TensorType]], bool]


def unfuse_function(f: Function, only: Selector | None = None) -> Function:
    """The function with every fused statement expanded into core ops (with `only`, those of
    them for which `only(statement, types)` holds; the function itself if there are none)."""
    types = f.types()
    if only is not None and not any(only(s, types) for s in f.body):
        return f
    taken = set(types)
    body = [t for s in f.body
            for t in (unfuse(s, types, taken) if only is None or only(s, types) else [s])]
    return replace(f, body=tuple(body))


def unfuse_module(m: Module, only: Selector | None = None) -> Module:
    """The module with the fused statements of every function expanded into core ops (`only`:
    as for unfuse_function)."""
    return m.replace([unfuse_function(it, only) if isinstance(it, Function) else it
                      for it in m.items])
