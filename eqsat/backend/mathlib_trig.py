"""Branch-free sin and cos (f32 and f64), written with `Emit`.

Both reductions below are always computed and a select picks one (no branches, so loops
vectorize); each yields the quadrant n and the reduced argument r = x - n pi/2 as a pair
r_hi + r_lo, with |r| about pi/4 at most.
- Cody-Waite, for |x| < `SMALL_LIMIT`: n = rint(x 2/pi), pi/2 in three parts and fused
  multiply-adds, the rounding of the last steps carried in r_lo.
- Payne-Hanek, for larger |x| (up to the largest float): with x = M 2^e, M an integer of the
  format's precision, only the bits of 2/pi from about 2^-e on matter for x 2/pi modulo 4.
  f64: a constant table holds them per exponent in four chunks of 53 bits; M times each chunk
  is exact as a two-product, integers are dropped along the way, and the remaining fraction
  is multiplied by pi/2 in double-double. f32: no table load (a table load per element becomes
  a gather, slow on x86): a 96-bit window of 2/pi is picked by selects among a few 32-bit
  words and shifted into place, and M times it in 64-bit integers gives the quadrant and 62
  fraction bits.
`sin_small` / `cos_small` skip the Payne-Hanek reduction (for kernels that check their
arguments' range and fall back to the full functions, see mathlib.FastTrig).
Then sin r and cos r by polynomials in r^2 (with r_lo's first-order term), and n mod 4 picks
and signs one. f32 works in f32 throughout; results are within 2 ulp of the correctly rounded
value over the whole finite range (tests/test_mathlib.py).
"""

from __future__ import annotations

import functools

from llvmlite import ir

from eqsat.backend import mathlib_fit as fit
from eqsat.backend.mathlib_emit import Emit, Value

NAN = float("nan")
INF = float("inf")
# float bits -> |x| below which the Cody-Waite reduction is used
# f32: below 2^11, so that x 2/pi < 2^10 rounds finely enough for |r| to stay under _R_MAX
# (from 2^11 on, rint of the f32 product can leave |r| up to ~pi/4 + 3e-4: clamped, wrong)
SMALL_LIMIT = {32: 2.0**11, 64: 2.0**30}
_R_MAX = 0.7856  # pi/4 plus the slack of rounding n; the polynomials are fitted this far


# float bits -> widths of the chunks of 2/pi per exponent (their sum: bits of (2^e' 2/pi) mod 4
# kept); the table serves f64 only, f32 picks its bits of 2/pi with selects (_f32_words)
_WIDTHS = {64: (53, 53, 53, 53)}


@functools.cache
def _chunk_table(bits: int) -> list[float]:
    """Per unbiased exponent e in [0, bias], floats (f64 for both formats; each exact in the
    format that uses it) whose sum is (2^(e - mant) 2/pi) mod 4 to its last bit, rounded."""
    mant, bias = (52, 1023) if bits == 64 else (23, 127)
    widths = _WIDTHS[bits]
    k = sum(widths) - 2  # fraction bits kept
    frac_bits = bias - mant + k + 64
    t = fit.two_over_pi_fixed(frac_bits)
    out: list[float] = []
    for e in range(bias + 1):
        shift = frac_bits - (e - mant) - k
        g = ((t + (1 << (shift - 1))) >> shift) & ((1 << (k + 2)) - 1)  # G_e * 2^k, rounded
        low = k + 2
        for w in widths:
            low -= w
            chunk = (g >> low) & ((1 << w) - 1)
            out.append(float(fit.Fraction(chunk) * fit.Fraction(2) ** (low - k)))
    return out


def _table(e: Emit) -> ir.GlobalVariable:
    module = e.b.module
    name = f"eqsat.trig.two_over_pi.f{e.bits}"
    g = module.globals.get(name)
    if g is None:
        values = _chunk_table(e.bits)
        arr = ir.ArrayType(ir.DoubleType(), len(values))
        g = ir.GlobalVariable(module, arr, name)
        g.global_constant = True
        g.linkage = "internal"
        g.initializer = ir.Constant(arr, [ir.Constant(ir.DoubleType(), v) for v in values])
    return g


