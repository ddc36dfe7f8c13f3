"""numpy's structural functions on traced values: tensordot, pad, diagonals, triangles and the
`*_like` constants.

Each is built from IR ops that move data without arithmetic (slices, reshapes, concats,
selects, one matmul for tensordot), so the values are numpy's bit for bit, inf and NaN
included: a triangle masks with `select` rather than multiplying by 0 (0 * inf is NaN), and a
diagonal is a strided slice of the flattened matrix. The masks a triangle needs are built
from two constants by the same strided-window trick, with no mask array captured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import dsl_array
from .dsl_trace import as_tracer, constant, index, literal, trace_error
from .dsl_tracer import FUNCTION_HANDLERS, Tracer, _numpy_defaults
from .types import DType, TensorType


def _filled(like: Tracer, value: Any, dtype: DType, shape: tuple[int, ...]) -> Tracer:
    """A constant of `shape` holding `value` cast to `dtype` as numpy's unsafe cast does
    (np.pad of an i32 array with 1.5 pads with 1; 0 in a bool array is False)."""
    t = TensorType(dtype, shape)
    with np.errstate(invalid="ignore", over="ignore"):
        scalar = np.asarray(value).astype(dtype.np, casting="unsafe").item()
    return constant(like.trace, literal(scalar, t, "constant"), t)


def _axes_pair(axes: Any, a: Tracer, b: Tracer) -> tuple[list[int], list[int]]:
    if isinstance(axes, (Sequence, np.ndarray)) and not isinstance(axes, str):
        if len(axes) != 2:
            raise trace_error(f"tensordot: axes must be an integer or a pair of axis "
                              f"sequences, got {axes!r}")
        sa, sb = ([x] if not isinstance(x, (Sequence, np.ndarray)) else list(x) for x in axes)
        if len(sa) != len(sb):
            raise trace_error(f"tensordot: {len(sa)} axes of a against {len(sb)} of b")
        return ([dsl_array.normalize_axis(x, a.ndim, "tensordot") for x in sa],
                [dsl_array.normalize_axis(x, b.ndim, "tensordot") for x in sb])
    n = index(axes, "tensordot")
    if not 0 <= n <= min(a.ndim, b.ndim):
        raise trace_error(f"tensordot: cannot sum over {n} axes of {a.type} and {b.type}")
    return list(range(a.ndim - n, a.ndim)), list(range(n))


def tensordot(a: Any, b: Any, axes: Any = 2) -> Tracer:
    """`np.tensordot`: the summed axes moved together, both operands flattened to matrices
    and one matmul, reshaped to a's free axes followed by b's."""
    a, b = as_tracer(a, "tensordot"), as_tracer(b, "tensordot")
    sa, sb = _axes_pair(axes, a, b)
    if len(set(sa)) != len(sa) or len(set(sb)) != len(sb):
        raise trace_error(f"tensordot: repeated axes {sa}, {sb}")
    for i, j in zip(sa, sb):
        if a.shape[i] != b.shape[j]:
            raise trace_error(f"tensordot: shape mismatch for sum: axis {i} of {a.type} "
                              f"against axis {j} of {b.type}")
    free_a = [i for i in range(a.ndim) if i not in sa]
    free_b = [j for j in range(b.ndim) if j not in sb]
    k = math.prod(a.shape[i] for i in sa)
    a2 = dsl_array.reshape(dsl_array.transpose(a, free_a + sa),
                           (math.prod(a.shape[i] for i in free_a), k))
    b2 = dsl_array.reshape(dsl_array.transpose(b, sb + free_b),
                           (k, math.prod(b.shape[j] for j in free_b)))
    shape = tuple(a.shape[i] for i in free_a) + tuple(b.shape[j] for j in free_b)
    return dsl_array.reshape(dsl_array.matmul(a2, b2), shape)


def _pad_widths(pad_width: Any, rank: int) -> list[tuple[int, int]]:
    widths = np.asarray(pad_width, dtype=object)
    if widths.ndim > 2 or widths.size == 0:
        raise trace_error(f"pad: pad_width must be an int, a pair or one pair per axis, "
                          f"got {pad_width!r}")
    try:
        widths = np.broadcast_to(widths, (rank, 2))
    except ValueError:
        raise trace_error(f"pad: pad_width {pad_width!r} does not fit {rank} axes") from None
    out = [(index(b, "pad"), index(e, "pad")) for b, e in widths]
    if any(b < 0 or e < 0 for b, e in out):
        raise trace_error(f"pad: widths must be >= 0, got {pad_width!r}")
    return out


def pad(array: Any, pad_width: Any, mode: Any = "constant", **kwargs: Any) -> Tracer:
    """`np.pad` in mode "constant": `constant_values` (0 by default; one value, in the
    array's dtype) joined before and after along each axis."""
    x = as_tracer(array, "pad")
    if mode != "constant" or set(kwargs) - {"constant_values"}:
        raise trace_error(f"pad: only mode='constant' with constant_values traces, got "
                          f"mode={mode!r}" + (f" and {sorted(kwargs)}" if kwargs else ""))
    value = kwargs.get("constant_values", 0)
    if isinstance(value, Tracer) or np.ndim(value) != 0:
        raise trace_error("pad: constant_values must be one scalar here (per-axis values "
                          "do not trace)")
    if x.ndim == 0:
        raise trace_error(f"pad: a scalar ({x.type}) has no axes to pad")
    for axis, (before, after) in enumerate(_pad_widths(pad_width, x.ndim)):
        parts = []
        for n in (before, after):
            shape = x.shape[:axis] + (n,) + x.shape[axis + 1:]
            parts.append(_filled(x, value, x.dtype, shape) if n else None)
        x = dsl_array.concatenate([p for p in (parts[0], x, parts[1]) if p is not None], axis)
    return x


def diagonal(a: Any, offset: Any = 0, axis1: Any = 0, axis2: Any = 1) -> Tracer:
    """`np.diagonal`: the two axes moved last and flattened, the diagonal a slice of step
    (columns + 1) of that, along a new last axis."""
    x = as_tracer(a, "diagonal")
    if x.ndim < 2:
        raise trace_error(f"diagonal: needs at least 2 axes, got {x.type}")
    k = index(offset, "diagonal")
    i1, i2 = (dsl_array.normalize_axis(v, x.ndim, "diagonal") for v in (axis1, axis2))
    if i1 == i2:
        raise trace_error("diagonal: axis1 and axis2 cannot be the same")
    rest = [i for i in range(x.ndim) if i not in (i1, i2)]
    x = dsl_array.transpose(x, rest + [i1, i2])
    lead, (n, m) = x.shape[:-2], x.shape[-2:]
    length = max(0, min(n, m - k) if k >= 0 else min(n + k, m))
    flat = dsl_array.reshape(x, lead + (n * m,))
    first = k if k >= 0 else -k * m
    every = (Ellipsis, slice(first, first + (length - 1) * (m + 1) + 1, m + 1))
    return dsl_array.getitem(flat, every if length else (Ellipsis, slice(0, 0)))


def trace(a: Any, offset: Any = 0, axis1: Any = 0, axis2: Any = 1, dtype: Any = None,
          out: Any = None) -> Tracer:
    """`np.trace`: the sum of `np.diagonal`, in the dtype numpy's sum gives it."""
    _numpy_defaults("trace", out=out)
    d = diagonal(a, offset, axis1, axis2)
    if dtype is not None:
        d = d.astype(dtype)
    return d.sum(axis=-1)


def _tril_mask(like: Tracer, n: int, m: int, k: int) -> Tracer:
    """bool[n, m], True where column <= row + k. Row i is the window q[n-1-i : n-1-i+m] of
    q = n+k Trues then Falses; n copies of q flattened, cut to start at n-1 and read as rows
    of len(q)-1, put window i at the start of row i."""
    if k <= -n or n == 0 or m == 0:
        return _filled(like, False, DType.bool, (n, m))
    if k >= m - 1:
        return _filled(like, True, DType.bool, (n, m))
    s, width = n - 1, n - 1 + m
    q = dsl_array.concatenate([_filled(like, True, DType.bool, (n + k,)),
                               _filled(like, False, DType.bool, (width - n - k,))], 0)
    if n == 1:
        return dsl_array.reshape(q, (1, m))
    copies = dsl_array.reshape(dsl_array.broadcast_to(q, (n, width)), (n * width,))
    rows = dsl_array.reshape(dsl_array.getitem(copies, slice(s, s + n * (width - 1))),
                             (n, width - 1))
    return dsl_array.getitem(rows, (slice(None), slice(0, m)))


def _triangle(name: str, x: Any, k: Any) -> Tracer:
    x = as_tracer(x, name)
    k = index(k, name)
    if x.ndim < 2:
        raise trace_error(f"{name}: needs at least 2 axes here, got {x.type}")
    n, m = x.shape[-2:]
    zero = _filled(x, 0, x.dtype, ())
    if name == "tril":
        return dsl_array.where(_tril_mask(x, n, m, k), x, zero)
    return dsl_array.where(_tril_mask(x, n, m, k - 1), zero, x)


def tril(m: Any, k: Any = 0) -> Tracer:
    """`np.tril`: elements above the k-th diagonal of the last two axes set to zero."""
    return _triangle("tril", m, k)


def triu(m: Any, k: Any = 0) -> Tracer:
    """`np.triu`: elements below the k-th diagonal of the last two axes set to zero."""
    return _triangle("triu", m, k)


def diag(v: Any, k: Any = 0) -> Tracer:
    """`np.diag`: a matrix's k-th diagonal, or the square matrix with a vector on its k-th
    diagonal (each element followed by n zeros, flattened and cut into rows of n, then
    padded by |k| rows and columns)."""
    x = as_tracer(v, "diag")
    k = index(k, "diag")
    if x.ndim == 2:
        return diagonal(x, k)
    if x.ndim != 1:
        raise trace_error(f"diag: input must be 1-d or 2-d, got {x.type}")
    n = x.shape[0]
    if n == 0:
        return _filled(x, 0, x.dtype, (abs(k), abs(k)))
    spaced = dsl_array.concatenate(
        [dsl_array.reshape(x, (n, 1)), _filled(x, 0, x.dtype, (n, n))], 1)
    square = dsl_array.reshape(
        dsl_array.getitem(dsl_array.reshape(spaced, (n * (n + 1),)), slice(0, n * n)), (n, n))
    if k == 0:
        return square
    return pad(square, ((0, k), (k, 0)) if k > 0 else ((-k, 0), (0, -k)))


def _like_type(name: str, a: Any, dtype: Any, order: Any, shape: Any,
               kwargs: dict[str, Any]) -> tuple[Tracer, TensorType]:
    """The traced `a` and the type a `*_like` of it has: a's own, or the dtype and shape given."""
    x = as_tracer(a, name)
    if set(kwargs) - {"device"} or kwargs.get("device") not in (None, "cpu"):
        raise trace_error(f"{name}: unexpected arguments {sorted(kwargs)}")
    if order not in ("K", "A", "C"):
        raise trace_error(f"{name}(order={order!r}) cannot be traced: traced values are "
                          f"row-major")
    target = x.dtype if dtype is None else dsl_array.to_dtype(dtype, name)
    dims = x.shape if shape is None else tuple(
        index(d, name) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    return x, TensorType(target, dims)


def _like(name: str, value: int) -> Any:
    def apply(a: Any, dtype: Any = None, order: Any = "K", subok: Any = True, shape: Any = None,
              **kwargs: Any) -> Tracer:
        x, t = _like_type(name, a, dtype, order, shape, kwargs)
        return _filled(x, value, t.dtype, t.shape)

    apply.__name__ = name
    apply.__doc__ = (f"`np.{name}`: a constant {value} of a's shape and dtype (or those given); "
                     f"no element of `a` is read.")
    return apply


def full_like(a: Any, fill_value: Any, dtype: Any = None, order: Any = "K", subok: Any = True,
              shape: Any = None, **kwargs: Any) -> Tracer:
    """`np.full_like`: `fill_value` (a scalar, cast as numpy casts it, or a traced value
    broadcast to the shape) in a's shape and dtype, or those given."""
    x, t = _like_type("full_like", a, dtype, order, shape, kwargs)
    if isinstance(fill_value, Tracer):
        return dsl_array.broadcast_to(fill_value.astype(t.dtype), t.shape)
    if np.ndim(fill_value) != 0:
        raise trace_error("full_like: fill_value must be a scalar or a traced value")
    return _filled(x, fill_value, t.dtype, t.shape)


FUNCTION_HANDLERS.update({
    np.zeros_like: _like("zeros_like", 0), np.ones_like: _like("ones_like", 1),
    np.empty_like: _like("empty_like", 0), np.full_like: full_like,
    np.tensordot: tensordot, np.pad: pad, np.diagonal: diagonal, np.trace: trace,
    np.diag: diag, np.tril: tril, np.triu: triu,
})
Tracer.diagonal = diagonal  # type: ignore[attr-defined]
