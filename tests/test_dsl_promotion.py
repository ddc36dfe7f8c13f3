"""numpy scalars in traced code promote as numpy 2 does (NEP 50): np.float64(2), np.sqrt(4) and
np.int64(1) are strongly typed, so `f32 tensor / np.sqrt(4)` is f64, while Python scalars
(2, 0.5, np.pi) are weak: they take the tensor's dtype unless their kind is higher. Every case runs the traced function and
the same code in numpy on the same arrays and compares values and dtypes."""

import linecache
import operator
import os
import warnings
from typing import Any

import numpy as np
import pytest

import eqsat
from eqsat.errors import TraceError
from eqsat.ir.dsl import function
from eqsat.ir.types import DType

from dsl_helpers import OPERATORS, refused, run

TRACED = [np.float32, np.float64, np.int32, np.int64, np.bool_]
SCALARS = [np.float32, np.float64, np.int32, np.int64, np.bool_]
# integers stay positive so that numpy's integer ** never meets a negative exponent
VALUES = {"f": [-1.5, 0.5, 2.0, 3.0], "i": [1, 2, 3, 5], "b": [True, False, True, False]}
COND = np.array([True, False, False, True])


def cases(s):
    """(label, kind, the traced body of x and c, the same in numpy) for numpy scalar `s`."""
    out = []
    for sym, stem in OPERATORS.items():
        op = getattr(operator, stem)

        def forward(x, c, op=op):
            return op(x, s)

        def swapped(x, c, op=op):  # numpy's scalar hands x to the ufunc (__array_ufunc__)
            return op(s, x)

        out += [(f"x {sym} s", sym, forward, forward), (f"s {sym} x", sym, swapped, swapped)]
        if sym in ("+", "-", "*", "/", "//", "**"):
            # Python's reflected operator, which a scalar deferring to the tensor reaches
            out.append((f"x.__r{stem}__(s)", sym,
                        lambda x, c, stem=stem: getattr(x, f"__r{stem}__")(s), swapped))
    for name in ("maximum", "minimum"):
        np_fn, eq_fn = getattr(np, name), getattr(eqsat, name)
        out += [(f"np.{name}(x, s)", name, lambda x, c, f=np_fn: f(x, s),
                 lambda x, c, f=np_fn: f(x, s)),
                (f"eqsat.{name}(s, x)", name, lambda x, c, f=eq_fn: f(s, x),
                 lambda x, c, f=np_fn: f(s, x))]
    return out + [("where(c, x, s)", "where", lambda x, c: eqsat.where(c, x, s),
                   lambda x, c: np.where(c, x, s)),
                  ("where(c, s, x)", "where", lambda x, c: eqsat.where(c, s, x),
                   lambda x, c: np.where(c, s, x))]


def traced_function(body, t: DType):
    """`body(x, c)` traced with x of dtype `t` and a bool condition c, both of shape [4]."""
    @function
    def f(x: t[4], c: DType.bool[4]):
        return body(x, c)

    return f


def check_cases(tdt: type, s: Any) -> None:
    """Every case of `cases(s)` on a tensor of `tdt`: numpy's dtype and values, or a
    TraceError at the user's line where eqsat has no op for the promoted operation."""
    t = DType.of(np.dtype(tdt))
    x = np.array(VALUES[np.dtype(tdt).kind], tdt)
    for label, kind, body, reference in cases(s):
        # numpy's power has no bool loop: a bool tensor to a Python int power is int8, not
        # an eqsat dtype, and refused
        bool_power = label == "x ** s" and tdt is np.bool_ and type(s) is int
        if refused(kind, np.result_type(x, s)) or bool_power:
            with pytest.raises(TraceError) as err:
                traced_function(body, t)
            assert err.value.filename.endswith(os.path.basename(__file__)), label
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            want = reference(x, COND)
            got = run(traced_function(body, t), x, COND)
        assert got.dtype == want.dtype, (label, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=label)


