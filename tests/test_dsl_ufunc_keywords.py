"""numpy's ufunc keywords on traced values: `dtype=` and `casting=` choose numpy's loop and cast
the operands to it (numpy's values and dtypes, numpy's refusals); `out=`, `where=`, `order=`,
`signature=` and a gufunc's `axes=` are refused by name at the user's line unless at a value
that changes nothing (`where=True`, `order="K"`, `subok=`)."""

import os

import numpy as np
import pytest
from dsl_helpers import run

import eqsat
from eqsat import TraceError, f32, function
from eqsat.ir.types import DType

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]
VALUES = {"f": [0.5, 1.5, 2.0], "i": [1, 2, 3], "b": [True, False, True]}
UNARY = [np.sinh, np.exp, np.sqrt, np.negative, np.absolute, np.floor, np.isnan, np.square]
BINARY = [np.add, np.subtract, np.multiply, np.divide, np.power, np.maximum, np.fmax, np.less,
          np.equal, np.hypot, np.logaddexp]


def traced(body, dtype):
    t = DType.of(np.dtype(dtype))

    @function
    def f(x: t[3]):
        return body(x)

    return f


def check(body, x, label):
    """`body(x)` traced gives numpy's dtype and values where numpy computes it; where numpy
    refuses it (a TypeError), tracing is a TraceError at this file's line; eqsat refuses
    only arithmetic on bools, as it does without keywords."""
    try:
        with np.errstate(all="ignore"):
            want = body(x)
    except TypeError:
        with pytest.raises(TraceError) as err:
            traced(body, x.dtype)
        assert err.value.filename.endswith(os.path.basename(__file__)), label
        return
    try:
        f = traced(body, x.dtype)
    except TraceError as e:  # eqsat has no arithmetic on bools, with dtype= or without
        assert want.dtype == np.bool_ and "needs a numeric operand" in str(e), (label, str(e))
        return
    got = run(f, x)
    assert got.dtype == want.dtype, (label, got.dtype, want.dtype)
    rtol = 1e-5 if got.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=rtol, err_msg=label)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("tdt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_keyword_computes_in_numpys_loop(tdt, dtype):
    """`np.sinh(x, dtype=np.float64)` was refused ("numpy's sinh (__call__) cannot run on
    traced values"), naming no keyword; numpy casts the operands to the loop its dtype picks
    (same_kind casting), computes there and refuses what that rule forbids."""
    x = np.array(VALUES[np.dtype(tdt).kind], tdt)
    for u in UNARY:
        check(lambda x, u=u: u(x, dtype=dtype), x, f"{u.__name__}(x)")
    for u in BINARY:
        check(lambda x, u=u: u(x, x, dtype=dtype), x, f"{u.__name__}(x, x)")
        check(lambda x, u=u: u(x, 2, dtype=dtype), x, f"{u.__name__}(x, 2)")
        check(lambda x, u=u: u(np.float32(2), x, dtype=dtype), x, f"{u.__name__}(f32, x)")


def test_casting_keyword_is_numpys():
    x = np.array([0.5, 1.5, -2.25], np.float32)
    for body in (lambda x: np.add(x, 2.5, dtype=np.int32, casting="unsafe"),
                 lambda x: np.add(x, np.float64(1), casting="no"),
                 lambda x: np.add(x, x, casting="no"), lambda x: np.add(x, 1, casting="equiv"),
                 lambda x: np.multiply(x, np.float64(2), casting="safe"),
                 lambda x: np.sinh(x, dtype=np.float64, casting="safe")):
        check(body, x, "casting")
    with pytest.raises(TraceError, match=r"add\(dtype=.*float16.*\) computes in float16, "
                                         r"which eqsat lacks"):
        traced(lambda x: np.add(x, 1, dtype=np.float16), np.float32)
    f = traced(lambda x: np.sinh(x, dtype=eqsat.f64), np.float32)  # eqsat's dtypes too
    assert f.signature.results[0] == eqsat.f64[3]


REFUSED = {  # marker: (body, message); each body sits on the marked line below
    "out": (lambda x: np.sinh(x, out=x), "sinh(out=...) cannot be traced: traced values are "
                                         "never written in place; use the result"),
    "out-tuple": (lambda x: np.add(x, 1, out=(x,)), "add(out=...) cannot be traced"),
    "where": (lambda x: np.exp(x, where=x > 0), "exp(where=...) cannot be traced: compute "
                                                "every element and choose with np.where"),
    "order": (lambda x: np.sinh(x, order="F"), "sinh(order=...) cannot be traced: traced "
                                               "values are row-major"),
    "signature": (lambda x: np.add(x, x, signature=(None, None, "f8")),
                  "add(signature=...) cannot be traced: give dtype= instead"),
    "axes": (lambda x: np.matmul(x, x, axes=[(0,), (0,), ()]),
             "matmul(axes=...) cannot be traced: only its default"),
    "dtype": (lambda x: np.add(x, 1, dtype=np.int32), "add(dtype=<class 'numpy.int32'>) cannot "
                                                      "be traced: Cannot cast ufunc 'add' input"),
    "casting": (lambda x: np.add(x, 1.0, casting="nonsense"), "add(casting='nonsense')"),
}


@pytest.mark.parametrize("marker", sorted(REFUSED))
def test_other_keywords_are_refused_by_name_at_the_users_line(marker):
    body, message = REFUSED[marker]
    with pytest.raises(TraceError) as err:
        traced(body, np.float32)
    assert message in str(err.value), str(err.value)
    line = body.__code__.co_firstlineno
    assert err.value.filename.endswith(os.path.basename(__file__)) and err.value.lineno == line


def test_keywords_at_values_that_change_nothing_trace():
    def body(x: f32[3]):
        return (np.sinh(x, where=True), np.add(x, 1, order="K"), np.exp(x, subok=False),
                np.add(x, x, casting="same_kind", order="C", subok=True), np.sinh(x, out=None))

    x = np.array([0.5, -1.5, 2.0], np.float32)
    for got, want in zip(run(function(body), x), body(x)):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5)
