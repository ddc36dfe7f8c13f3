"""Trace errors of the staged DSL: each names the user's file and line and says what is wrong."""

import numpy as np
import pytest

from eqsat.errors import Error, TraceError
from eqsat.ir import dsl
from eqsat.ir.dsl import function
from eqsat.ir.types import DType

f32, i32 = DType.f32, DType.i32


def line_of(marker: str) -> int:
    """The line of this file carrying `marker` in a comment (for error-location tests)."""
    with open(__file__) as fh:
        lines = [i + 1 for i, text in enumerate(fh) if text.rstrip().endswith("# " + marker)]
    assert len(lines) == 1, marker
    return lines[0]


def assert_located(err: pytest.ExceptionInfo, marker: str, *fragments: str) -> None:
    msg = str(err.value)
    assert f"test_dsl_errors.py:{line_of(marker)}: " in msg, msg
    assert err.value.lineno == line_of(marker)
    for frag in fragments:
        assert frag in msg, msg


# ---------------------------------------------------------------- errors at the user's line


def test_shape_error_names_the_users_line():
    with pytest.raises(TraceError) as err:
        @function
        def f(x: f32[3, 4], w: f32[5, 6]):
            return x @ w  # matmul-error
    assert_located(err, "matmul-error",
                   "matmul: inner dimensions differ (f32[3,4] @ f32[5,6]: 4 != 5)")


def helper_that_fails(x):
    return x + x.T  # helper-error


def test_error_in_a_helper_names_the_helpers_line():
    with pytest.raises(TraceError) as err:
        @function
        def f(x: f32[3, 4]):
            return helper_that_fails(x)
    assert_located(err, "helper-error", "cannot broadcast f32[3,4] and f32[4,3]")


