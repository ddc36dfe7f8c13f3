"""The Python AD API: grad, value_and_grad and vjp of traced functions."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat
from eqsat.ad import grad, value_and_grad, vjp
from eqsat.errors import Error, VerifyError
from eqsat.ir import Function, Module
from eqsat.ir.dsl import TracedFunction, function, tanh

f64 = eqsat.DType.f64
i32 = eqsat.DType.i32


@function
def ad_loss(x: f64[3, 4], w: f64[4, 2], y: f64[3, 2]):
    d = tanh(x @ w) - y
    return (d * d).sum()


@function
def ad_pair(x: f64[3], n: i32[3]):
    return x * x, n


def rng_args(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def closed_form_grad_w(x, w, y):
    t = np.tanh(x @ w)
    return x.T @ (2 * (t - y) * (1 - t * t))


def test_grad_returns_a_traced_function_with_the_adjoint():
    g = grad(ad_loss, wrt="w")
    assert isinstance(g, TracedFunction) and isinstance(g.ir, Function)
    assert "%w.adj" in str(g)
    x, w, y = rng_args((3, 4), (4, 2), (3, 2))
    np.testing.assert_allclose(g(x, w, y), closed_form_grad_w(x, w, y), rtol=1e-12)


def test_wrt_by_position_and_default_all_float_params():
    x, w, y = rng_args((3, 4), (4, 2), (3, 2), seed=1)
    by_pos = grad(ad_loss, wrt=[1])(x, w, y)
    np.testing.assert_allclose(by_pos, closed_form_grad_w(x, w, y), rtol=1e-12)
    every = grad(ad_loss)(x, w, y)
    assert len(every) == 3
    np.testing.assert_allclose(every[1], by_pos, rtol=1e-15)
    # a numpy integer (np.argmax's, an array index) is a position too
    np.testing.assert_array_equal(grad(ad_loss, wrt=np.int64(1))(x, w, y), by_pos)


def test_value_and_grad_and_module_membership():
    vg = value_and_grad(ad_loss, wrt=("w", "x"))
    x, w, y = rng_args((3, 4), (4, 2), (3, 2), seed=2)
    value, gw, gx = vg(x, w, y)
    np.testing.assert_allclose(value, ad_loss(x, w, y), rtol=1e-15)
    np.testing.assert_allclose(gw, closed_form_grad_w(x, w, y), rtol=1e-12)
    m = Module(ad_loss, vg)
    assert eqsat.parse(str(m)) == m
    np.testing.assert_allclose(eqsat.interpret(m, vg.name, x, w, y)[1], gw, rtol=1e-15)


def test_vjp_takes_seeds_and_skips_integers():
    v = vjp(ad_pair)  # default wrt: the float parameter x only
    assert [p.name for p in v.ir.params] == ["x", "n", "seed.0", "seed.1"]
    x = np.array([1.0, -2.0, 0.5])
    (gx,) = (v(x, np.array([1, 2, 3], dtype=np.int32), np.ones(3), np.zeros(3, np.int32)),)
    np.testing.assert_allclose(gx, 2 * x)


def test_hessian_vector_product_through_the_api():
    g = grad(ad_loss, wrt="w")
    hvp = vjp(g, wrt="w")
    x, w, y = rng_args((3, 4), (4, 2), (3, 2), seed=3)
    v = np.random.default_rng(4).standard_normal(w.shape)
    h = 1e-5
    want = (g(x, w + h * v, y) - g(x, w - h * v, y)) / (2 * h)  # H v (H is symmetric)
    np.testing.assert_allclose(hvp(x, w, y, v), want, rtol=1e-6, atol=1e-9)


def test_traced_gradient_can_be_called_inside_another_function():
    g = grad(ad_loss, wrt="w")

    @function
    def ad_step(x: f64[3, 4], w: f64[4, 2], y: f64[3, 2]):
        return w - g(x, w, y) * 0.1

    x, w, y = rng_args((3, 4), (4, 2), (3, 2), seed=5)
    np.testing.assert_allclose(ad_step(x, w, y), w - 0.1 * closed_form_grad_w(x, w, y),
                               rtol=1e-12)
    # and a vjp of it differentiates through the call (it is inlined)
    v = vjp(ad_step, wrt="w")
    assert all(s.op != "call" for s in v.ir.body)



def test_gradient_name_is_free_in_the_module():
    # The default name f_grad was taken by a callee, and its fallback f_grad_3 (3 = the
    # module's item count) by another: a VerifyError that @f_grad_3 was defined twice.
    @function
    def ad_named_grad(x: f64[3]):
        return x * 2.0

    @function
    def ad_named_grad_3(x: f64[3]):
        return x * 3.0

    @function
    def ad_named(x: f64[3]):
        return (ad_named_grad(x) * ad_named_grad_3(x)).sum()

    g = grad(ad_named)
    assert g.name not in ad_named.module
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(g(x), 12 * x)

@pytest.mark.parametrize("call,message", [
    (lambda: grad(ad_pair), "one float scalar"),
    (lambda: grad(ad_loss, wrt="nope"), "no parameter 'nope'"),
    (lambda: grad(ad_loss, wrt=5), "out of range"),
    (lambda: grad(ad_loss, wrt=10**5000), "position of 16610 bits is out of range"),
    (lambda: vjp(ad_pair, wrt="n"), "not a float type"),
    (lambda: grad(ad_loss, wrt=["w", "w"]), "listed twice"),
    (lambda: grad(ad_loss, wrt=[]), "wrt is empty"),
    (lambda: grad(ad_loss, wrt=1.5), "names or positions"),
])
def test_clear_errors(call, message):
    with pytest.raises(VerifyError, match=message):
        call()


def test_not_a_traced_function():
    with pytest.raises(Error, match="traced with @eqsat.function"):
        grad(lambda x: x)
