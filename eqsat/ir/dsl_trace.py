"""The tracing core of the staged DSL: traces, typed statement emission and the primitives.

While a Python function runs once under `@eqsat.function`, every operation on its traced values
(`Tracer`s, in dsl_tracer) appends a statement to the active trace. Statements are typed by the
op table's `infer`, so an ill-typed program fails at once, as a `TraceError` naming the user's
line. dsl_tracer builds Tracer's operators on the primitives here; this module reaches Tracer
only when it runs (`_tracer`), so the import goes one way.
"""

from __future__ import annotations

import math
import operator
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TraceError
from .module import Stmt
from .ops import OPS, OpTypeError, float_overflow
from .types import DTYPES, DType, TensorType, shape_problem

if TYPE_CHECKING:
    from .dsl_tracer import Tracer

Scalar = bool | int | float
# numpy's scalars of a numeric dtype: strongly typed, so they take part in promotion (NEP 50)
NUMPY_SCALARS = (np.number, np.bool_)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# numpy's own frames sit between the user's line and ours when a numpy function (np.sum, np.exp)
# dispatches to a Tracer
_SKIPPED = (_PACKAGE_DIR, os.path.dirname(os.path.abspath(np.__file__)) + os.sep)

# ---------------------------------------------------------------- errors at the user's line


def user_location() -> tuple[str, int] | None:
    """File and line of the innermost stack frame outside eqsat and numpy (the user's code)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_SKIPPED):
            rel = os.path.relpath(path) if os.path.splitdrive(path)[0] == "" else path
            return (path if rel.startswith("..") else rel), frame.f_lineno
        frame = frame.f_back
    return None


def trace_error(message: str, kind: type[TraceError] = TraceError) -> TraceError:
    """A TraceError prefixed with `file:line:` of the user's code; also kept as attributes."""
    where = user_location()
    err = kind(f"{where[0]}:{where[1]}: {message}" if where else message)
    err.filename, err.lineno = where if where else (None, 0)
    return err


# ---------------------------------------------------------------- traces


class Trace:
    """The statements recorded while one Python function runs under `@eqsat.function`."""

    def __init__(self, name: str):
        self.name = name
        self.body: list[Stmt] = []
        # TracedFunctions called, each with its name here, in first-call order; `items` is
        # their closures merged (two different callees of one name: the later is `name_2`).
        self.callees: list[tuple[Any, str]] = []
        self.items: dict[str, Any] = {}
        self.closed = False
        self._count = 0
        self._consts: dict[tuple[Any, ...], Tracer] = {}

    def fresh(self) -> str:
        """The next statement result name: 0, 1, 2, ..."""
        self._count += 1
        return str(self._count - 1)


_STATE = threading.local()


def _stack() -> list[Trace]:
    if not hasattr(_STATE, "stack"):
        _STATE.stack = []
    return _STATE.stack


@contextmanager
def tracing(name: str) -> Iterator[Trace]:
    """Make a new trace the active one for the duration of the block (traces nest)."""
    trace = Trace(name)
    stack = _stack()
    stack.append(trace)
    try:
        yield trace
    finally:
        stack.pop()
        trace.closed = True


def current_trace() -> Trace | None:
    """The innermost trace running now, or None outside `@eqsat.function`."""
    stack = _stack()
    return stack[-1] if stack else None


def active_trace(what: str, values: Sequence[Any]) -> Trace:
    """The trace the traced values among `values` belong to; it must be the one running now."""
    tracers = [v for v in values if isinstance(v, _tracer())]
    if not tracers:
        got = ", ".join(describe(v) for v in values)
        raise trace_error(f"{what} needs a traced value (a parameter of an @eqsat.function or "
                          f"an expression of one), got {got}")
    current = current_trace()
    for t in tracers:
        if t.trace.closed:
            raise trace_error(f"{what}: %{t.name} belongs to @{t.trace.name}, whose tracing has "
                              f"finished; a traced value cannot outlive its function (did it "
                              f"escape through a global?)")
        if t.trace is not current:
            raise trace_error(f"{what}: %{t.name} of @{t.trace.name} is used while tracing "
                              f"@{current.name if current else '?'}; pass it as a parameter "
                              f"instead of capturing it")
    return tracers[0].trace


