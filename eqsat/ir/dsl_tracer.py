"""`Tracer`, the traced value of the staged DSL: one IR value with numpy's operators and methods.

While a Python function runs under `@eqsat.function`, its parameters and every expression of
them are Tracers; each operator or method emits statements through dsl_trace's primitives (or
dsl_array's), and whatever a traced value cannot do (a truth value, an in-place write, an
ndarray method eqsat lacks) fails as a TraceError naming the user's line, with what to write
instead. The trace machinery lives in dsl_trace; this module is the value users hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np

from ..errors import TracedAttributeError
from .dsl_trace import (NUMPY_SCALARS, Trace, as_tracer, binary, cast_to, floor_divide,
                        numpy_scalar, promote, trace_error, true_divide, unary)
from .ops import COMPARE
from .types import DTYPES, DType, TensorType

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


# numpy ufuncs a Tracer answers (np.exp(x) while tracing), by name; filled by dsl_numpy and
# dsl_ufuncs.
UFUNC_HANDLERS: dict[str, Callable[..., Tracer]] = {}
# numpy's other functions a Tracer answers (np.where(c, x, y)), by the function; filled by
# dsl_protocol
FUNCTION_HANDLERS: dict[Callable[..., Any], Callable[..., Tracer]] = {}


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
        # NEP 13: an operand (or `out`) of a type with its own protocol handles the call, or
        # numpy raises its TypeError; numpy's arrays and scalars meet traced values here.
        if any(_foreign(type(v), "__array_ufunc__") for v in (*inputs, *kwargs.get("out", ()))):
            return NotImplemented
        handler = UFUNC_HANDLERS.get(ufunc.__name__)
        if method != "__call__" or handler is None:
            raise trace_error(f"numpy's {ufunc.__name__} ({method}) cannot run on traced "
                              f"values; use eqsat's functions (eqsat.exp, eqsat.maximum, ...)")
        # a numpy scalar comes as a 0-d array (np.float32(2) < x calls np.less with
        # array(2.0, dtype=float32)), which numpy 2 promotes as the scalar it came from
        inputs = tuple(map(numpy_scalar, inputs))
        if kwargs:
            inputs = _ufunc_keywords(ufunc, inputs, kwargs)
        return handler(*inputs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # NEP 18: a type among the arguments that has its own protocol (a foreign duck array)
        # gets its turn; numpy's arrays, with ndarray's protocol, meet traced values here.
        if any(_foreign(t, "__array_function__") for t in types):
            return NotImplemented
        handler = FUNCTION_HANDLERS.get(func)
        if handler is None:
            name = getattr(func, "__name__", repr(func))
            raise trace_error(f"numpy's {name} cannot run on traced values; use eqsat's "
                              f"functions (eqsat.where, eqsat.sum, ...) or numpy's that trace "
                              f"(see the README)")
        return handler(*args, **kwargs)


def _foreign(t: type, protocol: str) -> bool:
    """Whether values of type `t` implement numpy's `protocol` (`__array_ufunc__`, NEP 13, or
    `__array_function__`, NEP 18) themselves, as a foreign duck array does (dask's, xarray's,
    or one that sets it to None to refuse numpy): Tracer then leaves the operation to them. A
    type without the protocol (Python's scalars, a list) and ndarray with its subclasses that
    keep ndarray's protocol are not foreign: eqsat traces or refuses what they meet."""
    own = getattr(t, protocol, _ABSENT)
    return own is not _ABSENT and own is not getattr(np.ndarray, protocol) \
        and not issubclass(t, Tracer)


# numpy's ufunc keywords at values that change nothing a trace computes (every traced value
# is a new row-major array of its own type), and what to write instead of the others
_UFUNC_DEFAULTS: dict[str, Callable[[Any], bool]] = {
    "where": lambda v: v is True or v is np.True_,
    "order": lambda v: isinstance(v, str) and v.upper() in ("K", "A", "C"),
    "subok": lambda v: isinstance(v, (bool, np.bool_)),
}
_UFUNC_HINTS = {
    "out": "traced values are never written in place; use the result (y = np.{name}(...))",
    "where": "compute every element and choose with np.where(mask, result, other)",
    "order": "traced values are row-major",
    "signature": "give dtype= instead, or cast the operands with .astype() first",
}


def _ufunc_keywords(ufunc: Any, inputs: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[Any, ...]:
    """The operands of `ufunc(*inputs, **kwargs)` as numpy's loop takes them: `dtype=` and
    `casting=` choose the loop as numpy does, with numpy's error where it has none, and the
    operands are cast to its dtypes; any other keyword is refused by name at the user's line
    unless it is at a value that changes nothing here."""
    name = ufunc.__name__
    for key, value in kwargs.items():
        moot = _UFUNC_DEFAULTS.get(key)
        if key not in ("dtype", "casting") and not (moot and moot(value)):
            hint = _UFUNC_HINTS.get(key, "only its default can be traced").format(name=name)
            raise trace_error(f"numpy's {name}({key}=...) cannot be traced: {hint}")
    dtype, casting = kwargs.get("dtype"), kwargs.get("casting", "same_kind")
    if dtype is None and casting == "same_kind":
        return inputs
    if not all(isinstance(v, (Tracer, bool, int, float, *NUMPY_SCALARS)) for v in inputs):
        return inputs  # the handler refuses the operand, as it does without keywords
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k in ("dtype", "casting"))
    if isinstance(dtype, DType):
        dtype = dtype.np
    stand_ins = [np.empty(0, v.dtype.np) if isinstance(v, Tracer) else v for v in inputs]
    try:
        # numpy's own call on empty stand-ins says whether these keywords are allowed (its
        # rules for Python scalars under casting="no" or "equiv" are its own, and its
        # resolve_dtypes crashes on them there); the loop's input dtypes then come from
        # resolve_dtypes under "unsafe", which only validates casts and chooses the same loop
        with np.errstate(all="ignore"):
            result = ufunc(*stand_ins, dtype=dtype, casting=casting)
        given = tuple(v.dtype if isinstance(v, (np.ndarray, *NUMPY_SCALARS))
                      else np.dtype(bool) if isinstance(v, bool) else type(v) for v in stand_ins)
        loop = ufunc.resolve_dtypes((*given, *(None,) * ufunc.nout), casting="unsafe",
                                    signature=(None,) * ufunc.nin + (result.dtype,))
    except (TypeError, ValueError, OverflowError) as e:
        raise trace_error(f"numpy's {name}({shown}) cannot be traced: {e}") from None
    try:
        dtypes = [DType.of(d) for d in loop]
    except KeyError:
        raise trace_error(f"numpy's {name}({shown}) computes in "
                          f"{' and '.join(map(str, dict.fromkeys(loop)))}, which eqsat lacks "
                          f"({', '.join(DTYPES)})") from None
    with np.errstate(over="ignore"):  # as numpy's cast of a scalar into its loop
        return tuple(cast_to(v, d) if isinstance(v, Tracer) else d.np.type(v)
                     for v, d in zip(inputs, dtypes))


def _defers(other: Any) -> bool:
    """Whether a binary operator defers to `other` (returns NotImplemented, so that Python
    asks its reflected operator), as ndarray's operators do for a type with its own
    `__array_ufunc__` (NEP 13)."""
    return type(other) is not Tracer and _foreign(type(other), "__array_ufunc__")


_ABSENT = object()

# what to write instead of ndarray attributes a numpy user reaches for first
_NDARRAY_HINTS = {
    "copy": "use x itself (traced values are never written)",
    "mT": "use x.transpose(...)", "item": "a traced value has no Python value while tracing",
    "tolist": "a traced value has no Python value while tracing",
}


def _array() -> Any:
    from . import dsl_array  # imported late: its primitives are built on Tracer

    return dsl_array


def _unary_method(op: str) -> Callable[[Tracer], Tracer]:
    return lambda self: unary(op, self)


def _forward(fn: Callable[[Any, Any], Tracer]) -> Callable[[Tracer, Any], Tracer]:
    return lambda self, other: NotImplemented if _defers(other) else fn(self, other)


def _reflected(fn: Callable[[Any, Any], Tracer]) -> Callable[[Tracer, Any], Tracer]:
    return lambda self, other: NotImplemented if _defers(other) else fn(other, self)


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
    if _defers(other):
        return NotImplemented
    other = numpy_scalar(other)
    if modulo is not None:
        raise trace_error("pow(x, y, mod) with a modulus cannot be traced; eqsat has no "
                          "modulo op")
    if self.dtype is DType.bool and type(other) is int:
        raise trace_error("bool ** int: numpy computes a bool tensor to a Python int power in "
                          "int8, which eqsat lacks; cast the tensor first (.astype(eqsat.i32))")
    if isinstance(other, (float, np.floating)) and other == 0.5:
        # numpy computes an array to a scalar 0.5 as sqrt (in the promoted dtype: an i32 or f32
        # array to np.float64(0.5) is the f64 sqrt), whose values differ from pow's at -inf
        # (nan, not inf) and -0.0 (-0.0, not 0.0)
        x = promote("pow", [as_tracer(self, "pow"), other])[0]
        if x.dtype.is_float:
            return unary("sqrt", x)
    return binary("pow", self, other)


Tracer.__pow__ = _pow  # type: ignore[method-assign]


def _unsupported(symbol: str) -> Callable[..., Any]:
    def refuse(self: Tracer, *other: Any) -> Any:
        if other and _defers(other[0]):
            return NotImplemented
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
