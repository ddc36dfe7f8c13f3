"""Ulp distances for the math library's accuracy tests (test_mathlib, test_trig_fastpath)."""

from __future__ import annotations

import numpy as np

# the bound every function keeps against the correctly rounded value, in ulp
MAX_ULP_TRUE = 2


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Number of representable floats between a and b (0 for two NaNs, inf for one NaN)."""
    u_a = a.view(np.uint32 if a.dtype == np.float32 else np.uint64)
    u_b = b.view(u_a.dtype)
    top = u_a.dtype.type(1) << u_a.dtype.type(8 * a.itemsize - 1)
    # map the sign-magnitude bit patterns onto one monotone unsigned scale
    o_a = np.where(u_a & top, ~u_a, u_a | top)
    o_b = np.where(u_b & top, ~u_b, u_b | top)
    d = np.where(o_a >= o_b, o_a - o_b, o_b - o_a).astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    d[nan_a & nan_b] = 0
    d[nan_a ^ nan_b] = np.inf
    return d
