"""Polynomial coefficients for the math library, derived here rather than copied.

Each kernel approximates a smooth remainder function (for example (e^r - 1 - r) / r^2) on a
small interval. We interpolate it at Chebyshev nodes in 80-bit long double (a near-minimax
fit), convert the Chebyshev series to monomials exactly with `Fraction`s, and round the
coefficients once to the target precision. Function values come from Taylor series summed in
long double (or long double libm where no cheap series exists), so they carry ~64 bits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

LD = np.longdouble
Remainder = Callable[[np.ndarray], np.ndarray]


def _series(z: np.ndarray, coef: Callable[[int], Fraction], terms: int) -> np.ndarray:
    """Sum coef(k) * z^k for k < terms by Horner in long double (terms are all tiny at the end)."""
    acc = np.zeros_like(z)
    for k in reversed(range(terms)):
        c = coef(k)
        acc = acc * z + LD(c.numerator) / LD(c.denominator)
    return acc


def _exp_rem(r: np.ndarray) -> np.ndarray:
    """(e^r - 1 - r) / r^2 = sum r^k / (k+2)!."""
    return _series(r, lambda k: Fraction(1, math.factorial(k + 2)), 30)


def _log_p(z: np.ndarray) -> np.ndarray:
    """P(z) with 2*atanh(s) = 2s + s*z*P(z), z = s^2: sum 2 z^k / (2k+3)."""
    return _series(z, lambda k: Fraction(2, 2 * k + 3), 40)


def _log_q(z: np.ndarray) -> np.ndarray:
    """Q(z) = (P(z) - 2/3) / z, the part of the log series beyond the cubic term."""
    return _series(z, lambda k: Fraction(2, 2 * k + 5), 40)


def _ln2_ld() -> np.longdouble:
    v = ln2()
    head = float(v)
    return LD(head) + LD(float(v - Fraction(head)))


def _log2_s(z: np.ndarray) -> np.ndarray:
    """log2((1 + s) / (1 - s)) / s = 2 atanh(s) / (s ln2) as a function of z = s^2 (f32 pow)."""
    return (2 + z * _log_p(z)) / _ln2_ld()


def _exp2_rem(r: np.ndarray) -> np.ndarray:
    """(2^r - 1) / r = ln2 (1 + u (e^u - 1 - u) / u^2) with u = r ln2 (f32 pow)."""
    u = r * _ln2_ld()
    return _ln2_ld() * (1 + u * _exp_rem(u))


def _sin_rem(z: np.ndarray) -> np.ndarray:
    """(sin r - r) / r^3 as a function of z = r^2."""
    return _series(z, lambda k: Fraction((-1) ** (k + 1), math.factorial(2 * k + 3)), 25)


def _cos_rem(z: np.ndarray) -> np.ndarray:
    """(cos r - 1 + z/2) / z^2 as a function of z = r^2."""
    return _series(z, lambda k: Fraction((-1) ** k, math.factorial(2 * k + 4)), 25)


def _tanh_rem(z: np.ndarray) -> np.ndarray:
    """(tanh x - x) / x^3 as a function of z = x^2 (long double libm; cancellation is harmless
    because the remainder's weight shrinks exactly as fast as its error grows)."""
    x = np.sqrt(z)
    return (np.tanh(x) - x) / (x * x * x)


# name -> (remainder function, interval [lo, hi]); r-intervals carry a margin for the
# rounding of the reduction, z-intervals are squares of such margins.
# bits -> |x| below which tanh uses its polynomial (above: m / (m + 2), m = expm1(2|x|)), high
# enough to keep f64 within 1 ulp; f32 takes the quotient everywhere (see explog.tanh)
TANH_SMALL = {64: 0.625}
_INTERVALS: dict[str, tuple[Remainder, float, float]] = {
    "exp": (_exp_rem, -0.3466, 0.3466),
    "log_p": (_log_p, 0.0, 0.02945),
    "log_q": (_log_q, 0.0, 0.02945),
    "powf_log2": (_log2_s, 0.0, 0.02945),
    "powf_exp2": (_exp2_rem, -0.5, 0.5),
    "sin": (_sin_rem, 0.0, 0.7856**2),
    "cos": (_cos_rem, 0.0, 0.7856**2),
}
for _bits, _small in TANH_SMALL.items():
    _INTERVALS[f"tanh{_bits}"] = (_tanh_rem, 0.0, _small**2 * 1.0001)

# (name, bits) -> degree: the lowest degree whose measured error stays well inside the budget.
DEGREES: dict[tuple[str, int], int] = {
    ("exp", 32): 4,
    ("exp", 64): 9,
    ("log_p", 32): 3,
    ("log_p", 64): 8,
    ("log_q", 64): 7,
    # f32 pow works in f64 to about 2^-34 only (then rounds to f32): short polynomials
    ("powf_log2", 64): 4,
    ("powf_exp2", 64): 6,
    ("sin", 32): 4,
    ("sin", 64): 7,
    ("cos", 32): 4,
    ("cos", 64): 7,
    ("tanh64", 64): 15,
}


def _ld_fraction(v: np.longdouble) -> Fraction:
    """A long double exactly, as the sum of its leading double and the remainder."""
    head = float(v)
    return Fraction(head) + Fraction(float(v - LD(head)))


def chebyshev_fit(g: Remainder, lo: float, hi: float, degree: int) -> list[Fraction]:
    """Monomial coefficients (lowest first, exact rationals) of the degree-`degree` Chebyshev
    interpolant of g on [lo, hi]; its error is within a small factor of the minimax error."""
    n = degree + 1
    t = np.cos(LD(np.pi) * (np.arange(n, dtype=LD) + LD(0.5)) / LD(n))
    mid, half = (LD(lo) + LD(hi)) / 2, (LD(hi) - LD(lo)) / 2
    values = g(mid + half * t)
    # c_k = 2/n sum_j f(t_j) T_k(t_j), c_0 halved; T_k(t_j) by the three-term recurrence
    t_rows = [np.ones_like(t), t]
    while len(t_rows) < n:
        t_rows.append(2 * t * t_rows[-1] - t_rows[-2])
    cheb = [_ld_fraction(LD(2) / LD(n) * np.sum(values * row)) for row in t_rows[:n]]
    cheb[0] /= 2
    # the same recurrence on exact monomial coefficients gives sum c_k T_k(t) in powers of t
    t_polys = [[Fraction(1)], [Fraction(0), Fraction(1)]]
    while len(t_polys) < n:
        nxt = [Fraction(0)] + [2 * c for c in t_polys[-1]]
        for i, c in enumerate(t_polys[-2]):
            nxt[i] -= c
        t_polys.append(nxt)
    in_t = [Fraction(0)] * n
    for c_k, poly in zip(cheb, t_polys):
        for i, c in enumerate(poly):
            in_t[i] += c_k * c
    # substitute t = (x - mid) / half exactly
    fmid, fhalf = _ld_fraction(mid), _ld_fraction(half)
    out = [Fraction(0)] * n
    for i, a in enumerate(in_t):
        scale = a / fhalf**i
        for m in range(i + 1):
            out[m] += scale * math.comb(i, m) * (-fmid) ** (i - m)
    return out


@functools.cache
def coefficients(name: str, bits: int) -> tuple[float, ...]:
    """Coefficients (lowest degree first) of kernel `name` for a `bits`-bit float, rounded to
    that precision (float32 values are returned as the Python floats they equal)."""
    g, lo, hi = _INTERVALS[name]
    exact = chebyshev_fit(g, lo, hi, DEGREES[(name, bits)])
    if bits == 64:
        return tuple(float(c) for c in exact)
    return tuple(float(np.float32(float(c))) for c in exact)


# Exact constants, from integer series, to well beyond double-double precision.
_PREC = 1 << 300


def _atan_inv(q: int) -> Fraction:
    """atan(1/q) by its alternating series, to about 2^-300."""
    total, k, term = Fraction(0), 0, Fraction(1, q)
    while abs(term) * _PREC > 1:
        total += term / (2 * k + 1)
        k += 1
        term = -term / (q * q)
    return total


@functools.cache
def pi() -> Fraction:
    """pi by Machin's formula 16 atan(1/5) - 4 atan(1/239)."""
    return 16 * _atan_inv(5) - 4 * _atan_inv(239)


@functools.cache
def ln2() -> Fraction:
    """ln 2 = sum 1 / (k 2^k)."""
    total, k = Fraction(0), 1
    while Fraction(1, 2**k) * _PREC > 1:
        total += Fraction(1, k * 2**k)
        k += 1
    return total


def round_bits(v: Fraction, bits: int) -> Fraction:
    """v rounded to nearest (ties to even) with `bits` significant bits."""
    if v == 0:
        return v
    e = math.floor(math.log2(abs(v)))  # may be off by one; fixed below
    while abs(v) >= Fraction(2) ** (e + 1):
        e += 1
    while abs(v) < Fraction(2) ** e:
        e -= 1
    scale = Fraction(2) ** (bits - 1 - e)
    return Fraction(round(v * scale)) / scale


def split(v: Fraction, bits: int, parts: int, head_bits: int | None = None) -> list[float]:
    """v as a sum of `parts` floats with `bits`-bit significands (the first with only
    `head_bits` bits, so that small integer multiples of it are exact)."""
    out = []
    for i in range(parts):
        p = round_bits(v, head_bits if i == 0 and head_bits else bits)
        out.append(float(p))
        v -= p
    return out


@functools.cache
def exp_underflow(bits: int) -> float:
    """An integer below which e^x rounds to 0 (under half the smallest subnormal), with room
    for a low part added to x: -104 for f32, -746 for f64."""
    mant, emin = (52, -1022) if bits == 64 else (23, -126)
    return float(np.floor(np.log(LD(2) ** (emin - mant - 1))))


@functools.cache
def exp_overflow(bits: int) -> float:
    """The largest float x whose e^x rounds to a finite value (above it exp gives inf)."""
    mant, emax = (52, 1024) if bits == 64 else (23, 128)
    edge = LD(2) ** emax - LD(2) ** (emax - mant - 2)  # max float plus half an ulp
    t = np.log(edge)
    ft = np.float64 if bits == 64 else np.float32
    x = ft(t)
    while LD(x) >= t:
        x = np.nextafter(x, ft(0))
    return float(x)


@functools.cache
def two_over_pi_fixed(frac_bits: int) -> int:
    """floor(2/pi * 2^frac_bits), from pi computed in integer fixed point with guard bits
    (the large-argument sin/cos reduction needs about 1,200 bits of 2/pi for f64)."""
    prec = frac_bits + 64

    def atan_inv(q: int) -> int:  # atan(1/q) * 2^prec, truncated term by term
        total, k, term = 0, 0, (1 << prec) // q
        while term:
            total += term // (2 * k + 1) if k % 2 == 0 else -(term // (2 * k + 1))
            k += 1
            term //= q * q
        return total

    pi_fixed = 16 * atan_inv(5) - 4 * atan_inv(239)  # pi * 2^prec, error a few hundred units
    return (1 << (frac_bits + 1 + prec)) // pi_fixed