def describe(value: Any) -> str:
    """A short description of a Python value for error messages."""
    if isinstance(value, _tracer()):
        return f"a traced {value.type}"
    if isinstance(value, np.ndarray):
        return (f"a numpy array of shape {value.shape} (arrays are not captured as constants; "
                f"pass it as a parameter)")
    if isinstance(value, (bool, int, float)):
        return repr(value)
    return f"a {type(value).__name__}"


# ---------------------------------------------------------------- statements


def emit(trace: Trace, op: str, operands: Sequence[Tracer], attrs: dict[str, Any] | None = None,
         written: TensorType | None = None) -> Tracer:
    """Append one statement, typed by the op table; a type error becomes a TraceError."""
    opdef = OPS[op]
    attrs = attrs or {}
    ordered = tuple((k, attrs[k]) for k, _ in opdef.attrs)  # the printer's order, for round trips
    if written is not None and (problem := shape_problem(written.shape)):
        raise trace_error(f"{op}: {problem}")
    try:
        t = opdef.infer([o.type for o in operands], dict(ordered), written)
    except OpTypeError as e:
        raise trace_error(e.message) from None
    name = trace.fresh()
    trace.body.append(Stmt((name,), op, tuple(o.name for o in operands), ordered, (t,)))
    return _tracer()(trace, name, t)


@cache  # an import statement costs about 1 us, and tracing asks a few times per statement
def _tracer() -> type[Tracer]:
    """The Tracer class, imported when first needed: its operators are built on this module."""
    from .dsl_tracer import Tracer

    return Tracer


def constant(trace: Trace, value: Scalar, t: TensorType) -> Tracer:
    """A `const` statement of type `t` (one per value and type in a trace)."""
    key = (t, type(value), repr(value))  # repr tells -0.0 from 0.0 and nan from itself
    if key not in trace._consts:
        trace._consts[key] = emit(trace, "const", [], {"value": value}, t)
    return trace._consts[key]


def numpy_scalar(value: Any) -> Any:
    """A 0-d numpy array of a numeric dtype as the numpy scalar it holds, as numpy 2 treats it
    (NEP 50: both are strongly typed; numpy hands a scalar to a ufunc as a 0-d array); any
    other value as it is (an n-d array stays refused)."""
    if type(value) is np.ndarray and value.ndim == 0:
        scalar = value[()]
        if isinstance(scalar, NUMPY_SCALARS):
            return scalar
    return value


def literal(value: Any, t: TensorType, what: str) -> Scalar:
    """A Python scalar as a constant of `t`'s dtype; no implicit promotion of the tensor."""
    value = numpy_scalar(value)
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, (bool, int, float)):
        raise trace_error(f"{what}: cannot combine {t} with {describe(value)}")
    if t.dtype is DType.bool:
        if isinstance(value, bool):
            return value
        raise trace_error(f"{what}: a bool tensor ({t}) combines only with True or False, "
                          f"not {value!r}")
    if t.dtype.is_int:
        if isinstance(value, float):
            raise trace_error(f"{what}: an {t.dtype} value cannot hold the float {value!r}; "
                              f"convert with .astype(eqsat.f32) first")
        value = int(value)
        info = np.iinfo(t.dtype.np)
        if not info.min <= value <= info.max:
            raise trace_error(f"{what}: {_shown(value)} does not fit in {t.dtype}")
        return value
    try:
        value = float(value)
    except OverflowError:
        raise trace_error(f"{what}: {_shown(value)} is too large for {t.dtype}") from None
    return _cast_like_numpy(value, t.dtype, what)


