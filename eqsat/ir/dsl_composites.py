"""numpy's float ufuncs that take care to be accurate, composed of IR ops: np.log1p, np.expm1,
np.sinh, np.cosh, np.logaddexp, np.logaddexp2 and np.hypot.

Each one is the classic formula that keeps its accuracy where the naive one cancels or
overflows (Kahan's compensated log1p and expm1, the max-shifted logaddexp, the scaled hypot),
with selects that give numpy's values at 0, -0.0, inf, -inf and NaN. They trace into core ops
only, so AD differentiates them and the backends compile them like any expression. The
formulas must also survive optimization: the built-in rules fold `log(exp(x))` into `x`, which
would undo expm1's compensation, so the logarithm there reads a select of exp's result, which
no rule looks through.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import dsl_array
from .dsl_trace import binary, lift, unary
from .dsl_tracer import UFUNC_HANDLERS, Tracer
from .dsl_ufuncs import floating, numeric
from .types import DType

where = dsl_array.where


def _log1p(x: Tracer) -> Tracer:
    # log(1 + x) - e / u, where e = (u - 1) - x is the rounding error of u = 1 + x (exact: u
    # and 1 are within a factor of 2 where it matters). e / u is NaN only where log(u) is
    # already numpy's value: u = inf (x = inf) or u = 0 (x = -1). Where u is 1, x is the answer
    # (tiny, subnormal, -0.0 keep their bits).
    u = x + 1.0
    e = ((u - 1.0) - x) / u
    log_u = unary("log", u)
    return where(u == 1.0, x, where(e != e, log_u, log_u - e))


def _expm1(x: Tracer) -> Tracer:
    # Kahan's (u - 1) * x / log(u), u = exp(x): the ratio cancels most of u's rounding error.
    # Where u is 1 the answer is x, where u - 1 is -1 (x below about -17 in f32, -37 in f64)
    # it is -1, where u is inf or NaN it is u. There the formula reads u = 2 instead, so that
    # neither its value nor its gradient (which AD computes for both branches of a select)
    # divides 0 by 0 or multiplies inf by 0.
    u = unary("exp", x)
    u_1 = u - 1.0
    ordinary = where(u == 1.0, False, where(u_1 == -1.0, False, u < math.inf))
    safe = where(ordinary, u, 2.0)
    kahan = (safe - 1.0) * (x / unary("log", safe))
    special = where(u == 1.0, x, where(u_1 == -1.0, -1.0, u))
    return where(ordinary, kahan, special)


# per float dtype: a little below log(max), the largest |x| whose exp is finite
_LOG_MAX = {DType.f32: 88.72, DType.f64: 709.78}


def _exp_or_big(x: Tracer) -> tuple[Tracer, Tracer, Tracer]:
    """(|x| < _LOG_MAX, |x| there and 0 elsewhere, exp(|x|) / 2 for the elsewhere): sinh and
    cosh compute from the second, whose exp cannot overflow (an overflowed exp in the branch
    a select drops would still make AD's gradient NaN, as 0 * inf), and take the third
    beyond, as (exp(|x|/2) / 2) * exp(|x|/2), finite up to log(2 * max) (sinh and cosh of 89
    are finite in f32)."""
    a = abs(x)
    small = a < _LOG_MAX[x.dtype]
    w = unary("exp", 0.5 * a)
    return small, where(small, a, 0.0), (0.5 * w) * w


def log1p(x: Any) -> Tracer:
    """`np.log1p`: log(1 + x), accurate for small |x| (Kahan's compensated form)."""
    return _log1p(floating(x, "log1p"))


def expm1(x: Any) -> Tracer:
    """`np.expm1`: exp(x) - 1, accurate for small |x| (Kahan's (u - 1) * x / log(u))."""
    return _expm1(floating(x, "expm1"))


def sinh(x: Any) -> Tracer:
    """`np.sinh` from t = expm1(|x|): (2t - t^2 / (t + 1)) / 2 below |x| = 1, where it keeps
    expm1's accuracy, (t + t / (t + 1)) / 2 above, exp(|x|) / 2 where exp overflows; the sign
    of x goes back on last (-0.0 stays -0.0)."""
    x = floating(x, "sinh")
    small, a, big = _exp_or_big(x)
    t = _expm1(a)
    r = t / (t + 1.0)
    s = where(small, 0.5 * where(a < 1.0, (t + t) - t * r, t + r), big)
    return where(x == 0.0, x, where(x < 0.0, -s, s))


def cosh(x: Any) -> Tracer:
    """`np.cosh`: (u + 1/u) / 2 with u = exp(|x|), exp(|x|) / 2 where u overflows."""
    small, a, big = _exp_or_big(floating(x, "cosh"))
    u = unary("exp", a)
    return where(small, 0.5 * (u + 1.0 / u), big)


def _float_pair(x: Any, y: Any, what: str) -> tuple[Tracer, Tracer]:
    """x and y promoted and broadcast together as numpy does, in the float dtype numpy
    computes `what` in (f64 for integers; bools are refused: numpy takes float16)."""
    a, b = lift(what, [x, y])
    a = numeric(a, what)
    if not a.dtype.is_float:
        a, b = dsl_array.cast(a, DType.f64), dsl_array.cast(b, DType.f64)
    return a, b


def _log_add(what: str, x: Any, y: Any, tail: Callable[[Tracer], Tracer]) -> Tracer:
    # max(a, b) + tail(-|a - b|), as numpy; where a - b is NaN (a NaN operand, or infinities of
    # one sign, whose sum is then the answer) a + b
    a, b = _float_pair(x, y, what)
    d = a - b
    out = binary("maximum", a, b) + tail(-abs(d))
    return where(d != d, a + b, out)


def logaddexp(x: Any, y: Any) -> Tracer:
    """`np.logaddexp`: log(exp(x) + exp(y)) as max(x, y) + log1p(exp(-|x - y|))."""
    return _log_add("logaddexp", x, y, lambda d: _log1p(unary("exp", d)))


def logaddexp2(x: Any, y: Any) -> Tracer:
    """`np.logaddexp2`: log2(2^x + 2^y) as max(x, y) + log1p(2^-|x - y|) / ln 2."""
    return _log_add("logaddexp2", x, y,
                    lambda d: math.log2(math.e) * _log1p(binary("pow", 2.0, d)))


def hypot(x: Any, y: Any) -> Tracer:
    """`np.hypot`: sqrt(x^2 + y^2) without overflow or underflow: an f32 one in f64, where no
    square of an f32 does either, rounded once; an f64 one as m * sqrt(1 + (n/m)^2) with m, n
    the larger and smaller of |x|, |y|. inf where either is infinite, even if the other is NaN
    (C99's rule, numpy's)."""
    a, b = (abs(v) for v in _float_pair(x, y, "hypot"))
    if a.dtype is DType.f32:
        wa, wb = (dsl_array.cast(v, DType.f64) for v in (a, b))
        s = wa * wa + wb * wb
        root = unary("sqrt", where(s == 0.0, 1.0, s))  # a gradient of 0 at 0, as for f64
        h = dsl_array.cast(where(s == 0.0, 0.0, root), DType.f32)
    else:
        m, n = binary("maximum", a, b), binary("minimum", a, b)
        r = n / where(m == 0.0, 1.0, m)
        h = m * unary("sqrt", 1.0 + r * r)
    return where(a == math.inf, math.inf, where(b == math.inf, math.inf, h))


UFUNC_HANDLERS.update(log1p=log1p, expm1=expm1, sinh=sinh, cosh=cosh, logaddexp=logaddexp,
                      logaddexp2=logaddexp2, hypot=hypot)
