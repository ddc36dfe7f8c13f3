"""Shape-changing primitives of the staged DSL: reductions, layout, slicing, matmul, select.

Each takes numpy's arguments (negative axes, -1 in shapes, 1-D matmul operands, basic indexing)
and emits the IR's explicit form (sorted axes, written result types, reshapes and broadcasts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .dsl_trace import (active_trace, as_tracer, broadcast_shape, broadcast_to_type, cast_to,
                        constant, describe, emit, index, lift, literal, numpy_scalar, promote,
                        trace_error, true_divide)
from .dsl_tracer import Tracer
from .ops import broadcastable
from .types import DTYPES, DType, TensorType


def normalize_axis(axis: Any, rank: int, what: str) -> int:
    """One axis in 0..rank-1 (negative axes count from the end)."""
    a = index(axis, what)
    if not -rank <= a < rank:
        raise trace_error(f"{what}: axis {a} is out of range for rank {rank}")
    return a % rank


def normalize_axes(axis: Any, rank: int, what: str) -> tuple[int, ...]:
    """`axis=None|int|tuple` as sorted non-negative axes (None: all of them)."""
    if axis is None:
        return tuple(range(rank))
    axes = [normalize_axis(a, rank, what) for a in (axis if isinstance(axis, (tuple, list))
                                                     else (axis,))]
    if len(set(axes)) != len(axes):
        raise trace_error(f"{what}: repeated axis in {axis}")
    return tuple(sorted(axes))


def reduce(op: str, x: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """A reduction over `axis` (None: all); `keepdims` keeps them with length 1 via reshape.
    A sum of i32 or bool is taken in i64, as numpy's sum does (its default integer)."""
    x = as_tracer(x, op)
    axes = normalize_axes(axis, x.ndim, op)
    if op == "sum" and x.dtype in (DType.i32, DType.bool):
        x = cast_to(x, DType.i64)
    if not axes:
        return x
    out = emit(x.trace, op, [x], {"axes": axes})
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """The arithmetic mean over `axis`: the sum divided by the count; of an integer or bool
    tensor in f64, as numpy's mean is."""
    x = as_tracer(x, "mean")
    if not x.dtype.is_float:
        x = cast_to(x, DType.f64)
    axes = normalize_axes(axis, x.ndim, "mean")
    count = 1
    for a in axes:
        count *= x.shape[a]
    return true_divide(reduce("sum", x, axes, keepdims), float(count))


def reshape(x: Any, shape: Any) -> Tracer:
    """`x` with another shape of the same element count; one dimension may be -1."""
    x = as_tracer(x, "reshape")
    dims = [index(d, "reshape") for d in (shape if isinstance(shape, (tuple, list)) else (shape,))]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise trace_error(f"reshape: bad shape {dims} (dimensions are >= 0, at most one is -1)")
    if -1 in dims:
        known = 1
        for d in dims:
            known *= d if d != -1 else 1
        if known == 0 or x.type.size % known:
            raise trace_error(f"reshape: cannot reshape {x.type} ({x.type.size} elements) "
                              f"into {dims}")
        dims[dims.index(-1)] = x.type.size // known
    t = x.type.with_shape(tuple(dims))
    return x if t == x.type else emit(x.trace, "reshape", [x], written=t)


def transpose(x: Any, axes: Any = None) -> Tracer:
    """`np.transpose`: axes permuted (default: reversed)."""
    x = as_tracer(x, "transpose")
    if axes is None:
        perm = tuple(reversed(range(x.ndim)))
    else:
        perm = tuple(normalize_axis(a, x.ndim, "transpose") for a in axes)
    if perm == tuple(range(x.ndim)):
        return x
    return emit(x.trace, "transpose", [x], {"perm": perm})


