"""Gradients of hand-written models (.eqir text) against float64 central differences."""

from __future__ import annotations

import numpy as np
import pytest

from ad_helpers import numeric_vjp, run
from eqsat.ad import differentiate
from eqsat.ir import GradDecl, parse

MLP_MSE = """
func @layer(%x: f64[4,5], %w: f64[5,3], %b: f64[3]) -> f64[4,3] {
  %h = matmul %x, %w : f64[4,3]
  %bb = broadcast %b : f64[4,3]
  %z = add %h, %bb : f64[4,3]
  %a = tanh %z : f64[4,3]
  return %a
}

func @loss(%x: f64[4,5], %w1: f64[5,3], %b1: f64[3], %w2: f64[3,2], %b2: f64[2],
           %y: f64[4,2]) -> f64[] {
  %a = call @layer(%x, %w1, %b1) : f64[4,3]
  %h = matmul %a, %w2 : f64[4,2]
  %bb = broadcast %b2 : f64[4,2]
  %p = add %h, %bb : f64[4,2]
  %d = sub %p, %y : f64[4,2]
  %s = mul %d, %d : f64[4,2]
  %t = sum %s, axes=[0,1] : f64[]
  %n = const 0.125 : f64[]
  %l = mul %t, %n : f64[]
  return %l
}
"""

SOFTMAX_XENT = """
func @loss(%x: f64[4,5], %w: f64[5,3], %b: f64[3], %y: f64[4,3]) -> f64[] {
  %h = matmul %x, %w : f64[4,3]
  %bb = broadcast %b : f64[4,3]
  %logits = add %h, %bb : f64[4,3]
  %m = max %logits, axes=[1] : f64[4]
  %m2 = reshape %m : f64[4,1]
  %mb = broadcast %m2 : f64[4,3]
  %z = sub %logits, %mb : f64[4,3]
  %e = exp %z : f64[4,3]
  %se = sum %e, axes=[1] : f64[4]
  %lse = log %se : f64[4]
  %lse2 = reshape %lse : f64[4,1]
  %lseb = broadcast %lse2 : f64[4,3]
  %logp = sub %z, %lseb : f64[4,3]
  %yl = mul %y, %logp : f64[4,3]
  %t = sum %yl, axes=[0,1] : f64[]
  %n = const -0.25 : f64[]
  %l = mul %t, %n : f64[]
  return %l
}
"""

LAYER_NORM = """
func @loss(%x: f64[4,6], %gamma: f64[6], %beta: f64[6], %r: f64[4,6]) -> f64[] {
  %s = sum %x, axes=[1] : f64[4]
  %k = const 0.16666666666666666 : f64[4]
  %mean = mul %s, %k : f64[4]
  %mean2 = reshape %mean : f64[4,1]
  %meanb = broadcast %mean2 : f64[4,6]
  %xc = sub %x, %meanb : f64[4,6]
  %sq = mul %xc, %xc : f64[4,6]
  %ss = sum %sq, axes=[1] : f64[4]
  %var = mul %ss, %k : f64[4]
  %eps = const 1e-05 : f64[4]
  %ve = add %var, %eps : f64[4]
  %inv = rsqrt %ve : f64[4]
  %inv2 = reshape %inv : f64[4,1]
  %invb = broadcast %inv2 : f64[4,6]
  %xn = mul %xc, %invb : f64[4,6]
  %gb = broadcast %gamma : f64[4,6]
  %bb = broadcast %beta : f64[4,6]
  %xg = mul %xn, %gb : f64[4,6]
  %y = add %xg, %bb : f64[4,6]
  %yr = mul %y, %r : f64[4,6]
  %l = sum %yr, axes=[0,1] : f64[]
  return %l
}
"""

