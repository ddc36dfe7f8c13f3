"""numpy's ufuncs composed of IR ops (np.square, np.sign, np.exp2, np.log2, np.log10).

A ufunc applied to a traced value comes to Tracer's `__array_ufunc__`, which looks its name up
in UFUNC_HANDLERS; the ones here have no IR op of their own and trace as a few core ops with
numpy's dtype rules: a float function of an integer tensor is computed in f64, a bool tensor
(which numpy computes in int8 or float16) is refused at the user's line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import dsl_array
from .dsl_trace import as_tracer, binary, trace_error, true_divide, unary
from .dsl_tracer import UFUNC_HANDLERS, Tracer
from .types import DType


def numeric(x: Any, what: str) -> Tracer:
    """`x`, a traced value numpy's `what` has a loop for in its own dtype (not bool)."""
    x = as_tracer(x, what)
    if x.dtype is DType.bool:
        raise trace_error(f"{what} of a bool tensor ({x.type}) cannot be traced (numpy has no "
                          f"bool loop, or computes it in int8 or float16, which eqsat lacks); "
                          f"cast first: .astype(eqsat.f32)")
    return x


def floating(x: Any, what: str) -> Tracer:
    """`x` in the float dtype numpy computes `what` in (an integer tensor's in f64)."""
    x = numeric(x, what)
    return x if x.dtype.is_float else dsl_array.cast(x, DType.f64)


def square(x: Any) -> Tracer:
    """`np.square`: x * x, in x's dtype."""
    x = numeric(x, "square")
    return binary("mul", x, x)


def sign(x: Any) -> Tracer:
    """`np.sign`: -1, 0 or 1 in x's dtype; NaN stays NaN and -0.0 gives 0.0, as numpy's."""
    x = numeric(x, "sign")
    zero = dsl_array.where(x == 0, 0, x)
    return dsl_array.where(x > 0, 1, dsl_array.where(x < 0, -1, zero))


def exp2(x: Any) -> Tracer:
    """`np.exp2` as the IR's `pow(2, x)` (within an ulp of numpy's)."""
    return binary("pow", 2.0, floating(x, "exp2"))


def _log_base(base: float, name: str) -> Callable[[Any], Tracer]:
    ln_base = math.log(base)

    def apply(x: Any) -> Tracer:
        # an f32 logarithm is divided in f64 and rounded once: log(x) / ln(base) in f32 is up
        # to 4 ulps from numpy's; in f64 it is within 2 (and exact at most powers of the base)
        t = floating(x, name)
        wide = dsl_array.cast(t, DType.f64)
        return dsl_array.cast(true_divide(unary("log", wide), ln_base), t.dtype)

    apply.__name__ = name
    apply.__doc__ = f"`np.{name}` as log(x) / ln({base:g})."
    return apply


UFUNC_HANDLERS.update(square=square, sign=sign, exp2=exp2, log2=_log_base(2.0, "log2"),
                      log10=_log_base(10.0, "log10"))
