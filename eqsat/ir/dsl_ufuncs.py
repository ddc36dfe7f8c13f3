"""numpy's ufuncs composed of IR ops: np.square sign exp2 log2 log10, the classifications
isnan isinf isfinite, the roundings floor ceil trunc and the NaN-ignoring fmax fmin.

A ufunc applied to a traced value comes to Tracer's `__array_ufunc__`, which looks its name up
in UFUNC_HANDLERS; the ones here have no IR op of their own and trace as a few core ops with
numpy's dtype rules: a float function of an integer tensor is computed in f64, a bool tensor
(which numpy computes in int8 or float16) is refused at the user's line. The float functions
that take care to be accurate (np.log1p, np.hypot, ...) are in dsl_composites.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import dsl_array
from .dsl_trace import (as_tracer, binary, cast_to, constant, lift, trace_error, true_divide,
                        unary)
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


def _everywhere(x: Tracer, value: bool) -> Tracer:
    """A bool constant of x's shape: what a classification gives for an integer or bool x."""
    return constant(x.trace, value, x.type.with_dtype(DType.bool))


def isnan(x: Any) -> Tracer:
    """`np.isnan`: `x != x` (only NaN differs from itself); False for integers and bools."""
    x = as_tracer(x, "isnan")
    return x != x if x.dtype.is_float else _everywhere(x, False)


def isinf(x: Any) -> Tracer:
    """`np.isinf`: `|x| == inf`; False for integers and bools."""
    x = as_tracer(x, "isinf")
    return abs(x) == math.inf if x.dtype.is_float else _everywhere(x, False)


def isfinite(x: Any) -> Tracer:
    """`np.isfinite`: `|x| < inf` (False for NaN too); True for integers and bools."""
    x = as_tracer(x, "isfinite")
    return abs(x) < math.inf if x.dtype.is_float else _everywhere(x, True)


# per float dtype: the integer dtype a cast truncates it into, and the magnitude from which on
# every float of the dtype is an integer already (2^31 > 2^23, 2^63 > 2^52) that may not fit
_TRUNCATE = {DType.f32: (DType.i32, 2.0 ** 31), DType.f64: (DType.i64, 2.0 ** 63)}


def _rounding(name: str, adjust: Callable[[Tracer, Tracer], Tracer]) -> Callable[[Any], Tracer]:
    def apply(x: Any) -> Tracer:
        x = as_tracer(x, name)
        if not x.dtype.is_float:
            return x  # numpy 2 rounds integers and bools to themselves, in their dtype
        int_dtype, bound = _TRUNCATE[x.dtype]
        small = abs(x) < bound  # False for inf and NaN, which pass through as they are
        t = cast_to(cast_to(dsl_array.where(small, x, 0.0), int_dtype), x.dtype)
        t = dsl_array.where(t == 0, x * 0.0, t)  # a zero takes x's sign: trunc(-0.5) is -0.0
        return dsl_array.where(small, adjust(x, t), x)

    apply.__name__ = name
    apply.__doc__ = (f"`np.{name}` of a float tensor through a cast to an integer dtype and back "
                     f"(magnitudes from 2^31 (f32) or 2^63 (f64) on, inf and NaN are x itself; "
                     f"its gradient is 0 below them); an integer or bool tensor is itself.")
    return apply


def _nan_ignoring(name: str, op: str) -> Callable[[Any, Any], Tracer]:
    def apply(x: Any, y: Any) -> Tracer:
        a, b = lift(name, [x, y])
        if a.dtype is DType.bool:  # numpy's bool loop: or for fmax, and for fmin
            return dsl_array.where(a, a, b) if op == "maximum" else dsl_array.where(a, b, a)
        m = binary(op, a, b)
        if not a.dtype.is_float:
            return m
        return dsl_array.where(a != a, b, dsl_array.where(b != b, a, m))

    apply.__name__ = name
    apply.__doc__ = (f"`np.{name}`: `{op}`, but where one operand is NaN the other one (NaN "
                     f"only where both are); a tie of zeros gives the second, as `{op}`.")
    return apply


UFUNC_HANDLERS.update(
    square=square, sign=sign, exp2=exp2, log2=_log_base(2.0, "log2"),
    log10=_log_base(10.0, "log10"), isnan=isnan, isinf=isinf, isfinite=isfinite,
    trunc=_rounding("trunc", lambda x, t: t),
    floor=_rounding("floor", lambda x, t: dsl_array.where(t > x, t - 1.0, t)),
    ceil=_rounding("ceil", lambda x, t: dsl_array.where(t < x, t + 1.0, t)),
    fmax=_nan_ignoring("fmax", "maximum"), fmin=_nan_ignoring("fmin", "minimum"),
)
