"""The staged DSL's operations against numpy through the reference interpreter: every
elementwise function and operator, broadcasting and constants in the emitted IR, reductions,
layout and slicing, matmul, where, and the composites (softmax, logsumexp, layer_norm, gelu)."""

import math
import os

import numpy as np
import pytest
import scipy.special

import eqsat
from eqsat.errors import Error
from eqsat.ir import Module, dsl, parse
from eqsat.ir.dsl import TracedFunction, function
from eqsat.ir.ops import BINARY, COMPARE, UNARY
from eqsat.ir.types import DType

from ad_helpers import check_vjp
from dsl_helpers import RNG, close, rand, run

f32, f64, i32, i64, bool_ = DType.f32, DType.f64, DType.i32, DType.i64, DType.bool


def ops_of(tf: TracedFunction) -> list[str]:
    return [s.op for s in tf.ir.body]


# ---------------------------------------------------------------- elementwise functions

NUMPY_UNARY = {
    "negative": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0), "reciprocal": np.reciprocal, "sin": np.sin, "cos": np.cos,
}
NUMPY_BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "power": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "divide": np.divide, "less": np.less,
    "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "equal": np.equal, "not_equal": np.not_equal,
}


def test_every_table_op_has_a_dsl_function():
    # New unary/binary/compare ops of the table get a DSL function (and need a reference here).
    assert len(NUMPY_UNARY) == len(UNARY)
    assert len(NUMPY_BINARY) == len(BINARY | COMPARE)
    for name in {**NUMPY_UNARY, **NUMPY_BINARY}:
        assert callable(getattr(dsl, name)) and name in dsl.__all__


@pytest.mark.parametrize("name", sorted(NUMPY_UNARY))
def test_unary_function(name):
    @function
    def f(x: f32[3, 4]):
        return getattr(dsl, name)(x)

    x = rand((3, 4), low=0.25, high=2.0)  # inside every op's domain
    close(run(f, x), NUMPY_UNARY[name](x).astype(np.float32))
    assert len(f.ir.body) == 1 and f.ir.body[0].op in UNARY


@pytest.mark.parametrize("name", sorted(NUMPY_BINARY))
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)),
                                    ((2, 1, 4), (3, 1)), ((), (2, 3))])
def test_binary_function_broadcasts_like_numpy(name, shapes):
    sx, sy = shapes

    @function
    def f(x: f32[sx], y: f32[sy]):
        return getattr(dsl, name)(x, y)

    x, y = rand(sx, low=0.5, high=2.0), rand(sy, low=0.5, high=2.0)
    want = NUMPY_BINARY[name](x, y)
    close(run(f, x, y), want)
    out_shape = np.broadcast_shapes(sx, sy)
    broadcasts = [s for s in f.ir.body if s.op == "broadcast"]
    assert len(broadcasts) == (sx != out_shape) + (sy != out_shape)
    assert all(s.type.shape == out_shape for s in broadcasts)


OPERATORS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "**": lambda a, b: a ** b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


@pytest.mark.parametrize("sym", sorted(OPERATORS))
def test_operators_with_tensors_and_scalars(sym):
    op = OPERATORS[sym]

    @function
    def f(x: f32[3, 4], y: f32[4]):
        return op(x, y), op(x, 1.5), op(2, x), op(y, True)

    x, y = rand((3, 4), low=0.5, high=2.0), rand((4,), low=0.5, high=2.0)
    x[0, 0] = 1.5  # an exact tie for the comparisons
    got = run(f, x, y)
    want = (op(x, y), op(x, np.float32(1.5)), op(np.float32(2), x), op(y, np.float32(1)))
    for g, w in zip(got, want):
        close(g, w)


def test_power_of_one_half_is_numpys_sqrt():
    # numpy computes x ** 0.5 (a scalar exponent) as sqrt: nan at -inf and -0.0 at -0.0, where
    # pow gives inf and 0.0; a full array of exponents stays pow
    @function
    def f(x: f32[4], y: f32[4]):
        return x ** 0.5, x ** np.float32(0.5), x ** y

    x = np.array([-np.inf, -0.0, 4.0, 2.0], np.float32)
    y = np.full(4, 0.5, np.float32)
    with np.errstate(invalid="ignore"):
        want = (x ** 0.5, x ** np.float32(0.5), x ** y)
        for got in (run(f, x, y), eqsat.compile(f)(f.name, x, y)):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
                np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


