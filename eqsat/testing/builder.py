"""The function under construction that op-family generators draw statements into.

A generator asks the builder for operands (`value`, `operand`), which reuses values defined so
far or makes new ones on demand (a parameter, a constant, a broadcast, reshape, cast, slice or
transpose of an existing value), and then `emit`s its statement. Every helper statement uses an
op the caller allowed, so a function drawn over a restricted op set contains only those ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hypothesis import strategies as st

from eqsat.ir.module import Function, Param, Stmt
from eqsat.ir.ops import OPS, OpTypeError, broadcastable, ops_in
from eqsat.ir.types import DType, TensorType

Accept = Callable[[TensorType], bool]

PARAM_NAMES = ("x", "y", "w", "b", "in.0", "h_1")
# How statement results are spelled; drawing one per function exercises the name grammar.
RESULT_STYLES = ("{}", "v{}", "t.{}", "_{}")
FLOAT_LITERALS = (0.0, 1.0, -1.0, 0.5, 2.0, -0.25)


def literal(dtype: DType) -> st.SearchStrategy[Any]:
    """Constant values for `const` of `dtype`: small and finite, so programs stay tame."""
    if dtype is DType.bool:
        return st.booleans()
    if dtype.is_int:
        return st.integers(-8, 8)
    return st.one_of(st.sampled_from(FLOAT_LITERALS), st.floats(-4.0, 4.0))


class Builder:
    """A function being drawn: its parameters, statements and the type of every value so far.

    `draw` is hypothesis's draw function; `ops` the op names statements may use; `dtypes` the
    dtypes new parameters, constants and casts may have; `callees` the functions `call` may use.
    """

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any], ops: Iterable[str],
                 dtypes: Sequence[DType], max_params: int = 3, max_rank: int = 3,
                 max_dim: int = 5, callees: Sequence[Function] = ()):
        self.draw = draw
        self.ops = frozenset(ops)
        self.dtypes = tuple(dtypes)
        self.max_params = max_params
        self.max_rank = max_rank
        self.max_dim = max_dim
        self.callees = tuple(callees)
        self.params: list[Param] = []
        self.body: list[Stmt] = []
        self.env: dict[str, TensorType] = {}  # definition order: later values are "recent"
        self.style = draw(st.sampled_from(RESULT_STYLES))
        self._count = 0

    # ---------------------------------------------------------------- types and probing

    def infer(self, op: str, ins: Sequence[TensorType], attrs: dict[str, Any] | None = None,
              written: TensorType | None = None) -> TensorType | None:
        """The type `op` gives these operands, or None when the op table refuses them."""
        try:
            return OPS[op].infer(list(ins), attrs or {}, written)
        except OpTypeError:
            return None

    def dims(self, rank: int) -> tuple[int, ...]:
        return tuple(self.draw(st.lists(st.integers(1, self.max_dim), min_size=rank,
                                        max_size=rank)))

    def new_type(self, dtypes: Sequence[DType] | None = None, min_rank: int = 0,
                 max_rank: int | None = None) -> TensorType:
        """A fresh small type: dtype from `dtypes` (default: the builder's), dims 1..max_dim."""
        dtype = self.draw(st.sampled_from(tuple(dtypes or self.dtypes)))
        hi = self.max_rank if max_rank is None else max_rank
        rank = self.draw(st.integers(min(min_rank, hi), hi))
        return TensorType(dtype, self.dims(rank))

    # ---------------------------------------------------------------- values

    def values(self, accept: Accept | None = None) -> list[str]:
        """Names of the values defined so far whose type `accept`s, oldest first."""
        return [n for n, t in self.env.items() if accept is None or accept(t)]

    def recent(self, names: Sequence[str]) -> str:
        """One of `names`, shrinking towards the most recent so bodies form chains."""
        return names[-1 - self.draw(st.integers(0, len(names) - 1))]

    def value(self, accept: Accept | None = None, min_rank: int = 0,
              max_rank: int | None = None) -> str | None:
        """A value whose type `accept`s: usually an existing one, else one made on demand."""
        accept = accept or (lambda t: True)
        found = self.values(accept)
        if found and self.draw(st.integers(0, 3)) < 3:
            return self.recent(found)
        for dtype in self.draw(st.permutations(self.dtypes)):
            t = self.new_type((dtype,), min_rank, max_rank)
            if accept(t):
                name = self.operand(t)
                if name is not None:
                    return name
        return self.recent(found) if found else None

    def operand(self, t: TensorType) -> str | None:
        """A value of exactly type `t`: existing, or derived with an allowed op, or a parameter."""
        found = self.values(lambda u: u == t)
        if found and self.draw(st.integers(0, 3)) < 3:
            return self.recent(found)
        makers = self.draw(st.permutations(_MAKERS))
        for make in makers:
            name = make(self, t)
            if name is not None:
                return name
        return self.recent(found) if found else None

    def param(self, t: TensorType) -> str | None:
        """A new parameter of type `t`, if the parameter budget and dtypes allow one."""
        if len(self.params) >= self.max_params or t.dtype not in self.dtypes:
            return None
        i = len(self.params)
        name = PARAM_NAMES[i] if i < len(PARAM_NAMES) else f"p{i}"
        self.params.append(Param(name, t))
        self.env[name] = t
        return name

    def emit(self, op: str, operands: Sequence[str], attrs: dict[str, Any],
             types: TensorType | Sequence[TensorType]) -> str:
        """Append a statement; returns the name of its (first) result."""
        types = (types,) if isinstance(types, TensorType) else tuple(types)
        names = []
        for t in types:
            names.append(self.style.format(self._count))
            self._count += 1
        self.body.append(Stmt(tuple(names), op, tuple(operands), tuple(attrs.items()), types))
        self.env.update(zip(names, types))
        return names[0]

    # ---------------------------------------------------------------- finishing

    def finish(self, name: str) -> Function:
        """The function, returning one or two values, the last statement's first among them."""
        if self.body:
            first = self.body[-1].results[0]
        else:
            first = self.recent(list(self.env))
        returns = [first]
        others = [n for n in self.env if n != first]
        if others and self.draw(st.booleans()):
            returns.append(self.recent(others))
        return Function(name, tuple(self.params), tuple(self.env[r] for r in returns),
                        tuple(self.body), tuple(returns))


# ---------------------------------------------------------------- ways to make an operand


def _from_param(b: Builder, t: TensorType) -> str | None:
    return b.param(t)


def _from_const(b: Builder, t: TensorType) -> str | None:
    if "const" not in b.ops or t.dtype not in b.dtypes:
        return None
    return b.emit("const", (), {"value": b.draw(literal(t.dtype))}, t)


def _derive(b: Builder, op: str, t: TensorType, fits: Accept) -> str | None:
    """The recent value that `fits` becoming `t` through `op`, if `op` is allowed."""
    if op not in b.ops or t.dtype not in b.dtypes:
        return None
    found = b.values(lambda u: u != t and fits(u))
    return b.recent(found) if found else None


def _from_broadcast(b: Builder, t: TensorType) -> str | None:
    src = _derive(b, "broadcast", t,
                  lambda u: u.dtype == t.dtype and broadcastable(u.shape, t.shape))
    return None if src is None else b.emit("broadcast", (src,), {}, t)


def _from_reshape(b: Builder, t: TensorType) -> str | None:
    src = _derive(b, "reshape", t, lambda u: u.dtype == t.dtype and u.size == t.size)
    return None if src is None else b.emit("reshape", (src,), {}, t)


def _from_cast(b: Builder, t: TensorType) -> str | None:
    src = _derive(b, "cast", t, lambda u: u.shape == t.shape)
    return None if src is None else b.emit("cast", (src,), {}, t)


def _from_slice(b: Builder, t: TensorType) -> str | None:
    src = _derive(b, "slice", t, lambda u: u.dtype == t.dtype and u.rank == t.rank
                  and all(d >= e for d, e in zip(u.shape, t.shape)))
    if src is None:
        return None
    start = tuple(b.draw(st.integers(0, d - e)) for d, e in zip(b.env[src].shape, t.shape))
    stop = tuple(s + e for s, e in zip(start, t.shape))
    return b.emit("slice", (src,), {"start": start, "stop": stop}, t)


def _from_transpose(b: Builder, t: TensorType) -> str | None:
    src = _derive(b, "transpose", t, lambda u: u.dtype == t.dtype
                  and sorted(u.shape) == sorted(t.shape))
    if src is None:
        return None
    free = list(range(t.rank))
    perm = []
    for d in t.shape:  # any source axis of the right length will do
        axis = next(a for a in free if b.env[src].shape[a] == d)
        free.remove(axis)
        perm.append(axis)
    return b.emit("transpose", (src,), {"perm": tuple(perm)}, t)


def _from_compare(b: Builder, t: TensorType) -> str | None:
    """A bool mask from comparing two values of its shape (the usual source of conditions)."""
    compares = sorted(ops_in("compare") & b.ops)
    if t.dtype is not DType.bool or not compares:
        return None
    found = b.values(lambda u: u.shape == t.shape)
    if not found:
        return None
    x = b.recent(found)
    y = b.recent(b.values(lambda u: u == b.env[x]))
    op = b.draw(st.sampled_from(compares))
    return b.emit(op, (x, y), {}, t)


_MAKERS = (_from_param, _from_const, _from_broadcast, _from_reshape, _from_cast, _from_slice,
           _from_transpose, _from_compare)
