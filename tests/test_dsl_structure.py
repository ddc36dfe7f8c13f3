"""numpy's structural functions traced (np.tensordot, pad, diagonal, trace, diag, tril, triu):
numpy's values bit for bit (inf and NaN included), dtypes and shapes, through the interpreter
and compiled code, with gradients that match central differences."""

from __future__ import annotations

import numpy as np
import pytest
from ad_helpers import check_vjp
from hypothesis import given, settings
from hypothesis import strategies as st

import eqsat
from eqsat import TraceError, f32, f64
from eqsat.ir import Module, interpret

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]


def _values(shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
    """Random values; floats include inf, -inf, NaN and -0.0 (which a multiply by a 0/1 mask
    would turn into NaN or +0.0)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-9, 10, shape).astype(dtype)
    x = rng.standard_normal(shape).astype(dtype)
    specials = np.array([np.inf, -np.inf, np.nan, -0.0], dtype)
    flat = x.reshape(-1)
    flat[: min(4, flat.size)] = specials[: min(4, flat.size)]
    return rng.permutation(flat).reshape(shape)


def _traced(body, *types):
    if len(types) == 1:
        def structure_model(a):
            return body(a)
    else:
        def structure_model(a, b):
            return body(a, b)
    structure_model.__annotations__ = dict(zip("ab", types))
    return eqsat.function(structure_model)


def _check(body, *arrays, compiled: bool = True) -> None:
    types = [eqsat.DType.of(a.dtype)[a.shape] for a in arrays]
    f = _traced(body, *types)
    want = body(*arrays)
    m = Module(f)
    runs = [interpret(m, f.name, *arrays)]
    if compiled:
        runs.append(eqsat.compile(m)(f.name, *arrays))
    for got in runs:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        if want.dtype.kind == "f":
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5), m=st.integers(0, 6), k=st.integers(-7, 8),
       dtype=st.sampled_from(DTYPES), batch=st.sampled_from([(), (2,)]))
def test_triangles_and_diagonals_are_numpys_for_any_offset(n, m, k, dtype, batch):
    x = _values(batch + (n, m), dtype, seed=n * 100 + m)
    _check(lambda a: np.tril(a, k), x, compiled=False)
    _check(lambda a: np.triu(a, k), x, compiled=False)
    _check(lambda a: np.diagonal(a, k, -2, -1), x, compiled=False)
    if not batch:
        _check(lambda a: np.trace(a, k), x, compiled=False)
        _check(lambda a: np.diag(a, k), x, compiled=False)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 6), k=st.integers(-3, 3), dtype=st.sampled_from(DTYPES))
def test_diag_of_a_vector_is_numpys(n, k, dtype):
    _check(lambda a: np.diag(a, k), _values((n,), dtype, seed=n), compiled=False)


@pytest.mark.parametrize("body, shapes", [
    (lambda a: np.tril(a, -1) + np.triu(a, 2), [(5, 7)]),
    (lambda a: np.triu(a), [(3, 4, 4)]),
    (lambda a: a.diagonal(1, 0, 2) * 2, [(3, 4, 5)]),
    (lambda a: np.trace(a, -1), [(6, 4)]),
    (lambda a: np.diag(a[:, 0], -2), [(4, 3)]),
    (lambda a: np.pad(a, ((1, 2), (0, 3))), [(3, 4)]),
    (lambda a: np.pad(a, 2, constant_values=-1.5), [(2, 3)]),
    (lambda a: np.pad(a, (1,)), [(4,)]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hand_written_uses_compile_to_numpys_values(body, shapes, dtype):
    _check(body, *[_values(s, dtype, seed=i) for i, s in enumerate(shapes)])


@pytest.mark.parametrize("axes, shapes", [
    (2, [(2, 3, 4), (3, 4, 5)]), (0, [(2, 3), (4,)]), (([0, 2], [2, 1]), [(2, 3, 4), (5, 4, 2)]),
    ((1, 0), [(3, 0), (0, 2)]), (np.array([[1], [0]]), [(3, 4), (4, 2)]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tensordot_compiles_to_numpys_products(axes, shapes, dtype):
    """Close, not equal: numpy's tensordot and eqsat's matmul may add in different orders."""
    a, b = (np.random.default_rng(i).standard_normal(s).astype(dtype)
            for i, s in enumerate(shapes))
    f = _traced(lambda x, y: np.tensordot(x, y, axes), *(eqsat.DType.of(v.dtype)[v.shape]
                                                         for v in (a, b)))
    want = np.tensordot(a, b, axes)
    for got in (interpret(Module(f), f.name, a, b), eqsat.compile(Module(f))(f.name, a, b)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_tensordot_promotes_as_numpy_does():
    a, b = _values((2, 3), np.int32), _values((3, 2), np.float32, seed=1)
    b = np.nan_to_num(b, posinf=1.0, neginf=-1.0)
    _check(lambda x, y: np.tensordot(x, y, axes=1), a, b, compiled=False)


@pytest.mark.parametrize("body", [
    lambda a: np.sum(np.tril(a, 1) * np.triu(a, -1)),
    lambda a: np.trace(a @ a.T) + np.diagonal(a, 1).sum(),
    lambda a: np.sum(np.diag(np.diag(a)) ** 2),
    lambda a: np.sum(np.pad(a, 1, constant_values=2.0) ** 2),
    lambda a: np.sum(np.tensordot(a, a, axes=([0], [0])) ** 2),
])
def test_gradients_match_central_differences(body):
    f = _traced(lambda a: body(a), f64[4, 3])
    x = np.random.default_rng(3).standard_normal((4, 3))
    check_vjp(Module(f), f.name, [x], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("body, fragment", [
    (lambda a: np.pad(a, 1, mode="edge"), "only mode='constant'"),
    (lambda a: np.pad(a, ((1, 2), (3, 4), (5, 6))), "does not fit 2 axes"),
    (lambda a: np.pad(a, -1), "widths must be >= 0"),
    (lambda a: np.pad(a, 1, constant_values=(1, 2)), "one scalar"),
    (lambda a: np.pad(a, 1, constant_values=a[0, 0]), "one scalar"),
    (lambda a: np.tensordot(a, a, axes=3), "cannot sum over 3 axes"),
    (lambda a: np.tensordot(a, a[:2], axes=([0], [0])), "shape mismatch"),
    (lambda a: np.tensordot(a, a, axes=([0, 0], [1, 1])), "repeated axes"),
    (lambda a: np.diagonal(a, 0, 1, 1), "axis1 and axis2 cannot be the same"),
    (lambda a: np.diagonal(a[0]), "needs at least 2 axes"),
    (lambda a: np.tril(a[0]), "needs at least 2 axes"),
    (lambda a: np.diag(a[None]), "1-d or 2-d"),
    (lambda a: np.trace(a, out=a), "trace(out=...) cannot be traced"),
])
def test_what_numpy_refuses_or_eqsat_cannot_trace_is_a_trace_error(body, fragment):
    def structure_model(a: f32[3, 3]):
        return body(a)

    with pytest.raises(TraceError, match=r"test_dsl_structure.py:\d+: ") as err:
        eqsat.function(structure_model)
    assert fragment in str(err.value)


@pytest.mark.parametrize("body", [
    lambda a: np.zeros_like(a) + a, lambda a: np.ones_like(a), lambda a: np.full_like(a, 2.5),
    lambda a: np.full_like(a, 2.5, dtype=np.int32), lambda a: np.zeros_like(a, dtype=bool),
    lambda a: np.ones_like(a, shape=(2, 5)), lambda a: np.full_like(a, a[0, 1]),
    lambda a: np.full_like(a, a[0], dtype=np.float64),
    lambda a: np.full_like(a, -np.inf),
])
def test_like_constants_are_numpys(body):
    x = np.nan_to_num(_values((3, 4), np.float32), nan=1.0, posinf=2.0, neginf=-2.0)
    _check(body, x)


def test_like_constants_of_integer_arrays_cast_as_numpy_does():
    _check(lambda a: np.full_like(a, 7.9), _values((2, 3), np.int64))
    _check(lambda a: np.ones_like(a), _values((2, 3), np.bool_))


def test_empty_like_is_zeros_of_its_shape_and_dtype():
    """numpy's empty_like holds whatever memory held; a traced one is a constant, zeros."""
    f = _traced(lambda a: np.empty_like(a, dtype=np.int32), f32[2, 3])
    got = interpret(Module(f), f.name, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.int32))
    assert got.dtype == np.int32
