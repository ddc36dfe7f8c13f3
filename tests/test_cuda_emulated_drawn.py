"""The CUDA backend's kernels on the CPU emulator against `interpret`, on what hypothesis draws:
random modules, optimized for cuda or not, and shapes for the kernel families whose code path
depends on them (reductions, transposes, products). Hand-written cases for every code path are
in test_cuda_emulated.py. Shapes stay small: a block that synchronizes runs 256 OS threads."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.ir import DType
from eqsat.testing import inputs, modules

from cuda_helpers import NEEDS_EMULATOR, assert_same, module
from gpu_emulator import EmulatedCuda

pytestmark = NEEDS_EMULATOR


# ---------------------------------------------------------------- random programs

HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=HEALTH)
@given(data=st.data())
def test_random_modules(data):
    m = data.draw(modules(max_functions=2, max_stmts=6))
    emu = EmulatedCuda(m)
    for f in m.functions:
        assert_same(emu, m, f.name, data.draw(inputs(f)), rtol=1e-4, atol=1e-5)


@settings(max_examples=20, deadline=None, database=None, suppress_health_check=HEALTH)
@given(data=st.data())
def test_random_modules_optimized_for_cuda(data):
    m = data.draw(modules(max_functions=2, max_stmts=6, dtypes=[DType.f32, DType.f64]))
    opt = eqsat.optimize(m, target="cuda", limits=eqsat.Limits(iterations=4, seconds=3))
    emu = EmulatedCuda(opt)
    for f in m.functions:
        assert_same(emu, m, f.name, data.draw(inputs(f)), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- kernel families, drawn

BLOCKS = 24  # synchronizing blocks one drawn case may launch (each runs 256 OS threads)


def affordable(emu: EmulatedCuda, name: str = "f") -> bool:
    sync = emu.kernels.sync
    return sum(int(np.prod(k.grid)) for k in emu.launches(name) if k.name in sync) <= BLOCKS


def drawn(data: st.DataObject, text: str, name: str = "f") -> None:
    m = module(text)
    emu = EmulatedCuda(m)
    assume(affordable(emu, name))
    f = m[name]
    args = data.draw(inputs(f))
    assert_same(emu, m, name, args, rtol=1e-4, atol=1e-4)


def dims(data: st.DataObject, rank: tuple[int, int], most: int, total: int) -> list[int]:
    """A shape of `rank` axes of at most `most` each and at most `total` elements."""
    shape: list[int] = []
    for _ in range(data.draw(st.integers(*rank))):
        room = total // int(np.prod(shape))
        shape.append(data.draw(st.integers(1, max(1, min(most, room)))))
    return shape


def ty(dtype: str, shape: list[int]) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=HEALTH)
@given(data=st.data())
def test_drawn_reductions(data):
    shape = dims(data, (1, 3), 1500, 3000)
    axes = sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    dtype = data.draw(st.sampled_from(["f32", "f64", "i32", "i64"]))
    op = data.draw(st.sampled_from(["sum", "max", "min"]))
    out = ty(dtype, [d for i, d in enumerate(shape) if i not in axes])
    drawn(data, f"func @f(%x: {ty(dtype, shape)}) -> {out} {{\n"
                f"  %0 = {op} %x, axes={axes} : {out}\n  return %0\n}}")


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=HEALTH)
@given(data=st.data())
def test_drawn_transposes(data):
    shape = dims(data, (2, 4), 70, 4000)
    perm = data.draw(st.permutations(range(len(shape))))
    dtype = data.draw(st.sampled_from(["f32", "f64", "i32", "bool"]))
    out = ty(dtype, [shape[p] for p in perm])
    drawn(data, f"func @f(%x: {ty(dtype, shape)}) -> {out} {{\n"
                f"  %0 = transpose %x, perm={list(perm)} : {out}\n  return %0\n}}")


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=HEALTH)
@given(data=st.data())
def test_drawn_matmuls(data):
    batch = dims(data, (0, 2), 3, 4)
    m, n, k = (data.draw(st.integers(1, hi)) for hi in (80, 80, 40))
    ta, tb = data.draw(st.booleans()), data.draw(st.booleans())
    dtype = data.draw(st.sampled_from(["f32", "f64", "i32", "i64"]))
    a = ty(dtype, batch + ([k, m] if ta else [m, k]))
    b = ty(dtype, batch + ([n, k] if tb else [k, n]))
    out = ty(dtype, batch + [m, n])
    drawn(data, f"func @f(%a: {a}, %b: {b}) -> {out} {{\n"
                f"  %0 = matmul_t %a, %b, ta={int(ta)}, tb={int(tb)} : {out}\n"
                f"  return %0\n}}")
