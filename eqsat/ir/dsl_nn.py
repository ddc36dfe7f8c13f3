"""Composite neural-network functions of the staged DSL, written in the DSL itself.

They trace into plain IR ops (no new ops), so AD, the rules and the backends see them like any
other expression, and fusion rules can turn them back into single kernels.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import dsl_array
from .dsl_trace import as_tracer, numpy_scalar, trace_error, unary
from .dsl_tracer import Tracer


def float_operand(x: Any, what: str, axes: bool = True, axis: Any = -1) -> Tracer:
    """`x`, checked to be a traced float value (where the composite reduces over `axes`, with
    an axis and `axis` one of them): otherwise the composites would fail inside their formula,
    on an op the user never wrote."""
    x = as_tracer(x, what)
    if not x.dtype.is_float:
        raise trace_error(f"{what}: needs a float tensor, got {x.type}; convert with "
                          f".astype(eqsat.f32) first")
    if axes and not x.shape:
        raise trace_error(f"{what}: needs a tensor with an axis to work along, got the scalar "
                          f"{x.type}")
    if axes:
        dsl_array.normalize_axes(axis, x.ndim, what)
    return x


def softmax(x: Tracer, axis: Any = -1) -> Tracer:
    """`exp(x) / sum(exp(x))` over `axis`, with the maximum subtracted first so exp cannot
    overflow (scipy.special.softmax's formula)."""
    x = float_operand(x, "softmax", axis=axis)
    e = unary("exp", x - dsl_array.reduce("max", x, axis, keepdims=True))
    return e / dsl_array.reduce("sum", e, axis, keepdims=True)


def logsumexp(x: Tracer, axis: Any = -1, keepdims: bool = False) -> Tracer:
    """`log(sum(exp(x)))` over `axis`, computed stably as `m + log(sum(exp(x - m)))` with `m`
    the maximum; as scipy.special.logsumexp, an infinite maximum is replaced by 0 so rows of
    -inf give -inf rather than nan."""
    x = float_operand(x, "logsumexp", axis=axis)
    m = dsl_array.reduce("max", x, axis, keepdims=True)
    m = dsl_array.where(unary("abs", m) < math.inf, m, 0.0)
    s = dsl_array.reduce("sum", unary("exp", x - m), axis, keepdims=True)
    out = m + unary("log", s)
    if keepdims:
        return out
    axes = dsl_array.normalize_axes(axis, x.ndim, "logsumexp")
    return dsl_array.reshape(out, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def layer_norm(x: Tracer, axis: Any = -1, eps: float = 1e-5, gamma: Tracer | None = None,
               beta: Tracer | None = None) -> Tracer:
    """`(x - mean) / sqrt(var + eps)` over `axis` (biased variance, as in PyTorch), then scaled
    by `gamma` and shifted by `beta` when given (both broadcast against x). `eps` is taken in
    x's dtype even as a numpy scalar, which in numpy's own arithmetic would promote."""
    x = float_operand(x, "layer_norm", axis=axis)
    eps = numpy_scalar(eps)
    if isinstance(eps, np.generic):
        eps = eps.item()
    d = x - dsl_array.mean(x, axis, keepdims=True)
    var = dsl_array.mean(d * d, axis, keepdims=True)
    y = d * unary("rsqrt", var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu(x: Tracer) -> Tracer:
    """GELU by its tanh approximation (Hendrycks and Gimpel; as PyTorch's approximate="tanh"):
    `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`; not the exact erf form."""
    x = float_operand(x, "gelu", axes=False)
    inner = _GELU_C * (x + 0.044715 * (x * x * x))
    return 0.5 * x * (1.0 + unary("tanh", inner))


__all__ = ["gelu", "layer_norm", "logsumexp", "softmax"]