@pytest.mark.parametrize("sdt", SCALARS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("tdt", TRACED, ids=lambda d: np.dtype(d).name)
def test_numpy_scalars_promote_as_numpy_does(tdt, sdt):
    check_cases(tdt, sdt(True) if sdt is np.bool_ else sdt(2))


@pytest.mark.parametrize("sdt", SCALARS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("tdt", TRACED, ids=lambda d: np.dtype(d).name)
def test_zero_d_arrays_trace_as_the_numpy_scalars_they_hold(tdt, sdt):
    """A 0-d array (np.array(2.0, np.float32)) is strongly typed like a numpy scalar in
    numpy 2 (NEP 50); operators, ufuncs and eqsat's functions refused it ("cannot combine
    f32[4] with a numpy array of shape ()") where comparisons took it. Each case gives numpy's
    values and dtype, and the very IR the numpy scalar of the same dtype gives."""
    value = np.array(True if sdt is np.bool_ else 2, sdt)
    check_cases(tdt, value)
    t = DType.of(np.dtype(tdt))
    for (label, kind, body, _), (_, _, scalar_body, _) in zip(cases(value), cases(value[()])):
        if refused(kind, np.result_type(tdt, sdt)):
            continue
        assert str(traced_function(body, t)) == str(traced_function(scalar_body, t)), label


def test_zero_d_arrays_in_numpy_functions_and_n_d_arrays_still_refused():
    def body(x: DType.f32[3], n: DType.i32[3]):
        lo = np.array(-0.5, np.float32)
        return (np.clip(x, lo, 1.0), x * np.array(2.0, np.float32), n * np.array(2.0),
                np.where(np.array(True), x, np.array(3, np.int64)), x ** np.array(0.5),
                np.fmax(x, lo), np.hypot(n, np.array(3, np.int8)),
                np.array(1.5, np.float32) < x)

    x, n = np.array([-2.0, 0.25, 3.0], np.float32), np.array([1, -2, 3], np.int32)
    with np.errstate(invalid="ignore"):
        want = body(x, n)
    for got, w in zip(run(function(body), x, n), want):
        assert got.dtype == w.dtype
        np.testing.assert_allclose(got, w, rtol=2e-7)

    @function
    def norm(x: DType.f32[2, 3]):
        return eqsat.layer_norm(x, eps=np.array(1e-5))

    assert norm.signature.results[0] == DType.f32[2, 3]  # as for eps=np.float64(1e-5)
    with pytest.raises(TraceError, match=r"mul: cannot combine f32\[3\] with a numpy array "
                                         r"of shape \(1,\) \(arrays are not captured"):
        @function
        def g(x: DType.f32[3]):
            return x * np.ones(1, np.float32)


@pytest.mark.parametrize("s", [0.5, 2, True], ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("tdt", TRACED, ids=lambda d: np.dtype(d).name)
def test_python_scalars_are_weak_and_change_only_the_kind(tdt, s):
    """A Python scalar takes the traced dtype unless its kind is higher: an i32 tensor with
    0.5 is f64, a bool tensor with 2 is i64, an f32 tensor with 0.5 stays f32 (numpy 2)."""
    check_cases(tdt, s)


def test_user_code_with_numpy_and_python_scalars():
    # np.sqrt(4) and np.int64(3) are strongly typed, np.pi and 0.5 are Python floats (weak)
    def body(x: DType.f32[4], n: DType.i32[4], w: DType.f64[4]):
        return (x / np.sqrt(4), np.pi * x, np.float32(0.5) * x, x + np.int64(3), 0.5 * x,
                n + np.int64(1), n + np.int32(1), n * 2, w * np.float32(2), x * np.float32(2))

    x = np.array([1.0, -2.5, 0.1, 3.0], np.float32)
    n, w = np.array([1, -2, 3, 4], np.int32), np.array([0.1, 2.0, -3.0, 1e300])
    for got, want in zip(run(function(body), x, n, w), body(x, n, w)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_comparisons_happen_in_the_promoted_dtype():
    # f32(0.1) is not f64(0.1): numpy compares in f64, where the two differ
    def body(x: DType.f32[3]):
        return (x == np.float64(0.1), x < np.float64(0.1), np.float64(0.1) < x, x == 0.1,
                x * np.float64(0.1))

    x = np.array([0.1, 0.2, 1 / 3], np.float32)
    got, want = run(function(body), x), body(x)
    assert [bool(w[0]) for w in want[:4]] == [False, False, True, True]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_a_value_an_f32_tensor_cannot_hold_promotes_instead_of_overflowing():
    def body(x: DType.f32[2], n: DType.i32[2]):
        return x + np.float64(1e39), np.maximum(x, np.float64(-1e300)), n + np.int64(2 ** 40)

    x, n = np.array([1.0, -2.0], np.float32), np.array([3, -4], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning: nothing overflows
        f = function(body)
    for got, want in zip(run(f, x, n), body(x, n)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_power_of_a_numpy_one_half_is_sqrt_in_the_promoted_dtype():
    def body(x: DType.f32[4], n: DType.i32[4]):
        return x ** np.float64(0.5), n ** np.float64(0.5), x ** np.float32(0.5)

    x = np.array([-np.inf, -0.0, 2.0, 3.0], np.float32)
    n = np.array([-1, 0, 2, 3], np.int32)
    f = function(body)
    assert [s.op for s in f.ir.body].count("sqrt") == 3
    with np.errstate(invalid="ignore"):
        want = body(x, n)
        for got in (run(f, x, n), eqsat.compile(f)(f.name, x, n)):
            for g, w in zip(got, want):
                assert g.dtype == w.dtype
                np.testing.assert_array_equal(g, w)
                np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


@pytest.mark.parametrize("tdt, scalar", [
    (np.float32, np.float16(2)), (np.int32, np.float16(2)), (np.int32, np.int8(-3)),
    (np.int32, np.uint8(3)), (np.int32, np.uint32(3)), (np.int64, np.uint64(2 ** 63 + 5)),
])
def test_other_numpy_scalars_promote_to_an_eqsat_dtype_as_numpy_does(tdt, scalar):
    t = DType.of(np.dtype(tdt))
    x = np.array([1, -2], tdt)

    @function
    def f(x: t[2]):
        return x + scalar, scalar * x

    for got, want in zip(run(f, x), (x + scalar, scalar * x)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("tdt, scalar", [
    (np.bool_, np.float16(2)), (np.float32, np.longdouble(2)), (np.float32, np.complex64(1j)),
    (np.bool_, np.int8(2)), (np.bool_, np.uint64(2)),
])
def test_a_promotion_to_a_dtype_eqsat_lacks_is_an_error_at_the_line(tdt, scalar):
    t = DType.of(np.dtype(tdt))
    result = np.result_type(tdt, scalar)
    with pytest.raises(TraceError, match=rf"add: numpy promotes {t}\[2\] with the numpy scalar "
                                         rf".* to {result}, which is not an eqsat dtype") as err:
        @function
        def f(x: t[2]):
            return x + scalar
    assert err.value.filename.endswith(os.path.basename(__file__))
    assert linecache.getline(__file__, err.value.lineno).strip() == "return x + scalar"


def test_layer_norm_takes_eps_in_the_dtype_of_x():
    @function
    def f(x: DType.f32[2, 3]):
        return eqsat.layer_norm(x, eps=np.float64(1e-5))

    assert f.signature.results[0] == DType.f32[2, 3]


def test_where_of_two_scalars_takes_numpys_dtype_for_them():
    """np.where(c, 1.0, 0.0) is f64, (c, 1, 0) i64, two np.float32s f32: the scalars' own
    dtype as numpy 2 gives it, since no traced value decides one."""
    def body(x: DType.f32[4]):
        c = x > 0
        return (eqsat.where(c, 1.0, 0.0), eqsat.where(c, 1, 0), eqsat.where(c, 2, 0.5),
                eqsat.where(c, np.float32(1), np.float32(0)), eqsat.where(c, True, False))

    x = np.array([1.0, -1.0, 0.0, 2.0], np.float32)
    c = x > 0
    want = (np.where(c, 1.0, 0.0), np.where(c, 1, 0), np.where(c, 2, 0.5),
            np.where(c, np.float32(1), np.float32(0)), np.where(c, True, False))
    for got, w in zip(run(function(body), x), want):
        assert got.dtype == w.dtype
        np.testing.assert_array_equal(got, w)

    def half(x: DType.f32[4]):
        return eqsat.where(x > 0, np.float16(1), np.float16(0))

    with pytest.raises(TraceError, match="dtype eqsat lacks"):
        function(half)


def test_float_functions_and_reductions_of_integers_take_numpys_dtypes():
    """np.exp of an i32 tensor is f64, as are its mean and sqrt; the sum of an i32 or bool
    tensor is i64 (numpy's default integer), its max keeps i32."""
    def body(n: DType.i32[2, 3], m: DType.i64[2, 3], b: DType.bool[2, 3]):
        return (np.exp(n), np.sqrt(m), np.tanh(n), np.log(m), np.sin(n), np.cos(m),
                n.sum(), m.sum(axis=0), b.sum(axis=1), np.sum(n, axis=()), n.mean(),
                b.mean(axis=0), m.mean(axis=1, keepdims=True), n.max(), b.max(axis=0))

    n = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    m, b = n.astype(np.int64) * 3, n > 2
    for got, want in zip(run(function(body), n, m, b), body(n, m, b)):
        assert got.dtype == np.asarray(want).dtype
        np.testing.assert_allclose(got, want, rtol=1e-15)
