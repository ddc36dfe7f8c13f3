"""sin and cos kernels with a cheap first pass (small-argument reduction only) and a second,
full pass where some argument needs the Payne-Hanek reduction (loops.with_trig_fallback):
results must be bit-identical to the full functions in every case. The reference is the math
library's full function in a plain loop (mathlib_jit), which is what kernels computed before.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

import eqsat
from eqsat.backend import mathlib, mathlib_trig
from eqsat.backend.mathlib_jit import kernel
from math_helpers import MAX_ULP_TRUE, ulp_distance

DTYPES = ["float32", "float64"]
NAMES = ["sin", "cos"]
N = 3000  # not a multiple of the vector width: the loops' scalar remainders run too


def _module(text: str) -> eqsat.Module:
    return eqsat.parse(text)


def _unary(name: str, dt: str, n: int, optimize: bool = False):
    t = "f32" if dt == "float32" else "f64"
    m = _module(f"module @m\n\nfunc @f(%x: {t}[{n}]) -> ({t}[{n}]) {{\n"
                f"  %y = {name} %x : {t}[{n}]\n  return %y\n}}\n")
    return eqsat.compile(m, optimize=optimize), m


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _small(dt: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    limit = mathlib_trig.SMALL_LIMIT[32 if dt == "float32" else 64]
    x = rng.uniform(-limit, limit, n) * np.exp(rng.uniform(-20, 0, n))
    return x.astype(dt)


def _specials(dt: str) -> np.ndarray:
    fi = np.finfo(dt)
    limit = mathlib_trig.SMALL_LIMIT[32 if dt == "float32" else 64]
    t = np.dtype(dt).type
    below = np.nextafter(t(limit), t(0))
    return np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, fi.smallest_subnormal,
                     -fi.smallest_subnormal, fi.smallest_normal, below, -below, 1.0, -1.0,
                     np.pi / 2, -np.pi], dtype=dt)


def _huge(dt: str) -> np.ndarray:
    fi = np.finfo(dt)
    limit = mathlib_trig.SMALL_LIMIT[32 if dt == "float32" else 64]
    return np.array([limit, -limit, fi.max, -fi.max, 1e30, limit * 3.7], dtype=dt)


def _cases(dt: str) -> dict[str, np.ndarray]:
    small = _small(dt, N, 1)
    specials = np.resize(_specials(dt), N)
    mixed = small.copy()
    mixed[::97] = np.resize(_huge(dt), mixed[::97].size)
    one_huge = small.copy()
    one_huge[N - 1] = _huge(dt)[2]  # in the scalar remainder of the loop
    one_huge_mid = small.copy()
    one_huge_mid[N // 2] = _huge(dt)[0]  # exactly the limit: the full pass is needed
    return {"small": small, "specials": specials, "mixed": mixed, "one_huge": one_huge,
            "one_huge_mid": one_huge_mid}


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_elementwise_bit_identical_to_full_function(name: str, dt: str) -> None:
    exe, _ = _unary(name, dt, N)
    full = kernel(name, dt)
    for label, x in _cases(dt).items():
        ours = exe("f", x)
        assert np.array_equal(_bits(ours), _bits(full(x))), label


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_small_variant_equals_full_below_the_limit(name: str, dt: str) -> None:
    """The variant alone (no fallback): the same bits as the full function for |x| < limit,
    NaN and +-inf, and within the library's ulp bound of the true value."""
    x = np.concatenate([_small(dt, 1 << 16, 2), _specials(dt)])
    small = kernel(f"{name}_small", dt)(x)
    assert np.array_equal(_bits(small), _bits(kernel(name, dt)(x)))
    wide = np.float64 if dt == "float32" else np.longdouble
    with np.errstate(invalid="ignore"):
        truth = getattr(np, name)(x.astype(wide)).astype(dt)
    assert ulp_distance(small, truth).max() <= MAX_ULP_TRUE


@pytest.mark.parametrize("op", ["sin", "exp"])
def test_only_kernels_calling_sin_or_cos_get_two_passes(op: str) -> None:
    """The lowered kernel calls the variant and branches to the full pass; after optimization
    the fast pass is vectorized. Other kernels are unchanged."""
    from eqsat.backend import cpu, jit

    _, m = _unary(op, "float32", N)
    text, _ = cpu.lower(m)
    if op == "exp":
        assert "_small" not in text and "trig.full" not in text
        return
    assert "eqsat.sin_small.f32" in text and "trig.full" in text and "eqsat.sin.f32" in text
    opt = str(jit.optimize(text))
    assert any(v in opt for v in ("<16 x float>", "<8 x float>")), "not vectorized"


def test_small_variants_are_not_public_names() -> None:
    assert "sin_small" not in mathlib.NAMES and mathlib.SMALL_VARIANTS["cos"] == "cos_small"


