"""Branch-free sin and cos (f32 and f64), written with `Emit`.

Reduction: n = rint(x 2/pi), r = x - n pi/2 with pi/2 in three f64 parts and fused
multiply-adds (the first step is exact), so r keeps full relative precision even next to a
multiple of pi/2. Results (f32 ones computed in f64) hold a few ulp for |x| <= 2^40 (about
1.1e12; `ACCURATE_RANGE`, checked by the tests). Beyond it n itself is no longer exact; the
reduced argument is clamped to about [-pi/4, pi/4], so results degrade but stay finite in
[-1, 1], never NaN.
Then sin r and cos r by polynomials in r^2, and the quadrant n mod 4 picks and signs one.
"""

from __future__ import annotations

from llvmlite import ir

from eqsat.backend import mathlib_fit as fit
from eqsat.backend.mathlib_emit import Emit, Value

# float bits -> |x| below which results stay within the tests' ulp bound
ACCURATE_RANGE = {32: 2.0**40, 64: 2.0**40}
_R_MAX = 0.7856  # pi/4 plus the slack of rounding n; the polynomials are fitted this far


def _sin_cos_reduced(e: Emit, x: Value, coef_bits: int, want_cos: bool) -> Value:
    """sin x or cos x in the arithmetic of `e` (f64), polynomials fitted for `coef_bits`."""
    pio2 = fit.split(fit.pi() / 2, 53, 3)
    two_over_pi = float(fit.round_bits(2 / fit.pi(), 53))
    n = e.rint(e.mul(x, two_over_pi))
    r = x
    for part in pio2:
        r = e.fma(e.neg(n), part, r)
    r = e.sel(e.eq(n, 0.0), x, r)  # x - 0 pi/2 would turn -0 into +0
    r = e.sel(e.gt(r, _R_MAX), _R_MAX, r)
    r = e.sel(e.lt(r, -_R_MAX), -_R_MAX, r)
    q = e.sub(n, e.mul(e.floor(e.mul(n, 0.25)), 4.0))  # n mod 4, exact, in {0, 1, 2, 3}
    z = e.mul(r, r)
    ar = e.fabs(r)
    # r + r^3 S(z) on |r|, signed last so that sin(-0) = -0
    sin_r = e.copysign(e.fma(e.mul(ar, z), e.horner(z, fit.coefficients("sin", coef_bits)), ar), r)
    # 1 - z/2 + z^2 C(z), with the rounding error of 1 - z/2 added back
    hz = e.mul(z, 0.5)
    w = e.sub(1.0, hz)
    corr = e.sub(e.sub(1.0, w), hz)
    cos_r = e.add(w, e.fma(e.mul(z, z), e.horner(z, fit.coefficients("cos", coef_bits)), corr))
    odd = e.or_(e.eq(q, 1.0), e.eq(q, 3.0))
    if want_cos:
        val = e.sel(odd, sin_r, cos_r)
        negate = e.or_(e.eq(q, 1.0), e.eq(q, 2.0))
    else:
        val = e.sel(odd, cos_r, sin_r)
        negate = e.ge(q, 2.0)
    return e.sel(negate, e.neg(val), val)


def _trig(e: Emit, x: Value, want_cos: bool) -> Value:
    if e.bits == 64:
        return _sin_cos_reduced(e, x, 64, want_cos)
    d = e.at(ir.DoubleType())
    return e.narrow(_sin_cos_reduced(d, e.widen(x, d.ty), 32, want_cos), e.ty)


def sin(e: Emit, x: Value) -> Value:
    """sin x."""
    return _trig(e, x, want_cos=False)


def cos(e: Emit, x: Value) -> Value:
    """cos x."""
    return _trig(e, x, want_cos=True)