def _chunks(e: Emit, ax: Value) -> tuple[list[Value], Value]:
    """The table's chunks for |x|'s exponent, and M, |x|'s significand as an integer-valued
    float (f64)."""
    widths = _WIDTHS[e.bits]
    bits = e.to_bits(ax)
    ex = e.b.sub(e.b.lshr(bits, e.ci(e.mant)), e.ci(e.bias))
    ex = e.b.select(e.b.icmp_signed("<", ex, e.ci(0)), e.ci(0), ex)
    ex = e.b.select(e.b.icmp_signed(">", ex, e.ci(e.bias)), e.ci(e.bias), ex)
    idx = e.b.mul(ex, e.ci(len(widths)))
    table = _table(e)
    zero = ir.Constant(ir.IntType(32), 0)
    chunks = [e.b.load(e.b.gep(table, [zero, e.b.add(idx, e.ci(j))], inbounds=True))
              for j in range(len(widths))]
    m_bits = e.b.or_(e.b.and_(bits, e.ci((1 << e.mant) - 1)), e.ci((e.bias + e.mant) << e.mant))
    return chunks, e.from_bits(m_bits)


# f32 Payne-Hanek in integers: |x| = m 2^(E-150) with a 24-bit m and the biased exponent E in
# [_E_LO, 254]; a 96-bit window of 2/pi starting at bit E - 151 (bit j weighs 2^-j) gives
# x 2/pi mod 4 in 2.62 fixed point. The windows of all those E lie in _F32_WORDS words of 2/pi
# (starting at bit _E_LO - 151, leading bits zero), picked by selects over buckets of 32 E.
_E_LO = 127 + 11  # SMALL_LIMIT[32] = 2^11
_F32_WORDS = 7  # 4 buckets of 32 exponents (a <= 116), each needing 4 words


@functools.cache
def _f32_words() -> list[int]:
    """2/pi as 32-bit words, its bit `_E_LO - 151 + 32 w` the top bit of word w."""
    nbits = 32 * _F32_WORDS
    frac = nbits - 1 + (_E_LO - 151)  # weight of the top bit: 2^-(E_LO - 151)
    t = fit.two_over_pi_fixed(frac)
    return [(t >> (nbits - 32 * (w + 1))) & 0xFFFFFFFF for w in range(_F32_WORDS)]


def _reduce_large_f32(e: Emit, x: Value) -> tuple[Value, Value, Value]:
    """Payne-Hanek for f32 without table loads (so without gathers once vectorized): the three
    window words come from selects and variable shifts; m times the window in 64-bit integers
    leaves the quadrant in the top two bits and 62 fraction bits below, with an error under
    2^-61 quarter turns (the product's dropped low bits)."""
    b = e.b
    i32, i64 = ir.IntType(32), ir.IntType(64)
    bits = e.to_bits(x)
    big_e = b.and_(b.lshr(bits, e.ci(23)), e.ci(0xFF))
    a = b.sub(big_e, e.ci(_E_LO))
    a = b.select(b.icmp_signed("<", a, e.ci(0)), e.ci(0), a)  # small |x|: unused garbage
    k = b.lshr(a, e.ci(5))
    sh = b.and_(a, e.ci(31))
    words = _f32_words()
    # k in [0, 3]: a two-level select tree on its bits (shorter dependency chain than a ladder)
    k0 = b.icmp_unsigned("!=", b.and_(k, e.ci(1)), e.ci(0))
    k1 = b.icmp_unsigned("!=", b.and_(k, e.ci(2)), e.ci(0))

    def word(i: int) -> Value:  # words[k + i]
        pick = [e.ci(words[j + i]) for j in range(4)]
        return b.select(k1, b.select(k0, pick[3], pick[2]), b.select(k0, pick[1], pick[0]))

    ws = [word(i) for i in range(4)]
    rsh = b.sub(e.ci(31), sh)  # two shifts, so that sh = 0 never shifts by 32
    win = [b.or_(b.shl(ws[i], sh), b.lshr(b.lshr(ws[i + 1], e.ci(1)), rsh)) for i in range(3)]
    m = b.or_(b.and_(bits, e.ci(0x7FFFFF)), e.ci(0x800000))
    m64 = b.zext(m, i64)
    top = b.shl(b.zext(b.mul(m, win[0]), i64), ir.Constant(i64, 32))  # higher bits: multiples of 4
    mid = b.mul(m64, b.zext(win[1], i64))
    low = b.lshr(b.mul(m64, b.zext(win[2], i64)), ir.Constant(i64, 32))
    y = b.add(b.add(top, mid), low)
    q = b.lshr(b.add(y, ir.Constant(i64, 1 << 61)), ir.Constant(i64, 62))  # nearest quadrant
    f = b.sub(y, b.shl(q, ir.Constant(i64, 62)))  # signed, |f| <= 2^61
    d = e.at(ir.DoubleType())
    r = d.mul(b.sitofp(f, d.ty), float(fit.pi() / 2 / 2**62))
    r_hi = e.narrow(r, e.ty)
    r_lo = e.narrow(d.sub(r, e.widen(r_hi, d.ty)), e.ty)
    n = b.uitofp(b.trunc(q, i32), e.ty)
    neg = e.lt(x, 0.0)
    return (e.sel(neg, e.neg(n), n), e.sel(neg, e.neg(r_hi), r_hi), e.sel(neg, e.neg(r_lo), r_lo))