def test_unary_operators_matmul_and_properties():
    @function
    def f(x: f32[3, 4], w: f32[4, 2]):
        assert (x.shape, x.dtype, x.ndim, x.size, x.type) == ((3, 4), f32, 2, 12, f32[3, 4])
        return -x, +x, abs(x), x @ w, x.T, x.transpose(1, 0)

    x, w = rand((3, 4)), rand((4, 2))
    for g, want in zip(run(f, x, w), (-x, x, np.abs(x), x @ w, x.T, x.T)):
        close(g, want)


def test_scalar_constants_are_typed_at_the_needed_shape():
    @function
    def f(x: f32[128, 10], n: i32[5]):
        return x * 2 + 2.0, n + 3, 1 - x

    text = str(f)
    assert "const 2.0 : f32[128,10]" in text  # an int with a float tensor is a float constant
    assert "const 3 : i32[5]" in text
    assert len([s for s in f.ir.body if s.op == "const"]) == 3  # 2.0 once, 3, 1.0
    x, n = rand((128, 10)), rand((5,), np.int32)
    got = run(f, x, n)
    close(got[0], x * 2 + 2), close(got[1], n + 3), close(got[2], 1 - x)


def test_a_float_scalar_beyond_f32_becomes_inf_with_numpys_warning():
    """numpy casts a Python float too large for an f32 array's dtype to inf and warns; traced
    code computes the same (a generic sentinel such as -1e300 clamps an f32 array there too),
    warns at the user's line, and writes the constant as the inf it is, so the text reads
    back. `np.errstate(over="raise")` makes it the error numpy raises."""
    def body(x: f32[4]):
        return x * 1e39, np.maximum(x, -1e300), x < 1e39

    x = np.array([1.0, -2.0, 0.0, 3.0], np.float32)
    with pytest.warns(RuntimeWarning, match=r"overflows f32 \(the largest finite f32 is "
                      r"3.4028235e\+38\) and becomes -?inf") as caught:
        f = function(body)
    assert [str(w.message).split(" overflows")[0] for w in caught] == [
        "mul: 1e+39", "maximum: -1e+300", "lt: 1e+39"]
    assert {os.path.abspath(w.filename) for w in caught} == {__file__}
    assert "const inf : f32[4]" in str(f) and "const -inf : f32[4]" in str(f)
    assert parse(str(Module(f))) == Module(f)
    with np.errstate(over="ignore", invalid="ignore"):  # and 0 * inf is nan
        want = body(x)
    for got, w in zip(run(f, x), want):
        np.testing.assert_array_equal(got, w)
        assert got.dtype == w.dtype
    with np.errstate(over="raise"), pytest.raises(Error, match="overflows f32"):
        function(body)


