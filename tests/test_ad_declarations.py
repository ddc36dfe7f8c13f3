"""Reverse-mode AD through declarations and calls: grad, value_and_grad and vjp of
declarations (a Hessian-vector product), calls inlined at any depth, adjoint names that never
clash, and golden adjoint texts."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import eqsat.ir as ir
from ad_helpers import check_vjp, run
from call_trees import call_tree
from eqsat.ad import differentiate
from eqsat.errors import VerifyError
from eqsat.ir import GradDecl, parse

MLP = """
func @predict(%x: f64[3,4], %w: f64[4,2], %b: f64[2]) -> f64[3,2] {
  %0 = matmul %x, %w : f64[3,2]
  %1 = broadcast %b : f64[3,2]
  %2 = add %0, %1 : f64[3,2]
  %3 = tanh %2 : f64[3,2]
  return %3
}

func @loss(%x: f64[3,4], %w: f64[4,2], %b: f64[2], %y: f64[3,2]) -> f64[] {
  %p = call @predict(%x, %w, %b) : f64[3,2]
  %d = sub %p, %y : f64[3,2]
  %s = mul %d, %d : f64[3,2]
  %t = sum %s, axes=[0,1] : f64[]
  return %t
}

func @loss_grad = grad @loss wrt %w, %b
func @loss_vg = value_and_grad @loss wrt %w
func @hvp = vjp @loss_grad wrt %w
"""


def mlp_args(rng):
    return [rng.standard_normal(s) for s in ((3, 4), (4, 2), (2,), (3, 2))]


def test_differentiate_expands_every_declaration_and_keeps_functions():
    m = parse(MLP)
    d = differentiate(m)
    assert [it.name for it in d.items] == [it.name for it in m.items]
    assert not d.grad_decls
    assert d["predict"] == m["predict"] and d["loss"] == m["loss"]
    assert parse(str(d)) == d
    assert all(s.op != "call" for s in d["loss_grad"].body)


def test_grad_and_value_and_grad_match_central_differences():
    rng = np.random.default_rng(4)
    m = parse(MLP)
    args = mlp_args(rng)
    check_vjp(m, "loss", args, wrt=("w", "b"))
    d = differentiate(m)
    gw, gb = run(d, "loss_grad", *args)
    value, gw2 = run(d, "loss_vg", *args)
    assert value == run(m, "loss", *args)[0]
    assert np.array_equal(gw, gw2)


def test_hessian_vector_product_matches_differences_of_the_gradient():
    rng = np.random.default_rng(5)
    d = differentiate(parse(MLP))
    x, w, b, y = mlp_args(rng)
    v, u = rng.standard_normal(w.shape), rng.standard_normal(b.shape)
    (hv,) = run(d, "hvp", x, w, b, y, v, u)
    h = 1e-5
    # d/dw <(v, u), grad(w)> along the direction e for every element e of w
    want = np.zeros_like(w)
    for j in np.ndindex(w.shape):
        wp, wm = w.copy(), w.copy()
        wp[j] += h
        wm[j] -= h
        gp, gm = run(d, "loss_grad", x, wp, b, y), run(d, "loss_grad", x, wm, b, y)
        want[j] = (np.sum(v * (gp[0] - gm[0])) + np.sum(u * (gp[1] - gm[1]))) / (2 * h)
    np.testing.assert_allclose(hv, want, rtol=1e-6, atol=1e-8)


def test_calls_twice_parameter_returns_and_several_results():
    m = parse("""
func @pair(%a: f64[3], %b: f64[3]) -> (f64[3], f64[3]) {
  %p = mul %a, %b : f64[3]
  return %p, %a
}
func @f(%x: f64[3], %y: f64[3]) -> f64[3] {
  %u, %v = call @pair(%x, %y) : f64[3], f64[3]
  %s, %t = call @pair(%u, %v) : f64[3], f64[3]
  %r = sin %s : f64[3]
  %q = add %r, %t : f64[3]
  return %q
}
""")
    rng = np.random.default_rng(6)
    e = check_vjp(m, "f", [rng.standard_normal(3), rng.standard_normal(3)])
    body = e["f_vjp"].body
    assert [s.results[0] for s in body[:2]] == ["u", "s"]  # callee values take the caller's names


def test_functions_may_call_declarations():
    m = parse(MLP + """
