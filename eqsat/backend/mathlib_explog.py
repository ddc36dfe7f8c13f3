"""Branch-free exp, log, tanh, sigmoid and pow kernels (f32 and f64), written with `Emit`.

exp: Cody-Waite reduction x = n ln2 + r (ln2 in two parts, fused multiply-adds), a polynomial
for e^r on |r| <= ln2/2, and 2^n applied with one rounding (subnormal results included): by
ldexp (vscalefps on AVX-512) or, on NVPTX, as two exact power-of-two factors.
log: x = 2^k m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(f / (2 + f)) with f = m - 1,
arranged so the large terms are exact.
pow: exp(y log|x|) with the log carried in double-double (f64); f32: 2^(y log2|x|) in f64
with polynomials sized to f32 (about 2^-33), rounded once. Then the C99 special cases (signs
for odd integer exponents, NaN for negative bases, 0 and inf) by selects.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from llvmlite import ir

from eqsat.backend import mathlib_fit as fit
from eqsat.backend.mathlib_emit import Emit, Value

INF = float("inf")
NAN = float("nan")


def _consts(e: Emit) -> dict[str, Any]:
    return _consts_for(e.bits)


@functools.cache
def _consts_for(bits: int) -> dict[str, Any]:
    sig = 53 if bits == 64 else 24
    ln2 = fit.ln2()
    return {
        "log2e": float(fit.round_bits(1 / ln2, sig)),
        "ln2": fit.split(ln2, sig, 2),
        # few leading bits: k * ln2_hi is exact for every exponent k
        "ln2_k": fit.split(ln2, sig, 2, head_bits=sig - 12),
        "max": float(np.finfo(np.float64 if bits == 64 else np.float32).max),
        "min_normal": 2.0 ** (-1022 if bits == 64 else -126),
        "xmax": fit.exp_overflow(bits),
        "zero_below": fit.exp_underflow(bits),
        # clamps keep n small (n/2 a normal exponent, for _scale's two factors); beyond them
        # exp is 0 or inf
        "clamp_hi": 720.0 if bits == 64 else 100.0,
        "clamp_lo": -760.0 if bits == 64 else -120.0,
    }


def _reduce(e: Emit, x: Value, clamp: bool = True) -> tuple[Value, Value]:
    """x -> (r, n as i32) with x = n ln2 + r, |r| <= ln2/2. With `clamp`, x is first
    clamped so that n is always a small integer; NaN passes through where n comes from lrint
    (an unspecified integer for NaN, and r is NaN), else it goes to the upper clamp (fptosi of
    NaN would be poison) and callers restore it. Where n comes from lrint, x is at least
    exp_'s zero_below already. Without `clamp`, the caller guarantees a finite x within the
    clamps."""
    k = _consts(e)
    xc = x
    if clamp and e.native_ldexp:
        # min (one vminps) whose compare is false on NaN: x stays
        xc = e.sel(e.gt(x, k["clamp_hi"]), k["clamp_hi"], x)
    elif clamp:
        xc = e.sel(e.lt(x, k["clamp_hi"]), x, k["clamp_hi"])
        xc = e.sel(e.gt(xc, k["clamp_lo"]), xc, k["clamp_lo"])
    ni = e.lrint(e.mul(xc, k["log2e"]))
    n = e.b.sitofp(ni, e.ty)
    ln2_hi, ln2_lo = k["ln2"]
    r = e.fma(e.neg(n), ln2_hi, xc)  # exact: the difference fits in the format
    return e.fma(e.neg(n), ln2_lo, r), ni


def _expm1_reduced(e: Emit, r: Value) -> Value:
    """e^r - 1 for |r| <= ln2/2: r + r^2 g(r)."""
    g = e.horner(r, fit.coefficients("exp", e.bits))
    return e.fma(e.mul(r, r), g, r)


def _scale(e: Emit, p: Value, ni: Value) -> Value:
    """p * 2^n, rounded once: ldexp where it is one instruction (vscalefps), elsewhere two
    power-of-two factors, each normal, so that only the last product rounds."""
    if e.native_ldexp:
        return e.ldexp(p, ni)
    n1 = e.b.ashr(ni, ni.type(1))
    n2 = e.b.sub(ni, n1)
    return e.mul(e.mul(p, e.pow2i(_wide(e, n1))), e.pow2i(_wide(e, n2)))


def _wide(e: Emit, ni: Value) -> Value:
    return ni if e.bits == 32 else e.b.sext(ni, e.ity)


def exp_(e: Emit, x: Value, x_lo: Value | None = None) -> Value:
    """e^(x + x_lo); x_lo is an optional low part (double-double argument, used by pow)."""
    k = _consts(e)
    # Where e^x rounds to 0 it is computed of x = 0 and replaced by 0 last: an x86 core takes
    # a microcode assist for every result that underflows, so e^-inf, the common case over an
    # attention mask (and sigmoid of a large logit), ran 20x slower than e^0.
    zero = e.lt(x, k["zero_below"])
    x = e.sel(zero, 0.0, x)
    r, ni = _reduce(e, x)
    if x_lo is not None:
        r = e.add(r, e.sel(e.lt(e.fabs(x), k["clamp_hi"]), x_lo, 0.0))
    # e^r as one Horner chain 1 + r (1 + r g(r)): one operation fewer than 1 + (r + r^2 g)
    res = _scale(e, e.horner(r, (1.0, 1.0, *fit.coefficients("exp", e.bits))), ni)
    if not e.native_ldexp:
        # Overflow exactly where the correctly rounded exp overflows (sigmoid's 1/(1+e^-x) is
        # 0 beyond it, so being off by one ulp there would be off by millions of subnormal
        # ulps). With ldexp, one rounding of a result within an ulp of e^x overflows exactly
        # where the correctly rounded exp does: next to the threshold e^x moves by far more
        # than an ulp per step of x (tests check both sides). NaN came through the clamps.
        res = e.sel(e.gt(res, k["max"]), k["max"], res)
        res = e.sel(e.gt(x, k["xmax"]), INF, res)
        res = e.sel(e.isnan(x), x, res)
    return e.sel(zero, 0.0, res)


def expm1_pos(e: Emit, x: Value) -> Value:
    """e^x - 1 for x >= 0, clamped to a finite value for large x and NaN (tanh needs no more)."""
    limit = 80.0 if e.bits == 64 else 40.0
    # NaN: kept where lrint gives n (the result is NaN then), else clamped (see _reduce)
    x = e.sel(e.gt(x, limit) if e.native_ldexp else e.ugt(x, limit), limit, x)
    r, ni = _reduce(e, x, clamp=False)
    s = e.pow2i(_wide(e, ni))
    return e.fma(s, _expm1_reduced(e, r), e.sub(s, 1.0))  # s - 1 is exact where it matters


def sigmoid(e: Emit, x: Value) -> Value:
    """1 / (1 + e^-x), rounded step by step exactly like the numpy formula."""
    return e.div(1.0, e.add(1.0, exp_(e, e.neg(x))))


def tanh(e: Emit, x: Value) -> Value:
    """tanh|x| = m / (m + 2), m = e^(2|x|) - 1, signed last; in f64 an odd polynomial for
    small |x|. f32 takes the quotient everywhere: within 2 ulp near 0 too (1 with the
    polynomial), and 13% faster an element in a kernel like tanh(x*w+b)*sigmoid(x), where
    both forms were computed for every element and one picked."""
    ax = e.fabs(x)
    m = expm1_pos(e, e.add(ax, ax))
    res = e.div(m, e.add(m, 2.0))
    if e.bits == 64:
        z = e.mul(x, x)
        small = e.fma(e.mul(ax, z), e.horner(z, fit.coefficients("tanh64", 64)), ax)
        res = e.sel(e.lt(ax, fit.TANH_SMALL[64]), small, res)
    # computed on |x| and signed last, so that tanh(-0) = -0
    res = e.copysign(res, x)
    return res if e.native_ldexp else e.sel(e.isnan(x), x, res)


def _log_split(e: Emit, x: Value) -> tuple[Value, Value]:
    """Positive finite x -> (k as float, f) with x = 2^k (1 + f), 1 + f in [sqrt(1/2), sqrt(2));
    f is exact. Subnormals are first scaled into the normal range."""
    k = _consts(e)
    tiny = e.lt(x, k["min_normal"])
    up = e.mant + 2
    xs = e.sel(tiny, e.mul(x, float(2**up)), x)
    bits = e.to_bits(xs)
    sqrt_half = 0x3FE6A09E667F3BCD if e.bits == 64 else 0x3F3504F3
    kk = e.b.ashr(e.b.sub(bits, e.ci(sqrt_half)), e.ci(e.mant))
    m = e.from_bits(e.b.sub(bits, e.b.shl(kk, e.ci(e.mant))))
    kk = e.b.sub(kk, e.b.select(tiny, e.ci(up), e.ci(0)))
    return e.to_float(kk), e.sub(m, 1.0)


def log(e: Emit, x: Value) -> Value:
    """Natural log: k ln2 + log(1 + f), special values by selects."""
    kc = _consts(e)
    kf, f = _log_split(e, x)
    s = e.div(f, e.add(f, 2.0))
    z = e.mul(s, s)
    big_r = e.mul(z, e.horner(z, fit.coefficients("log_p", e.bits)))
    hfsq = e.mul(e.mul(f, f), 0.5)
    ln2_hi, ln2_lo = kc["ln2_k"]
    # log(1+f) = f - hfsq + s (hfsq + R); the exact f leads, small terms are summed first.
    tail = e.fma(kf, ln2_lo, e.mul(s, e.add(hfsq, big_r)))
    res = e.add(e.mul(kf, ln2_hi), e.sub(f, e.sub(hfsq, tail)))
    res = e.sel(e.eq(x, INF), INF, res)
    res = e.sel(e.eq(x, 0.0), -INF, res)
    return e.sel(e.or_(e.lt(x, 0.0), e.isnan(x)), NAN, res)


def _log_dd(e: Emit, x: Value) -> tuple[Value, Value]:
    """log x for positive x as a double-double (hi, lo), relative error about 2^-64 (f64)."""
    kc = _consts(e)
    kf, f = _log_split(e, x)
    d = e.add(f, 2.0)
    d_lo = e.sub(f, e.sub(d, 2.0))  # exact: |2| >= |f|
    s = e.div(f, d)
    s_lo = e.div(e.sub(e.fma(e.neg(s), d, f), e.mul(s, d_lo)), d)
    # (2/3) s^3 carried in double-double, the rest of the atanh series in plain arithmetic
    s2, s2_lo = e.two_prod(s, s)
    s2_lo = e.fma(e.add(s, s), s_lo, s2_lo)
    s3, s3_lo = e.two_prod(s2, s)
    s3_lo = e.fma(s2_lo, s, e.fma(s2, s_lo, s3_lo))
    c_hi, c_lo = fit.split(fit.Fraction(2, 3), 53, 2)
    t_hi, t_lo = e.two_prod(s3, c_hi)
    t_lo = e.fma(s3_lo, c_hi, e.fma(s3, c_lo, t_lo))
    rest = e.mul(e.mul(s3, s2), e.horner(s2, fit.coefficients("log_q", e.bits)))
    ln2_hi, ln2_lo = kc["ln2_k"]
    h1, l1 = e.fast_two_sum(e.add(s, s), t_hi)
    h2, l2 = e.two_sum(e.mul(kf, ln2_hi), h1)
    lo = e.add(e.add(l1, l2), e.add(e.add(s_lo, s_lo), e.add(t_lo, rest)))
    lo = e.fma(kf, ln2_lo, lo)
    return e.fast_two_sum(h2, lo)


def _pow_magnitude_f64(e: Emit, ax: Value, y: Value) -> Value:
    """|x|^y = e^(y log|x|) with the product in double-double, for f64."""
    l_hi, l_lo = _log_dd(e, ax)
    # log 0 = -inf and log inf = inf make y log|x| give the right 0 / inf limits
    l_hi = e.sel(e.eq(ax, 0.0), -INF, e.sel(e.eq(ax, INF), INF, l_hi))
    l_hi = e.sel(e.isnan(ax), ax, l_hi)
    t_hi, t_lo = e.two_prod(y, l_hi)
    t_lo = e.fma(y, l_lo, t_lo)
    return exp_(e, t_hi, e.sel(e.isnan(t_lo), 0.0, t_lo))


def _pow_special(e: Emit, x: Value, y: Value, mag: Value) -> Value:
    """C99 / numpy pow special cases around the magnitude |x|^y."""
    ax = e.fabs(x)
    fy = e.floor(y)
    y_int = e.eq(fy, y)  # true for +-inf, false for NaN
    half = e.mul(y, 0.5)
    y_odd = e.and_(y_int, e.ne_or_nan(e.floor(half), half))
    x_signed = e.b.icmp_signed("<", e.to_bits(x), e.ci(0))
    res = e.sel(e.and_(x_signed, y_odd), e.neg(mag), mag)
    neg_finite = e.and_(e.lt(x, 0.0), e.gt(x, -INF))
    res = e.sel(e.and_(neg_finite, e.not_(y_int)), NAN, res)
    res = e.sel(e.and_(e.eq(ax, 1.0), e.eq(e.fabs(y), INF)), 1.0, res)
    res = e.sel(e.eq(x, 1.0), 1.0, res)
    return e.sel(e.eq(y, 0.0), 1.0, res)


def _log2_f64_short(d: Emit, ax: Value) -> Value:
    """log2 of a positive normal f64 (any f32 widened) to about 2^-37 relative: exponent k and
    m in [sqrt(1/2), sqrt(2)), log2 m = s P(s^2) with s = (m - 1) / (m + 1)."""
    bits = d.to_bits(ax)
    kk = d.b.ashr(d.b.sub(bits, d.ci(0x3FE6A09E667F3BCD)), d.ci(52))
    m = d.from_bits(d.b.sub(bits, d.b.shl(kk, d.ci(52))))
    s = d.div(d.sub(m, 1.0), d.add(m, 1.0))
    return d.fma(s, d.horner(d.mul(s, s), fit.coefficients("powf_log2", 64)), d.to_float(kk))


def _pow_magnitude_f32(e: Emit, x: Value, y: Value) -> Value:
    """|x|^y for f32 operands, as 2^(y log2|x|) in f64 with polynomials sized to f32: the
    f64 exponent t = y log2|x| is within about 2^-33 of the true one wherever the result is
    finite and nonzero, and 2^t is then rounded once to f32 (overflow, subnormals included)."""
    d = e.at(ir.DoubleType())
    ax = e.fabs(x)
    axd, yd = e.widen(ax, d.ty), e.widen(y, d.ty)
    l2 = _log2_f64_short(d, axd)  # f32 subnormals are normal in f64
    # log2 0 = -inf and log2 inf = inf give the right 0 / inf limits of y log2|x|
    l2 = d.sel(d.eq(axd, 0.0), -INF, d.sel(d.eq(axd, INF), INF, l2))
    t = d.mul(yd, l2)
    # beyond +-160 the f32 result is 0 or inf either way; the clamps keep 2^n an f64 normal.
    # NaN: lrint keeps it in r (the result is NaN); elsewhere it is clamped and put back last
    if e.native_ldexp:
        tc = d.sel(d.gt(t, 160.0), 160.0, t)
        tc = d.sel(d.lt(tc, -160.0), -160.0, tc)
    else:
        tc = d.sel(d.lt(t, 160.0), t, 160.0)
        tc = d.sel(d.gt(tc, -160.0), tc, -160.0)
    ni = d.lrint(tc)
    r = d.sub(tc, d.b.sitofp(ni, d.ty))  # exact, |r| <= 1/2
    p = d.fma(r, d.horner(r, fit.coefficients("powf_exp2", 64)), 1.0)
    # 2^n with n in [-160, 160] is an f64 normal: one vscalefpd where ldexp is native
    mag = d.ldexp(p, ni) if e.native_ldexp else d.mul(p, d.pow2i(d.b.sext(ni, d.ity)))
    if not e.native_ldexp:
        mag = d.sel(d.isnan(t), t, mag)
    res = e.narrow(mag, e.ty)
    return e.sel(e.isnan(x), x, res)  # the bits of NaN made some log


def pow_(e: Emit, x: Value, y: Value) -> Value:
    """x ** y with numpy's float semantics (negative bases with integer exponents included)."""
    if e.bits == 64:
        return _pow_special(e, x, y, _pow_magnitude_f64(e, e.fabs(x), y))
    return _pow_special(e, x, y, _pow_magnitude_f32(e, x, y))