def _cast_like_numpy(value: float, dtype: DType, what: str) -> float:
    """A Python float as numpy casts it to `dtype` next to an array of that dtype: one too
    large becomes an infinity, with numpy's RuntimeWarning at the user's line (or its error,
    or nothing, as `np.errstate(over=...)` says), so that traced code computes what the same
    numpy code computes (a `1e300` sentinel meant for any dtype clamps an f32 array to inf
    there too) and the printed const reads back."""
    with np.errstate(over="ignore"):
        stored = float(dtype.np.type(value))
    if not math.isinf(stored) or math.isinf(value):
        return value
    then = f" and becomes {stored}, as numpy casts it"
    message = f"{what}: {float_overflow(repr(value), dtype, then)}"
    mode = np.geterr()["over"]
    if mode == "raise":
        raise trace_error(message)
    if mode != "ignore":
        warnings.warn_explicit(message, RuntimeWarning, *(user_location() or ("<trace>", 0)))
    return stored


def _shown(value: int) -> int | str:
    """A huge Python int as its size: str() of one of 5000 digits is a ValueError."""
    bits = value.bit_length()
    return value if bits <= 64 else f"an integer of {bits} bits"


def broadcast_shape(what: str, types: Sequence[TensorType]) -> tuple[int, ...]:
    """numpy's broadcast of several shapes (aligned from the right; equal or 1)."""
    rank = max(t.rank for t in types)
    out = []
    for i in range(1, rank + 1):
        dims = {t.shape[-i] for t in types if t.rank >= i} - {1}
        if len(dims) > 1:
            raise trace_error(f"{what}: cannot broadcast {' and '.join(map(str, types))} "
                              f"together (numpy's rule: aligned from the right, dimensions must "
                              f"be equal or 1)")
        out.append(dims.pop() if dims else 1)
    return tuple(reversed(out))


def broadcast_to_type(x: Tracer, t: TensorType) -> Tracer:
    """`x` broadcast to `t` with an explicit `broadcast` statement (none when already `t`)."""
    return x if x.type == t else emit(x.trace, "broadcast", [x], written=t)


def cast_to(x: Tracer, dtype: DType) -> Tracer:
    """`x` converted to `dtype` with a `cast` statement (none when it has that dtype)."""
    return x if x.dtype is dtype else emit(x.trace, "cast", [x],
                                           written=x.type.with_dtype(dtype))


def promote(what: str, values: Sequence[Any]) -> list[Any]:
    """`values` as numpy 2 promotes them (NEP 50): traced values and numpy scalars
    (np.float64(2), np.sqrt(4), 0-d arrays) are strongly typed, so the result dtype is
    numpy's `result_type` of all their dtypes (f32 with f64 gives f64, f32 with i32 gives f64,
    i32 with i64 gives i64); the traced values of another dtype are cast to it and the numpy
    scalars become Python values of it. Python scalars are weak: they change the kind only (an i32
    with 0.5 is f64, a bool with 1 is i64) and stay as they are, to take the result dtype in
    `literal`."""
    tracer = _tracer()
    values = [numpy_scalar(v) for v in values]
    traced = [v for v in values if isinstance(v, tracer)]
    scalars = [v for v in values if isinstance(v, NUMPY_SCALARS)]
    weak = [v for v in values if isinstance(v, (bool, int, float))
            and not isinstance(v, NUMPY_SCALARS)]
    if not traced or (not scalars and not weak
                      and all(v.dtype is traced[0].dtype for v in traced)):
        return list(values)
    dtype = _result_dtype(what, traced, scalars, weak)
    out = []
    for v in values:
        if isinstance(v, tracer):
            v = cast_to(v, dtype)
        elif isinstance(v, NUMPY_SCALARS):
            v = dtype.np.type(v).item()  # as numpy converts it for the ufunc's loop
        out.append(v)
    return out


