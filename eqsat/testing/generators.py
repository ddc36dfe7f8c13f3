"""One generator per op family: each draws one statement of an op of its family.

A generator is `gen(builder, op_name) -> str | None`: it picks operands the op can take (asking
the op table's type inference, so dtype rules are never restated here), emits the statement and
returns its result's name, or returns None when the op cannot be used with what is allowed.
Later work registers generators for its own families in `GENERATORS`; a generator that
covers only some ops of its family lists them in a `covers` attribute.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from eqsat.ir.types import DType, TensorType

from .builder import Builder, literal
from .fused import fused, layout

Generator = Callable[[Builder, str], "str | None"]


def unary(b: Builder, op: str) -> str | None:
    """`op %x`: any value the op accepts."""
    x = b.value(lambda t: b.infer(op, [t]) is not None)
    if x is None:
        return None
    return b.emit(op, (x,), {}, b.infer(op, [b.env[x]]))


def binary(b: Builder, op: str) -> str | None:
    """`op %x, %y` on two values of one type (the same value twice when no other fits)."""
    x = b.value(lambda t: b.infer(op, [t, t]) is not None)
    if x is None:
        return None
    t = b.env[x]
    y = b.operand(t) or x
    operands = (y, x) if b.draw(st.booleans()) else (x, y)
    return b.emit(op, operands, {}, b.infer(op, [t, t]))


def select(b: Builder, op: str) -> str | None:
    """`select %c, %x, %y` with a bool condition of the branches' shape."""
    x = b.value()
    if x is None:
        return None
    t = b.env[x]
    y = b.operand(t) or x
    c = b.operand(t.with_dtype(DType.bool))
    if c is None:
        return None
    return b.emit(op, (c, x, y), {}, b.infer(op, [b.env[c], t, t]))


def const(b: Builder, op: str) -> str | None:
    """`const v : T`, often of an existing value's shape so that later ops combine them."""
    existing = b.values()
    if existing and b.draw(st.booleans()):
        shape = b.env[b.recent(existing)].shape
        t = TensorType(b.draw(st.sampled_from(b.dtypes)), shape)
    else:
        t = b.new_type()
    value = b.draw(literal(t.dtype))
    if b.infer(op, [], {"value": value}, t) is None:
        return None
    return b.emit(op, (), {"value": value}, t)


def broadcast(b: Builder, op: str) -> str | None:
    """`broadcast %x : T` to a shape that grows size-1 dims and adds leading ones."""
    x = b.value()
    if x is None:
        return None
    src = b.env[x]
    grown = tuple(b.draw(st.integers(1, b.max_dim)) if d == 1 else d for d in src.shape)
    lead = b.draw(st.integers(0, max(0, b.max_rank - src.rank)))
    t = src.with_shape(b.dims(lead) + grown)
    if b.infer(op, [src], {}, t) is None:
        return None
    return b.emit(op, (x,), {}, t)


def reduce(b: Builder, op: str) -> str | None:
    """`op %x, axes=[...]` over a subset of the axes, in any order."""
    x = b.value(lambda t: b.infer(op, [t], {"axes": tuple(range(t.rank))}) is not None,
                min_rank=1)
    if x is None:
        return None
    src = b.env[x]
    axes = tuple(b.draw(st.lists(st.integers(0, src.rank - 1), unique=True, max_size=src.rank))
                 if src.rank else [])
    t = b.infer(op, [src], {"axes": axes})
    if t is None:  # e.g. max over an axis of length 0
        return None
    return b.emit(op, (x,), {"axes": axes}, t)


def matmul(b: Builder, op: str) -> str | None:
    """`matmul %a, %b` of rank 2 or 3 (equal batch dims); `%b` made to fit `%a`."""

    def square(t: TensorType) -> TensorType:
        return t.with_shape(t.shape[:-2] + (t.shape[-1], t.shape[-2]))

    a = b.value(lambda t: 2 <= t.rank <= 3 and b.infer(op, [t, square(t)]) is not None,
                min_rank=2, max_rank=3)
    if a is None:
        return None
    ta = b.env[a]
    n = b.draw(st.integers(1, b.max_dim))
    rhs = b.operand(ta.with_shape(ta.shape[:-2] + (ta.shape[-1], n)))
    if rhs is None:
        rhs = b.operand(square(ta)) or (a if ta.shape[-1] == ta.shape[-2] else None)
    if rhs is None:
        return None
    return b.emit(op, (a, rhs), {}, b.infer(op, [ta, b.env[rhs]]))


