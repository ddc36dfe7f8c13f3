"""Random arguments for a function's parameters, drawn by numpy: what `optimize`'s last check
(extract/validate.py) and the equivalence helpers of `eqsat.testing` feed the interpreter.
Kept apart from `eqsat.testing`, which imports hypothesis, so `optimize` never loads it."""

from __future__ import annotations

import math

import numpy as np

from .module import Function
from .types import DType


def inward(low: float, high: float, dtype: np.dtype) -> tuple[float, float]:
    """The bounds rounded inwards to values `dtype` represents exactly."""
    lo, hi = dtype.type(low), dtype.type(high)
    if lo < low:
        lo = np.nextafter(lo, dtype.type(np.inf))
    if hi > high:
        hi = np.nextafter(hi, dtype.type(-np.inf))
    return float(lo), float(hi)


def random_arguments(f: Function, low: float, high: float, rng: np.random.Generator
                     ) -> tuple[np.ndarray, ...]:
    """Arrays of `f`'s parameter types: floats uniform in [low, high] (bounds the dtype holds),
    integers in [floor(low), ceil(high)], bools fair."""
    out = []
    for p in f.params:
        t = p.type
        if t.dtype is DType.bool:
            a = rng.random(t.shape) < 0.5
        elif t.dtype.is_int:
            a = rng.integers(math.floor(low), math.ceil(high) + 1, t.shape)
        else:
            lo, hi = inward(low, high, t.dtype.np)
            a = np.clip(rng.uniform(lo, hi, t.shape).astype(t.dtype.np), lo, hi)
        out.append(np.asarray(a, dtype=t.dtype.np))
    return tuple(out)
