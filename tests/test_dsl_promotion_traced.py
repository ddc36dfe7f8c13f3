"""Traced values of different dtypes promote as numpy 2 does: `f64 @ f32` is f64, `f32 + i32`
is f64, `i32 < i64` compares in i64, with a `cast` inserted on the operand that differs. Every
case runs the traced function and the same code in numpy on the same arrays and compares values
and dtypes; where eqsat has no op for numpy's operation in the promoted dtype, tracing fails at
the user's line. The IR itself stays strict: only the DSL promotes."""

import math
import operator
import os

import numpy as np
import pytest

import eqsat
from eqsat.errors import TraceError, VerifyError
from eqsat.ir.dsl import function
from eqsat.ir.types import DType

from dsl_helpers import OPERATORS, refused, run

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]
# two different operands per kind; integers stay positive so that numpy's integer ** never
# meets a negative exponent, and the second operand has no zero to divide by
VALUES = {"f": ([[-1.5, 0.5, 2.0], [3.0, -0.25, 1.0]], [[2.0, -3.0, 0.5], [1.5, 4.0, -1.0]]),
          "i": ([[1, 2, 3], [5, 4, 2]], [[3, 1, 2], [2, 5, 3]]),
          "b": ([[True, False, True], [False, True, True]],
                [[True, True, False], [False, True, False]])}
COND = np.array([[True, False, False], [True, True, False]])


def cases():
    """(label, kind, the traced body of x, y and c, the same in numpy)."""
    out = []
    for sym, stem in OPERATORS.items():
        op = getattr(operator, stem)
        out.append((f"x {sym} y", sym, lambda x, y, c, op=op: op(x, y), None))
        if sym in ("+", "-", "*", "/", "//", "**"):
            out.append((f"x.__r{stem}__(y)", sym,
                        lambda x, y, c, stem=stem: getattr(x, f"__r{stem}__")(y),
                        lambda x, y, c, op=op: op(y, x)))
    for name in ("maximum", "minimum"):
        np_fn, eq_fn = getattr(np, name), getattr(eqsat, name)
        out += [(f"np.{name}(x, y)", name, lambda x, y, c, f=np_fn: f(x, y), None),
                (f"eqsat.{name}(x, y)", name, lambda x, y, c, f=eq_fn: f(x, y),
                 lambda x, y, c, f=np_fn: f(x, y))]
    return out + [
        ("np.add(x, y)", "+", lambda x, y, c: np.add(x, y), None),
        ("x @ y.T", "@", lambda x, y, c: x @ y.T, None),
        ("eqsat.matmul(x, y.T)", "@", lambda x, y, c: eqsat.matmul(x, y.T),
         lambda x, y, c: np.matmul(x, y.T)),
        ("np.matmul(x.T, y)", "@", lambda x, y, c: np.matmul(x.T, y), None),
        ("where(c, x, y)", "where", lambda x, y, c: eqsat.where(c, x, y),
         lambda x, y, c: np.where(c, x, y)),
        ("concatenate([x, y])", "concat", lambda x, y, c: eqsat.concatenate([x, y]),
         lambda x, y, c: np.concatenate([x, y])),
        ("concatenate([y, x, y], 1)", "concat",
         lambda x, y, c: eqsat.concatenate([y, x, y], axis=1),
         lambda x, y, c: np.concatenate([y, x, y], axis=1)),
    ]


def traced_function(body, a: DType, b: DType):
    """`body(x, y, c)` traced with x: a[2, 3], y: b[2, 3] and a bool condition c[2, 3]."""
    @function
    def f(x: a[2, 3], y: b[2, 3], c: DType.bool[2, 3]):
        return body(x, y, c)

    return f