def transpose(b: Builder, op: str) -> str | None:
    """`transpose %x, perm=[...]`, mostly of rank >= 2."""
    x = b.value(lambda t: t.rank >= 2, min_rank=2) if b.draw(st.integers(0, 3)) else b.value()
    if x is None:
        return None
    src = b.env[x]
    perm = tuple(b.draw(st.permutations(range(src.rank))))
    return b.emit(op, (x,), {"perm": perm}, b.infer(op, [src], {"perm": perm}))


def reshape(b: Builder, op: str) -> str | None:
    """`reshape %x : T` to another shape with the same element count."""
    x = b.value()
    if x is None:
        return None
    src = b.env[x]
    t = src.with_shape(_shape_of_size(b, src.size))
    if b.infer(op, [src], {}, t) is None:
        return None
    return b.emit(op, (x,), {}, t)


def slice_(b: Builder, op: str) -> str | None:
    """`slice %x, start=[...], stop=[...]`, non-empty on every axis."""
    x = b.value()
    if x is None:
        return None
    src = b.env[x]
    start, stop = [], []
    for d in src.shape:
        s = b.draw(st.integers(0, d - 1))
        start.append(s)
        stop.append(b.draw(st.integers(s + 1, d)))
    attrs = {"start": tuple(start), "stop": tuple(stop)}
    return b.emit(op, (x,), attrs, b.infer(op, [src], attrs))


def concat(b: Builder, op: str) -> str | None:
    """`concat %x, %y, ..., axis=k` of two or three values differing only along `k`."""
    x = b.value(lambda t: t.rank >= 1, min_rank=1)
    if x is None:
        return None
    src = b.env[x]
    axis = b.draw(st.integers(0, src.rank - 1))
    operands = [x]
    for _ in range(b.draw(st.integers(1, 2))):
        dim = b.draw(st.integers(1, b.max_dim))
        t = src.with_shape(src.shape[:axis] + (dim,) + src.shape[axis + 1:])
        operands.append(b.operand(t) or x)
    operands = b.draw(st.permutations(operands))
    attrs = {"axis": axis}
    return b.emit(op, tuple(operands), attrs, b.infer(op, [b.env[o] for o in operands], attrs))


def cast(b: Builder, op: str) -> str | None:
    """`cast %x : T` to any allowed dtype (its own included)."""
    x = b.value()
    if x is None:
        return None
    t = b.env[x].with_dtype(b.draw(st.sampled_from(b.dtypes)))
    if b.infer(op, [b.env[x]], {}, t) is None:
        return None
    return b.emit(op, (x,), {}, t)


def call(b: Builder, op: str) -> str | None:
    """`%r... = call @f(args)` of an earlier function, its arguments made to fit."""
    if not b.callees:
        return None
    f = b.draw(st.sampled_from(b.callees))
    args = []
    for p in f.params:
        arg = b.operand(p.type)
        if arg is None:
            return None
        args.append(arg)
    return b.emit(op, tuple(args), {"callee": f.name}, f.result_types)


def _shape_of_size(b: Builder, size: int) -> tuple[int, ...]:
    """A shape of rank <= max_rank with `size` elements: prime factors dealt out to the dims."""
    factors, n, p = [], size, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    rank = b.draw(st.integers(1 if factors else 0, b.max_rank)) if b.max_rank else 0
    if rank == 0:
        return () if size == 1 else (size,)
    dims = [1] * rank
    for f in factors:
        dims[b.draw(st.integers(0, rank - 1))] *= f
    return tuple(dims)


GENERATORS: dict[str, Generator] = {
    "unary": unary,
    "binary": binary,
    "compare": binary,
    "select": select,
    "const": const,
    "broadcast": broadcast,
    "reduce": reduce,
    "matmul": matmul,
    "transpose": transpose,
    "reshape": reshape,
    "slice": slice_,
    "concat": concat,
    "cast": cast,
    "call": call,
    "fused": fused,
    "layout": layout,
}
