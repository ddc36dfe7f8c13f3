"""numpy's own functions on traced values (`__array_function__`, NEP 18): each one traced from a
numpy-written model gives numpy's values, dtype and shape; the others are refused at the
user's line."""

from __future__ import annotations

import numpy as np
import pytest
from ad_helpers import check_vjp
from dsl_helpers import rand, run
from math_helpers import ulp_distance

import eqsat
from eqsat import TraceError, f32, f64, function, i32
from eqsat.ir import Module

X = rand((3, 4))
W = rand((4, 2))
V = rand((4,))

# name -> a model written with numpy, run on (x: f32[3, 4], w: f32[4, 2], v: f32[4])
CASES = {
    "where": lambda x, w, v: np.where(x > 0, x, 0.0),
    "where-scalars": lambda x, w, v: np.where(x > 0, 1.0, np.float32(0)),
    "concatenate": lambda x, w, v: np.concatenate([x, x * 2], axis=1),
    "concatenate-none": lambda x, w, v: np.concatenate((x, v), axis=None),
    "stack": lambda x, w, v: np.stack([x, x + 1]),
    "stack-last": lambda x, w, v: np.stack([x, x], axis=-1),
    "dot-2d": lambda x, w, v: np.dot(x, w), "dot-1d": lambda x, w, v: np.dot(v, v),
    "dot-2d-1d": lambda x, w, v: np.dot(x, v), "x.dot": lambda x, w, v: x.dot(w),
    "dot-scalar": lambda x, w, v: np.dot(x, 2.0),
    "matmul": lambda x, w, v: np.matmul(x, w),
    "transpose": lambda x, w, v: np.transpose(x), "swapaxes": lambda x, w, v: np.swapaxes(x, 0, 1),
    "x.swapaxes": lambda x, w, v: np.stack([x, x]).swapaxes(0, 2),
    "moveaxis": lambda x, w, v: np.moveaxis(np.stack([x, x]), 0, -1),
    "moveaxis-many": lambda x, w, v: np.moveaxis(np.stack([x, x]), [0, 1], [2, 0]),
    "expand_dims": lambda x, w, v: np.expand_dims(x, 1),
    "expand_dims-tuple": lambda x, w, v: np.expand_dims(v, (0, 2)),
    "squeeze": lambda x, w, v: np.squeeze(x[None, :, None]),
    "squeeze-axis": lambda x, w, v: np.squeeze(x[None, :, None], axis=2),
    "x.squeeze": lambda x, w, v: x[:, None].squeeze(1),
    "broadcast_to": lambda x, w, v: np.broadcast_to(v, (3, 4)),
    "reshape": lambda x, w, v: np.reshape(x, (2, -1)), "ravel": lambda x, w, v: np.ravel(x),
    "x.flatten": lambda x, w, v: x.flatten(), "x.ravel": lambda x, w, v: x.ravel(),
    "sum": lambda x, w, v: np.sum(x, axis=1, keepdims=True),
    "mean": lambda x, w, v: np.mean(x, axis=-1, keepdims=True),
    "max": lambda x, w, v: np.max(x, axis=0), "amax": lambda x, w, v: np.amax(x),
    "min": lambda x, w, v: np.min(x, axis=(0, 1)),
    "amin": lambda x, w, v: np.amin(x, 1, None, True),
    "clip": lambda x, w, v: np.clip(x, -1, 1), "clip-low": lambda x, w, v: np.clip(x, 0.5, None),
    "clip-high": lambda x, w, v: np.clip(x, None, v), "x.clip": lambda x, w, v: x.clip(-1.5, 0.5),
    "clip-keywords": lambda x, w, v: np.clip(x, min=0),
    "var": lambda x, w, v: np.var(x), "var-axis": lambda x, w, v: np.var(x, axis=0, ddof=1),
    "x.var": lambda x, w, v: x.var(axis=1, keepdims=True),
    "std": lambda x, w, v: np.std(x, axis=1), "x.std": lambda x, w, v: x.std(ddof=1),
    "outer": lambda x, w, v: np.outer(x[0], v), "tile": lambda x, w, v: np.tile(x, (2, 1)),
    "tile-rank": lambda x, w, v: np.tile(v, (2, 1, 3)), "tile-int": lambda x, w, v: np.tile(x, 2),
    "norm": lambda x, w, v: np.linalg.norm(x),
    "norm-axis": lambda x, w, v: np.linalg.norm(x, axis=1),
    "norm-keepdims": lambda x, w, v: np.linalg.norm(x, axis=0, keepdims=True),
    "einsum-matmul": lambda x, w, v: np.einsum("ij,jk->ik", x, w),
    "einsum-batch": lambda x, w, v: np.einsum("bij,bjk->bik", np.stack([x, x]), np.stack([w, w])),
    "einsum-transpose": lambda x, w, v: np.einsum("ij->ji", x),
    "astype": lambda x, w, v: np.astype(x, np.float64),
    "shape-ndim-size":
        lambda x, w, v: x * (np.shape(x)[1] + np.ndim(v) + np.size(x, -1) + np.size(w)),
}