func @step(%x: f64[3,4], %w: f64[4,2], %b: f64[2], %y: f64[3,2]) -> f64[4,2] {
  %gw, %gb = call @loss_grad(%x, %w, %b, %y) : f64[4,2], f64[2]
  %lr = const 0.1 : f64[]
  %l = broadcast %lr : f64[4,2]
  %d = mul %gw, %l : f64[4,2]
  %n = sub %w, %d : f64[4,2]
  return %n
}
""")
    rng = np.random.default_rng(7)
    e = check_vjp(m, "step", mlp_args(rng), wrt=("w",))
    assert isinstance(e["step_vjp"], ir.Function) and isinstance(e["loss_grad"], ir.Function)


def test_calls_deeper_than_the_recursion_limit():
    # Each function calls the one before: inlining ran recursively and hit RecursionError.
    depth = sys.getrecursionlimit() + 100
    funcs = ["func @f0(%x: f64[2]) -> f64[2] {\n  return %x\n}"]
    funcs += [f"func @f{i}(%x: f64[2]) -> f64[2] {{\n  %y = call @f{i - 1}(%x) : f64[2]\n"
              f"  %z = add %y, %x : f64[2]\n  return %z\n}}" for i in range(1, depth)]
    m = parse("\n".join(funcs) + f"\nfunc @g = vjp @f{depth - 1} wrt %x\n")
    seed = np.array([1.0, -2.0])
    (gx,) = run(differentiate(m), "g", np.zeros(2), seed)
    np.testing.assert_array_equal(gx, depth * seed)


def test_a_gradient_that_would_copy_callees_exponentially_is_refused():
    # inlining copies a callee at every call: 40 deep it would be 2^40 statements, and
    # differentiate ran until memory ran out; now it is a located VerifyError, at once
    text = call_tree(40, t="f64[2]") + "\nfunc @g = vjp @f39 wrt %x\n"
    with pytest.raises(VerifyError, match=r"line 278, col 1: vjp @f39: with its calls inlined "
                                          r"@f39 runs 1,649,267,441,662 statements") as e:
        differentiate(parse(text))
    assert (e.value.line, e.value.col) == (278, 1)
    m = parse(call_tree(5, t="f64[2]") + "\nfunc @g = vjp @f4 wrt %x\n")
    check_vjp(m, "f4", [np.array([0.3, -1.2])], wrt=("x",))



def test_a_declaration_built_in_python_reads_one_wrt_name_as_one_parameter():
    # wrt="xy" was split into its letters: a silent gradient w.r.t. %x and %y.
    m = parse("func @f(%x: f64[], %y: f64[], %xy: f64[]) -> f64[] {\n"
              "  %a = mul %x, %xy : f64[]\n  %b = mul %a, %y : f64[]\n  return %b\n}\n")
    d = differentiate(m.replace(m.items + (GradDecl("g", "grad", "f", "xy"),)))
    assert d["g"].returns == ("xy.adj",)
    assert run(d, "g", np.float64(2.0), np.float64(3.0), np.float64(5.0)) == [6.0]

def test_seed_names_never_clash_with_values():
    m = parse("func @f(%x: f64[2]) -> f64[2] {\n  %seed.0 = exp %x : f64[2]\n"
              "  return %seed.0\n}\nfunc @v = vjp @f wrt %x\n")
    d = differentiate(m)
    assert [p.name for p in d["v"].params] == ["x", "seed.0"]
    x = np.array([0.5, -1.0])
    assert np.allclose(run(d, "v", x, np.array([1.0, 2.0]))[0], np.exp(x) * [1.0, 2.0])


GOLDEN = """\
func @f(%x: f32[4], %w: f32[4]) -> f32[] {
  %y = mul %x, %w : f32[4]
  %t = tanh %y : f32[4]
  %l = sum %t, axes=[0] : f32[]
  return %l
}