@pytest.mark.parametrize("bdt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("adt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_traced_values_promote_as_numpy_does(adt, bdt):
    a, b = DType.of(np.dtype(adt)), DType.of(np.dtype(bdt))
    x = np.array(VALUES[np.dtype(adt).kind][0], adt)
    y = np.array(VALUES[np.dtype(bdt).kind][1], bdt)
    for label, kind, body, reference in cases():
        if refused(kind, np.result_type(x, y)):
            with pytest.raises(TraceError) as err:
                traced_function(body, a, b)
            assert err.value.filename.endswith(os.path.basename(__file__)), label
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            want = np.asarray((reference or body)(x, y, COND))
            got = run(traced_function(body, a, b), x, y, COND)
        assert got.dtype == want.dtype, (label, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=label)


def test_mixed_dtypes_insert_one_cast_on_the_operand_that_differs():
    @function
    def f(x: DType.f32[2, 3], w: DType.f64[3, 2]):
        return x @ w

    ops = [(s.op, str(s.types[0])) for s in f.ir.body]
    assert ops == [("cast", "f64[2,3]"), ("matmul", "f64[2,2]")]


def test_where_keeps_refusing_a_non_bool_condition():
    # numpy's where takes any condition's truth; the DSL asks for a comparison, as before
    with pytest.raises(TraceError, match="the condition must be bool, got f32"):
        @function
        def f(x: DType.f32[3], y: DType.f64[3]):
            return eqsat.where(x, x, y)


def test_the_ir_itself_still_refuses_mixed_dtypes():
    text = ("func @f(%a: f32[2], %b: f64[2]) -> f64[2] {\n"
            "  %0 = add %a, %b : f64[2]\n  return %0\n}\n")
    with pytest.raises(VerifyError, match="add needs operands of one type"):
        eqsat.parse(text)


def np_softmax(x: np.ndarray) -> np.ndarray:
    """eqsat.softmax's formula, in numpy."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, softmax):
    """The common attention block: scores scaled by np.sqrt(d), an np.float64 (numpy 2 then
    computes the scores, and so the output, in f64 even for f32 q, k and v)."""
    return softmax(q @ k.T / np.sqrt(q.shape[-1])) @ v


@function
def promoted_attn(q: DType.f32[5, 8], k: DType.f32[5, 8], v: DType.f32[5, 4]):
    return attention(q, k, v, eqsat.softmax)


@function
def promoted_attn_loss(q: DType.f32[5, 8], k: DType.f32[5, 8], v: DType.f32[5, 4],
                       r: DType.f64[5, 4]):
    return (attention(q, k, v, eqsat.softmax) * r).sum()


def attention_args(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((5, 8), (5, 8), (5, 4))]


def test_attention_in_f32_is_f64_as_in_numpy():
    q, k, v = attention_args()
    want = attention(q, k, v, np_softmax)
    got = run(promoted_attn, q, k, v)
    assert promoted_attn.signature.results[0] == DType.f64[5, 4]
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_attention_stays_f32_with_an_f32_or_python_scale():
    @function
    def promoted_attn32(q: DType.f32[5, 8], k: DType.f32[5, 8], v: DType.f32[5, 4]):
        a = eqsat.softmax(q @ k.T / np.float32(np.sqrt(8))) @ v
        b = eqsat.softmax(q @ k.T / math.sqrt(8)) @ v
        return a, b

    assert [str(t) for t in promoted_attn32.signature.results] == ["f32[5,4]", "f32[5,4]"]
    assert "cast" not in [s.op for s in promoted_attn32.ir.body]


def numeric_attention_grad(args: list[np.ndarray], r: np.ndarray, h: float = 1e-6):
    """d sum(attention * r) / d(q, k, v) by central differences, all in f64."""
    args = [a.astype(np.float64) for a in args]
    grads = []
    for i, a in enumerate(args):
        g = np.zeros(a.shape)
        for j in np.ndindex(a.shape):
            plus, minus = [x.copy() for x in args], [x.copy() for x in args]
            plus[i][j] += h
            minus[i][j] -= h
            fp, fm = (np.sum(attention(*xs, np_softmax) * r) for xs in (plus, minus))
            g[j] = (fp - fm) / (2 * h)
        grads.append(g)
    return grads


def test_attention_gradient_through_the_promotion():
    q, k, v = attention_args(1)
    r = np.random.default_rng(2).standard_normal((5, 4))
    g = eqsat.grad(promoted_attn_loss, wrt=("q", "k", "v"))
    got = run(g, q, k, v, r)
    for name, gg, want in zip("qkv", got, numeric_attention_grad([q, k, v], r)):
        assert gg.dtype == np.float32, name  # a gradient has its parameter's type
        np.testing.assert_allclose(gg, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_attention_and_its_gradient_compiled_optimized_equal_interpret():
    g = eqsat.grad(promoted_attn_loss, wrt=("q", "k", "v"))
    m = eqsat.Module(promoted_attn, promoted_attn_loss, g)
    exe = eqsat.compile(m, optimize=True)
    q, k, v = attention_args(3)
    r = np.random.default_rng(4).standard_normal((5, 4))
    for name, args in ((promoted_attn.name, (q, k, v)), (g.name, (q, k, v, r))):
        want = eqsat.interpret(m, name, *args)
        got = exe(name, *args)
        for w, c in zip(*(x if isinstance(x, tuple) else (x,) for x in (want, got))):
            assert c.dtype == w.dtype, name
            np.testing.assert_allclose(c, w, rtol=1e-5, atol=1e-6, err_msg=name)


def np_layer_norm(x, gamma, beta, eps=1e-5):
    """eqsat.layer_norm's formula, in numpy."""
    d = x - x.mean(axis=-1, keepdims=True)
    var = (d * d).mean(axis=-1, keepdims=True)
    return d * (1 / np.sqrt(var + eps)) * gamma + beta


@pytest.mark.parametrize("gdt, bdt", [(np.float64, np.float32), (np.float32, np.int32),
                                      (np.int64, np.float64), (np.bool_, np.float32)])
def test_layer_norm_gamma_and_beta_promote_as_the_numpy_formula_does(gdt, bdt):
    @function
    def f(x: DType.f32[2, 3], gamma: DType.of(np.dtype(gdt))[3],
          beta: DType.of(np.dtype(bdt))[3]):
        return eqsat.layer_norm(x, gamma=gamma, beta=beta)

    x = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]], np.float32)
    gamma, beta = np.array([2, 1, 3]).astype(gdt), np.array([1, 0, -2]).astype(bdt)
    want, got = np_layer_norm(x, gamma, beta), run(f, x, gamma, beta)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