def _reduce_large(e: Emit, x: Value) -> tuple[Value, Value, Value]:
    """Payne-Hanek: (n, r_hi, r_lo) for finite |x| >= SMALL_LIMIT (garbage elsewhere)."""
    if e.bits == 32:
        return _reduce_large_f32(e, x)
    chunks, m = _chunks(e, e.fabs(x))
    p0, q0 = e.two_prod(m, chunks[0])
    p1, q1 = e.two_prod(m, chunks[1])
    p2, q2 = e.two_prod(m, chunks[2])
    p3 = e.mul(m, chunks[3])
    # exact steps: drop multiples of 4 from p0, then nearest integers from the three big terms
    h = e.sub(p0, e.mul(e.floor(e.mul(p0, 0.25)), 4.0))
    k0, k1, k2 = e.rint(h), e.rint(q0), e.rint(p1)
    s0 = e.add(e.sub(h, k0), e.sub(q0, k1))  # |s0| <= 1 on a grid of the chunk's ulp: exact
    p1f = e.sub(p1, k2)
    k3 = e.rint(e.add(s0, p1f))
    s, e1 = e.two_sum(e.sub(s0, k3), p1f)  # cancels exactly when r is tiny, so e1 = 0 there
    u, ue = e.two_sum(q1, p2)
    a, ae = e.two_sum(s, u)
    lo = e.add(ae, e.add(e1, e.add(ue, e.add(q2, p3))))
    f_hi, f_lo = e.fast_two_sum(a, lo)  # x 2/pi - n, in quarter turns
    sig = 53 if e.bits == 64 else 24
    c_hi, c_lo = fit.split(fit.pi() / 2, sig, 2)
    r_hi = e.mul(f_hi, c_hi)
    r_lo = e.fma(f_hi, c_lo, e.fma(f_lo, c_hi, e.fma(f_hi, c_hi, e.neg(r_hi))))
    n = e.add(e.add(k0, k1), e.add(k2, k3))
    neg = e.lt(x, 0.0)
    return (e.sel(neg, e.neg(n), n), e.sel(neg, e.neg(r_hi), r_hi), e.sel(neg, e.neg(r_lo), r_lo))