ERRORS = {  # marker: (body, message fragment); each body sits on the marked line below
    "promoted-floordiv": (lambda x, n: x // n, "floor division of f64[3,4]"),
    "float-floordiv": (lambda x, n: x // 2.0, "floor division of f32[3,4]"),
    "axis": (lambda x, n: dsl.sum(x, axis=2), "sum: axis 2 is out of range for rank 2"),
    "reshape": (lambda x, n: x.reshape(5, 3), "reshape must keep the element count"),
    "exp-bool": (lambda x, n: dsl.exp(n > 0), "exp: numpy computes it of a bool tensor"),
    "slice-step": (lambda x, n: x[::-1], "step -1 is not supported"),
    "index": (lambda x, n: x[3], "index 3 is out of range for axis 0"),
    "array": (lambda x, n: x + np.ones(4), "a numpy array of shape (4,)"),
    "bool": (lambda x, n: x if x > 0 else -x, "truth value"),
    "where": (lambda x, n: dsl.where(x, x, x), "condition must be bool"),
    "broadcast": (lambda x, n: dsl.broadcast_to(x, (4, 4)), "cannot broadcast f32[3,4] to"),
    "concat": (lambda x, n: dsl.concatenate([x, n.T]), "axis 0: f64[4,3] does not fit f64[3,4]"),
    "ufunc": (lambda x, n: np.add.reduce(x), "numpy's add (reduce) cannot run"),
    "scalars": (lambda x, n: dsl.exp(2.0), "exp needs a traced value"),
}


@pytest.mark.parametrize("marker", sorted(ERRORS))
def test_trace_errors(marker):
    body, fragment = ERRORS[marker]
    with pytest.raises(TraceError) as err:
        @function
        def f(x: f32[3, 4], n: i32[3, 4]):
            return body(x, n)

    msg = str(err.value)
    assert fragment in msg, msg
    # The message points into this file, at the lambda's line in ERRORS.
    line = body.__code__.co_firstlineno
    assert f"test_dsl_errors.py:{line}: " in msg and err.value.lineno == line, msg


def test_annotation_errors():
    with pytest.raises(TraceError) as err:
        @function  # missing-annotation
        def f(x: f32[3], y):
            return x
    assert_located(err, "missing-annotation", "parameter 'y' of f has no type annotation")
    # a default was dropped silently (calls without y then failed: missing argument(s) y)
    for default in ("annotated", "bare"):
        with pytest.raises(TraceError) as err:
            if default == "annotated":
                @function  # with-default
                def h(x: f32[3], y: f32[()] = 2.0):
                    return x * y
            else:
                @function  # with-default
                def h(x: f32[3], eps=1e-5):
                    return x + eps
        assert "has a default" in str(err.value) and "constant in the body" in str(err.value)
    with pytest.raises(TraceError, match="annotated 3, not a tensor type"):
        @function
        def g(x: 3):
            return x
    with pytest.raises(TraceError, match=r"\*rest parameters are not supported"):
        @function
        def h(x: f32[3], *rest: f32[3]):
            return x
    with pytest.raises(TraceError, match="cannot read the annotations"):
        @function
        def k(x: "undefined_name[3]"):  # noqa: F821
            return x
    with pytest.raises(TraceError, match="use a def, not a lambda"):
        function(lambda x: x)
    with pytest.raises(TraceError, match="decorates a Python function, not 3"):
        function(3)

    @function
    def traced(x: f32[3]):
        return x

    assert function(traced) is traced  # decorating a traced function again changes nothing
    with pytest.raises(TraceError, match="annotated to return f32\\[4\\] but returns f32\\[3\\]"):
        @function
        def r(x: f32[3]) -> f32[4]:
            return x


def test_misspelled_tensor_types_say_how_to_write_them():
    """f32[3][4] and f32() raised Python's TypeError ('not subscriptable', 'not callable')."""
    from eqsat.errors import Error

    with pytest.raises(Error, match=r"written in one subscript, f32\[3, 4\], not f32\[3\]\[4\]"):
        f32[3][4]
    with pytest.raises(Error, match=r"f32 is a dtype, not a function: write f32\[3, 4\]"):
        f32()
    assert DType("f32") is f32  # looking a dtype up by name still works


def test_result_errors_and_escaped_values():
    with pytest.raises(TraceError, match="returns nothing"):
        @function
        def none(x: f32[3]):
            pass
    with pytest.raises(TraceError, match="returns 1.0"):
        @function
        def scalar(x: f32[3]):
            return 1.0
    leaked = []

    @function
    def leak(x: f32[3]):
        leaked.append(x)
        return x

    with pytest.raises(TraceError, match="whose tracing has finished"):
        @function
        def late(y: f32[3]):
            return y + leaked[0]

    with pytest.raises(TraceError, match="pass it as a parameter"):
        @function
        def outer(x: f32[3]):
            @function
            def inner(y: f32[3]):
                return y + x
            return inner(x)


def test_tracers_are_hashable_and_len():
    @function
    def f(x: f32[3, 4]):
        seen = {x: 1}
        assert seen[x] == 1 and len(x) == 3
        return x

    assert f.ir.returns == ("x",)


def test_call_with_a_wrong_argument_type():
    @function
    def scale(x: f32[3], s: f32[()]):
        return x * s

    with pytest.raises(TraceError) as err:
        @function
        def bad(x: f32[4]):
            return scale(x, 2.0)  # bad-call
    assert_located(err, "bad-call", "argument 1 of @scale (%x) must be f32[3], got f32[4]")


@pytest.mark.parametrize("dims", [2.5, True, None, [3, 4], "a", np.float64(3.7), -1, (2, 3.0)])
def test_bad_dimensions_in_an_annotation(dims):
    """`f32[...]` takes integers (numpy's too): a float was truncated, True became 1, and
    other values raised TypeError or an unrelated ValueError."""
    from eqsat.errors import Error
    with pytest.raises(Error, match=r"f32\[") as e:
        DType.f32[dims]
    assert type(e.value) is Error


def test_numpy_integer_dimensions_are_fine():
    assert DType.f32[np.int64(5), 3].shape == (5, 3) and DType.f64[()].shape == ()


def test_numpy_reductions_on_traced_values():
    """np.sum / np.mean / np.max / np.min dispatch to the tracer with numpy's dtype= and out=
    keywords (they raised TypeError); non-default ones are TraceErrors at the user's line."""
    @function
    def f(x: DType.f32[3, 4]):
        return np.sum(x) + np.mean(x, axis=0).sum() + np.max(x) + np.min(x, axis=1).sum()

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = np.sum(x) + np.mean(x, axis=0).sum() + np.max(x) + np.min(x, axis=1).sum()
    assert float(f(x)) == pytest.approx(float(want))
    with pytest.raises(TraceError, match=r"test_dsl_errors.py:\d+: sum\(dtype=...\)"):
        @function
        def g(x: DType.f32[3]):
            return np.sum(x, dtype=np.float64)


def test_python_int_too_large_for_the_dtype():
    def huge(x: i32[3]):
        return x + 10**5000

    def big(x: i32[3]):
        return x * 2**40

    for fn in (huge, big):
        with pytest.raises(TraceError, match="does not fit in i32"):
            function(fn)


def test_python_int_too_large_for_a_float_dtype():
    """A float tensor with an int past float's range raised the ValueError of str() on an int
    of 5000 digits, where the i32 case said its size."""
    def huge(x: f32[3]):
        return x * 10**5000

    with pytest.raises(TraceError, match="an integer of 16610 bits is too large for f32"):
        function(huge)


@pytest.mark.parametrize("body", [lambda x: x % 2, lambda x: (x > 0) & (x < 1), lambda x: ~(x > 0),
                                  lambda x: round(x), lambda x: pow(x, 2, 3),
                                  lambda x: divmod(x, 2)])
def test_operators_without_an_op_are_trace_errors(body):
    def g(x: f32[3]):
        return body(x)

    with pytest.raises(TraceError, match="not supported|cannot be traced"):
        function(g)


@pytest.mark.parametrize("body, fragment", [
    (lambda x: x.copy(), "has no .copy, which numpy's ndarray has; use x itself"),
    (lambda x: x.cumsum(), "has no .cumsum"), (lambda x: x.prod(), "has no .prod"),
    (lambda x: np.cumsum(x), "numpy's cumsum cannot run on traced values"),
    (lambda x: np.sum(x, where=x > 0), "sum(where=...) cannot be traced"),
    (lambda x: np.max(x, initial=0.0), "max(initial=...) cannot be traced"),
    (lambda x: x.reshape((3,), order="F"), "reshape(order=...) cannot be traced"),
    (lambda x: f"{x:.3f}", "no Python value to format"),
])
def test_ndarray_methods_and_keywords_without_a_trace_are_trace_errors(body, fragment):
    """numpy's ndarray methods and keywords eqsat lacks raised AttributeError or TypeError; they
    name the user's line now (a missing method is also an AttributeError, for hasattr)."""
    def g(x: f32[3]):
        return body(x)

    with pytest.raises(TraceError, match=r"test_dsl_errors.py:\d+: ") as err:
        function(g)
    assert fragment in str(err.value)


def test_writing_into_a_traced_value_is_a_trace_error():
    def assign(x: f32[3]):
        x[0] = 1.0  # item assignment
        return x

    def reshape_in_place(x: f32[3]):
        x.shape = (3, 1)  # shape assignment
        return x

    for fn, marker in [(assign, "item assignment"), (reshape_in_place, "shape assignment")]:
        with pytest.raises(TraceError) as err:
            function(fn)
        assert_located(err, marker, "cannot be changed in place")


def test_traced_values_answer_hasattr_and_copy_and_known_numpy_keywords():
    import copy

    @function
    def f(x: f32[2, 3]):
        assert not hasattr(x, "cumsum") and getattr(x, "prod", None) is None
        y = copy.deepcopy(x).reshape((3, 2), order="C").astype(np.float32, copy=False)
        return y.sum(axis=0, initial=None) + np.mean(x, axis=1)

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(f(x), x.reshape(3, 2).sum(axis=0) + x.mean(axis=1))


@pytest.mark.parametrize("name", ["softmax", "logsumexp", "layer_norm", "gelu"])
def test_composites_on_integer_tensors_name_themselves(name):
    """logsumexp of an i32 tensor failed inside its formula ('lt: cannot combine i32[1] with
    the float inf'), softmax at an exp the user never wrote."""
    composite = getattr(dsl, name)

    def g(x: i32[3]):
        return composite(x)

    with pytest.raises(TraceError, match=rf"test_dsl_errors.py:\d+: {name}: needs a float "
                                         rf"tensor, got i32\[3\]"):
        function(g)


@pytest.mark.parametrize("name", ["softmax", "logsumexp", "layer_norm"])
def test_composites_of_a_scalar_name_themselves(name):
    # softmax of an f32[] said 'max: axis -1 is out of range', an op the user never wrote
    composite = getattr(dsl, name)

    def g(x: f32[()]):
        return composite(x)

    with pytest.raises(TraceError, match=rf"{name}: needs a tensor with an axis to work "
                                         rf"along, got the scalar f32\[\]"):
        function(g)


@pytest.mark.parametrize("name", ["softmax", "logsumexp", "layer_norm"])
def test_composites_name_themselves_for_an_axis_out_of_range(name):
    # softmax(x, axis=2) of an f32[3,4] said 'max: axis 2 is out of range for rank 2'
    composite = getattr(dsl, name)

    def g(x: f32[3, 4]):
        return composite(x, axis=2)

    with pytest.raises(TraceError, match=rf"test_dsl_errors.py:\d+: {name}: axis 2 is out of "
                                         rf"range for rank 2"):
        function(g)


@pytest.mark.parametrize("body", [lambda x: x[10**5000], lambda x: x.reshape(10**5000),
                                  lambda x: x.sum(axis=-10**5000),
                                  lambda x: dsl.softmax(x, 10**5000),
                                  lambda x: dsl.broadcast_to(x, (10**5000, 3))])
def test_absurd_python_ints_as_indices_axes_and_dimensions(body):
    """An int of 5000 digits as an index, axis or dimension raised the ValueError of str() on
    it while the message was built; slices clip it, as numpy's do."""
    def g(x: f32[3]):
        return body(x) + x[10**5000:].sum() + x[-10**5000:]

    with pytest.raises(TraceError, match=r"an integer of 16610 bits is out of range"):
        function(g)
    with pytest.raises(Error, match=r"a dimension of 16610 bits is out of range"):
        DType.f32[10**5000]
