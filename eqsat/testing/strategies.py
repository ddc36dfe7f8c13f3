"""Hypothesis strategies for random well-typed eqsat programs and their inputs.

`functions()` draws a function that `eqsat.ir.verify` accepts: it picks an op family, then an op,
then operands that can satisfy it, building operands on demand. Everything is driven by the op
table and `GENERATORS`, so a new op is covered as soon as its family has a generator.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra import numpy as hnp

from eqsat.ir.dsl import TracedFunction
from eqsat.ir.module import Function, Module
from eqsat.ir.ops import OPS
from eqsat.ir.samples import inward as _inward
from eqsat.ir.types import DType, TensorType

from .builder import Builder
from .generators import GENERATORS

ALL_DTYPES: tuple[DType, ...] = tuple(DType)

# Each drawn op gets this many tries to find operands before another op is drawn.
_TRIES_PER_STATEMENT = 3


def has_generator(op: str) -> bool:
    """Whether `GENERATORS` can draw statements of `op` (its family's generator covers it)."""
    gen = GENERATORS.get(OPS[op].family)
    return gen is not None and op in getattr(gen, "covers", (op,))


def missing_generators() -> set[str]:
    """Names of ops in the table that no generator in `GENERATORS` draws."""
    return {name for name in OPS if not has_generator(name)}


def default_ops(include_call: bool = False) -> frozenset[str]:
    """Every op of the table that has a generator (`call` only when asked for)."""
    return frozenset(name for name in OPS if has_generator(name)
                     and (include_call or name != "call"))


def types(dtypes: Sequence[DType] | None = None, max_rank: int = 3,
          max_dim: int = 5) -> st.SearchStrategy[TensorType]:
    """Tensor types: a dtype from `dtypes` (default all five), rank 0..max_rank, dims 1..max_dim."""
    dtypes = _check_dtypes(dtypes)
    shapes = st.integers(0, max_rank).flatmap(
        lambda r: st.lists(st.integers(1, max_dim), min_size=r, max_size=r))
    return st.builds(lambda d, s: TensorType(d, tuple(s)), st.sampled_from(dtypes), shapes)


def functions(ops: Iterable[str] | None = None, dtypes: Sequence[DType] | None = None,
              max_stmts: int = 8, max_params: int = 3,
              name: str = "f") -> st.SearchStrategy[Function]:
    """Random functions that verify, over `ops` (default: every generated op but `call`).

    New parameters, constants and casts have dtypes from `dtypes` (default all five); the only
    other values are bool masks of compare ops, when `ops` has one. Every statement uses an op
    of `ops` (ops no generator draws are left out); about `max_stmts` statements are drawn
    (operands built on demand may add a few). It returns one or two values, the last
    statement's first among them. Without a compare op in `ops` (and bool in `dtypes`),
    `select` has no condition to use and is not drawn.
    """
    return _functions(_check_ops(ops, include_call=False), _check_dtypes(dtypes), max_stmts,
                      _check_params(max_params), name, ())


def modules(max_functions: int = 3, **kw) -> st.SearchStrategy[Module]:
    """Random modules of 1..max_functions functions `f0, f1, ...`; later ones may call earlier.

    Keyword arguments are those of `functions()`; by default `ops` includes `call`, and
    `name` is the prefix of the function names.
    """
    if max_functions < 1:
        raise InvalidArgument(f"max_functions must be at least 1, got {max_functions}")
    ops = _check_ops(kw.pop("ops", None), include_call=True)
    dtypes = _check_dtypes(kw.pop("dtypes", None))
    max_stmts = kw.pop("max_stmts", 8)
    max_params = _check_params(kw.pop("max_params", 3))
    prefix = kw.pop("name", "f")
    if kw:
        raise InvalidArgument(f"modules() got unexpected arguments {sorted(kw)}")

    @st.composite
    def draw_module(draw):
        count = draw(st.integers(1, max_functions))
        funcs: list[Function] = []
        for i in range(count):
            funcs.append(draw(_functions(ops, dtypes, max_stmts, max_params, f"{prefix}{i}",
                                         tuple(funcs))))
        return Module(*funcs, name="m")

    return draw_module()


def inputs(function: Function, low: float = -3.0,
           high: float = 3.0) -> st.SearchStrategy[tuple[np.ndarray, ...]]:
    """Arrays of exactly `function`'s parameter types: floats finite in [low, high], ints in
    [floor(low), ceil(high)], bools; ready for `interpret`. A traced `@eqsat.function` stands
    for its IR function."""
    if isinstance(function, TracedFunction):
        function = function.module[function.name]
    if not isinstance(function, Function):
        raise InvalidArgument(f"inputs() takes a Function (module['f']) or an @eqsat.function, "
                              f"not {type(function).__name__}")
    if not low <= high:
        raise InvalidArgument(f"inputs() needs low <= high, got {low} and {high}")
    return st.tuples(*(_array(p.type, low, high) for p in function.params))


# ---------------------------------------------------------------- internals


@st.composite
def _functions(draw, ops: frozenset[str], dtypes: tuple[DType, ...], max_stmts: int,
               max_params: int, name: str, callees: tuple[Function, ...]) -> Function:
    b = Builder(draw, ops, dtypes, max_params, callees=callees)
    b.param(b.new_type())
    # A family is drawn first, weighted by the square root of its size, so that big families
    # (unary) neither crowd out the rest nor leave their own ops rarely drawn.
    families = sorted({OPS[op].family for op in ops}, key=list(GENERATORS).index)
    by_family = {f: sorted(op for op in ops if OPS[op].family == f) for f in families}
    weights = [math.sqrt(len(by_family[f])) for f in families]
    target = draw(st.integers(1, max(1, max_stmts)))
    # Ops are chosen by a seeded Random: hypothesis's own draws repeat early choices so often
    # that the last ops of a family were almost never drawn; the seed still replays exactly.
    pick = random.Random(draw(st.integers(0, 2**32 - 1)))
    attempts = 0
    while len(b.body) < target and attempts < _TRIES_PER_STATEMENT * target:
        attempts += 1
        family = pick.choices(families, weights)[0]
        op = pick.choice(by_family[family])
        GENERATORS[family](b, op)
    return b.finish(name)


def _check_ops(ops: Iterable[str] | None, include_call: bool) -> frozenset[str]:
    if ops is None:
        return default_ops(include_call)
    ops = frozenset([ops] if isinstance(ops, str) else ops)
    unknown = sorted(op for op in ops if op not in OPS)
    if unknown:
        raise InvalidArgument(f"unknown ops {unknown}")
    # Ops nobody can draw yet are left out (missing_generators() names them), so op sets
    # computed from traits keep working when a new op family arrives.
    drawable = frozenset(op for op in ops if has_generator(op))
    if not drawable:
        raise InvalidArgument(f"no generator draws any of {sorted(ops)}; register one in "
                              f"eqsat.testing.GENERATORS")
    return drawable


def _check_dtypes(dtypes: Sequence[DType] | None) -> tuple[DType, ...]:
    if dtypes is None:
        return ALL_DTYPES
    dtypes = tuple(dict.fromkeys([dtypes] if isinstance(dtypes, DType) else dtypes))
    if not dtypes or not all(isinstance(d, DType) for d in dtypes):
        raise InvalidArgument(f"dtypes must be a non-empty sequence of DType, got {dtypes!r}")
    return dtypes


def _check_params(max_params: int) -> int:
    if max_params < 1:
        raise InvalidArgument(f"max_params must be at least 1, got {max_params}")
    return max_params


def _array(t: TensorType, low: float, high: float) -> st.SearchStrategy[np.ndarray]:
    if t.dtype is DType.bool:
        elements = st.booleans()
    elif t.dtype.is_int:
        elements = st.integers(math.floor(low), math.ceil(high))
    else:
        width = 8 * t.dtype.itemsize
        lo, hi = _inward(low, high, t.dtype.np)
        elements = st.floats(lo, hi, width=width, allow_nan=False, allow_infinity=False)
    return hnp.arrays(t.dtype.np, t.shape, elements=elements)


