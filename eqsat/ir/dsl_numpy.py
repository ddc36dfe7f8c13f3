"""The numpy-named functions of the staged DSL (`eqsat.exp`, `eqsat.sum`, `eqsat.where`, ...).

The elementwise ones are generated from the op table (every unary, binary and compare op, under
numpy's name for it); the others take numpy's arguments. All of them work on traced values only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import dsl_array
from . import dsl_trace
from .dsl_trace import binary, unary
from .dsl_tracer import UFUNC_HANDLERS, Tracer
from .ops import BINARY, COMPARE, OPS, UNARY

# IR op name -> numpy's name, where they differ. `div` is left out: numpy's `divide` is true
# division, which `divide` below keeps (the IR's integer `div` floors, as `floor_divide` does).
NUMPY_NAMES = {
    "neg": "negative", "recip": "reciprocal", "sub": "subtract", "mul": "multiply",
    "pow": "power", "lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal",
    "eq": "equal", "ne": "not_equal",
}


def _unary_function(op: str) -> Callable[[Tracer], Tracer]:
    def apply(x: Tracer) -> Tracer:
        return unary(op, x)

    return _named(apply, op, f"Elementwise {OPS[op].doc} (the IR op `{op}`).")


def _binary_function(op: str) -> Callable[[Any, Any], Tracer]:
    def apply(x: Any, y: Any) -> Tracer:
        return binary(op, x, y)

    return _named(apply, op, f"Elementwise {OPS[op].doc} (the IR op `{op}`), with numpy "
                             f"broadcasting; x or y may be a Python scalar.")


def _named(fn: Callable[..., Tracer], op: str, doc: str) -> Callable[..., Tracer]:
    fn.__name__ = fn.__qualname__ = NUMPY_NAMES.get(op, op)
    fn.__doc__ = doc
    return fn


ELEMENTWISE_FUNCTIONS: dict[str, Callable[..., Tracer]] = {
    **{NUMPY_NAMES.get(op, op): _unary_function(op) for op in sorted(UNARY)},
    **{NUMPY_NAMES.get(op, op): _binary_function(op)
       for op in sorted((BINARY | COMPARE) - {"div"})},
}
globals().update(ELEMENTWISE_FUNCTIONS)


def divide(x: Any, y: Any) -> Tracer:
    """`x / y` for float tensors, with numpy broadcasting."""
    return dsl_trace.true_divide(x, y)


def floor_divide(x: Any, y: Any) -> Tracer:
    """`x // y` for integer tensors, with numpy broadcasting."""
    return dsl_trace.floor_divide(x, y)


def sum(x: Tracer, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """The sum over `axis` (None: all axes; an int or a tuple, negative counts from the end)."""
    return dsl_array.reduce("sum", x, axis, keepdims)


def max(x: Tracer, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """The maximum over `axis` (None: all axes)."""
    return dsl_array.reduce("max", x, axis, keepdims)


def min(x: Tracer, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """The minimum over `axis` (None: all axes)."""
    return dsl_array.reduce("min", x, axis, keepdims)


def mean(x: Tracer, axis: Any = None, keepdims: bool = False) -> Tracer:
    """The mean over `axis` (None: all axes): the sum divided by the count; float tensors only."""
    return dsl_array.mean(x, axis, keepdims)


def transpose(x: Tracer, axes: Sequence[int] | None = None) -> Tracer:
    """`np.transpose`: the axes permuted by `axes` (default: reversed)."""
    return dsl_array.transpose(x, axes)


def reshape(x: Tracer, shape: int | Sequence[int]) -> Tracer:
    """`np.reshape` (row-major); one dimension may be -1."""
    return dsl_array.reshape(x, shape)


def broadcast_to(x: Tracer, shape: int | Sequence[int]) -> Tracer:
    """`np.broadcast_to`: an explicit `broadcast` to `shape`."""
    return dsl_array.broadcast_to(x, shape)


def concatenate(xs: Sequence[Tracer], axis: int = 0) -> Tracer:
    """`np.concatenate` of traced values along `axis` (their dtypes promote as numpy's do)."""
    return dsl_array.concatenate(xs, axis)


def matmul(a: Tracer, b: Tracer) -> Tracer:
    """`np.matmul` (the `@` operator): 1-D operands and batch broadcasting as numpy does."""
    return dsl_array.matmul(a, b)


def cast(x: Tracer, dtype: Any) -> Tracer:
    """`x.astype(dtype)`: dtype is an eqsat dtype (eqsat.f32), its name or a numpy dtype."""
    return dsl_array.cast(x, dtype)


def where(cond: Any, x: Any, y: Any) -> Tracer:
    """`np.where(cond, x, y)`: cond is bool; all three broadcast; x or y may be a scalar."""
    return dsl_array.where(cond, x, y)


# numpy's ufuncs applied to a traced value (np.exp(x)) come here, by the ufunc's name.
UFUNC_HANDLERS.update(ELEMENTWISE_FUNCTIONS)
UFUNC_HANDLERS.update(absolute=ELEMENTWISE_FUNCTIONS["abs"], divide=divide,
                      floor_divide=floor_divide, matmul=matmul)

# numpy's functions and ufuncs on traced values
from . import dsl_composites, dsl_protocol, dsl_structure, dsl_ufuncs  # noqa: E402,F401

__all__ = sorted([*ELEMENTWISE_FUNCTIONS, "broadcast_to", "cast", "concatenate", "divide",
                  "floor_divide", "matmul", "max", "mean", "min", "reshape", "sum", "transpose",
                  "where"])
