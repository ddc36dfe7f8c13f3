"""The tracing core of the staged DSL: traces, traced values and typed statement emission.

A `Tracer` stands for one IR value while a Python function runs once under `@eqsat.function`;
every operation on it appends a statement to the active trace. Statements are typed by the op
table's `infer`, so an ill-typed program fails at once, as a `TraceError` naming the user's line.
"""

from __future__ import annotations

import operator
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from ..errors import TraceError, TracedAttributeError
from .module import Stmt
from .ops import COMPARE, OPS, OpTypeError
from .types import DType, TensorType, shape_problem

Scalar = bool | int | float
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


# numpy's keywords a traced method accepts only at their defaults, and what to write instead
_NUMPY_KEYWORDS = {
    "out": "the result is a new value", "dtype": "cast with .astype() first",
    "initial": "combine the result with eqsat.maximum, eqsat.minimum or + instead",
    "where": "mask the operand with eqsat.where first", "order": "traced values are row-major",
}


def _numpy_defaults(name: str, **given: Any) -> None:
    """numpy's functions pass these keywords on (np.sum(x, where=m) calls x.sum(where=m)); a
    trace has no arrays to write to, takes the operand's dtype and has only row-major order."""
    for key, value in given.items():
        if value is not None and not (key == "order" and value == "C"):
            raise trace_error(f"{name}({key}=...) cannot be traced: {_NUMPY_KEYWORDS[key]}")


# ---------------------------------------------------------------- traces


class Trace:
    """The statements recorded while one Python function runs under `@eqsat.function`."""

    def __init__(self, name: str):
        self.name = name
        self.body: list[Stmt] = []
        self.callees: list[Any] = []  # TracedFunctions called, in first-call order
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
    tracers = [v for v in values if isinstance(v, Tracer)]
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
    if isinstance(value, Tracer):
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
    return Tracer(trace, name, t)


def constant(trace: Trace, value: Scalar, t: TensorType) -> Tracer:
    """A `const` statement of type `t` (one per value and type in a trace)."""
    key = (t, type(value), repr(value))  # repr tells -0.0 from 0.0 and nan from itself
    if key not in trace._consts:
        trace._consts[key] = emit(trace, "const", [], {"value": value}, t)
    return trace._consts[key]


def literal(value: Any, t: TensorType, what: str) -> Scalar:
    """A Python scalar as a constant of `t`'s dtype; no implicit promotion of the tensor."""
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
            raise trace_error(f"{what}: cannot combine {t} with the float {value!r}; eqsat does "
                              f"not promote implicitly, convert with .astype(eqsat.f32)")
        value = int(value)
        info = np.iinfo(t.dtype.np)
        if not info.min <= value <= info.max:
            raise trace_error(f"{what}: {_shown(value)} does not fit in {t.dtype}")
        return value
    try:
        return float(value)
    except OverflowError:
        raise trace_error(f"{what}: {_shown(value)} is too large for {t.dtype}") from None


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


def lift(what: str, values: Sequence[Any], extra: tuple[int, ...] | None = None) -> list[Tracer]:
    """Operands made into tracers of one type: broadcast to the common shape (joined with
    `extra`), Python scalars as constants of the traced operands' dtype."""
    trace = active_trace(what, values)
    types = [v.type for v in values if isinstance(v, Tracer)]
    for t in types[1:]:
        if t.dtype != types[0].dtype:
            raise trace_error(f"{what}: operands have different dtypes ({types[0]} and {t}); "
                              f"eqsat does not promote implicitly, convert one with .astype(...)")
    extra_types = [types[0].with_shape(extra)] if extra is not None else []
    target = types[0].with_shape(broadcast_shape(what, types + extra_types))
    return [broadcast_to_type(v, target) if isinstance(v, Tracer)
            else constant(trace, literal(v, target, what), target) for v in values]


# ---------------------------------------------------------------- primitives


def unary(op: str, x: Any) -> Tracer:
    """An elementwise op of the table's unary family."""
    trace = active_trace(op, [x])
    return emit(trace, op, [x])


def binary(op: str, x: Any, y: Any) -> Tracer:
    """An elementwise binary or compare op with numpy broadcasting and scalar constants."""
    a, b = lift(op, [x, y])
    return emit(a.trace, op, [a, b])


def true_divide(x: Any, y: Any) -> Tracer:
    """`x / y` for float tensors (the IR's integer `div` floors, unlike numpy's `/`)."""
    a, b = lift("div", [x, y])
    if not a.dtype.is_float:
        raise trace_error(f"div: true division of {a.type} would need a float result; convert "
                          f"with .astype(eqsat.f32) first, or use // for floor division")
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


# ---------------------------------------------------------------- traced values

