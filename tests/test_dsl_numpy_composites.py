"""numpy's ufuncs that trace as composites of IR ops (np.fmax fmin floor ceil trunc isnan isinf
isfinite): numpy's dtypes, numpy's values over the whole range (0, -0.0, subnormal, huge, inf,
NaN) through the interpreter and through compiled (optimized) code, and gradients that match
central differences."""

from __future__ import annotations

import numpy as np
import pytest
from ad_helpers import check_vjp
from dsl_helpers import run
from math_helpers import ulp_distance

import eqsat
from eqsat import bool_, f32, f64, function, i32
from eqsat.ir import Module

UNARY = ["floor", "ceil", "trunc", "isnan", "isinf", "isfinite"]
BINARY = ["fmax", "fmin"]
EXACT = {"floor", "ceil", "trunc", "isnan", "isinf", "isfinite", "fmax", "fmin"}


def _wide(dtype, rng: np.random.Generator) -> np.ndarray:
    """Values across the whole range of `dtype` and of both signs, with the special ones."""
    hi = 88.0 if dtype == np.float32 else 709.0
    info = np.finfo(dtype)
    tiny = float(info.smallest_subnormal)
    x = np.concatenate([
        rng.uniform(-hi, hi, 3000), rng.uniform(-2, 2, 3000), rng.uniform(-1e-3, 1e-3, 1000),
        np.exp(rng.uniform(-hi, hi, 3000)) * rng.choice([-1.0, 1.0], 3000),
        2.0 ** np.arange(-60, 60), -(2.0 ** np.arange(-60, 60)), rng.uniform(-40, 40, 200) // 1,
        [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, -0.999, 1e-8, np.inf, -np.inf, np.nan, tiny, -tiny,
         7 * tiny, float(info.tiny), float(info.max), -float(info.max), hi + 0.5, -hi - 1.0,
         2.0 ** 23 + 0.5, 2.0 ** 31, -(2.0 ** 52) - 0.5, 2.0 ** 63, 1e300]])
    with np.errstate(over="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_composites_give_numpys_values_over_the_whole_range(dtype):
    rng = np.random.default_rng(3)
    x = _wide(dtype, rng)
    y = rng.permutation(x)
    t = eqsat.DType.of(np.dtype(dtype))[x.size]

    def npc_model(x, y):
        return (*(getattr(np, k)(x) for k in UNARY), *(getattr(np, k)(x, y) for k in BINARY))

    npc_model.__annotations__ = {"x": t, "y": t}
    f = function(npc_model)
    with np.errstate(all="ignore"):
        want = npc_model(x, y)
        results = {"interpret": run(f, x, y), "compile": eqsat.compile(Module(f))(f.name, x, y)}
    for path, got in results.items():
        for name, g, w in zip(UNARY + BINARY, got, want):
            where = f"{name} ({path}, {np.dtype(dtype).name})"
            assert g.dtype == w.dtype, where
            if w.dtype == np.bool_:
                np.testing.assert_array_equal(g, w, err_msg=where)
                continue
            d = ulp_distance(g, w)
            assert d.max() == 0, (where, x[d.argmax()])
            signed = ~np.isnan(w) & ((w != 0) | (name not in ("fmax", "fmin")))  # zero ties
            np.testing.assert_array_equal(np.signbit(g)[signed], np.signbit(w)[signed],
                                          err_msg=where)


def test_integer_and_bool_operands_take_numpys_dtypes():
    def npc_model(x: f32[5], n: i32[5], b: bool_[5]):
        return (np.fmax(n, x), np.fmin(n, 2.5), np.fmax(b, x > 0), np.fmin(b, x > 0),
                np.floor(b), np.ceil(n), np.trunc(n), np.isnan(n), np.isinf(b), np.isfinite(n))

    x = np.array([0.5, -1.0, 2.0, np.nan, -0.0], np.float32)
    n = np.array([1, -2, 3, 0, 7], np.int32)
    b = np.array([True, False, True, False, True])
    with np.errstate(all="ignore"):
        for k, (g, w) in enumerate(zip(run(function(npc_model), x, n, b), npc_model(x, n, b))):
            assert g.dtype == w.dtype, k
            np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=str(k))


@pytest.mark.parametrize("name", UNARY[:3] + BINARY)
def test_gradients_of_composites_match_central_differences(name):
    fn = getattr(np, name)

    def npc_loss(x: f64[3, 4], y: f64[3, 4]):
        return np.sum(fn(x, y) if fn.nin == 2 else fn(x) * y)

    rng = np.random.default_rng(4)
    x = rng.uniform(-3.0, 3.0, (3, 4))
    x = np.abs(x) if name == "log1p" else x  # log1p is NaN below -1
    f = function(npc_loss)
    check_vjp(Module(f), f.name, [x, rng.uniform(-3.0, 3.0, (3, 4))], rtol=1e-6, atol=1e-8)


def test_gradients_of_roundings_are_zero():
    x = np.array([0.0, -0.0, 0.5, -2.5, 1e10, -1e18, 123.25])
    for name in ("floor", "ceil", "trunc"):
        def npc_loss(x: f64[7]):
            return np.sum(getattr(np, name)(x))

        np.testing.assert_array_equal(eqsat.grad(function(npc_loss))(x), 0 * x, err_msg=name)