def test_integer_and_bool_tensors():
    @function
    def f(a: i64[4], b: i64[4], c: bool_[4]):
        return a // b, a * b - 1, a ** 2, dsl.where(c, a, -a), c == True  # noqa: E712

    a, b = rand((4,), np.int64), np.array([1, 2, -3, 4], dtype=np.int64)
    c = np.array([True, False, True, False])
    got = run(f, a, b, c)
    for g, want in zip(got, (a // b, a * b - 1, a ** 2, np.where(c, a, -a), c)):
        np.testing.assert_array_equal(g, want)


def test_numpy_ufuncs_on_tracers():
    @function
    def f(x: f32[3]):
        return np.exp(x), np.maximum(x, 0.5), np.float32(2.0) * x, np.divide(x, 2.0)

    x = rand((3,))
    for g, want in zip(run(f, x), (np.exp(x), np.maximum(x, np.float32(0.5)), 2 * x, x / 2)):
        close(g, want)


def test_a_numpy_scalar_left_of_a_comparison():
    # Python asks the numpy scalar first, which calls the ufunc with itself as a 0-d array
    @function
    def f(x: f32[4], c: bool_[4]):
        return np.float32(1.5) < x, np.float32(1.5) == x, np.int32(2) >= x, np.bool_(True) != c

    x, c = np.array([1.0, 1.5, 2.0, -1.0], np.float32), np.array([True, False, True, False])
    want = (np.float32(1.5) < x, np.float32(1.5) == x, np.int32(2) >= x, np.bool_(True) != c)
    for got, w in zip(run(f, x, c), want):
        np.testing.assert_array_equal(got, w)
        assert got.dtype == w.dtype


# ---------------------------------------------------------------- reductions and layout


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (-1, 0), ()])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(axis, keepdims):
    @function
    def f(x: f32[2, 3, 4]):
        return (dsl.sum(x, axis, keepdims), dsl.max(x, axis, keepdims),
                dsl.min(x, axis=axis, keepdims=keepdims), dsl.mean(x, axis, keepdims),
                x.sum(axis=axis, keepdims=keepdims), x.mean(axis, keepdims))

    x = rand((2, 3, 4))
    got = run(f, x)
    want = (np.sum(x, axis, keepdims=keepdims), np.max(x, axis, keepdims=keepdims),
            np.min(x, axis, keepdims=keepdims), np.mean(x, axis, keepdims=keepdims),
            x.sum(axis, keepdims=keepdims), x.mean(axis, keepdims=keepdims))
    for g, w in zip(got, want):
        close(g, np.asarray(w, dtype=np.float32))
    reductions = [s for s in f.ir.body if s.op in ("sum", "max", "min")]
    assert all(list(s.attr["axes"]) == sorted(s.attr["axes"]) for s in reductions)


def test_layout_functions():
    @function
    def f(x: f32[2, 3, 4], y: f32[2, 5, 4], v: f32[4]):
        return (dsl.transpose(x), dsl.transpose(x, (0, -1, 1)), dsl.reshape(x, (6, -1)),
                x.reshape(4, 6), x.reshape(24), dsl.broadcast_to(v, (3, 4)),
                dsl.concatenate([x, y], axis=1), dsl.concatenate((x, x, x), axis=-1),
                dsl.cast(x, i32), x.astype(np.float64), x.astype("f32"))

    x, y, v = rand((2, 3, 4)), rand((2, 5, 4)), rand((4,))
    want = (x.transpose(), x.transpose(0, 2, 1), x.reshape(6, -1), x.reshape(4, 6),
            x.reshape(24), np.broadcast_to(v, (3, 4)), np.concatenate([x, y], 1),
            np.concatenate([x, x, x], -1), x.astype(np.int32), x.astype(np.float64), x)
    for g, w in zip(run(f, x, y, v), want):
        np.testing.assert_array_equal(g, w)
    assert "cast" in ops_of(f) and ops_of(f).count("cast") == 2  # astype(f32) emits nothing


def test_transpose_none_reverses_axes_as_numpy():
    import numpy as np

    import eqsat

    def t(x: eqsat.f32[2, 3, 4]):
        return x.transpose(None), np.transpose(x)

    tf = eqsat.function(t)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for got in tf(x):
        np.testing.assert_array_equal(got, np.transpose(x))


@pytest.mark.parametrize("key", [
    np.s_[1], np.s_[-1], np.s_[1:3], np.s_[:, 1:3], np.s_[0, :, 2], np.s_[..., 1],
    np.s_[None, 1], np.s_[1:2, None, ..., -3:], np.s_[-10:10], np.s_[2:1], np.s_[:],
])
def test_basic_slicing(key):
    @function
    def f(x: f32[3, 4, 5]):
        return x[key]

    x = rand((3, 4, 5))
    np.testing.assert_array_equal(run(f, x), x[key])
    assert set(ops_of(f)) <= {"slice", "reshape"}
    assert ops_of(f).count("slice") <= 1


@pytest.mark.parametrize("key", [
    np.s_[::2], np.s_[:, 1::2], np.s_[1:, ::3, 1:4:2], np.s_[::5, ::4, ::9], np.s_[..., ::2],
    np.s_[None, 1::2, 2], np.s_[2:3:2], np.s_[3:1:2], np.s_[:, 3::2],
])
def test_strided_slicing_takes_every_step_th_element(key):
    """A slice with a step > 1 is slices, reshapes and a concat (no strided op in the IR); it
    runs compiled and differentiates as numpy's indexing does."""
    @function
    def f(x: f64[3, 4, 9]):
        return x[key]

    x = RNG.standard_normal((3, 4, 9))
    np.testing.assert_array_equal(run(f, x), x[key])
    np.testing.assert_array_equal(eqsat.compile(f)(f, x), x[key])
    if x[key].size:
        check_vjp(Module(f), f.name, [x])