@pytest.mark.parametrize("dt", DTYPES)
def test_fused_map_body_matches_full_functions_interpreter_and_numpy(dt: str) -> None:
    t = "f32" if dt == "float32" else "f64"
    m = _module(f"module @m\n\nfunc @f(%x: {t}[{N}], %y: {t}[{N}]) -> ({t}[{N}]) {{\n"
                f"  %z = map %x, %y, body=mul(sin($0), cos($1)) : {t}[{N}]\n"
                f"  return %z\n}}\n")
    exe = eqsat.compile(m)
    sin, cos = kernel("sin", dt), kernel("cos", dt)
    cases = _cases(dt)
    for label, x in cases.items():
        y = np.roll(cases["mixed" if label == "small" else "small"], 5)
        ours = exe("f", x, y)
        assert np.array_equal(_bits(ours), _bits(sin(x) * cos(y))), label
        with np.errstate(invalid="ignore"):
            ref = eqsat.interpret(m, "f", x, y)
            want = (np.sin(x) * np.cos(y)).astype(dt)
        for other in (ref, want):
            finite = np.isfinite(other)
            assert np.array_equal(np.isnan(ours), np.isnan(other)), label
            np.testing.assert_allclose(ours[finite], other[finite], rtol=1e-5 if dt == "float32"
                                       else 1e-13, atol=1e-6 if dt == "float32" else 1e-14)


def test_unfused_program_through_the_optimizer() -> None:
    """mul(sin x, cos y) written as core ops: whatever kernels the optimizer makes of it, the
    result is the full functions' product."""
    m = _module(f"module @m\n\nfunc @f(%x: f32[{N}], %y: f32[{N}]) -> (f32[{N}]) {{\n"
                f"  %s = sin %x : f32[{N}]\n  %c = cos %y : f32[{N}]\n"
                f"  %z = mul %s, %c : f32[{N}]\n  return %z\n}}\n")
    exe = eqsat.compile(m)
    cases = _cases("float32")
    x, y = cases["mixed"], cases["small"]
    expect = kernel("sin", "float32")(x) * kernel("cos", "float32")(y)
    assert np.array_equal(_bits(exe("f", x, y)), _bits(expect))
    assert np.array_equal(_bits(exe("f", y, x)),
                          _bits(kernel("sin", "float32")(y) * kernel("cos", "float32")(x)))


@pytest.mark.parametrize("name", NAMES)
def test_speed_against_numpy(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Measured, not a benchmark: 4M f32 through eqsat.compile, small arguments and the same
    with one huge element (the second pass runs), interleaved with numpy, medians printed."""
    n = 1 << 22
    exe, _ = _unary(name, "float32", n)
    x = np.random.default_rng(0).uniform(-10, 10, n).astype(np.float32)
    x_huge = x.copy()
    x_huge[n // 3] = 1e30
    fn = getattr(np, name)
    runs: dict[str, list[float]] = {"small": [], "huge": [], "numpy": []}
    for _ in range(15):
        for who, call in (("small", lambda: exe("f", x)), ("huge", lambda: exe("f", x_huge)),
                          ("numpy", lambda: fn(x))):
            t0 = time.perf_counter()
            call()
            runs[who].append((time.perf_counter() - t0) * 1e3)
    med = {w: statistics.median(t) for w, t in runs.items()}
    with capsys.disabled():
        print(f"\n{name} f32 4M: ours small args {med['small']:.2f} ms, one huge "
              f"{med['huge']:.2f} ms, numpy {med['numpy']:.2f} ms (medians)")
    # loose: a second pass costs at most about one more full-function pass
    assert min(runs["small"]) < 8 * min(runs["numpy"])


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dt", DTYPES)
def test_reduction_of_a_trig_body_matches_the_full_functions(dt: str, axis: int) -> None:
    """A map_reduce whose body calls sin takes the cheap pass too (without it, sum(sin(x)) ran
    2-3x slower fused than sin and sum as two kernels); where an element needs the full
    function, the second pass starts the reduction again from its identity."""
    from eqsat.backend import cpu

    t = "f32" if dt == "float32" else "f64"
    shape, kept = (24, 125), 125 if axis == 0 else 24
    m = _module(f"module @m\n\nfunc @f(%x: {t}[24,125]) -> ({t}[{kept}], {t}[{kept}]) {{\n"
                f"  %a = map_reduce %x, body=sin($0), reduce=max, axes=[{axis}] : {t}[{kept}]\n"
                f"  %b = map_reduce %x, body=sin($0), reduce=sum, axes=[{axis}] : {t}[{kept}]\n"
                f"  return %a, %b\n}}\n")
    assert "eqsat.sin_small" in cpu.lower(m)[0]
    exe, full = eqsat.compile(m, optimize=False), kernel("sin", dt)
    for label in ("small", "mixed", "one_huge", "one_huge_mid"):
        x = _cases(dt)[label].reshape(shape)
        top, total = exe("f", x)
        s = full(x.ravel()).reshape(shape)
        assert np.array_equal(_bits(top), _bits(s.max(axis=axis))), label
        np.testing.assert_allclose(total, s.astype(np.float64).sum(axis=axis),
                                   rtol=1e-5 if dt == "float32" else 1e-12, atol=1e-5)
