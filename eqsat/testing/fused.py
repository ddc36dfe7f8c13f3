"""Generators for the fused-kernel and layout ops (`map`, `map_reduce`, `matmul_epi`,
`matmul_t`), with random well-typed scalar bodies.

Body ops are the allowed ops that may appear in a body (all body ops when none is allowed), so
a function drawn over, say, the differentiable ops has only those inside its kernels too.
"""

from __future__ import annotations

import functools
import itertools

from hypothesis import strategies as st

from eqsat.ir.ops import OPS, OpTypeError, broadcastable, ops_in
from eqsat.ir.scalar_expr import App, Arg, Expr, Lit, body_op_names, check_body
from eqsat.ir.types import DType, TensorType

from .builder import Builder, literal

MAX_BODY_DEPTH = 3


@functools.cache
def _signatures(op: str) -> tuple[tuple[tuple[DType, ...], DType], ...]:
    """Every (operand dtypes, result dtype) the op's type rule accepts on scalars."""
    out = []
    for ins in itertools.product(tuple(DType), repeat=OPS[op].arity or 0):
        try:
            out.append((ins, OPS[op].infer([TensorType(d, ()) for d in ins], {}, None).dtype))
        except OpTypeError:
            pass
    return tuple(out)


def body(b: Builder, in_dtypes: list[DType], want: DType | None,
         depth: int = MAX_BODY_DEPTH) -> Expr | None:
    """A random body over `$0..` of `in_dtypes` computing `want` (any dtype when None)."""
    ops = sorted(body_op_names() & b.ops) or sorted(body_op_names())
    args = [i for i, d in enumerate(in_dtypes) if want is None or d == want]
    if depth == 0 or (args and b.draw(st.integers(0, 2)) == 0):
        if args:
            return Arg(b.recent(args))
        return Lit(b.draw(literal(want))) if want is not None else None
    reachable = set(in_dtypes)
    choices = [(op, ins) for op in ops for ins, out in _signatures(op)
               if (want is None or out == want) and any(d in reachable for d in ins)]
    if not choices:
        return Arg(b.recent(args)) if args else None
    op, ins = b.draw(st.sampled_from(choices))
    parts = []
    for d in ins:
        # An operand of a dtype no input has can still be a literal beside an input.
        part = body(b, in_dtypes, d, depth - 1) if d in reachable else Lit(b.draw(literal(d)))
        if part is None:
            return None
        parts.append(part)
    return App(op, tuple(parts))


def _typed_body(b: Builder, in_dtypes: list[DType], want: DType | None) -> tuple[Expr, DType]:
    """A body that type-checks, and its dtype; falls back to `$0` when a drawn one does not."""
    e = body(b, in_dtypes, want)
    if e is not None:
        try:
            return e, check_body(e, in_dtypes, want)
        except OpTypeError:
            pass
    return Arg(0), in_dtypes[0]


def _extras(b: Builder, shape: tuple[int, ...], most: int) -> list[str]:
    """Up to `most` values broadcasting to `shape`: existing ones, or made to fit."""
    out = []
    for _ in range(b.draw(st.integers(0, most))):
        fits = b.values(lambda t: broadcastable(t.shape, shape))
        if fits and b.draw(st.booleans()):
            out.append(b.recent(fits))
            continue
        t = b.new_type(min_rank=len(shape), max_rank=len(shape)).with_shape(shape)
        name = b.operand(t)
        if name is not None:
            out.append(name)
    return out


def _bools_allowed(b: Builder) -> bool:
    """Whether a drawn value may be bool: it is one of the dtypes asked for, or a compare op
    is allowed (its masks are the one exception `functions()` documents)."""
    return DType.bool in b.dtypes or bool(ops_in("compare") & b.ops)


