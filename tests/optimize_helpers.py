"""Helpers the optimize() tests share: the bundled examples, cost and result comparisons."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import eqsat.extract as ex
from eqsat import interpret
from eqsat.extract import function_costs
from eqsat.ir import Module

EXAMPLES = Path(ex.__file__).parent.parent / "examples"


def assert_not_costlier(before: Module, after: Module, target: str = "cuda") -> None:
    b, a = function_costs(before, target), function_costs(after, target)
    assert set(a) == set(b)
    for name in b:
        assert a[name] <= b[name] * (1 + 1e-9), f"@{name}: {a[name]} > {b[name]}"


def same_results(before: Module, after: Module, name: str, *args: np.ndarray) -> None:
    r1, r2 = interpret(before, name, *args), interpret(after, name, *args)
    for x, y in zip(r1 if isinstance(r1, tuple) else (r1,), r2 if isinstance(r2, tuple) else (r2,)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32)