ATTENTION = """
func @softmax(%s: f64[5,5]) -> f64[5,5] {
  %m = max %s, axes=[1] : f64[5]
  %m2 = reshape %m : f64[5,1]
  %mb = broadcast %m2 : f64[5,5]
  %z = sub %s, %mb : f64[5,5]
  %e = exp %z : f64[5,5]
  %se = sum %e, axes=[1] : f64[5]
  %se2 = reshape %se : f64[5,1]
  %seb = broadcast %se2 : f64[5,5]
  %p = div %e, %seb : f64[5,5]
  return %p
}

func @loss(%x: f64[5,4], %wq: f64[4,3], %wk: f64[4,3], %wv: f64[4,3], %r: f64[5,3]) -> f64[] {
  %q = matmul %x, %wq : f64[5,3]
  %k = matmul %x, %wk : f64[5,3]
  %v = matmul %x, %wv : f64[5,3]
  %kt = transpose %k, perm=[1,0] : f64[3,5]
  %s = matmul %q, %kt : f64[5,5]
  %c = const 0.5773502691896258 : f64[5,5]
  %sc = mul %s, %c : f64[5,5]
  %p = call @softmax(%sc) : f64[5,5]
  %o = matmul %p, %v : f64[5,3]
  %or = mul %o, %r : f64[5,3]
  %l = sum %or, axes=[0,1] : f64[]
  return %l
}
"""

MODELS = {
    "mlp_mse": (MLP_MSE, ("w1", "b1", "w2", "b2")),
    "softmax_xent": (SOFTMAX_XENT, ("x", "w", "b")),
    "layer_norm": (LAYER_NORM, ("x", "gamma", "beta")),
    "attention": (ATTENTION, ("x", "wq", "wk", "wv")),
}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_gradient_matches_central_differences(model):
    text, wrt = MODELS[model]
    m = parse(text)
    m = m.replace(m.items + (GradDecl("loss_grad", "grad", "loss", wrt),))
    d = differentiate(m)
    assert parse(str(d)) == d  # the generated function prints and parses back
    rng = np.random.default_rng(sorted(MODELS).index(model))
    args = [rng.standard_normal(p.type.shape) for p in m["loss"].params]
    if model == "softmax_xent":  # targets: rows of a probability distribution
        y = np.abs(args[-1])
        args[-1] = y / y.sum(axis=1, keepdims=True)
    got = run(d, "loss_grad", *args)
    want = numeric_vjp(d, "loss", args, wrt, [np.ones(())])
    for w, g, e in zip(wrt, got, want):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-8, err_msg=f"{model}: %{w}")


def test_softmax_xent_gradient_is_softmax_minus_target():
    # the textbook closed form, as a check independent of finite differences
    m = parse(SOFTMAX_XENT)
    d = differentiate(m.replace(m.items + (GradDecl("g", "grad", "loss", ("b",)),)))
    rng = np.random.default_rng(9)
    x, w, b = rng.standard_normal((4, 5)), rng.standard_normal((5, 3)), rng.standard_normal(3)
    y = np.eye(3)[[0, 2, 1, 2]]
    (gb,) = run(d, "g", x, w, b, y)
    logits = x @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(gb, (p - y).sum(0) / 4, rtol=1e-12, atol=1e-14)