def to_dtype(dtype: Any, what: str) -> DType:
    """A DType from a DType, its name ("f32") or a numpy dtype (np.float32)."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    try:
        return DType.of(np.dtype(dtype))
    except (TypeError, KeyError):
        raise trace_error(f"{what}: {dtype!r} is not an eqsat dtype "
                          f"({', '.join(DTYPES)})") from None


def cast(x: Any, dtype: Any) -> Tracer:
    """`x.astype(dtype)`: the same shape with another element type."""
    return cast_to(as_tracer(x, "cast"), to_dtype(dtype, "cast"))


def broadcast_to(x: Any, shape: Any) -> Tracer:
    """`np.broadcast_to` as an explicit `broadcast` statement."""
    x = as_tracer(x, "broadcast")
    dims = tuple(index(d, "broadcast") for d in (shape if isinstance(shape, (tuple, list))
                                                 else (shape,)))
    if not broadcastable(x.shape, dims):
        raise trace_error(f"broadcast: cannot broadcast {x.type} to {x.type.with_shape(dims)} "
                          f"(numpy's right-aligned rule)")
    return broadcast_to_type(x, x.type.with_shape(dims))


def concatenate(xs: Sequence[Any], axis: int = 0) -> Tracer:
    """`np.concatenate` of traced values along `axis`, in the dtype numpy promotes them to."""
    xs = list(xs)
    if not xs or not all(isinstance(x, Tracer) for x in xs):
        got = ", ".join(describe(x) for x in xs) or "nothing"
        raise trace_error(f"concat needs a sequence of traced values, got {got}")
    trace = active_trace("concat", xs)
    xs = promote("concat", xs)
    if xs[0].ndim == 0:
        raise trace_error(f"concat: scalars ({xs[0].type}) cannot be concatenated")
    a = normalize_axis(axis, xs[0].ndim, "concat")
    return xs[0] if len(xs) == 1 else emit(trace, "concat", xs, {"axis": a})


def where(cond: Any, x: Any, y: Any) -> Tracer:
    """`np.where(cond, x, y)` with broadcasting; `cond` is bool, x or y is a traced value."""
    trace = active_trace("select", [cond, x, y])
    cond, x, y = map(numpy_scalar, (cond, x, y))
    if isinstance(cond, Tracer) and cond.dtype is not DType.bool:
        raise trace_error(f"select: the condition must be bool, got {cond.type}; compare first, "
                          f"e.g. where(x > 0, x, 0.0)")
    extra = cond.shape if isinstance(cond, Tracer) else ()
    if not isinstance(x, Tracer) and not isinstance(y, Tracer):
        # numpy's dtype of two scalars: 1.0 and 0.0 give f64, 1 and 0 i64, np.float32s f32
        x = _scalar_array(trace, x, _scalars_dtype(x, y), extra)
    a, b = lift("select", [x, y], extra)
    c_type = a.type.with_dtype(DType.bool)
    c = (broadcast_to_type(cond, c_type) if isinstance(cond, Tracer)
         else constant(trace, literal(cond, c_type, "select"), c_type))
    return emit(trace, "select", [c, a, b])


def _scalars_dtype(x: Any, y: Any) -> DType:
    """The dtype numpy gives `np.where(c, x, y)` for two scalars (it must be an eqsat one)."""
    for v in (x, y):
        if not isinstance(v, (bool, int, float, np.bool_, np.number)):
            raise trace_error(f"select: cannot take {describe(v)} as a value")
    try:
        result = np.result_type(x, y)
        return DType.of(result)
    except (KeyError, OverflowError, TypeError):
        raise trace_error(f"select: numpy makes {x!r} and {y!r} a dtype eqsat lacks; "
                          f"convert them first, e.g. with float() or np.float32()") from None


def _scalar_array(trace: Any, value: Any, dtype: DType, shape: tuple[int, ...]) -> Tracer:
    """A constant of `dtype` filling `shape`."""
    t = TensorType(dtype, shape)
    if isinstance(value, (np.bool_, np.number)):
        value = value.item()
    return constant(trace, literal(value, t, "select"), t)


def matmul(a: Any, b: Any) -> Tracer:
    """`np.matmul`: 1-D operands promoted and dropped again, batch dimensions broadcast."""
    trace = active_trace("matmul", [a, b])
    for i, v in enumerate((a, b)):
        if not isinstance(v, Tracer) or v.ndim == 0:
            raise trace_error(f"matmul: operand {i + 1} must be a traced value of rank >= 1, "
                              f"got {describe(v)}")
    a, b = promote("matmul", [a, b])
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if a.shape[-1] != k_b:
        raise trace_error(f"matmul: inner dimensions differ ({a.type} @ {b.type}: "
                          f"{a.shape[-1]} != {k_b})")
    if a.ndim >= 3 and b.ndim == 2:
        # a stack of rows times one matrix (x[B, T, D] @ w) is one product of all the rows:
        # as a batched product of w broadcast, w's gradient was a [B, D, N] stack summed
        # over B, B times w's size in memory
        rows = reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))
        return reshape(emit(trace, "matmul", [rows, b]), a.shape[:-1] + b.shape[-1:])
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    batch = broadcast_shape("matmul", [a2.type.with_shape(a2.shape[:-2]),
                                       b2.type.with_shape(b2.shape[:-2])])
    a2 = broadcast_to_type(a2, a2.type.with_shape(batch + a2.shape[-2:]))
    b2 = broadcast_to_type(b2, b2.type.with_shape(batch + b2.shape[-2:]))
    out = emit(trace, "matmul", [a2, b2])
    keep = out.shape[:-2] + (() if a.ndim == 1 else out.shape[-2:-1]) + (
        () if b.ndim == 1 else out.shape[-1:])
    return reshape(out, keep)


def getitem(x: Tracer, key: Any) -> Tracer:
    """Basic indexing: ints, slices, `...` and None, as a `slice` and a reshape (a slice with
    a step > 1 also takes every step-th element: `_every`)."""
    x = as_tracer(x, "slice")
    key = key if isinstance(key, tuple) else (key,)
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise trace_error("slice: an index can only have a single ellipsis ('...')")
    if used > x.ndim:
        raise trace_error(f"slice: too many indices for {x.type}: {used} given")
    i = next((j for j, k in enumerate(key) if k is Ellipsis), len(key))
    key = key[:i] + (slice(None),) * (x.ndim - used) + key[i + 1:]
    start, stop, shape, steps, axis = [], [], [], [], 0
    for k in key:
        if k is None:
            shape.append(1)
            continue
        d = x.shape[axis]
        if isinstance(k, slice):
            step = 1 if k.step is None else index(k.step, "slice")
            if step < 1:
                raise trace_error(f"slice: step {step} is not supported (eqsat has no reversal; "
                                  f"steps are positive)")
            for part in (k.start, k.stop):
                if part is not None:
                    index(part, "slice", clipped=True)
            s, e, _ = k.indices(d)
            n = len(range(s, e, step))
            start.append(s)
            stop.append(s + (n - 1) * step + 1 if n else s)
            shape.append(n)
            if step > 1 and n > 1:
                steps.append((axis, step, n))
        elif isinstance(k, (bool, np.bool_, Tracer)) or not hasattr(k, "__index__"):
            raise trace_error(f"slice: unsupported index {describe(k)}; use ints, slices with "
                              f"positive steps, ... and None")
        else:
            i = index(k, "slice")
            if not -d <= i < d:
                raise trace_error(f"slice: index {i} is out of range for axis {axis} of "
                                  f"{x.type}")
            start.append(i % d)
            stop.append(i % d + 1)
        axis += 1
    out = x
    if tuple(start) != (0,) * x.ndim or tuple(stop) != x.shape:
        out = emit(x.trace, "slice", [x], {"start": tuple(start), "stop": tuple(stop)})
    for a, step, n in steps:
        out = _every(out, a, step, n)
    return reshape(out, tuple(shape))


def _every(x: Tracer, axis: int, step: int, n: int) -> Tracer:
    """Elements 0, step, ..., (n-1)*step of `x` along `axis` (whose length is (n-1)*step+1):
    the first n-1 as rows of a reshape to (n-1, step) whose first column is kept, and the
    last one joined after them."""
    before = (slice(None),) * axis
    head = reshape(getitem(x, before + (slice(0, (n - 1) * step),)),
                   x.shape[:axis] + (n - 1, step) + x.shape[axis + 1:])
    head = getitem(head, before + (slice(None), 0))
    return concatenate([head, getitem(x, before + (slice((n - 1) * step, None),))], axis)


