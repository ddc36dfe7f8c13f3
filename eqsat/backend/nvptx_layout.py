"""Data-movement GPU kernels: broadcast, slice, concat and transpose.

Broadcasts, slices, concats and transposes that keep the innermost axis are strided pointwise
copies (coalesced on both sides). A transpose that moves the innermost axis goes through
32x32 shared-memory tiles: a block reads a tile along the input's rows and writes it along the
output's rows, so both global accesses are coalesced; the tile has one padding column so the
column-wise reads from shared memory hit 32 different banks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llvmlite import ir

from ..ir.module import Stmt
from ..ir.types import TensorType
from .loops import collapse, row_major_strides
from .nvptx_kernels import (GPU_KERNELS, I32_LIMIT, GpuKernel, GpuKernelBuilder, cint,
                            index_type, load, offsets, store, widen)
from . import nvptx_target as T
from .nvptx_pointwise import Piece, pointwise, whole
from .scalar import I32, I64, llvm_type

TILE = 32
MAX_GRID_YZ = 65535
ROWS = 8  # a block is 32 x 8 threads; each moves 4 elements of a tile


def _identity(b: ir.IRBuilder, args: list) -> ir.Value:
    return next(a for a in args if a is not None)[0]


def broadcast(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """numpy's broadcast_to, materialized."""
    return pointwise(kb, "broadcast", s.type, ins, [whole(s.type, ins)], _identity)


def slice_(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """A window of the input read through its own strides from the start offset."""
    xs = row_major_strides(ins[0].shape)
    start = sum(a * st for a, st in zip(s.attr["start"], xs))
    return pointwise(kb, "slice", s.type, ins, [whole(s.type, ins, [start], [xs])], _identity)


# Operands of one concat kernel; a longer concat is several, each writing its windows.
CONCAT_MAX_INPUTS = T.MAX_KERNEL_INPUTS


def concat(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType], at: int = 0) -> GpuKernel:
    """Each operand copied into its window of the result, one piece after another; `at` is
    where the first operand's window starts along the axis (a part of a longer concat)."""
    out, axis = s.type, s.attr["axis"]
    os_ = row_major_strides(out.shape)
    pieces = []
    for k, t in enumerate(ins):
        pieces.append(Piece(t.shape, os_, at * os_[axis], [k], [row_major_strides(t.shape)], [0]))
        at += t.shape[axis]
    return pointwise(kb, "concat", out, ins, pieces, _identity)