def _map(b: Builder, op: str) -> str | None:
    x = b.value()
    if x is None:
        return None
    shape = b.env[x].shape
    operands = [x] + _extras(b, shape, 2)
    e, d = _typed_body(b, [b.env[o].dtype for o in operands], b.env[x].dtype)
    t = TensorType(d, shape)
    attrs = {"body": e}
    if b.infer(op, [b.env[o] for o in operands], attrs, t) is None:
        return None
    return b.emit(op, tuple(operands), attrs, t)


def _map_reduce(b: Builder, op: str) -> str | None:
    x = b.value(lambda t: t.rank >= 1, min_rank=1)
    if x is None:
        return None
    shape = b.env[x].shape
    operands = [x] + _extras(b, shape, 2)
    ins = [b.env[o] for o in operands]
    e, d = _typed_body(b, [t.dtype for t in ins], None)
    if d is DType.bool and not _bools_allowed(b):  # a compare in the body: a mask nobody asked for
        e, d = _typed_body(b, [t.dtype for t in ins], ins[0].dtype)
    reducers = sorted(ops_in("reduce") & b.ops) or sorted(ops_in("reduce"))
    axes = tuple(b.draw(st.lists(st.integers(0, len(shape) - 1), unique=True,
                                 min_size=1, max_size=len(shape))))
    attrs = {"body": e, "reduce": b.draw(st.sampled_from(reducers)), "axes": axes}
    t = b.infer(op, ins, attrs)
    if t is None and d is DType.bool:  # sum needs a numeric body
        attrs["reduce"] = "max"
        t = b.infer(op, ins, attrs)
    return None if t is None else b.emit(op, tuple(operands), attrs, t)


def _product(b: Builder, op: str, attrs: dict) -> tuple[str, str] | None:
    """Operands a, b of `op(a) @ op(b)` for the flags in `attrs`."""

    def swap(t: TensorType) -> TensorType:
        return t.with_shape(t.shape[:-2] + (t.shape[-1], t.shape[-2]))

    a = b.value(lambda t: 2 <= t.rank <= 3 and t.dtype.is_numeric, min_rank=2, max_rank=3)
    if a is None:
        return None
    ta = swap(b.env[a]) if attrs["ta"] else b.env[a]
    want = ta.with_shape(ta.shape[:-2] + (ta.shape[-1], b.draw(st.integers(1, b.max_dim))))
    rhs = b.operand(swap(want) if attrs["tb"] else want)
    return None if rhs is None else (a, rhs)


def _matmul_t(b: Builder, op: str) -> str | None:
    attrs = {"ta": b.draw(st.integers(0, 1)), "tb": b.draw(st.integers(0, 1))}
    pair = _product(b, op, attrs)
    if pair is None:
        return None
    t = b.infer(op, [b.env[v] for v in pair], attrs)
    return None if t is None else b.emit(op, pair, attrs, t)


def _matmul_epi(b: Builder, op: str) -> str | None:
    flags = {"ta": b.draw(st.integers(0, 1)), "tb": b.draw(st.integers(0, 1))}
    pair = _product(b, op, flags)
    if pair is None:
        return None
    p = b.infer("matmul_t", [b.env[v] for v in pair], flags)
    if p is None:
        return None
    extras = _extras(b, p.shape, 2)
    e, _ = _typed_body(b, [p.dtype] + [b.env[v].dtype for v in extras], p.dtype)
    attrs = {**flags, "body": e}
    operands = pair + tuple(extras)
    t = b.infer(op, [b.env[v] for v in operands], attrs)
    return None if t is None else b.emit(op, operands, attrs, t)


FUSED = {"map": _map, "map_reduce": _map_reduce, "matmul_epi": _matmul_epi}
LAYOUT = {"matmul_t": _matmul_t}


def _dispatch(table: dict):
    def gen(b: Builder, op: str) -> str | None:
        make = table.get(op)
        return None if make is None else make(b, op)
    gen.covers = frozenset(table)  # type: ignore[attr-defined]  (read by missing_generators)
    gen.__doc__ = f"Draws one of {', '.join(sorted(table))}."
    return gen


fused = _dispatch(FUSED)
layout = _dispatch(LAYOUT)