func @df = grad @f wrt %w
"""

GOLDEN_DF = """\
func @df(%x: f32[4], %w: f32[4]) -> f32[4] {
  %y = mul %x, %w : f32[4]
  %t = tanh %y : f32[4]
  %t.adj = const 1.0 : f32[4]
  %t.bwd = mul %t, %t : f32[4]
  %y.adj = sub %t.adj, %t.bwd : f32[4]
  %w.adj = mul %y.adj, %x : f32[4]
  return %w.adj
}"""


README_MLP = """
func @predict(%x: f32[8,4], %w: f32[4,3], %b: f32[3]) -> f32[8,3] {
  %0 = matmul %x, %w : f32[8,3]
  %1 = broadcast %b : f32[8,3]
  %2 = add %0, %1 : f32[8,3]
  %3 = relu %2 : f32[8,3]
  return %3
}

func @loss(%x: f32[8,4], %w: f32[4,3], %b: f32[3], %y: f32[8,3]) -> f32[] {
  %p = call @predict(%x, %w, %b) : f32[8,3]
  %d = sub %p, %y : f32[8,3]
  %s = mul %d, %d : f32[8,3]
  %t = sum %s, axes=[0,1] : f32[]
  %n = const 0.041666668 : f32[]
  %l = mul %t, %n : f32[]
  return %l
}

func @loss_grad = grad @loss wrt %w, %b
"""

README_MLP_GRAD = """\
func @loss_grad(%x: f32[8,4], %w: f32[4,3], %b: f32[3], %y: f32[8,3]) -> (f32[4,3], f32[3]) {
  %predict.0 = matmul %x, %w : f32[8,3]
  %predict.1 = broadcast %b : f32[8,3]
  %predict.2 = add %predict.0, %predict.1 : f32[8,3]
  %p = relu %predict.2 : f32[8,3]
  %d = sub %p, %y : f32[8,3]
  %s.adj = const 0.041666668 : f32[8,3]
  %d.adj.1 = mul %s.adj, %d : f32[8,3]
  %d.adj = add %d.adj.1, %d.adj.1 : f32[8,3]
  %zero = const 0.0 : f32[8,3]
  %p.bwd = gt %predict.2, %zero : bool[8,3]
  %predict.2.adj = select %p.bwd, %d.adj, %zero : f32[8,3]
  %b.adj = sum %predict.2.adj, axes=[0] : f32[3]
  %predict.0.bwd = transpose %x, perm=[1,0] : f32[4,8]
  %w.adj = matmul %predict.0.bwd, %predict.2.adj : f32[4,3]
  return %w.adj, %b.adj
}"""


def test_golden_adjoint_text():
    d = differentiate(parse(GOLDEN))
    assert "\n".join(ir.printer.format_function(d["df"])) == GOLDEN_DF


def test_golden_readme_example():
    # the README's example: a call inlined, relu, un-broadcasting of the bias, matmul
    d = differentiate(parse(README_MLP))
    assert "\n".join(ir.printer.format_function(d["loss_grad"])) == README_MLP_GRAD


def test_generated_code_has_no_trivial_arithmetic():
    d = differentiate(parse(MLP))
    for fn in d.functions:
        consts = {s.results[0]: s.attr["value"] for s in fn.body if s.op == "const"}
        for s in fn.body:
            if s.op in ("add", "sub"):
                assert consts.get(s.operands[1]) != 0.0 and (s.op == "sub" or
                                                            consts.get(s.operands[0]) != 0.0)
            if s.op == "mul":
                assert 1.0 not in (consts.get(s.operands[0]), consts.get(s.operands[1]))
        # primal values are reused: no statement of the primal is computed twice
        keys = [(s.op, s.operands, s.attrs, s.types) for s in fn.body]
        assert len(keys) == len(set(keys))
