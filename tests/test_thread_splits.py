"""Kernels whose outer loop is not the one threads usually split: a reduction down the columns
(its rows cut into parts, each walked in order) and a concat along an inner axis (split by rows
of every piece). Results must be the serial ones bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir as llvm_ir

import eqsat
from eqsat.backend import compile_module, llvm_kernels, loops
from eqsat.backend.reductions import split_reductions
from eqsat.host import REDUCTION_PARTS, SPLIT_MIN_ELEMENTS
from eqsat.ir import parse


def extent(text: str) -> int:
    """The outer extent that threads split, of the kernel of the function's first statement."""
    m = parse(text)
    stmt = m["f"].body[0]
    env = m["f"].types()
    kb = llvm_kernels.KernelBuilder(llvm_ir.Module())
    return llvm_kernels.build_kernel(kb, stmt, [env[o] for o in stmt.operands]).extent


@pytest.mark.parametrize("reduce", ["sum", "max", "min"])
@pytest.mark.parametrize("shape", [(37, 1003), (65536, 16), (9, 4, 7), (4096, 24), (1, 64, 2048)],
                         ids=str)
def test_column_reductions_walk_rows_in_parts(fresh, reduce, shape):
    """Reducing down the columns (reduced rows outside, kept columns inside): the kernel walks
    its rows in memory order, never split by columns (two threads each walking every row for
    their columns took 2-4x the CPU time of one, and with 16 columns stored into one cache
    line of the result on every row: 65536x16 f32 in 7 ms against 0.07). Where the rows are a
    multiple of REDUCTION_PARTS and the domain large enough, lowering cuts them into parts
    that the threads share (backend/reductions.py). Results are the same bits on one thread
    and on two, and sums are at least as close to the exact ones as numpy's (which adds the
    rows one after another)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    ty = f"f32[{','.join(map(str, shape))}]"
    kept = f"f32[{','.join(map(str, shape[1:]))}]"
    text = f"""module @m
func @f(%x: {ty}) -> ({kept}, {kept}) {{
  %a = {reduce} %x, axes=[0] : {kept}
  %b = map_reduce %x, body=tanh(exp($0)), reduce={reduce}, axes=[0] : {kept}
  return %a, %b
}}
"""
    fresh(1, 1 << 40)
    serial = compile_module(parse(text), cache_dir=None).f(x)
    fresh(2, 0)
    threaded = compile_module(parse(text), cache_dir=None).f(x)
    for got, want in zip(threaded, serial):
        np.testing.assert_array_equal(got, want)
    reference = eqsat.interpret(parse(text), "f", x)
    for got, want, terms in zip(threaded, reference, (x, np.tanh(np.exp(x.astype(np.float64))))):
        exact = getattr(np, reduce)(terms.astype(np.float64), axis=0)
        ours, numpys = np.abs(got - exact).max(), np.abs(want - exact).max()
        assert ours <= max(numpys, 1e-6 * np.abs(terms).sum(axis=0).max()), (ours, numpys)
    assert extent(text) == 1
    lowered = split_reductions(parse(text))["f"]
    cut = shape[0] % REDUCTION_PARTS == 0 and x.size >= SPLIT_MIN_ELEMENTS
    assert len(lowered.body) == (2 * 3 if cut else 2), lowered  # reshape, parts, combine


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concats_split_over_threads(fresh, axis):
    """A concat along an inner axis copies every piece row by row, so threads split the rows
    (4 x 4 MiB along axis 1: 1358 -> 637 us); along the outer axis the pieces are consecutive
    blocks of the result, and threads split the result's rows, each copying the parts of the
    pieces in its own."""
    rng = np.random.default_rng(axis)
    shapes = [[5, 7, 9], [5, 7, 9], [5, 7, 9]]
    for k, s in enumerate(shapes):
        s[axis] += k
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    ty = [f"f32[{','.join(map(str, s))}]" for s in (*shapes, out)]
    params = ", ".join(f"%x{k}: {t}" for k, t in enumerate(ty[:3]))
    text = (f"module @m\nfunc @f({params}) -> {ty[3]} {{\n"
            f"  %y = concat %x0, %x1, %x2, axis={axis} : {ty[3]}\n  return %y\n}}\n")
    fresh(1, 1 << 40)
    serial = compile_module(parse(text), cache_dir=None).f(*xs)
    fresh(2, 0)
    threaded = compile_module(parse(text), cache_dir=None).f(*xs)
    np.testing.assert_array_equal(serial, np.concatenate(xs, axis=axis))
    np.testing.assert_array_equal(threaded, serial)
    assert extent(text) == (5 + 6 + 7 if axis == 0 else 5 * (7 if axis == 2 else 1))


@pytest.mark.parametrize("shape, perm", [((300, "W"), (1, 0)), ((2, 37, "W"), (0, 2, 1)),
                                         ((17, 3, "W"), (2, 1, 0)), ((5, 6, "W", 3), (2, 0, 3, 1)),
                                         ((513, 1, "W"), (2, 1, 0)), ((300, "W+1"), (1, 0))],
                         ids=str)
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "bool"])
def test_transposes_walk_tiles_split_over_threads(fresh, monkeypatch, shape, perm, dtype):
    """A copy reading down its source's columns, with rows of a multiple of 1 KiB (W elements
    here), walks square tiles (loops.tiled_nest), edge tiles clipped; threads split its
    outermost loop. Every element lands where numpy puts it, on one thread and on two."""
    item = {"f32": 4, "f64": 8, "i32": 4, "bool": 1}[dtype]
    width = 1024 // item
    shape = tuple({"W": width, "W+1": width + 1}.get(d, d) for d in shape)
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape)
    x = x > 0 if dtype == "bool" else (x * 100).astype({"f32": np.float32, "f64": np.float64,
                                                         "i32": np.int32}[dtype])
    out = [shape[p] for p in perm]
    text = (f"module @m\nfunc @f(%x: {dtype}[{','.join(map(str, shape))}]) -> "
            f"{dtype}[{','.join(map(str, out))}] {{\n"
            f"  %y = transpose %x, perm=[{','.join(map(str, perm))}] : "
            f"{dtype}[{','.join(map(str, out))}]\n  return %y\n}}\n")
    walks = []

    def tiled_nest(*args, **kwargs):
        walks.append(args[3])
        return loops.tiled_nest(*args, **kwargs)

    monkeypatch.setattr(llvm_kernels, "tiled_nest", tiled_nest)
    for n, min_work in ((1, 1 << 40), (2, 0)):
        fresh(n, min_work)
        np.testing.assert_array_equal(compile_module(parse(text), cache_dir=None).f(x),
                                      np.transpose(x, perm))
    assert bool(walks) == (width in shape), "the tiled walk"
