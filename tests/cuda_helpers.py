"""What the CUDA backend's test files share: the bundled examples and the program whose kernels
have the code shapes we designed for; and for running kernels on the CPU emulator against
`interpret`, programs, arguments and the comparison."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import eqsat
from eqsat.ad import differentiate
from eqsat.ir import DType
from eqsat.testing.equivalence import compare

from gpu_emulator import EmulatedCuda, jit_unavailable

EXAMPLES = Path(eqsat.__file__).parent / "examples"
RTOL, ATOL = 1e-5, 1e-5
_UNAVAILABLE = jit_unavailable()
# for a test file's `pytestmark`: the emulator needs LLVM's NVPTX JIT support on this host
NEEDS_EMULATOR = pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))


def module(text: str) -> eqsat.Module:
    return eqsat.parse("module @t\n" + text)


def example(name: str) -> eqsat.Module:
    """A bundled example with its gradient declarations expanded."""
    return differentiate(eqsat.parse((EXAMPLES / f"{name}.eqir").read_text()))


# The kernels whose code shapes test_cuda checks in PTX (vectorized maps, warp-shuffled
# reductions, shared-memory tiles), at sizes that take those paths; test_cuda_runtime runs it.
SHAPES = """
func @f(%x: f32[256,512], %y: f32[256,512], %b: f32[512], %w: f32[512,96], %v: f64[96,40],
        %k: i32[48,64], %c: bool[256,512]) -> (f32[256,512], f32[256], f32[512], f32[],
        f32[512,256], f32[256,96], f32[96,256], f32[4,96,128], f64[40], i32[64,48], f32[256,1024],
        f32[256,512], f32[256,96], i64[48,64], f32[256,512]) {
  %bb = broadcast %b : f32[256,512]
  %e = map %x, %y, %b, body=tanh(add(mul($0, $1), $2)) : f32[256,512]
  %rows = map_reduce %x, %y, body=mul(sub($0, $1), sub($0, $1)), reduce=sum, axes=[1] : f32[256]
  %cols = sum %x, axes=[0] : f32[512]
  %all = max %e, axes=[0,1] : f32[]
  %t = transpose %x, perm=[1,0] : f32[512,256]
  %mm = matmul %x, %w : f32[256,96]
  %mt = matmul_t %w, %x, ta=1, tb=1 : f32[96,256]
  %r3 = reshape %x : f32[4,64,512]
  %w3 = reshape %w : f32[4,128,96]
  %sl = slice %r3, start=[0,0,0], stop=[4,64,128] : f32[4,64,128]
  %bm = matmul %sl, %w3 : f32[4,64,96]
  %p = transpose %bm, perm=[0,2,1] : f32[4,96,64]
  %q = concat %p, %p, axis=2 : f32[4,96,128]
  %vs = sum %v, axes=[0] : f64[40]
  %kt = transpose %k, perm=[1,0] : i32[64,48]
  %cc = concat %x, %y, axis=1 : f32[256,1024]
  %sel = select %c, %x, %bb : f32[256,512]
  %b2 = const 0.5 : f32[96]
  %ep = matmul_epi %x, %w, %b2, ta=0, tb=0, body=relu(add($0, $1)) : f32[256,96]
  %ki = cast %k : i64[48,64]
  %ex = exp %x : f32[256,512]
  return %e, %rows, %cols, %all, %t, %mm, %mt, %q, %vs, %kt, %cc, %sel, %ep, %ki, %ex
}
"""


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