# numpy ufuncs a Tracer answers (np.exp(x) while tracing); filled by dsl_numpy.
UFUNC_HANDLERS: dict[str, Callable[..., Tracer]] = {}


class Tracer:
    """One IR value of a function being traced: `.type`, `.shape`, numpy-like operators."""

    __slots__ = ("trace", "name", "type")
    __hash__ = object.__hash__  # == builds an `eq` statement, so hash by identity

    def __init__(self, trace: Trace, name: str, type: TensorType):
        object.__setattr__(self, "trace", trace)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "type", type)

    shape = property(lambda self: self.type.shape, doc="The static shape, a tuple of ints.")
    dtype = property(lambda self: self.type.dtype, doc="The element type, an eqsat DType.")
    ndim = property(lambda self: self.type.rank, doc="The number of axes.")
    size = property(lambda self: self.type.size, doc="The number of elements.")
    T = property(lambda self: _array().transpose(self), doc="The transpose (axes reversed).")

    def __repr__(self) -> str:
        return f"<traced %{self.name}: {self.type} in @{self.trace.name}>"

    def __getitem__(self, key: Any) -> Tracer:
        return _array().getitem(self, key)

    def __getattr__(self, name: str) -> Any:
        # only reached for names the class lacks: numpy's ndarray methods (x.flatten()); a
        # protocol probe (numpy's __array_interface__) gets the plain AttributeError it expects
        if name.startswith("__") or name in Tracer.__slots__:
            raise AttributeError(name)
        hint = _NDARRAY_HINTS.get(name, "use eqsat's functions (eqsat.exp, eqsat.where, ...)")
        raise trace_error(f"%{self.name} ({self.type}) has no .{name}, which numpy's ndarray "
                          f"has; {hint}", TracedAttributeError)

    def _immutable(self, *_: Any) -> None:
        raise trace_error(f"%{self.name} ({self.type}) cannot be changed in place: traced values "
                          f"are immutable; build a new value (x = x.reshape(...), "
                          f"eqsat.where(mask, new, x), eqsat.concatenate)")

    __setattr__ = __setitem__ = __delitem__ = __delattr__ = _immutable

    def __format__(self, spec: str) -> str:
        if spec:
            raise trace_error(f"%{self.name} ({self.type}) has no Python value to format with "
                              f"{spec!r} while tracing")
        return repr(self)

    def __copy__(self) -> Tracer:
        return self

    def __deepcopy__(self, memo: Any) -> Tracer:
        return self

    def __pos__(self) -> Tracer:
        return self

    # `dtype`, `out`, `initial` and `where` are numpy's (np.sum(x) calls x.sum(axis=, dtype=,
    # out=)), keywords here so that x.sum(0, True) keeps meaning keepdims: only their defaults
    # can be traced.
    def sum(self, axis: Any = None, keepdims: bool = False, *, dtype: Any = None,
            out: Any = None, initial: Any = None, where: Any = None) -> Tracer:
        """The sum over `axis` (None: all axes)."""
        _numpy_defaults("sum", dtype=dtype, out=out, initial=initial, where=where)
        return _array().reduce("sum", self, axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False, *, out: Any = None,
            initial: Any = None, where: Any = None) -> Tracer:
        """The maximum over `axis` (None: all axes)."""
        _numpy_defaults("max", out=out, initial=initial, where=where)
        return _array().reduce("max", self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False, *, out: Any = None,
            initial: Any = None, where: Any = None) -> Tracer:
        """The minimum over `axis` (None: all axes)."""
        _numpy_defaults("min", out=out, initial=initial, where=where)
        return _array().reduce("min", self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False, *, dtype: Any = None,
             out: Any = None, where: Any = None) -> Tracer:
        """The mean over `axis` (None: all axes)."""
        _numpy_defaults("mean", dtype=dtype, out=out, where=where)
        return _array().mean(self, axis, keepdims)

    def reshape(self, *shape: Any, order: str = "C", copy: Any = None) -> Tracer:
        """`x.reshape(2, 3)` or `x.reshape((2, 3))`; one dimension may be -1 (`copy` is moot:
        traced values are never written)."""
        _numpy_defaults("reshape", order=order)
        return _array().reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes: Any) -> Tracer:
        """`x.transpose()` reverses the axes; `x.transpose(1, 0, 2)` permutes them."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        elif len(axes) == 1 and axes[0] is None:  # numpy's x.transpose(None), np.transpose(x)
            axes = ()
        return _array().transpose(self, axes or None)

    def astype(self, dtype: Any, *, copy: bool = True) -> Tracer:
        """The same values converted to `dtype` (a `cast`; `copy` is moot, as for reshape)."""
        return _array().cast(self, dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise trace_error(f"len() of a scalar ({self.type})")
        return self.shape[0]

    def __iter__(self) -> Iterator[Tracer]:
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        raise trace_error(f"the truth value of %{self.name} ({self.type}) is not known while "
                          f"tracing; Python if/and/or/while cannot depend on tensor values "
                          f"(use eqsat.where or eqsat.maximum)")

    def _no_number(self, *_: Any) -> Any:
        raise trace_error(f"%{self.name} ({self.type}) has no Python value while tracing")

    __float__ = __int__ = __index__ = __complex__ = _no_number

    def __array__(self, *_: Any, **__: Any) -> Any:
        raise trace_error(f"numpy cannot run on traced value %{self.name} ({self.type}); use "
                          f"eqsat's functions of the same name (eqsat.exp, eqsat.sum, ...)")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        handler = UFUNC_HANDLERS.get(ufunc.__name__)
        if method != "__call__" or kwargs or handler is None:
            raise trace_error(f"numpy's {ufunc.__name__} ({method}) cannot run on traced "
                              f"values; use eqsat's functions (eqsat.exp, eqsat.maximum, ...)")
        return handler(*inputs)


# what to write instead of ndarray attributes a numpy user reaches for first
_NDARRAY_HINTS = {
    "flatten": "use x.reshape(-1)", "ravel": "use x.reshape(-1)", "squeeze": "use x.reshape(...)",
    "dot": "use x @ y", "copy": "use x itself (traced values are never written)",
    "clip": "use eqsat.minimum(eqsat.maximum(x, lo), hi)", "swapaxes": "use x.transpose(...)",
    "mT": "use x.transpose(...)", "item": "a traced value has no Python value while tracing",
    "tolist": "a traced value has no Python value while tracing",
}


def _array() -> Any:
    from . import dsl_array  # imported late: its primitives are built on Tracer

    return dsl_array


def _unary_method(op: str) -> Callable[[Tracer], Tracer]:
    return lambda self: unary(op, self)


def _forward(fn: Callable[[Any, Any], Tracer]) -> Callable[[Tracer, Any], Tracer]:
    return lambda self, other: fn(self, other)


def _reflected(fn: Callable[[Any, Any], Tracer]) -> Callable[[Tracer, Any], Tracer]:
    return lambda self, other: fn(other, self)


# Python's operator dunders: `x + 2` and `2 + x` alike. Comparisons need no reflected twins
# (Python swaps `2 < x` into `x > 2` itself) and their dunders are the IR op names.
_ARITHMETIC: dict[str, Callable[[Any, Any], Tracer]] = {
    "add": partial(binary, "add"), "sub": partial(binary, "sub"), "mul": partial(binary, "mul"),
    "pow": partial(binary, "pow"), "truediv": true_divide, "floordiv": floor_divide,
    "matmul": lambda a, b: _array().matmul(a, b),
}
for _stem, _fn in _ARITHMETIC.items():
    setattr(Tracer, f"__{_stem}__", _forward(_fn))
    setattr(Tracer, f"__r{_stem}__", _reflected(_fn))
for _op in COMPARE:
    setattr(Tracer, f"__{_op}__", _forward(partial(binary, _op)))
for _op in ("neg", "abs"):
    setattr(Tracer, f"__{_op}__", _unary_method(_op))


def _pow(self: Tracer, other: Any, modulo: Any = None) -> Tracer:
    if modulo is not None:
        raise trace_error("pow(x, y, mod) with a modulus cannot be traced; eqsat has no "
                          "modulo op")
    if self.dtype.is_float and isinstance(other, (float, np.floating)) and other == 0.5:
        # numpy computes an array to a scalar 0.5 as sqrt, whose values differ from pow's at
        # -inf (nan, not inf) and -0.0 (-0.0, not 0.0)
        return unary("sqrt", self)
    return binary("pow", self, other)


Tracer.__pow__ = _pow  # type: ignore[method-assign]


def _unsupported(symbol: str) -> Callable[..., Any]:
    def refuse(self: Tracer, *_: Any) -> Any:
        raise trace_error(f"{symbol} is not supported on traced values (eqsat's operators are "
                          f"+ - * / // @ **, unary -, abs and comparisons; use eqsat.where "
                          f"for masks)")
    return refuse


# Python operators eqsat has no op for: a TraceError naming the user's line, not a TypeError.
for _names, _symbol in [(("mod", "rmod"), "%"), (("divmod", "rdivmod"), "divmod()"),
                        (("and", "rand"), "&"), (("or", "ror"), "|"), (("xor", "rxor"), "^"),
                        (("lshift", "rlshift"), "<<"), (("rshift", "rrshift"), ">>"),
                        (("invert",), "~"), (("round",), "round()"), (("floor",), "floor()"),
                        (("ceil",), "ceil()"), (("trunc",), "trunc()")]:
    for _n in _names:
        setattr(Tracer, f"__{_n}__", _unsupported(_symbol))
