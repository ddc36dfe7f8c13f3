"""numpy's functions on traced values: the `__array_function__` protocol (NEP 18) of Tracer.

Models written against numpy (np.where, np.concatenate, np.var, x.clip, ...) trace unchanged:
each numpy function listed here maps onto the DSL's primitives with numpy's values, dtype and
shape, and every other numpy function is refused by Tracer as a TraceError at the user's line,
so numpy never coerces a traced value to an array. The ndarray methods of the same meaning
(x.var, x.clip, x.dot, x.flatten, ...) are installed here too; numpy's ufuncs composed of IR
ops (np.square, np.log1p, ...) live in dsl_ufuncs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import dsl_array
from .dsl_trace import as_tracer, binary, describe, trace_error, true_divide, unary
from .dsl_tracer import FUNCTION_HANDLERS, Tracer, _numpy_defaults
from .types import DType

_NO_VALUE = getattr(np, "_NoValue", None)


def _given(value: Any) -> Any:
    """numpy's `<no value>` default as None."""
    return None if value is _NO_VALUE else value


def _tracers(arrays: Sequence[Any], what: str) -> list[Tracer]:
    xs = list(arrays)
    if not xs or not all(isinstance(x, Tracer) for x in xs):
        got = ", ".join(describe(x) for x in xs) or "nothing"
        raise trace_error(f"{what} needs a sequence of traced values, got {got}")
    return xs


def where(condition: Any, x: Any = None, y: Any = None) -> Tracer:
    """`np.where(c, x, y)`; the one-argument form (indices of nonzeros) has no static shape."""
    if x is None or y is None:
        raise trace_error("np.where(condition) without x and y gives indices, whose count is "
                          "not known while tracing; use np.where(condition, x, y)")
    return dsl_array.where(condition, x, y)


def concatenate(arrays: Sequence[Any], axis: Any = 0, out: Any = None, *, dtype: Any = None,
                casting: str = "same_kind") -> Tracer:
    """`np.concatenate`; `axis=None` joins the flattened arrays."""
    _numpy_defaults("concatenate", out=out, dtype=dtype)
    xs = _tracers(arrays, "concatenate")
    if axis is None:
        return dsl_array.concatenate([dsl_array.reshape(x, -1) for x in xs], 0)
    return dsl_array.concatenate(xs, axis)


def stack(arrays: Sequence[Any], axis: Any = 0, out: Any = None, *, dtype: Any = None,
          casting: str = "same_kind") -> Tracer:
    """`np.stack`: arrays of one shape joined along a new axis."""
    _numpy_defaults("stack", out=out, dtype=dtype)
    xs = _tracers(arrays, "stack")
    if len({x.shape for x in xs}) != 1:
        raise trace_error(f"stack: all input arrays must have the same shape, got "
                          f"{', '.join(str(x.type) for x in xs)}")
    a = dsl_array.normalize_axis(axis, xs[0].ndim + 1, "stack")
    return dsl_array.concatenate([expand_dims(x, a) for x in xs], a)


def dot(a: Any, b: Any, out: Any = None) -> Tracer:
    """`np.dot` for operands of rank 0 to 2 (a product, an inner product or a matmul)."""
    _numpy_defaults("dot", out=out)
    # numpy makes a Python scalar an array here, so it is strongly typed (f32 with 2.0 is f64)
    a, b = (v if isinstance(v, Tracer) else np.asarray(v)[()] for v in (a, b))
    ranks = [v.ndim if isinstance(v, Tracer) else np.ndim(v) for v in (a, b)]
    if 0 in ranks:
        return binary("mul", a, b)
    if max(ranks) > 2:
        raise trace_error(f"dot of rank {ranks[0]} and {ranks[1]} operands cannot be traced "
                          f"(numpy sums over the last and second-to-last axes); use a @ b or "
                          f"np.einsum")
    return dsl_array.matmul(a, b)