def test_iterating_a_tracer_gives_rows():
    @function
    def f(x: f32[3, 2]):
        return dsl.concatenate([row * float(i) for i, row in enumerate(x)], axis=0)

    x = rand((3, 2))
    close(run(f, x), np.concatenate([x[i] * i for i in range(3)]))


@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4),
                                                                        (5, 4, 2))])
def test_matmul_like_numpy(sa, sb):
    @function
    def f(a: f32[sa], b: f32[sb]):
        return dsl.matmul(a, b), a @ b

    a, b = rand(sa), rand(sb)
    for g in run(f, a, b):
        close(g, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_rows_times_a_matrix_is_one_product_and_its_gradient_no_stack():
    """x[B, T, D] @ w is one [B*T, D] @ [D, N] product: traced as a batched product of w
    broadcast, w's gradient was a [B, D, N] stack of products summed over B (B times w's
    memory: 512 MiB for a [1024, 4096] layer at B = 32)."""
    @function
    def f(x: f32[3, 5, 4], w: f32[4, 6], r: f32[3, 5, 6]):
        return ((x @ w) * r).sum()

    g = eqsat.grad(f, wrt=("w",))
    stmts = [s for s in g.ir.body if s.op in ("matmul", "matmul_t", "broadcast")]
    assert [s.op for s in stmts] == ["matmul"] and stmts[0].types[0].shape == (4, 6)
    x, w, r = rand((3, 5, 4)), rand((4, 6)), rand((3, 5, 6))
    close(run(g, x, w, r), np.einsum("btd,btn->dn", x, r), rtol=1e-5, atol=1e-5)
    close(run(f, x, w, r), np.sum((x @ w) * r), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 4), (4,), ()])
def test_where_broadcasts_condition_and_scalars(shape):
    @function
    def f(c: bool_[shape], x: f32[3, 4]):
        return dsl.where(c, x, 0.0), dsl.where(x > 0, 1.0, x), dsl.where(True, x, -x)

    c, x = RNG.random(shape) > 0.5, rand((3, 4))
    want = (np.where(c, x, np.float32(0)), np.where(x > 0, np.float32(1), x), x)
    for g, w in zip(run(f, c, x), want):
        close(g, w)


# ---------------------------------------------------------------- composites


def test_composites_match_numpy_formulas():
    @function
    def f(x: f32[4, 6], g: f32[6], b: f32[6]):
        return (dsl.softmax(x), dsl.softmax(x, axis=0), dsl.logsumexp(x),
                dsl.logsumexp(x, axis=(0, 1)), dsl.logsumexp(x, axis=0, keepdims=True),
                dsl.layer_norm(x), dsl.layer_norm(x, gamma=g, beta=b, eps=1e-3), dsl.gelu(x))

    x, g, b = rand((4, 6), low=-30, high=30), rand((6,)), rand((6,))
    d = x - x.mean(-1, keepdims=True)
    norm = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
    norm3 = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-3)
    gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    want = (scipy.special.softmax(x, -1), scipy.special.softmax(x, 0),
            scipy.special.logsumexp(x, -1), scipy.special.logsumexp(x, (0, 1)),
            scipy.special.logsumexp(x, 0, keepdims=True), norm, norm3 * g + b, gelu)
    for got, w in zip(run(f, x, g, b), want):
        close(got, w.astype(np.float32), rtol=1e-4, atol=1e-5)


def test_logsumexp_is_stable_for_large_and_infinite_rows():
    @function
    def f(x: f64[3, 3]):
        return dsl.logsumexp(x), dsl.softmax(x)

    x = np.array([[1000.0, 1000.0, 999.0], [-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]])
    lse, sm = run(f, x)
    np.testing.assert_allclose(lse, scipy.special.logsumexp(x, -1))
    np.testing.assert_allclose(sm[[0, 2]], scipy.special.softmax(x[[0, 2]], -1))
