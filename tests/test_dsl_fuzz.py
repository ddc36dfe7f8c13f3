"""Random numpy-style programs, run by numpy and traced by the DSL, must agree.

Hypothesis draws a short straight-line program over tensors of every eqsat dtype, Python and
numpy scalars: operators, comparisons, numpy's ufuncs and functions, reductions with keepdims,
slices with steps. The same Python code runs once on numpy arrays (the reference) and once
traced; where numpy computes a result and the DSL traces the program, the results' dtypes are
equal and their values close. The DSL may refuse a program (a TraceError at the user's line,
for what eqsat has no op for) and never raises anything else while tracing.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.errors import TraceError
from eqsat.ir.types import DType

from dsl_helpers import run

SHAPES = {"m": (3, 4), "v": (4,)}
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]
SCALARS = [2, 0.5, True, np.float32(1.5), np.float64(0.25), np.int32(2), np.int64(3)]
BINARY = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
          operator.pow, operator.lt, operator.eq, np.maximum, np.minimum, np.fmax, np.logaddexp,
          np.hypot]
UNARY = [np.exp, np.tanh, operator.neg, abs, lambda x: np.sqrt(abs(x)), np.square,
         lambda x: x.sum(axis=0, keepdims=True), lambda x: x.mean(axis=-1, keepdims=True),
         lambda x: x.max(axis=0, keepdims=True), lambda x: x[..., ::2].sum(axis=-1, keepdims=True),
         lambda x: np.clip(x, -1, 2), lambda x: np.where(x > 0, x, 0),
         lambda x: (x @ x.T)[..., :1] if x.ndim == 2 else (x @ x)[None],
         lambda x: np.concatenate([x, x], axis=-1)[..., 1::2],
         lambda x: x.var(axis=-1, keepdims=True), np.floor, lambda x: np.log1p(abs(x)), np.expm1,
         np.isnan, lambda x: np.triu(x, 1) if x.ndim == 2 else np.pad(x, (1, 0))[1:],
         lambda x: np.full_like(x, 3)]


def params(dtypes: list[type], kinds: list[str]) -> list[np.ndarray]:
    """Inputs: small integers (so powers and products stay in range), floats around 1."""
    rng = np.random.default_rng(0)
    out = []
    for dt, kind in zip(dtypes, kinds):
        shape = SHAPES[kind]
        if dt is np.bool_:
            out.append(rng.integers(0, 2, shape).astype(bool))
        elif np.dtype(dt).kind == "i":
            out.append(rng.integers(1, 4, shape).astype(dt))
        else:
            out.append(rng.uniform(0.25, 2.0, shape).astype(dt))
    return out


@st.composite
def programs(draw):
    """(parameter dtypes, parameter shapes, steps): each step applies a unary function to one
    earlier value, or a binary one to two values (earlier values or scalars)."""
    n = draw(st.integers(1, 3))
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(n)]
    kinds = [draw(st.sampled_from(sorted(SHAPES))) for _ in range(n)]
    steps = []
    for i in range(draw(st.integers(1, 4))):
        values = n + i
        if draw(st.booleans()):
            steps.append(("unary", draw(st.integers(0, len(UNARY) - 1)),
                          draw(st.integers(0, values - 1))))
        else:
            operand = st.one_of(st.integers(0, values - 1),
                                st.sampled_from(range(len(SCALARS))).map(lambda k: -1 - k))
            a, b = draw(operand), draw(operand)
            if a < 0 and b < 0:  # one operand at least is a tensor, as in numpy code
                a = draw(st.integers(0, values - 1))
            steps.append(("binary", draw(st.integers(0, len(BINARY) - 1)), a, b))
    return dtypes, kinds, steps


def execute(steps, *xs):
    """Run the program on `xs` (numpy arrays or traced values); the last two values."""
    values = list(xs)

    def get(k):
        return SCALARS[-1 - k] if k < 0 else values[k]

    for step in steps:
        if step[0] == "unary":
            values.append(UNARY[step[1]](values[step[2]]))
        else:
            values.append(BINARY[step[1]](get(step[2]), get(step[3])))
    return tuple(values[-2:]) if len(values) - len(xs) > 1 else values[-1]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_traced_programs_compute_what_numpy_computes(program):
    dtypes, kinds, steps = program
    args = params(dtypes, kinds)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = execute(steps, *args)
    except (TypeError, ValueError, OverflowError):
        want = None  # numpy refuses these types (or these values: int to a negative power)

    f = _function(steps, dtypes, kinds)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = eqsat.function(f)
    except TraceError:
        return
    if want is None:
        return
    got = run(traced, *args)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        w = np.asarray(w)
        assert g.dtype == w.dtype, (steps, dtypes, kinds, g.dtype, w.dtype)
        assert g.shape == w.shape, (steps, dtypes, kinds)
        if w.dtype.kind == "f":
            tol = 1e-5 if w.dtype == np.float32 or _touches_f32(dtypes, steps) else 1e-12
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True,
                                       err_msg=str((steps, dtypes, kinds)))
        else:
            np.testing.assert_array_equal(g, w, err_msg=str((steps, dtypes, kinds)))


def _touches_f32(dtypes, steps) -> bool:
    """Whether an f32 value takes part: the composites (np.log1p, ...) are a few ulp from
    numpy's, and an f32 ulp stays that large after promotion to f64 (f32 + np.float64(0.25))."""
    scalars = {SCALARS[-1 - k] for step in steps if step[0] == "binary" for k in step[2:] if k < 0}
    return np.float32 in dtypes or any(isinstance(v, np.float32) for v in scalars)


def _function(steps, dtypes, kinds):
    """A Python function `f(x0: T0, x1: T1, ...)` that runs the program (the DSL reads its
    parameters' annotations)."""
    names = [f"x{i}" for i in range(len(dtypes))]
    types = {f"T{i}": DType.of(np.dtype(dt))[SHAPES[kind]]
             for i, (dt, kind) in enumerate(zip(dtypes, kinds))}
    header = ", ".join(f"{n}: T{i}" for i, n in enumerate(names))
    namespace = {"execute": execute, "steps": steps, **types}
    exec(f"def f({header}):\n    return execute(steps, {', '.join(names)})\n", namespace)
    return namespace["f"]


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_fuzzed_programs_can_trace(dt):
    """The generator's building blocks trace on their own for each dtype where numpy computes
    them (so the fuzz above compares, rather than only collecting refusals)."""
    traced = 0
    for k in range(len(UNARY)):
        try:
            eqsat.function(_function([("unary", k, 0)], [dt], ["m"]))
            traced += 1
        except TraceError:
            pass
    assert traced >= (len(UNARY) // 2 if dt is np.bool_ else len(UNARY) - 1)
