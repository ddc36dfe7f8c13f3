"""Running CUDA kernels on the CPU emulator against `interpret`: what the emulated-CUDA test
files share (programs, arguments, the comparison)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

import eqsat
from eqsat.ir import DType
from eqsat.testing.equivalence import compare

from gpu_emulator import EmulatedCuda, jit_unavailable

RTOL, ATOL = 1e-5, 1e-5
_UNAVAILABLE = jit_unavailable()
# for a test file's `pytestmark`: the emulator needs LLVM's NVPTX JIT support on this host
NEEDS_EMULATOR = pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))


def module(text: str) -> eqsat.Module:
    return eqsat.parse("module @t\n" + text)


def arguments(f: eqsat.ir.Function, seed: int, low: float = -2.0, high: float = 2.0
              ) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for p in f.params:
        t = p.type
        if t.dtype is DType.bool:
            a = rng.random(t.shape) < 0.5
        elif t.dtype.is_int:
            a = rng.integers(-9, 10, t.shape)
        else:
            a = rng.uniform(low, high, t.shape)
        out.append(np.asarray(a, t.dtype.np))
    return out


def assert_same(emu: EmulatedCuda, m: eqsat.Module, name: str, args: Sequence[np.ndarray],
                rtol: float = RTOL, atol: float = ATOL) -> None:
    """The emulated kernels give `interpret`'s results (NaN and infinities in place)."""
    got, want = emu(name, *args), eqsat.interpret(m, name, *args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        why = compare(g, w, rtol, atol)
        assert why is None, f"@{name} result {k}: emulated GPU vs interpret: {why}"


def check(m: eqsat.Module, seed: int = 0, **tolerance: float) -> EmulatedCuda:
    """Every function of `m` (gradients expanded) on the emulator against `interpret`."""
    m = eqsat.differentiate(m)
    emu = EmulatedCuda(m)
    for f in m.functions:
        assert_same(emu, m, f.name, arguments(f, seed), **tolerance)
    return emu


def whats(emu: EmulatedCuda, name: str = "f") -> list[str]:
    return [k.what for k in emu.launches(name)]