def _reduce_small(e: Emit, x: Value) -> tuple[Value, Value, Value]:
    """Cody-Waite: (n, r_hi, r_lo) for |x| < SMALL_LIMIT."""
    sig = 53 if e.bits == 64 else 24
    p1, p2, p3 = fit.split(fit.pi() / 2, sig, 3)
    two_over_pi = float(fit.round_bits(2 / fit.pi(), sig))
    n = e.rint(e.mul(x, two_over_pi))
    a = e.fma(e.neg(n), p1, x)  # exact: n p1 is within a few ulp of x
    if e.bits == 64:  # n < 2^30 leaves r accurate enough in one float
        r = e.fma(e.neg(n), p3, e.fma(e.neg(n), p2, a))
        return n, e.sel(e.eq(n, 0.0), x, r), e.c(0.0)  # keeps sin(-0) = -0
    b_hi, b_lo = e.two_prod(n, p2)
    r_hi, r_err = e.two_sum(a, e.neg(b_hi))
    r_lo = e.sub(r_err, e.fma(n, p3, b_lo))
    return n, e.sel(e.eq(n, 0.0), x, r_hi), r_lo


def _sin_cos(e: Emit, x: Value, want_cos: bool, small_only: bool = False) -> Value:
    n, r, r_lo = _reduce_small(e, x)
    if not small_only:
        nl, rl, ll = _reduce_large(e, x)
        small = e.lt(e.fabs(x), SMALL_LIMIT[e.bits])
        n, r, r_lo = e.sel(small, n, nl), e.sel(small, r, rl), e.sel(small, r_lo, ll)
    r = e.sel(e.gt(r, _R_MAX), _R_MAX, r)
    r = e.sel(e.lt(r, -_R_MAX), -_R_MAX, r)
    q = e.sub(n, e.mul(e.floor(e.mul(n, 0.25)), 4.0))  # n mod 4, exact, in {0, 1, 2, 3}
    z = e.mul(r, r)
    ar = e.fabs(r)
    hz = e.mul(z, 0.5)
    # r + r^3 S(z) + r_lo (1 - z/2) on |r|, signed last so that sin(-0) = -0
    lo_abs = e.sel(e.lt(r, 0.0), e.neg(r_lo), r_lo)
    poly = e.horner(z, fit.coefficients("sin", e.bits))
    tail = e.fma(e.mul(ar, z), poly, e.fma(e.neg(lo_abs), hz, lo_abs))
    sin_r = e.copysign(e.add(ar, tail), r)
    # 1 - z/2 + z^2 C(z) - r r_lo, with the rounding error of 1 - z/2 added back
    w = e.sub(1.0, hz)
    corr = e.fma(e.neg(r), r_lo, e.sub(e.sub(1.0, w), hz))
    cos_r = e.add(w, e.fma(e.mul(z, z), e.horner(z, fit.coefficients("cos", e.bits)), corr))
    odd = e.or_(e.eq(q, 1.0), e.eq(q, 3.0))
    if want_cos:
        val = e.sel(odd, sin_r, cos_r)
        negate = e.or_(e.eq(q, 1.0), e.eq(q, 2.0))
    else:
        val = e.sel(odd, cos_r, sin_r)
        negate = e.ge(q, 2.0)
    res = e.sel(negate, e.neg(val), val)
    return e.sel(e.or_(e.isnan(x), e.eq(e.fabs(x), INF)), NAN, res)


def sin(e: Emit, x: Value) -> Value:
    """sin x."""
    return _sin_cos(e, x, want_cos=False)


def cos(e: Emit, x: Value) -> Value:
    """cos x."""
    return _sin_cos(e, x, want_cos=True)


# The small variants compute exactly the operations `sin` / `cos` select for |x| <
# SMALL_LIMIT (and for NaN and +-inf, whose result is the NaN constant either way), so they
# agree with them bit for bit there; elsewhere their result is wrong. A kernel using them
# checks `needs_full` and recomputes with the full functions (scalar.math_call, loops.py).


def sin_small(e: Emit, x: Value) -> Value:
    """sin x for |x| < SMALL_LIMIT, NaN and +-inf only: no Payne-Hanek reduction."""
    return _sin_cos(e, x, want_cos=False, small_only=True)


def cos_small(e: Emit, x: Value) -> Value:
    """cos x for |x| < SMALL_LIMIT, NaN and +-inf only: no Payne-Hanek reduction."""
    return _sin_cos(e, x, want_cos=True, small_only=True)