def transpose(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """np.transpose: a strided copy when the innermost axis stays, shared tiles otherwise."""
    x, perm = ins[0], list(s.attr["perm"])
    xs = row_major_strides(x.shape)
    in_strides = [xs[p] for p in perm]
    out = s.type
    # Axes of length 1 do not move anything; only a real move of the innermost axis needs tiles.
    dims = collapse(out.shape, [row_major_strides(out.shape), in_strides])
    moves_inner = len(dims) >= 2 and dims[-1][1][1] != 1 and out.size > 0
    batch = out.size // (x.shape[-1] * x.shape[perm[-1]]) if moves_inner else 0
    # The tiles index the two moving axes in 32 bits: past I32_LIMIT the strided copy (64-bit
    # indices) does it (an axis of 2^32 + 4 was bounded by 4).
    if not moves_inner or batch > MAX_GRID_YZ or -(-x.shape[perm[-1]] // TILE) > MAX_GRID_YZ \
            or max(x.shape[-1], x.shape[perm[-1]]) + TILE > I32_LIMIT:
        return pointwise(kb, "transpose", out, ins, [whole(out, ins, [0], [in_strides])],
                         _identity)
    return _tiled_transpose(kb, x, perm, out)


def _tiled_transpose(kb: GpuKernelBuilder, x: TensorType, perm: list[int],
                     out: TensorType) -> GpuKernel:
    """Tiles over (the input's innermost axis, the input axis that becomes the output's
    innermost); every other axis is a batch index, decomposed from blockIdx.z and y."""
    r = x.rank
    a_in = r - 1  # contiguous in the input: read along it
    a_out = perm[-1]  # contiguous in the output: write along it
    xs = row_major_strides(x.shape)
    os_by_in = [0] * r
    for j, p in enumerate(perm):
        os_by_in[p] = row_major_strides(out.shape)[j]
    others = [d for d in range(r) if d not in (a_in, a_out)]
    # Merge batch axes that are contiguous for both sides (fewer divisions per block).
    bdims = collapse([x.shape[d] for d in others], [[xs[d] for d in others],
                                                    [os_by_in[d] for d in others]])
    batch = math.prod(x.shape[d] for d in others)
    nx, ny = x.shape[a_in], x.shape[a_out]
    tiles_x, tiles_y = -(-nx // TILE), -(-ny // TILE)
    dty = llvm_type(out.dtype)
    fn, b, (o,), (p,) = kb.function("transpose_tiled", [out.dtype], [x.dtype])
    tile = kb.shared(dty, TILE * (TILE + 1))
    tx, ty = T.tid(b, "x"), T.tid(b, "y")
    # blockIdx.x, y and z enumerate x tiles, y tiles and the batch.
    bt, ytile = T.ctaid(b, "z"), T.ctaid(b, "y")
    ity = index_type(batch)
    in_base, out_base = offsets(b, widen(b, bt, ity), bdims, [0, 0]) if others else \
        (cint(I64, 0), cint(I64, 0))
    x0 = b.mul(T.ctaid(b, "x"), cint(I32, TILE))
    y0 = b.mul(ytile, cint(I32, TILE))

    def wide(v: ir.Value) -> ir.Value:
        return widen(b, v, I64)

    def guarded(cond: ir.Value, emit) -> None:
        with b.if_then(cond):
            emit()

    for k in range(TILE // ROWS):  # read: rows of the input tile, coalesced along x
        xi = b.add(x0, tx)
        yi = b.add(y0, b.add(ty, cint(I32, k * ROWS)))
        ok = b.and_(b.icmp_unsigned("<", xi, cint(I32, nx)),
                    b.icmp_unsigned("<", yi, cint(I32, ny)))
        slot = b.add(b.mul(b.add(ty, cint(I32, k * ROWS)), cint(I32, TILE + 1)), tx)

        def read(xi=xi, yi=yi, slot=slot) -> None:
            off = b.add(in_base, b.add(b.mul(wide(yi), cint(I64, xs[a_out])), wide(xi)))
            b.store(load(b, p, off), b.gep(tile, [slot], inbounds=True))

        guarded(ok, read)
    T.barrier(b)
    for k in range(TILE // ROWS):  # write: rows of the output tile, coalesced along y
        yi = b.add(y0, tx)
        xi = b.add(x0, b.add(ty, cint(I32, k * ROWS)))
        ok = b.and_(b.icmp_unsigned("<", xi, cint(I32, nx)),
                    b.icmp_unsigned("<", yi, cint(I32, ny)))
        slot = b.add(b.mul(tx, cint(I32, TILE + 1)), b.add(ty, cint(I32, k * ROWS)))

        def write(xi=xi, yi=yi, slot=slot) -> None:
            off = b.add(out_base, b.add(b.mul(wide(xi), cint(I64, os_by_in[a_in])),
                                        b.mul(wide(yi), cint(I64, os_by_in[a_out]))))
            store(b, b.load(b.gep(tile, [slot], inbounds=True)), o, off)

        guarded(ok, write)
    b.ret_void()
    return GpuKernel(fn.name, (tiles_x, tiles_y, batch), (TILE, ROWS, 1),
                     f"transpose {x} -> {out}")


GPU_KERNELS.update({
    "broadcast": broadcast,
    "slice": slice_,
    "concat": concat,
    "transpose": transpose,
})
