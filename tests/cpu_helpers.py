"""What the CPU backend's test files share: compiling without the disk cache, and comparing
compiled results with the interpreter's to within a few units in the last place."""

from __future__ import annotations

import numpy as np

import eqsat
from eqsat.backend import compile_module
from eqsat.ir import parse


def compiled(text: str):
    """Compile module text without touching the disk cache."""
    return compile_module(parse(text), cache_dir=None)


def assert_matches(got, want, ulps: int = 4, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Integers and bools exactly; floats within `ulps` units in the last place (plus `rtol`
    and `atol`, for sums in another order), NaN where the interpreter has NaN."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w)
            continue
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        finite = np.isfinite(w)
        np.testing.assert_array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)])
        tiny = np.finfo(w.dtype).tiny
        err = np.abs(g[finite].astype(np.float64) - w[finite])
        tol = ulps * np.spacing(np.abs(w[finite])) + rtol * np.abs(w[finite]) + ulps * tiny + atol
        assert np.all(err <= tol), f"max error {err.max()} > tolerance"


def run_both(module, name: str, *args):
    """`name`'s results compiled (without the disk cache) and interpreted, in that order."""
    exe = compile_module(module, cache_dir=None)
    return exe(name, *args), eqsat.interpret(module, name, *args)