def transpose(a: Any, axes: Any = None) -> Tracer:
    """`np.transpose`."""
    return dsl_array.transpose(a, axes)


def swapaxes(a: Any, axis1: Any, axis2: Any) -> Tracer:
    """`np.swapaxes`: two axes exchanged."""
    x = as_tracer(a, "swapaxes")
    i, j = (dsl_array.normalize_axis(v, x.ndim, "swapaxes") for v in (axis1, axis2))
    perm = list(range(x.ndim))
    perm[i], perm[j] = j, i
    return dsl_array.transpose(x, perm)


def moveaxis(a: Any, source: Any, destination: Any) -> Tracer:
    """`np.moveaxis`: axes moved to new positions, the others keeping their order."""
    x = as_tracer(a, "moveaxis")
    src = [dsl_array.normalize_axis(v, x.ndim, "moveaxis") for v in _seq(source)]
    dst = [dsl_array.normalize_axis(v, x.ndim, "moveaxis") for v in _seq(destination)]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise trace_error("moveaxis: source and destination must be distinct axes, as many "
                          "of one as of the other")
    perm = [i for i in range(x.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        perm.insert(d, s)
    return dsl_array.transpose(x, perm)


def _seq(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (tuple, list)) else [v]


def expand_dims(a: Any, axis: Any) -> Tracer:
    """`np.expand_dims`: axes of length 1 inserted at `axis` (an int or a tuple)."""
    x = as_tracer(a, "expand_dims")
    rank = x.ndim + len(_seq(axis))
    axes = dsl_array.normalize_axes(axis, rank, "expand_dims")
    dims = iter(x.shape)
    return dsl_array.reshape(x, tuple(1 if i in axes else next(dims) for i in range(rank)))


def squeeze(a: Any, axis: Any = None) -> Tracer:
    """`np.squeeze`: axes of length 1 removed (all of them, or those in `axis`)."""
    x = as_tracer(a, "squeeze")
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = dsl_array.normalize_axes(axis, x.ndim, "squeeze")
        if any(x.shape[i] != 1 for i in axes):
            raise trace_error(f"squeeze: cannot select an axis to squeeze out which has size "
                              f"not equal to one ({x.type}, axis {axis})")
    return dsl_array.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def broadcast_to(array: Any, shape: Any, subok: bool = False) -> Tracer:
    """`np.broadcast_to`."""
    return dsl_array.broadcast_to(array, shape)


def reshape(a: Any, shape: Any = None, order: str = "C", *, newshape: Any = None,
            copy: Any = None) -> Tracer:
    """`np.reshape` (`newshape` is numpy's older name of `shape`)."""
    return as_tracer(a, "reshape").reshape(newshape if shape is None else shape, order=order)


def ravel(a: Any, order: str = "C") -> Tracer:
    """`np.ravel`: the row-major flattening."""
    _numpy_defaults("ravel", order=order)
    return dsl_array.reshape(as_tracer(a, "ravel"), -1)


def _reduction(name: str) -> Callable[..., Tracer]:
    def apply(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
              keepdims: Any = False, initial: Any = None, where: Any = None) -> Tracer:
        given = {"out": out, "initial": _given(initial), "where": _given(where)}
        _numpy_defaults(name, dtype=dtype, **given)
        return getattr(as_tracer(a, name), name)(axis, bool(_given(keepdims)))

    apply.__name__ = name
    apply.__doc__ = f"`np.{name}` over `axis` with `keepdims`."
    return apply


def _extremum(name: str) -> Callable[..., Tracer]:
    reduce = _reduction(name)

    def apply(a: Any, axis: Any = None, out: Any = None, keepdims: Any = False,
              initial: Any = None, where: Any = None) -> Tracer:
        return reduce(a, axis, None, out, keepdims, initial, where)

    apply.__name__ = name
    return apply


def mean(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: Any = False,
         *, where: Any = None) -> Tracer:
    """`np.mean` over `axis` with `keepdims`."""
    _numpy_defaults("mean", dtype=dtype, out=out, where=_given(where))
    return dsl_array.mean(as_tracer(a, "mean"), axis, bool(_given(keepdims)))


def clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, *, min: Any = None,
         max: Any = None, **kwargs: Any) -> Tracer:  # noqa: A002
    """`np.clip` as numpy computes it, `minimum(maximum(a, lo), hi)`; None is an open bound."""
    _numpy_defaults("clip", out=out)
    if kwargs:
        raise trace_error(f"clip({', '.join(kwargs)}=...) cannot be traced")
    lo, hi = _given(a_min), _given(a_max)
    lo, hi = (min if lo is None else lo), (max if hi is None else hi)
    x = as_tracer(a, "clip")
    if lo is not None:
        x = binary("maximum", x, lo)
    if hi is not None:
        x = binary("minimum", x, hi)
    return x


def var(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
        keepdims: Any = False, *, where: Any = None, mean: Any = None,
        correction: Any = None) -> Tracer:
    """`np.var`: the mean of squared deviations from the mean, divided by `n - ddof` (in the
    float dtype numpy takes it in: an f32 array's in f32, an integer one's in f64)."""
    _numpy_defaults("var", dtype=dtype, out=out, where=_given(where))
    if _given(mean) is not None:
        raise trace_error("var(mean=...) cannot be traced; compute it from x directly")
    if _given(correction) is not None:
        ddof = correction
    x = as_tracer(a, "var")
    axes = dsl_array.normalize_axes(axis, x.ndim, "var")
    count = math.prod(x.shape[i] for i in axes)
    d = x - dsl_array.mean(x, axes, keepdims=True)
    total = dsl_array.reduce("sum", d * d, axes, bool(_given(keepdims)))
    return true_divide(total, float(max(count - ddof, 0)))


def std(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
        keepdims: Any = False, *, where: Any = None, mean: Any = None,
        correction: Any = None) -> Tracer:
    """`np.std`: the square root of `np.var`."""
    return unary("sqrt", var(a, axis, dtype, out, ddof, keepdims, where=where, mean=mean,
                             correction=correction))


def outer(a: Any, b: Any, out: Any = None) -> Tracer:
    """`np.outer` of the flattened operands."""
    _numpy_defaults("outer", out=out)
    x, y = (dsl_array.reshape(as_tracer(v, "outer"), -1) for v in (a, b))
    return binary("mul", dsl_array.reshape(x, (-1, 1)), dsl_array.reshape(y, (1, -1)))


def tile(A: Any, reps: Any) -> Tracer:  # noqa: N803  (numpy's name)
    """`np.tile`: copies joined along each axis (`reps` and A's shape padded with 1s)."""
    x = as_tracer(A, "tile")
    reps = [dsl_array.index(r, "tile") for r in _seq(reps)]
    if any(r < 1 for r in reps):
        raise trace_error(f"tile: repetitions must be >= 1 (got {reps})")
    rank = max(len(reps), x.ndim)
    x = dsl_array.reshape(x, (1,) * (rank - x.ndim) + x.shape)
    for axis, r in enumerate([1] * (rank - len(reps)) + reps):
        if r > 1:
            x = dsl_array.concatenate([x] * r, axis)
    return x


def norm(x: Any, ord: Any = None, axis: Any = None,  # noqa: A002  (numpy's names)
         keepdims: bool = False) -> Tracer:
    """`np.linalg.norm` with the default `ord`: the 2-norm over `axis` (None: all elements);
    an integer array's in f64, as numpy's."""
    if ord is not None:
        raise trace_error(f"np.linalg.norm(ord={ord!r}) cannot be traced; only the default "
                          f"2-norm (ord=None)")
    t = as_tracer(x, "norm")
    if not t.dtype.is_float:
        t = dsl_array.cast(t, DType.f64)
    return unary("sqrt", dsl_array.reduce("sum", t * t, axis, keepdims))


def einsum(subscripts: Any, *operands: Any, **kwargs: Any) -> Tracer:
    """`np.einsum` for an axis permutation ("ij->ji") or a batched matmul ("ij,jk->ik",
    "bij,bjk->bik"); other subscripts are refused."""
    if kwargs or not isinstance(subscripts, str) or "->" not in subscripts:
        raise trace_error("np.einsum is traced only with explicit '->' subscripts and no "
                          "keywords (a transpose or a matmul)")
    inputs, output = subscripts.replace(" ", "").split("->")
    ins = inputs.split(",")
    if len(ins) != len(operands) or any(len(set(s)) != len(s) for s in [*ins, output]):
        raise trace_error(f"np.einsum({subscripts!r}) cannot be traced (repeated letters or "
                          f"a wrong operand count)")
    if len(ins) == 1 and sorted(ins[0]) == sorted(output):
        x = as_tracer(operands[0], "einsum")
        return dsl_array.transpose(x, [ins[0].index(c) for c in output])
    if len(ins) == 2:
        (a, b), (sa, sb) = operands, ins
        batch = sa[:-2]
        if (len(sa) == len(sb) == len(output) >= 2 and sb[:-2] == batch == output[:-2]
                and sa[-1] == sb[-2] and output[-2:] == sa[-2] + sb[-1]
                and len(set(sa[-2:] + sb[-1])) == 3 and not set(batch) & set(sa[-2:] + sb[-1])):
            return dsl_array.matmul(as_tracer(a, "einsum"), as_tracer(b, "einsum"))
    raise trace_error(f"np.einsum({subscripts!r}) cannot be traced; only transposes "
                      f"('ij->ji') and matmuls ('ij,jk->ik', 'bij,bjk->bik'); use @, "
                      f"np.transpose and sums")


def size(a: Any, axis: Any = None) -> int:
    """`np.size`: the element count, or the length of `axis`."""
    x = as_tracer(a, "size")
    return x.size if axis is None else x.shape[dsl_array.normalize_axis(axis, x.ndim, "size")]


def astype(x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Tracer:
    """`np.astype` (numpy 2): `x.astype(dtype)`."""
    return as_tracer(x, "astype").astype(dtype)


FUNCTION_HANDLERS.update({
    np.shape: lambda a: as_tracer(a, "shape").shape, np.ndim: lambda a: as_tracer(a, "ndim").ndim,
    np.size: size, np.astype: astype,
    np.where: where, np.concatenate: concatenate, np.stack: stack, np.dot: dot,
    np.matmul: dsl_array.matmul, np.transpose: transpose, np.swapaxes: swapaxes,
    np.moveaxis: moveaxis, np.expand_dims: expand_dims, np.squeeze: squeeze,
    np.broadcast_to: broadcast_to, np.reshape: reshape, np.ravel: ravel,
    np.sum: _reduction("sum"), np.mean: mean, np.max: _extremum("max"),
    np.amax: _extremum("max"), np.min: _extremum("min"), np.amin: _extremum("min"),
    np.clip: clip, np.var: var, np.std: std, np.outer: outer, np.tile: tile,
    np.linalg.norm: norm, np.einsum: einsum,
})


# the ndarray methods of the functions above (x.var(axis=1) is np.var(x, axis=1)): each
# function takes the array first, so it serves as the method itself
def _shape_method(fn: Callable[..., Tracer]) -> Callable[..., Tracer]:
    def method(self: Tracer, *axes: Any) -> Tracer:
        return fn(self, axes[0] if len(axes) == 1 else (axes or None))

    method.__doc__ = fn.__doc__
    return method


for _name, _fn in {"var": var, "std": std, "clip": clip, "dot": dot, "ravel": ravel,
                   "flatten": ravel, "swapaxes": swapaxes}.items():
    setattr(Tracer, _name, _fn)
Tracer.squeeze = _shape_method(squeeze)  # type: ignore[attr-defined]
