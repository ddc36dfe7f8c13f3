"""The staged DSL: every function and operator against numpy through the reference interpreter,
broadcasting and constants in the emitted IR, calls and modules, and errors at the user's line."""

import math

import numpy as np
import pytest
import scipy.special

import eqsat
from eqsat.errors import Error, InterpretError
from eqsat.ir import Function, GradDecl, Module, interpret, parse, verify
from eqsat.ir import dsl
from eqsat.ir.dsl import TracedFunction, function
from eqsat.ir.ops import BINARY, COMPARE, UNARY
from eqsat.ir.types import DType

f32, f64, i32, i64, bool_ = DType.f32, DType.f64, DType.i32, DType.i64, DType.bool
RNG = np.random.default_rng(0)


def run(tf: TracedFunction, *arrays):
    """Interpret a traced function through a module built from it (the oracle path)."""
    return interpret(Module(tf), tf.name, *arrays)


def rand(shape, dtype=np.float32, low=-2.0, high=2.0):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.uniform(low, high, size=shape).astype(dtype)


def close(got, want, rtol=1e-5, atol=1e-6):
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


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


# ---------------------------------------------------------------- functions, calls, modules


@function
def affine(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
    return x @ w + b


@function
def stats(y: f32[8, 3]):
    return y.sum(axis=0), y.max()


@function
def model(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
    h = dsl.relu(affine(x, w, b))
    total, peak = stats(h)
    again = affine(x, w, b=b)
    return dsl.sum(total) + peak, again


def test_calls_emit_call_statements_and_modules_bring_callees():
    # Names are unique per process (another test file may trace an `affine` too): use .name.
    assert [s.attr.get("callee") for s in model.ir.body if s.op == "call"] == \
        [affine.name, stats.name, affine.name]
    call = next(s for s in model.ir.body if s.op == "call" and s.attr["callee"] == stats.name)
    assert len(call.results) == 2
    m = Module(model)
    assert [it.name for it in m] == [affine.name, stats.name, model.name]
    assert model.__eqsat_items__() == list(m.items)
    assert Module(affine, model) == m  # shared callees appear once
    verify(m)
    assert parse(str(m)) == m and str(parse(str(m))) == str(m)
    assert parse(str(model)).items == m.items  # str(f) is parseable text of f and its callees
    x, w, b = rand((8, 4)), rand((4, 3)), rand((3,))
    h = np.maximum(x @ w + b, 0)
    got_loss, got_again = run(model, x, w, b)
    close(got_loss, np.float32(h.sum(0).sum() + h.max()), rtol=1e-5)
    close(got_again, x @ w + b)


def test_statement_and_parameter_names():
    assert [p.name for p in affine.ir.params] == ["x", "w", "b"]
    assert [s.results[0] for s in affine.ir.body] == ["0", "1", "2"]
    assert affine.name == affine.ir.name and affine.__name__ == "affine"
    assert f"func @{affine.name}(%x: f32[8,4], %w: f32[4,3], %b: f32[3])" in repr(affine)


def test_eager_call_runs_the_interpreter():
    x, w, b = rand((8, 4)), rand((4, 3)), rand((3,))
    close(affine(x, w, b), x @ w + b)
    close(affine(x, w=w, b=b), x @ w + b)
    total, peak = stats(np.ones((8, 3), np.float32))
    close(total, np.full(3, 8, np.float32)), close(peak, np.float32(1))
    with pytest.raises(InterpretError, match="shape"):
        affine(x[:4], w, b)
    with pytest.raises(InterpretError, match="missing"):
        affine(x, w)


def test_call_with_a_scalar_argument():
    @function
    def scale(x: f32[3], s: f32[()]):
        return x * s

    @function
    def user(x: f32[3]):
        return scale(x, 2)

    assert "const 2.0 : f32[]" in str(user)
    close(run(user, np.ones(3, np.float32)), np.full(3, 2, np.float32))


def test_call_with_only_scalar_arguments_inside_a_trace_is_a_call():
    @function
    def square(s: f32[()]):
        return s * s

    @function
    def user(x: f32[3]):
        return x * square(3.0)  # no traced argument: still a call, not an eager run

    assert f"call @{square.name}(%" in str(user)
    close(run(user, np.ones(3, np.float32)), np.full(3, 9, np.float32))
    with pytest.raises(Error, match="numpy array"):
        @function
        def eager_inside(x: f32[3]):
            return x * square(np.ones((), np.float32))


def make_layer(n):
    @function
    def layer(x: f32[4]):
        return x * float(n)

    return layer


def test_name_clashes_get_unique_names():
    one, two, one_again = make_layer(1), make_layer(2), make_layer(1)
    assert one.name != two.name
    assert one_again.name == one.name  # identical IR keeps its name

    @function
    def both(x: f32[4]):
        return one(x) + two(x)

    m = Module(both)
    assert {it.name for it in m} == {one.name, two.name, both.name}
    verify(m)
    assert parse(str(m)) == m
    close(run(both, np.ones(4, np.float32)), np.full(4, 3, np.float32))


def test_from_ir_wraps_generated_functions_and_declarations():
    fn = Function("twice_gen", affine.ir.params, affine.ir.result_types,
                  affine.ir.body, affine.ir.returns)
    wrapped = TracedFunction.from_ir(fn, [])
    x, w, b = rand((8, 4)), rand((4, 3)), rand((3,))
    close(wrapped(x, w, b), x @ w + b)

    @function
    def scalar_loss(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
        return dsl.sum(affine(x, w, b))

    decl = TracedFunction.from_ir(GradDecl("scalar_loss_grad", "grad", scalar_loss.name,
                                           ("w",)), [scalar_loss])
    assert [it.name for it in Module(decl)] == [affine.name, scalar_loss.name, decl.name]
    assert decl.signature.results == (f32[4, 3],)

    @function
    def uses(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
        return decl(x, w, b) * 2.0, wrapped(x, w, b)

    m = Module(uses)
    assert f"call @{decl.name}(%x, %w, %b) : f32[4,3]" in str(m)
    assert parse(str(m)) == m
    with pytest.raises(Error):
        TracedFunction.from_ir("not ir")


def test_from_ir_renames_a_dependency_whose_name_a_traced_function_holds():
    """A plain Function passed as a dependency kept its name although a different traced
    function held it, and a function calling both failed with 'two different functions'."""
    @function
    def from_ir_dep(x: f32[3]):
        return x * 2.0

    m = parse("func @from_ir_dep(%x: f32[3]) -> f32[3] {\n  %0 = const 5.0 : f32[3]\n"
              "  %1 = mul %x, %0 : f32[3]\n  return %1\n}\n"
              "func @from_ir_user(%x: f32[3]) -> f32[3] {\n"
              "  %0 = call @from_ir_dep(%x) : f32[3]\n  return %0\n}\n")
    user = TracedFunction.from_ir(m["from_ir_user"], [m["from_ir_dep"]])

    @function
    def both(x: f32[3]):
        return user(x) + from_ir_dep(x)

    assert len({it.name for it in Module(both)}) == 4
    close(both(np.ones(3, np.float32)), np.full(3, 7.0, np.float32))


def test_eager_calls_go_through_the_runner_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(TracedFunction, "runner",
                        lambda module, name, *args: seen.append((module, name, len(args))))
    affine(1, 2, 3)
    assert seen == [(Module(affine, name=affine.name), affine.name, 3)]


def test_traced_functions_verify_and_accept_string_annotations():
    @function
    def g(x: "f32[2, 2]", s: "f32[()]") -> "f32[2, 2]":
        return x * s

    assert g.ir.params[1].type == f32[()] and verify(Module(g))
    close(g(np.eye(2, dtype=np.float32), np.float32(3)), 3 * np.eye(2, dtype=np.float32))



def test_transpose_none_reverses_axes_as_numpy():
    import numpy as np

    import eqsat

    def t(x: eqsat.f32[2, 3, 4]):
        return x.transpose(None), np.transpose(x)

    tf = eqsat.function(t)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for got in tf(x):
        np.testing.assert_array_equal(got, np.transpose(x))


def test_traced_functions_pickle_as_their_ir():
    """The module-level name of a decorated function is the TracedFunction, so pickle could
    not store the Python function by name; it pickles as its IR and the functions it calls."""
    import pickle

    @function
    def inner(x: DType.f32[3]):
        return dsl.exp(x) * 2.0

    @function
    def outer(x: DType.f32[3], y: DType.f32[3]):
        """A docstring kept across pickling."""
        return inner(x) + y

    back = pickle.loads(pickle.dumps(outer))
    assert isinstance(back, TracedFunction) and back.module == outer.module
    assert (back.__name__, back.__doc__) == ("outer", "A docstring kept across pickling.")
    x, y = np.float32([0.5, -1.0, 2.0]), np.float32([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(back(x, y), outer(x, y))


def test_unpickled_functions_take_their_names_in_the_new_process(monkeypatch):
    """A traced function unpickled in a fresh process (a worker) did not register its names
    there: a different function traced there under a callee's name took that name too, and a
    function using both failed with 'two different functions are named @f'."""
    import pickle

    from eqsat.ir import dsl_function

    def make_f(k: float) -> TracedFunction:
        def pickled_callee(x: DType.f32[3]):
            return x * k
        return function(pickled_callee)

    f = make_f(2.0)

    @function
    def pickled_caller(x: DType.f32[3]):
        return f(x) + 1.0

    blob = pickle.dumps(pickled_caller)
    x = np.float32([1.0, 2.0, 3.0])
    for first_here in ("unpickled", "traced"):  # a fresh process: no names handed out yet
        monkeypatch.setattr(dsl_function, "_NAMES", {})
        if first_here == "traced":
            other = make_f(5.0)
        back = pickle.loads(blob)
        if first_here == "unpickled":
            other = make_f(5.0)

        @function
        def h(x: DType.f32[3]):
            return back(x) + other(x)

        f_name = "pickled_callee"
        assert back.name == "pickled_caller"
        assert other.name == (f_name if first_here == "traced" else f_name + "_2")
        assert {it.name for it in h.module} == {f_name, f_name + "_2", back.name, h.name}
        np.testing.assert_allclose(h(x), x * 2.0 + 1.0 + x * 5.0)