def traced(body):
    def npf_model(x: f32[3, 4], w: f32[4, 2], v: f32[4]):
        return body(x, w, v)

    return function(npf_model)


@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_functions_trace_to_numpys_values_and_dtypes(name):
    want = CASES[name](X, W, V)
    got = run(traced(CASES[name]), X, W, V)
    assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want), name
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_numpy_functions_compile_to_numpys_values():
    def npf_model(x: f32[3, 4], w: f32[4, 2], v: f32[4]):
        h = np.clip(np.dot(x, w), -1, 1) + np.var(x, axis=1, keepdims=True)
        z = np.where(h > 0, h, 0.0) + np.einsum("ij->ji", np.stack([v[:3], v[1:]]))
        return np.concatenate([z, np.expand_dims(x.std(axis=1), 1)], axis=1).ravel()

    f = function(npf_model)
    want = npf_model(X, W, V)
    got = eqsat.compile(Module(f))(f.name, X, W, V)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_integer_inputs_take_numpys_dtypes():
    def npf_model(n: i32[3, 4]):
        return (np.var(n, axis=0), np.clip(n, -1.5, 2), np.linalg.norm(n), np.stack([n, n]),
                np.where(n > 0, n, 0))

    n = rand((3, 4), np.int32)
    for g, w in zip(run(function(npf_model), n), npf_model(n)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_var_with_ddof_at_the_count_is_numpys_inf():
    def npf_model(x: f64[3]):
        return np.var(x, ddof=3)

    x = np.array([1.0, 2.0, 4.0])
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"), np.errstate(divide="ignore"):
        want = npf_model(x)
    assert run(function(npf_model), x) == want == np.inf


@pytest.mark.parametrize("body", [
    lambda x: np.where(x > 0, x, -x) * np.clip(x, -0.5, 0.7),
    lambda x: np.var(x, axis=1) + np.std(x, axis=0).sum(),
    lambda x: np.linalg.norm(np.stack([x, x * x]), axis=0),
])
def test_gradients_through_numpy_functions_match_central_differences(body):
    def npf_loss(x: f64[3, 4]):
        return np.sum(body(x))

    f = function(npf_loss)
    check_vjp(Module(f), f.name, [rand((3, 4), np.float64)], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("body, fragment", [
    (lambda x: np.cumsum(x), "numpy's cumsum cannot run on traced values"),
    (lambda x: np.square(x > 0), "square of a bool tensor"),
    (lambda x: np.fmod(x, 2.0), "numpy's fmod (__call__) cannot run"),
    (lambda x: np.sort(x), "numpy's sort cannot run"),
    (lambda x: np.flip(x), "numpy's flip cannot run"),
    (lambda x: np.where(x > 0), "np.where(condition) without x and y"),
    (lambda x: np.dot(np.stack([x, x]), x), "dot of rank 3 and 2 operands"),
    (lambda x: np.einsum("ii->i", x), "np.einsum('ii->i') cannot be traced"),
    (lambda x: np.einsum("ij,jk", x, x), "explicit '->'"),
    (lambda x: np.linalg.norm(x, ord=1), "norm(ord=1) cannot be traced"),
    (lambda x: np.var(x, out=x), "var(out=...) cannot be traced"),
    (lambda x: np.squeeze(x, axis=0), "cannot select an axis to squeeze out"),
    (lambda x: np.stack([x, x[:1]]), "must have the same shape"),
])
def test_other_numpy_functions_are_trace_errors_at_the_users_line(body, fragment):
    def npf_model(x: f32[3, 3]):
        return body(x)

    with pytest.raises(TraceError, match=r"test_dsl_numpy_functions.py:\d+: ") as err:
        function(npf_model)
    assert fragment in str(err.value)


def _wide(dtype) -> np.ndarray:
    """Positive values across the range (powers of 2 and 10 among them), then 0, 1, inf, NaN."""
    rng = np.random.default_rng(1)
    hi = 80 if dtype == np.float32 else 700
    x = np.concatenate([np.exp(rng.uniform(-hi, hi, 2000)), rng.uniform(0, 4, 2000),
                        2.0 ** np.arange(-60, 60), 10.0 ** np.arange(-30, 30),
                        [0.0, 1.0, np.inf, np.nan]])
    with np.errstate(over="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_ufuncs_composed_of_ir_ops_are_within_three_ulps(dtype):
    """log2 and log10 are log then a division by a rounded constant: an ulp from log (compiled
    code's f64 log is within one of numpy's), half from the constant, half from the division,
    against numpy's own log10 (libm's where numpy has no SIMD loop for the host)."""
    def npf_model(x: f64[4184], y: f64[4184]):
        return np.log2(x), np.log10(x), np.exp2(y), np.square(y), np.sign(y)

    npf_model.__annotations__ = {"x": eqsat.DType.of(np.dtype(dtype))[4184],
                             "y": eqsat.DType.of(np.dtype(dtype))[4184]}
    x = _wide(dtype)
    y = np.concatenate([np.random.default_rng(2).uniform(-120, 120, 4176),
                        [0.0, -0.0, 1.0, -3.0, np.inf, -np.inf, np.nan, 2.5]]).astype(dtype)
    f = function(npf_model)
    with np.errstate(all="ignore"):
        want = npf_model(x, y)
        for got in (run(f, x, y), eqsat.compile(Module(f))(f.name, x, y)):
            for name, g, w in zip(["log2", "log10", "exp2", "square", "sign"], got, want):
                assert g.dtype == w.dtype == dtype, name
                assert ulp_distance(g, w).max() <= (0 if name in ("square", "sign") else 3), name
                np.testing.assert_array_equal(np.signbit(g), np.signbit(w), err_msg=name)


def test_numpy_ufuncs_of_integers_take_numpys_dtypes():
    def npf_model(n: i32[5]):
        return np.square(n), np.sign(n), np.exp2(n), np.log2(n)

    n = np.array([-3, 0, 1, 4, 7], np.int32)
    with np.errstate(all="ignore"):
        for g, w in zip(run(function(npf_model), n), npf_model(n)):
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-15)


class Duck:
    """A foreign duck array (as dask's, xarray's): it implements np.concatenate only."""

    def __array_function__(self, func, types, args, kwargs):
        return "duck" if func is np.concatenate else NotImplemented


class DuckArray(np.ndarray):
    """A foreign ndarray subclass with a protocol of its own: np.where only."""

    def __array_function__(self, func, types, args, kwargs):
        return "duck array" if func is np.where else NotImplemented


def test_numpy_functions_leave_foreign_array_types_their_turn():
    """Tracer's __array_function__ ignored `types`: it ran (or refused with a TraceError) numpy
    functions of a traced value and a foreign array type, which never got its turn (NEP 18:
    an unknown type in `types` means NotImplemented; numpy raises TypeError if nobody takes
    the call). Plain numpy arrays and scalars still meet traced values as before."""
    got = {}

    def npf_model(x: f32[3, 4]):
        got["concatenate"] = np.concatenate([x, Duck()])
        got["where"] = np.where(x > 0, x, np.zeros((3, 4), np.float32).view(DuckArray))
        with pytest.raises(TypeError, match="no implementation found for 'numpy.stack'"):
            np.stack([x, Duck()])
        with pytest.raises(TraceError, match="arrays are not captured as constants"):
            np.where(x > 0, x, np.zeros((3, 4), np.float32))
        with pytest.raises(TraceError, match="arrays are not captured as constants"):
            np.concatenate([x, np.ma.zeros((3, 4), np.float32)])
        return np.where(x > 0, np.float32(2), x) + np.clip(x, np.float32(-0.5), 1.0)

    f = function(npf_model)
    assert got == {"concatenate": "duck", "where": "duck array"}
    want = np.where(X > 0, np.float32(2), X) + np.clip(X, np.float32(-0.5), 1.0)
    np.testing.assert_array_equal(run(f, X), want)


class UfuncDuck:
    """A foreign duck array with its own __array_ufunc__ (NEP 13): np.add only, and the
    reflected + and the comparison > as operators."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return "duck add" if ufunc is np.add else NotImplemented

    def __radd__(self, other):
        return "duck radd"

    def __gt__(self, other):
        return "duck gt"


class NoUfuncs:
    """A type that refuses numpy's ufuncs (`__array_ufunc__ = None`) but has a reflected *."""

    __array_ufunc__ = None

    def __rmul__(self, other):
        return "no-ufuncs rmul"


def test_ufuncs_and_operators_leave_foreign_types_their_turn():
    """Tracer's __array_ufunc__ and operators raised eqsat's TraceError ("cannot combine
    f32[3,4] with a UfuncDuck") for a foreign type with its own __array_ufunc__, which never got
    its turn. NEP 13: the ufunc returns NotImplemented (numpy raises TypeError if nobody takes
    the call) and the operators too (Python asks the reflected operator). Types without the
    protocol and numpy's arrays are traced or refused as before."""
    got = {}

    def npf_model(x: f32[3, 4]):
        got["np.add"], got["np.add reflected"] = np.add(x, UfuncDuck()), np.add(UfuncDuck(), x)
        got["out"] = np.add(x, x, out=(UfuncDuck(),))
        got["+"], got["<"] = x + UfuncDuck(), x < UfuncDuck()
        got["*"] = x * NoUfuncs()
        for call in (lambda: np.multiply(x, UfuncDuck()), lambda: np.add(x, NoUfuncs()),
                     lambda: x - UfuncDuck(), lambda: UfuncDuck() + x,
                     lambda: x ** UfuncDuck(), lambda: x % UfuncDuck(), lambda: x @ NoUfuncs()):
            with pytest.raises(TypeError) as err:
                call()
            assert not isinstance(err.value, TraceError), err.value
        with pytest.raises(TraceError, match="cannot combine f32\\[3,4\\] with a Duck"):
            np.add(x, Duck())  # NEP 18's duck has no __array_ufunc__ of its own
        with pytest.raises(TraceError, match="cannot combine f32\\[3,4\\] with a str"):
            x + "2"
        with pytest.raises(TraceError, match="arrays are not captured as constants"):
            x + np.ma.zeros((3, 4), np.float32)
        return x + 1.0

    f = function(npf_model)
    assert got == {"np.add": "duck add", "np.add reflected": "duck add", "out": "duck add",
                   "+": "duck radd", "<": "duck gt", "*": "no-ufuncs rmul"}
    np.testing.assert_array_equal(run(f, X), X + 1)