def test_model_hessian_vector_product():
    # vjp of a grad: H v for the MLP, against central differences of the gradient
    m = parse(MLP_MSE)
    m = m.replace(m.items + (GradDecl("g", "grad", "loss", ("w2", "b2")),
                             GradDecl("hvp", "vjp", "g", ("w2",))))
    d = differentiate(m)
    rng = np.random.default_rng(11)
    args = [rng.standard_normal(p.type.shape) for p in m["loss"].params]
    v = [rng.standard_normal((3, 2)), rng.standard_normal(2)]
    (hv,) = run(d, "hvp", *args, *v)
    want = numeric_vjp(d, "g", args, ("w2",), v)[0]
    np.testing.assert_allclose(hv, want, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- compiled gradients of extrema

def _compiled_matches_interpreted(text: str, trials: int, seed: int) -> None:
    import eqsat

    m = eqsat.parse(text)
    f = m["f"]
    exe = eqsat.compile(m)
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        args = [rng.uniform(-2, 2, p.type.shape) for p in f.params]
        seeds = [rng.standard_normal(t.shape) for t in f.result_types]
        want = eqsat.interpret(m, "g", *args, *seeds)
        got = exe("g", *args, *seeds)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_optimized_maximum_gradient_survives_a_recomputed_operand():
    # The optimizer computes %q as a * recip(exp(b)) in one kernel and as a / exp(b) in
    # another (div_bcast_recip): a winner decided by eq(%q, %m) lost the gradient of %b.
    _compiled_matches_interpreted("""
func @f(%a: f64[2,5], %b: f64[], %c: f64[2,5], %d: f64[2,5]) -> f64[2,5] {
  %bb = broadcast %b : f64[2,5]
  %e = exp %bb : f64[2,5]
  %q = div %a, %e : f64[2,5]
  %m = maximum %q, %c : f64[2,5]
  %n = minimum %m, %d : f64[2,5]
  return %n
}
func @g = vjp @f wrt %a, %b, %c, %d
""", trials=20, seed=1)


def test_optimized_softmax_gradient_has_no_nan_when_the_max_is_recomputed():
    # Same rewrite under a max reduction: no element of a row "equalled" the max, and
    # g / count(0) turned every gradient into NaN.
    _compiled_matches_interpreted("""
func @f(%a: f64[4,5], %b: f64[]) -> f64[4,5] {
  %bb = broadcast %b : f64[4,5]
  %e = exp %bb : f64[4,5]
  %q = div %a, %e : f64[4,5]
  %m = max %q, axes=[1] : f64[4]
  %mr = reshape %m : f64[4,1]
  %mb = broadcast %mr : f64[4,5]
  %s = sub %q, %mb : f64[4,5]
  %x = exp %s : f64[4,5]
  %z = sum %x, axes=[1] : f64[4]
  %zr = reshape %z : f64[4,1]
  %zb = broadcast %zr : f64[4,5]
  %p = div %x, %zb : f64[4,5]
  return %p
}
func @g = vjp @f wrt %a, %b
""", trials=20, seed=1)


def test_optimized_max_gradient_survives_a_recomputed_operand():
    # The forward max reads a * recip(exp(b)), the backward mask recomputes a / exp(b): with an
    # exact test of "at the max" a row whose recomputed maximum rounded below lost its gradient.
    _compiled_matches_interpreted("""
func @f(%a: f64[4,5], %b: f64[]) -> f64[4] {
  %bb = broadcast %b : f64[4,5]
  %e = exp %bb : f64[4,5]
  %q = div %a, %e : f64[4,5]
  %m = max %q, axes=[1] : f64[4]
  %n = sin %m : f64[4]
  return %n
}
func @g = vjp @f wrt %a, %b
""", trials=20, seed=1)


def test_max_gradient_at_ties_infinities_and_nan():
    import eqsat

    m = eqsat.parse("func @f(%x: f32[2,3]) -> f32[2] {\n  %m = max %x, axes=[1] : f32[2]\n"
                    "  return %m\n}\nfunc @g = vjp @f wrt %x\n")
    x = np.array([[np.inf, 1.0, np.inf], [2.0, 2.0 * (1 - 2.0 ** -20), np.nan]], np.float32)
    want = np.array([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
    for got in (eqsat.interpret(m, "g", x, np.ones(2, np.float32)),
                eqsat.compile(m)("g", x, np.ones(2, np.float32))):
        np.testing.assert_array_equal(got, want)
    y = np.array([[3.0, 1.0, 2.0], [-1.0, 5.0, 5.0]], np.float32)
    np.testing.assert_array_equal(eqsat.interpret(m, "g", y, np.ones(2, np.float32)),
                                  [[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
