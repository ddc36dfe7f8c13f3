"""What the staged-DSL test files share: running a traced function through the reference
interpreter, random operands, and a dtype-checking comparison."""

from __future__ import annotations

import numpy as np

from eqsat.ir import Module, interpret
from eqsat.ir.dsl import TracedFunction

RNG = np.random.default_rng(0)
# Python's binary operators by symbol, each with `operator`'s name for it
OPERATORS = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "**": "pow",
             "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


def run(tf: TracedFunction, *arrays: np.ndarray):
    """Interpret a traced function through a module built from it (the oracle path)."""
    return interpret(Module(tf), tf.name, *arrays)


def rand(shape, dtype=np.float32, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Random operands: integers in [-5, 5] for integer dtypes, else uniform in [low, high)."""
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.uniform(low, high, size=shape).astype(dtype)


def close(got, want, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Same dtype, and values within the tolerances."""
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def refused(kind: str, result: np.dtype) -> bool:
    """Where eqsat has no op for numpy's operation in the promoted dtype: floor division of
    floats, and arithmetic, maximum and matmul on bools (true division of integers and bools
    is done in f64, as numpy does)."""
    if kind == "//":
        return result.kind != "i"
    return kind in ("+", "-", "*", "**", "maximum", "minimum", "@") and result.kind == "b"