def _result_dtype(what: str, traced: Sequence[Tracer], scalars: Sequence[Any],
                  weak: Sequence[bool | int | float] = ()) -> DType:
    """numpy's `result_type` of the traced values' and the numpy scalars' dtypes, and of the
    Python scalars `weak`, which change only the kind (an i32 with 0.5 is f64, a bool with 1
    is i64, an f32 with 0.5 stays f32); it must be an eqsat dtype (two eqsat dtypes always
    promote to one; a float16 scalar may not)."""
    # a Python int beyond int64 decides nothing numpy would not refuse later (`literal` says so)
    weak = [v for v in weak if not isinstance(v, int) or -2**63 <= v < 2**63]
    result = np.result_type(*(v.dtype.np for v in traced), *(s.dtype for s in scalars), *weak)
    try:
        return DType.of(result)
    except KeyError:
        shown = " and ".join(dict.fromkeys(str(v.type) for v in traced))
        scalar = " and ".join(repr(s) for s in scalars)
        raise trace_error(f"{what}: numpy promotes {shown} with the numpy scalar {scalar} to "
                          f"{result}, which is not an eqsat dtype ({', '.join(DTYPES)}); "
                          f"convert the scalar first, e.g. with float() or np.float32()"
                          ) from None


def lift(what: str, values: Sequence[Any], extra: tuple[int, ...] | None = None) -> list[Tracer]:
    """Operands made into tracers of one type: traced values and numpy scalars promoted to
    one dtype as numpy does (`promote`), broadcast to the common shape (joined with `extra`),
    Python scalars as constants of that dtype."""
    trace = active_trace(what, values)
    tracer = _tracer()
    values = promote(what, values)
    types = [v.type for v in values if isinstance(v, tracer)]
    extra_types = [types[0].with_shape(extra)] if extra is not None else []
    target = types[0].with_shape(broadcast_shape(what, types + extra_types))
    return [broadcast_to_type(v, target) if isinstance(v, tracer)
            else constant(trace, literal(v, target, what), target) for v in values]


# ---------------------------------------------------------------- primitives


# numpy's float functions run an integer tensor in f64 (np.exp(i32) is f64), and a bool one in
# float16, which eqsat lacks; `recip` is not among them: np.reciprocal of integers is integer
_FLOAT_FUNCTIONS = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos"})


def unary(op: str, x: Any) -> Tracer:
    """An elementwise op of the table's unary family; a float function of an integer tensor
    is computed in f64, as numpy does."""
    trace = active_trace(op, [x])
    if op in _FLOAT_FUNCTIONS and isinstance(x, _tracer()) and not x.dtype.is_float:
        if x.dtype is DType.bool:
            raise trace_error(f"{op}: numpy computes it of a bool tensor ({x.type}) in "
                              f"float16, which eqsat lacks; cast first: .astype(eqsat.f32)")
        x = cast_to(x, DType.f64)
    return emit(trace, op, [x])


def binary(op: str, x: Any, y: Any) -> Tracer:
    """An elementwise binary or compare op with numpy broadcasting and scalar constants."""
    a, b = lift(op, [x, y])
    return emit(a.trace, op, [a, b])


def true_divide(x: Any, y: Any) -> Tracer:
    """`x / y` as numpy's true division: integers and bools are divided in f64 (the IR's
    `div` floors on integers, so they are cast first)."""
    a, b = lift("div", [x, y])
    if not a.dtype.is_float:
        a, b = cast_to(a, DType.f64), cast_to(b, DType.f64)
    return emit(a.trace, "div", [a, b])


def floor_divide(x: Any, y: Any) -> Tracer:
    """`x // y` for integer tensors (the IR's `div` on integers)."""
    a, b = lift("div", [x, y])
    if not a.dtype.is_int:
        raise trace_error(f"div: floor division of {a.type} is not an eqsat op; use / for "
                          f"float division")
    return emit(a.trace, "div", [a, b])


def as_tracer(x: Any, what: str) -> Tracer:
    """`x` itself, checked to be a traced value of the running trace."""
    active_trace(what, [x])
    return x


def index(value: Any, what: str, clipped: bool = False) -> int:
    """An integer argument (axis, dimension, index) as a Python int; past 64 bits only where
    it is `clipped` to its range (a slice bound), as no axis or dimension can use it."""
    try:
        i = operator.index(value)
    except TypeError:
        raise trace_error(f"{what}: expected an integer, got {describe(value)}") from None
    if not clipped and i.bit_length() > 63:
        raise trace_error(f"{what}: {_shown(i)} is out of range")
    return i
