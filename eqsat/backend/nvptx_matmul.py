"""Matrix-product GPU kernels: matmul, matmul_t (transposed operands read in place) and
matmul_epi (an elementwise epilogue applied before the product is stored).

Classic shared-memory tiling with register blocking: a block of 16x16 threads computes a
64x64 tile of C; per step of 16 along k it stages a 64x16 tile of op(A) and a 16x64 tile of
op(B) in shared memory (each read from global memory along its contiguous axis, whichever
that is after the transposes), then every thread accumulates a 4x4 block of C in registers.
Thread (ty, tx) owns rows ty + 16i and columns tx + 16j: its shared reads are broadcasts or
consecutive words, and its stores to C are coalesced along rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from llvmlite import ir

from ..ir.module import Stmt
from ..ir.scalar_expr import body_args
from ..ir.types import TensorType
from . import nvptx_target as T
from .fused_kernels import emit_body
from .llvm_kernels import broadcast_strides
from .loops import collapse, counted
from .nvptx_kernels import (GPU_KERNELS, GpuKernel, GpuKernelBuilder, cint, index_type, load,
                            offsets, store, widen)
from .scalar import I64, const, intrinsic, llvm_type

BM = BN = 64
BK = 16
TS = 16  # threads per side of the block
MICRO = BM // TS  # 4x4 results per thread
PAD = 1  # one extra word per shared row: the tile stores hit distinct banks
MAX_GRID_YZ = 65535


def matmul_kernel(kb: GpuKernelBuilder, name: str, out: TensorType, ins: Sequence[TensorType],
                  ta: bool = False, tb: bool = False, body: Any = None) -> GpuKernel:
    """op(A) @ op(B) per batch, then `body` ($0 the product, $1.. ins[2:]) if given."""
    a = ins[0]
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    batch = math.prod(out.shape[:-2])
    tiles_m, tiles_n = -(-m // BM), -(-n // BN)
    pdt = a.dtype
    pty = llvm_type(pdt)
    is_float = pdt.is_float
    fn, b, (c,), ptrs = kb.function(name, [out.dtype], [t.dtype for t in ins])
    pa, pb = ptrs[0], ptrs[1]
    a_stride, b_stride = BM + PAD, BN + PAD
    sa = kb.shared(pty, BK * a_stride)
    sb = kb.shared(pty, BK * b_stride)
    # 32-bit indices unless a dimension of 2^30 or more needs 64 (a bound of 2^32 + 4 was
    # truncated to 4 and only 4 columns were computed).
    ity = index_type(max(m, n, k) + BM)
    t = widen(b, T.tid(b), ity)
    tx, ty = b.urem(t, cint(ity, TS)), b.udiv(t, cint(ity, TS))
    col0 = b.mul(widen(b, T.ctaid(b, "x"), ity), cint(ity, BN))
    zero = const(pty, 0.0 if is_float else 0)
    with b.goto_entry_block():
        acc = [[b.alloca(pty) for _ in range(MICRO)] for _ in range(MICRO)]
    # Grid y and z hold at most 65535 blocks: the blocks loop over further row tiles and
    # batches (every thread of a block takes the same trips, so the barriers stay uniform).
    loops = ExitStack()
    z = loops.enter_context(counted(b, widen(b, T.ctaid(b, "z"), I64), cint(I64, max(batch, 1)),
                                    widen(b, T.nctaid(b, "z"), I64), "bz", signed=False))
    ytile = loops.enter_context(counted(b, widen(b, T.ctaid(b, "y"), ity), cint(ity, tiles_m),
                                        widen(b, T.nctaid(b, "y"), ity), "by", signed=False))
    row0 = b.mul(ytile, cint(ity, BM))
    a_base, b_base = b.mul(z, cint(I64, m * k)), b.mul(z, cint(I64, k * n))
    for row in acc:
        for slot in row:
            b.store(zero, slot)

    def stage(ptr: ir.Value, base: ir.Value, smem: ir.Value, sstride: int, k0: ir.Value,
              outer0: ir.Value, outer_n: int, k_contiguous: bool, extent: int) -> None:
        """One 16 x 64 tile into shared memory as smem[kk * sstride + idx], read along the
        operand's contiguous axis; elements outside the matrix are zero."""
        per = BK * extent // (TS * TS)
        for q in range(per):
            e = b.add(t, cint(ity, q * TS * TS))
            if k_contiguous:
                idx, kk = b.udiv(e, cint(ity, BK)), b.urem(e, cint(ity, BK))
            else:
                kk, idx = b.udiv(e, cint(ity, extent)), b.urem(e, cint(ity, extent))
            gi, gk = b.add(outer0, idx), b.add(k0, kk)
            ok = b.and_(b.icmp_unsigned("<", gi, cint(ity, outer_n)),
                        b.icmp_unsigned("<", gk, cint(ity, k)))
            wi, wk = widen(b, gi, I64), widen(b, gk, I64)
            off = b.add(wi, b.mul(wk, cint(I64, outer_n))) if not k_contiguous else \
                b.add(wk, b.mul(wi, cint(I64, k)))
            off = b.select(ok, b.add(base, off), cint(I64, 0))  # never read past the buffer
            value = b.select(ok, load(b, ptr, off), zero)
            slot = b.add(b.mul(kk, cint(ity, sstride)), idx)
            b.store(value, b.gep(smem, [slot], inbounds=True))

    n_tiles = -(-k // BK)
    with counted(b, cint(ity, 0), cint(ity, n_tiles), cint(ity, 1), "kt", signed=False) as kt:
        k0 = b.mul(kt, cint(ity, BK))
        # A is [m, k] (k contiguous) or, transposed, [k, m] (m contiguous); B likewise.
        stage(pa, a_base, sa, a_stride, k0, row0, m, not ta, BM)
        stage(pb, b_base, sb, b_stride, k0, col0, n, tb, BN)
        T.barrier(b)
        for kk in range(BK):
            av = [b.load(b.gep(sa, [b.add(ty, cint(ity, kk * a_stride + TS * i))],
                               inbounds=True)) for i in range(MICRO)]
            bv = [b.load(b.gep(sb, [b.add(tx, cint(ity, kk * b_stride + TS * j))],
                               inbounds=True)) for j in range(MICRO)]
            for i in range(MICRO):
                for j in range(MICRO):
                    old = b.load(acc[i][j])
                    new = intrinsic(b, "fma", av[i], bv[j], old) if is_float else \
                        b.add(old, b.mul(av[i], bv[j]))
                    b.store(new, acc[i][j])
        T.barrier(b)
    _store_tile(b, out, ins, ptrs[2:], c, z, row0, col0, tx, ty, acc, body)
    loops.close()  # the row-tile loop, then the batch loop
    b.ret_void()
    grid = (tiles_n, min(tiles_m, MAX_GRID_YZ), min(max(batch, 1), MAX_GRID_YZ))
    return GpuKernel(fn.name, grid, (TS * TS, 1, 1),
                     f"{name} {out} (k={k}, {BM}x{BN} tiles)")


def _store_tile(b: ir.IRBuilder, out: TensorType, ins: Sequence[TensorType],
                extra_ptrs: list[ir.Value], c: ir.Value, z: ir.Value, row0: ir.Value,
                col0: ir.Value, tx: ir.Value, ty: ir.Value, acc: list[list[ir.Value]],
                body: Any) -> None:
    """Each thread's 4x4 results (through the epilogue, if any) into C, inside the matrix."""
    m, n = out.shape[-2], out.shape[-1]
    ity = row0.type
    extras = list(ins[2:])
    used = body_args(body) if body is not None else frozenset()
    strides = [broadcast_strides(t.shape, out.shape) for t in extras]
    lead = out.shape[:-2]
    if extras and lead:
        bdims = collapse(lead, [st[:-2] for st in strides])
        bases = offsets(b, z, bdims, [0] * len(extras))
    else:
        bases = [cint(I64, 0)] * len(extras)
    c_base = b.mul(z, cint(I64, m * n))
    for i in range(MICRO):
        row = b.add(row0, b.add(ty, cint(ity, TS * i)))
        for j in range(MICRO):
            col = b.add(col0, b.add(tx, cint(ity, TS * j)))
            ok = b.and_(b.icmp_unsigned("<", row, cint(ity, m)),
                        b.icmp_unsigned("<", col, cint(ity, n)))
            with b.if_then(ok):
                wr, wc = widen(b, row, I64), widen(b, col, I64)
                value = b.load(acc[i][j])
                if body is not None:
                    args = [(value, ins[0].dtype)]
                    for e, (p, t, st, base) in enumerate(zip(extra_ptrs, extras, strides, bases)):
                        if e + 1 not in used:
                            args.append(None)
                            continue
                        off = b.add(base, b.add(b.mul(wr, cint(I64, st[-2])),
                                                b.mul(wc, cint(I64, st[-1]))))
                        args.append((load(b, p, off), t.dtype))
                    value = emit_body(b, body, args, out.dtype)
                store(b, value, c, b.add(c_base, b.add(b.mul(wr, cint(I64, n)), wc)))


def matmul(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """np.matmul with equal batch dimensions."""
    return matmul_kernel(kb, "matmul", s.type, ins)


def matmul_t(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """op(a) @ op(b) with the transposes read in place."""
    return matmul_kernel(kb, "matmul_t", s.type, ins, bool(s.attr["ta"]), bool(s.attr["tb"]))


def matmul_epi(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """matmul_t, then the body over each product element before it is stored."""
    return matmul_kernel(kb, "matmul_epi", s.type, ins, bool(s.attr["ta"]), bool(s.attr["tb"]),
                         s.attr["body"])


GPU_KERNELS.update({"matmul": matmul, "matmul_t": matmul_t, "matmul_epi": matmul_epi})
