"""A packed, register-blocked GEMM generated as LLVM IR: the Goto/BLIS structure.

C[m x n] = op(A)[m x k] @ op(B)[k x n] per batch. The columns of a thread's share go in
blocks of NC, the depth in blocks of KC, the rows in blocks of MC; each (KC x NC) block of B
and each (MC x KC) block of A is copied ("packed") into a contiguous stack buffer in
micro-panel order, read through the operand's own strides (so transposed or viewed operands
cost nothing extra) and zero-padded to whole panels. A micro-kernel then computes each
MR x NR tile of C from an MR-row panel of A and an NR-column panel of B with MR * NR / W
vector accumulators held in registers (W lanes: 16 f32 on AVX-512), one broadcast of A and
NR / W vector FMAs per row and step of the depth. Only the valid part of an edge tile is
written back. An epilogue rewrites each (MC x NC) block of C as soon as its last depth block
is done, while it is still in cache. Threads get whole products of a batch, or equal shares
of one product's columns or rows (`split`), each packing into its own stack buffers, so the
kernel is re-entrant.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from ..ir.types import DType, TensorType
from . import jit
from .loops import for_range, i64, row_major_strides
from .scalar import I1, I64, llvm_type

if TYPE_CHECKING:  # llvm_kernels imports this module
    from .llvm_kernels import Kernel, KernelBuilder

# Rewrites rows of C in place: (builder, extra pointers, C, flat row index, (first column,
# end column) or None for the whole row).
BlockEpilogue = Callable[[ir.IRBuilder, list[ir.Value], ir.Value, ir.Value,
                          "tuple[ir.Value, ir.Value] | None"], None]


@dataclass(frozen=True)
class Blocking:
    """Tile and block sizes in elements: MR x NR register tile, KC depth, MC rows and NC
    columns of the packed blocks."""

    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    lanes: int


def blocking(dtype: DType) -> Blocking:
    """The blocking for `dtype` on this host, measured on a 2-core Zen 4 (AVX-512 at half
    rate: one 512-bit FMA a cycle, 117 GFLOP/s f32 per core; L1 32 KiB, L2 1 MiB per core):
    6 x 64 (f32; 6 x 32 f64) tiles, per depth step 4 vector loads of B and 6 broadcasts of A
    for 24 FMAs into 24 of the 32 vector registers (AVX2: 6 x 2W, 12 of 16). The A block
    (MC x KC, 144 KiB f32) and the B block (KC x NC, 512 KiB) stay in L2; measured best
    among 12x32, 8x48, 4x96, 14x32 and KC 128-256 on bench/gemm_bench.py's shapes."""
    lanes = jit.vector_bits() // (8 * dtype.itemsize)
    mr, nr = 6, (4 if jit.vector_bits() >= 512 else 2) * lanes
    kc = 256 if dtype.itemsize == 4 else 128
    return Blocking(mr=mr, nr=nr, kc=kc, mc=24 * mr, nc=8 * nr, lanes=lanes)


# ---------------------------------------------------------------- the micro-kernel


def _micro_kernel(module: ir.Module, dtype: DType, bl: Blocking) -> ir.Function:
    """`void uk(T* ap, T* bp, i64 kc, T* c, i64 ldc, i64 rows, i64 cols, i1 acc)`: the tile
    C[rows x cols] (acc: +)= ap[kc x MR]^T @ bp[kc x NR], both packed panels."""
    ety = llvm_type(dtype)
    name = f"eqsat.gemm.uk.{dtype}.{bl.mr}x{bl.nr}"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    p = ety.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [p, p, I64, p, I64, I64, I64, I1]),
                     name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    for a in (fn.args[0], fn.args[1], fn.args[3]):
        a.add_attribute("noalias")
    ap, bp, kc, c, ldc, rows, cols, acc = fn.args
    w, mr, nv = bl.lanes, bl.mr, bl.nr // bl.lanes
    vty = ir.VectorType(ety, w)
    vptr = vty.as_pointer()
    fma = module.globals.get(f"llvm.fma.v{w}{_sfx(dtype)}") or ir.Function(
        module, ir.FunctionType(vty, [vty, vty, vty]), f"llvm.fma.v{w}{_sfx(dtype)}")
    zero = ir.Constant(vty, None)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # Fetch the C tile (for writing) while the depth loop runs: its lines are far from L1 by
    # now, and waiting for them at the end costs a good part of a tile. Prefetches never fault,
    # so the rows and columns of an edge tile beyond C need no guard.
    pf = module.globals.get("llvm.prefetch.p0") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), *[ir.IntType(32)] * 3]),
        "llvm.prefetch.p0")
    i32 = ir.IntType(32)
    per_line = 64 // dtype.itemsize
    for i in range(mr):
        rowp = b.gep(c, [b.mul(i64(i), ldc)])
        for line in range(-(-bl.nr // per_line)):
            addr = b.bitcast(b.gep(rowp, [i64(line * per_line)]), ir.IntType(8).as_pointer())
            b.call(pf, [addr, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
    entry = b.block
    loop, done = fn.append_basic_block("k"), fn.append_basic_block("k.done")
    b.branch(loop)
    b.position_at_end(loop)
    q = b.phi(I64, name="p")
    q.add_incoming(i64(0), entry)
    accs = [[b.phi(vty, name=f"c{i}_{v}") for v in range(nv)] for i in range(mr)]
    for row in accs:
        for phi in row:
            phi.add_incoming(zero, entry)
    bbase = b.mul(q, i64(bl.nr))
    bvec = [b.load(b.bitcast(b.gep(bp, [b.add(bbase, i64(v * w))], inbounds=True), vptr),
                   align=64) for v in range(nv)]
    abase = b.mul(q, i64(mr))
    undef = ir.Constant(vty, ir.Undefined)
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), w), [0] * w)
    new = []
    for i in range(mr):
        s = b.load(b.gep(ap, [b.add(abase, i64(i))], inbounds=True))
        av = b.shuffle_vector(b.insert_element(undef, s, ir.Constant(ir.IntType(32), 0)),
                              undef, splat_mask)
        new.append([b.call(fma, [av, bvec[v], accs[i][v]]) for v in range(nv)])
    nxt = b.add(q, i64(1))
    q.add_incoming(nxt, b.block)
    for i in range(mr):
        for v in range(nv):
            accs[i][v].add_incoming(new[i][v], b.block)
    b.cbranch(b.icmp_signed("<", nxt, kc), loop, done)

    b.position_at_end(done)
    full = b.and_(b.icmp_signed("==", rows, i64(mr)), b.icmp_signed("==", cols, i64(bl.nr)))
    with b.if_else(full) as (whole, edge):
        with whole:
            for i in range(mr):
                rowp = b.gep(c, [b.mul(i64(i), ldc)], inbounds=True)
                for v in range(nv):
                    ptr = b.bitcast(b.gep(rowp, [i64(v * w)], inbounds=True), vptr)
                    with b.if_else(acc) as (add, put):
                        with add:
                            b.store(b.fadd(b.load(ptr, align=dtype.itemsize), new[i][v]), ptr,
                                    align=dtype.itemsize)
                        with put:
                            b.store(new[i][v], ptr, align=dtype.itemsize)
        with edge:
            # Through a tile on the stack: edge tiles are few, so plain scalar copies do.
            with b.goto_entry_block():
                tile = b.alloca(ir.ArrayType(ety, mr * bl.nr), name="tile")
                tile.align = 64
            tp = b.bitcast(tile, p)
            for i in range(mr):
                for v in range(nv):
                    b.store(new[i][v], b.bitcast(
                        b.gep(tp, [i64(i * bl.nr + v * w)], inbounds=True), vptr), align=64)
            with for_range(b, 0, rows, name="er") as r:
                rowp = b.gep(c, [b.mul(r, ldc)], inbounds=True)
                trow = b.gep(tp, [b.mul(r, i64(bl.nr))], inbounds=True)
                with for_range(b, 0, cols, name="ec") as j:
                    dst = b.gep(rowp, [j], inbounds=True)
                    val = b.load(b.gep(trow, [j], inbounds=True))
                    b.store(b.select(acc, b.fadd(b.load(dst), val), val), dst)
    b.ret_void()
    return fn


def _sfx(dtype: DType) -> str:
    return "f32" if dtype.itemsize == 4 else "f64"


# ---------------------------------------------------------------- packing


def _transpose(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The transpose of a W x W block held as W vectors: at each level h, rows i and i + h
    exchange the elements whose column has bit h set for those whose column has it clear,
    which swaps bit h of every element's row and column index."""
    w = len(rows)
    rows = list(rows)
    h = w // 2
    while h:
        lo = ir.Constant(ir.VectorType(ir.IntType(32), w),
                         [w + j - h if j & h else j for j in range(w)])
        hi = ir.Constant(ir.VectorType(ir.IntType(32), w),
                         [w + j if j & h else j + h for j in range(w)])
        for i in range(w):
            if not i & h:
                x, y = rows[i], rows[i + h]
                rows[i], rows[i + h] = b.shuffle_vector(x, y, lo), b.shuffle_vector(x, y, hi)
        h //= 2
    return rows


def _pack_transposing(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, depth: ir.Value, r: int,
                      s_w: int, lanes: int, name: str) -> None:
    """A whole panel of r (a multiple of the lanes) read along its contiguous depth: W x W
    blocks loaded as W vectors and transposed in registers, where element by element would
    scatter each store (slow on Zen 4); the rest of the depth element by element."""
    ety = dst.type.pointee
    size = 4 if isinstance(ety, ir.FloatType) else 8
    vty = ir.VectorType(ety, lanes)
    full = b.mul(b.udiv(depth, i64(lanes)), i64(lanes))
    with for_range(b, 0, b.udiv(depth, i64(lanes)), name=f"{name}.tp") as pq:
        p0 = b.mul(pq, i64(lanes))
        for g in range(r // lanes):
            vecs = [b.load(b.bitcast(b.gep(src, [b.add(i64((g * lanes + i) * s_w), p0)],
                                           inbounds=True), vty.as_pointer()),
                           align=size)
                    for i in range(lanes)]
            for j, v in enumerate(_transpose(b, vecs)):
                at = b.add(b.mul(b.add(p0, i64(j)), i64(r)), i64(g * lanes))
                b.store(v, b.bitcast(b.gep(dst, [at], inbounds=True), vty.as_pointer()),
                        align=lanes * size)  # panels of r * depth: 64-byte aligned
    with for_range(b, full, depth, name=f"{name}.tr") as p:
        out = b.gep(dst, [b.mul(p, i64(r))], inbounds=True)
        for i in range(r):
            b.store(b.load(b.gep(src, [b.add(i64(i * s_w), p)], inbounds=True)),
                    b.gep(out, [i64(i)], inbounds=True))


def _pack(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, width: ir.Value, depth: ir.Value,
          r: int, s_w: int, s_d: int, zero: ir.Constant, name: str, lanes: int) -> None:
    """dst = the `width` x `depth` block at src (element strides s_w across, s_d along the
    depth) as panels of r: panel q holds dst[q*r*depth + p*r + i] = src[(q*r + i)*s_w +
    p*s_d], zero where q*r + i >= width (never written back, but stack garbage there could
    be denormals or NaNs, which slow the FMAs)."""
    panels = b.udiv(b.add(width, i64(r - 1)), i64(r))
    with for_range(b, 0, panels, name=f"{name}.q") as q:
        first = b.mul(q, i64(r))
        srcq = b.gep(src, [b.mul(first, i64(s_w))], inbounds=True)
        dstq = b.gep(dst, [b.mul(first, depth)], inbounds=True)
        valid = b.sub(width, first)
        with b.if_else(b.icmp_signed(">=", valid, i64(r))) as (whole, part):
            # A wide panel (B's NR) read along the depth goes row by row, so the loads are
            # vectors; a narrow one (A's MR) step by step: MR loads, one contiguous store,
            # where row by row would scatter (slow on Zen 4).
            with whole:
                if s_d == 1 and s_w != 1 and r % lanes == 0:
                    _pack_transposing(b, dstq, srcq, depth, r, s_w, lanes, name)
                elif s_d == 1 and s_w != 1 and r > 16:
                    with for_range(b, 0, r, name=f"{name}.wi") as i:
                        row = b.gep(srcq, [b.mul(i, i64(s_w))], inbounds=True)
                        with for_range(b, 0, depth, name=f"{name}.wp") as p:
                            b.store(b.load(b.gep(row, [p], inbounds=True)),
                                    b.gep(dstq, [b.add(b.mul(p, i64(r)), i)], inbounds=True))
                else:
                    with for_range(b, 0, depth, name=f"{name}.p") as p:
                        row = b.gep(srcq, [b.mul(p, i64(s_d))], inbounds=True)
                        out = b.gep(dstq, [b.mul(p, i64(r))], inbounds=True)
                        for i in range(r):
                            b.store(b.load(b.gep(row, [i64(i * s_w)], inbounds=True)),
                                    b.gep(out, [i64(i)], inbounds=True))
            with part:
                with for_range(b, 0, depth, name=f"{name}.ep") as p:
                    row = b.gep(srcq, [b.mul(p, i64(s_d))], inbounds=True)
                    out = b.gep(dstq, [b.mul(p, i64(r))], inbounds=True)
                    with for_range(b, 0, i64(r), name=f"{name}.ei") as i:
                        inside = b.icmp_signed("<", i, valid)
                        with b.if_else(inside) as (load, pad):
                            with load:
                                b.store(b.load(b.gep(row, [b.mul(i, i64(s_w))], inbounds=True)),
                                        b.gep(out, [i], inbounds=True))
                            with pad:
                                b.store(zero, b.gep(out, [i], inbounds=True))


# ---------------------------------------------------------------- the kernel


@dataclass(frozen=True)
class Operand:
    """How an operand of a product is read: element strides of op(x)'s rows and columns, and
    its batch strides (per batch axis of the result)."""

    rows: int
    cols: int
    batch: tuple[int, ...]


def operand(shape: Sequence[int], trans: bool, view: Sequence[int] | None) -> Operand:
    """The strides of op(x), for x of row-major `shape` (as stored) read transposed or not, or
    read in place through `view` (strides of op(x) itself, batch axes first)."""
    if view is not None:
        return Operand(view[-2], view[-1], tuple(view[:-2]))
    st = row_major_strides(shape)
    r, c = st[-2], st[-1]
    return Operand(*((c, r) if trans else (r, c)), tuple(st[:-2]))


@dataclass(frozen=True)
class Split:
    """How a product is cut into the kernel's units: per batch, `parts` shares of the columns
    (`by_cols`) or rows, each `chunk` long (the last may be shorter)."""

    parts: int
    chunk: int
    by_cols: bool


# Rough cycles per element of packing A (scalar loads) and B (vector copies), against
# MR * NR / W cycles per depth step of a micro-tile: for choosing how to split a product.
PACK_A_CYCLES, PACK_B_CYCLES = 0.5, 0.25


def split(batch: int, m: int, n: int, bl: Blocking, threads: int) -> Split:
    """Units for `threads` threads: whole products when there are enough of them, else each
    product cut in `threads` shares of its columns or rows, whichever makes the largest share
    cheapest per step of the depth: its micro-tiles (a share is whole tiles, so shares can
    differ by a column or row of tiles) plus its packing (each thread packs the operand it
    shares whole: A's m*k for column shares, B's k*n for row shares)."""
    parts = 1 if batch >= 2 * threads or batch % threads == 0 else threads
    tile_cycles = bl.mr * bl.nr / bl.lanes
    mt, nt = -(-m // bl.mr), -(-n // bl.nr)
    cols = -(-nt // parts) * mt * tile_cycles + PACK_A_CYCLES * m + PACK_B_CYCLES * n / parts
    rows = -(-mt // parts) * nt * tile_cycles + PACK_B_CYCLES * n + PACK_A_CYCLES * m / parts
    by_cols = cols <= rows
    dim, tile = (n, bl.nr) if by_cols else (m, bl.mr)
    chunk = -(-dim // (parts * tile)) * tile
    return Split(-(-dim // chunk), chunk, by_cols)


def gemm_kernel(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, c: ir.Value,
                pa: ir.Value, pb: ir.Value, extras: list[ir.Value], dtype: DType,
                bshape: Sequence[int], m: int, n: int, k: int, oa: Operand, ob: Operand,
                sp: Split, bl: Blocking, epilogue: BlockEpilogue | None) -> None:
    """Emit, at `b` (in a kernel function), the units [lo, hi) of the product (see `split`):
    unit u is share u % parts of batch u // parts. k >= 1."""
    ety = llvm_type(dtype)
    uk = _micro_kernel(b.module, dtype, bl)
    zero = ir.Constant(ety, 0.0)
    with b.goto_entry_block():
        abuf = b.alloca(ir.ArrayType(ety, bl.mc * bl.kc), name="apack")
        bbuf = b.alloca(ir.ArrayType(ety, bl.kc * bl.nc), name="bpack")
        abuf.align = bbuf.align = 64
    ap, bp = b.bitcast(abuf, ety.as_pointer()), b.bitcast(bbuf, ety.as_pointer())

    def batch_offset(t: ir.Value, strides: Sequence[int]) -> ir.Value:
        off, inner = i64(0), 1
        for d in reversed(range(len(bshape))):
            if strides[d] and bshape[d] > 1:
                idx = b.urem(b.udiv(t, i64(inner)), i64(bshape[d]))
                off = b.add(off, b.mul(idx, i64(strides[d])))
            inner *= bshape[d]
        return off

    def smin(x: ir.Value, y: ir.Value) -> ir.Value:
        return b.select(b.icmp_signed("<", x, y), x, y)

    with for_range(b, lo, hi, name="unit") as u:
        t, part = b.udiv(u, i64(sp.parts)), b.urem(u, i64(sp.parts))
        a_t = b.gep(pa, [batch_offset(t, oa.batch)], inbounds=True)
        b_t = b.gep(pb, [batch_offset(t, ob.batch)], inbounds=True)
        c_t = b.gep(c, [b.mul(t, i64(m * n))], inbounds=True)
        start = b.mul(part, i64(sp.chunk))
        end = smin(b.add(start, i64(sp.chunk)), i64(n if sp.by_cols else m))
        c0, c1 = (start, end) if sp.by_cols else (i64(0), i64(n))
        r0, r1 = (i64(0), i64(m)) if sp.by_cols else (start, end)
        nblocks = b.udiv(b.add(b.sub(c1, c0), i64(bl.nc - 1)), i64(bl.nc))
        with for_range(b, 0, nblocks, name="jc") as jb:
            jc = b.add(c0, b.mul(jb, i64(bl.nc)))
            nc = smin(i64(bl.nc), b.sub(c1, jc))
            # Depth blocks of equal length (not KC and a short rest: a short block pays the
            # C tile's loads and stores for little work).
            kblocks = -(-k // bl.kc)
            kstep = -(-k // kblocks)
            with for_range(b, 0, i64(kblocks), name="pc") as pb_:
                pc = b.mul(pb_, i64(kstep))
                kc = smin(i64(kstep), b.sub(i64(k), pc))
                first = b.icmp_signed("!=", pb_, i64(0))  # accumulate into C after block 0
                last = b.icmp_signed(">=", b.add(pc, kc), i64(k))
                bsrc = b.gep(b_t, [b.add(b.mul(pc, i64(ob.rows)), b.mul(jc, i64(ob.cols)))],
                             inbounds=True)
                _pack(b, bp, bsrc, nc, kc, bl.nr, ob.cols, ob.rows, zero, "pb", bl.lanes)
                mblocks = b.udiv(b.add(b.sub(r1, r0), i64(bl.mc - 1)), i64(bl.mc))
                with for_range(b, 0, mblocks, name="ic") as ib:
                    ic = b.add(r0, b.mul(ib, i64(bl.mc)))
                    mc = smin(i64(bl.mc), b.sub(r1, ic))
                    asrc = b.gep(a_t, [b.add(b.mul(ic, i64(oa.rows)),
                                             b.mul(pc, i64(oa.cols)))], inbounds=True)
                    _pack(b, ap, asrc, mc, kc, bl.mr, oa.rows, oa.cols, zero, "pa", bl.lanes)
                    cblk = b.gep(c_t, [b.add(b.mul(ic, i64(n)), jc)], inbounds=True)
                    jrs = b.udiv(b.add(nc, i64(bl.nr - 1)), i64(bl.nr))
                    irs = b.udiv(b.add(mc, i64(bl.mr - 1)), i64(bl.mr))
                    with for_range(b, 0, jrs, name="jr") as jq:
                        jr = b.mul(jq, i64(bl.nr))
                        bpan = b.gep(bp, [b.mul(jr, kc)], inbounds=True)
                        cols = smin(i64(bl.nr), b.sub(nc, jr))
                        with for_range(b, 0, irs, name="ir") as iq:
                            ir_ = b.mul(iq, i64(bl.mr))
                            apan = b.gep(ap, [b.mul(ir_, kc)], inbounds=True)
                            rows = smin(i64(bl.mr), b.sub(mc, ir_))
                            ctile = b.gep(cblk, [b.add(b.mul(ir_, i64(n)), jr)], inbounds=True)
                            b.call(uk, [apan, bpan, kc, ctile, i64(n), rows, cols, first])
                    if epilogue is not None:
                        with b.if_then(last):
                            with for_range(b, 0, mc, name="erow") as r:
                                row = b.add(b.mul(t, i64(m)), b.add(ic, r))
                                epilogue(b, extras, c, row, (jc, b.add(jc, nc)))


# ---------------------------------------------------------------- as a kernel

# Which float products the generated GEMM takes instead of the host BLAS, from EQSAT_GEMM (read
# at import): "all" (the default), "batched" (lone products on the BLAS), "0" (none: the BLAS
# for every product, for comparisons). Both switches are part of the compiled code's cache key
# (cpu.cache_key). Measured here (bench/gemm_bench.py, bench/run.py): on lone products the GEMM
# matches OpenBLAS (190-210 versus 180-200 GFLOP/s; 2-core peak ~234), on batched ones it is
# ~1.5x faster; with every large product on it, the BLAS only gets narrow products, which run
# on the calling thread alone (llvm_kernels._blas_matmul), so OpenBLAS's workers never wake
# and spin beside our pool (mixing the two pools made mlp_fwd 1.7x slower).
MODE = os.environ.get("EQSAT_GEMM", "all")
ENABLED = MODE != "0"
LONE_PRODUCTS = MODE not in ("0", "batched")


def supports(dtype: DType) -> bool:
    """Whether products of `dtype` go to the generated GEMM."""
    return ENABLED and dtype in (DType.f32, DType.f64)


# Below this fraction of useful work in its micro-tiles (a product 10 columns wide fills 10
# of a tile's 64), the host BLAS, which has narrower kernels, is faster (measured: 14 versus
# 50 GFLOP/s for 1024 x 256 @ 256 x 10).
MIN_TILE_USE = 0.7


def tile_use(dtype: DType, m: int, n: int) -> float:
    """The fraction of the micro-tiles' arithmetic that computes C's m x n elements."""
    bl = blocking(dtype)
    return m * n / (-(-m // bl.mr) * bl.mr * -(-n // bl.nr) * bl.nr)


def gemm_matmul(kb: KernelBuilder, name: str, out: TensorType, ins: Sequence[TensorType],
                ta: bool, tb: bool, epilogue: BlockEpilogue | None,
                views: Sequence[Sequence[int] | None] = (None, None)) -> Kernel:
    """A `Kernel` (see llvm_kernels) computing op(A) @ op(B) with the packed GEMM, then
    `epilogue` over each finished block of rows; operands read through `views` where given.
    Its units are `split`'s shares, equal in work, so threads get equal parts."""
    from .llvm_kernels import Kernel  # noqa: F811  (at run time: a circular import above)
    from .parallel import PARALLEL_MIN_WORK, THREADS
    a = ins[0]
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    bshape = out.shape[:-2]
    batch = math.prod(bshape)
    bl = blocking(out.dtype)
    oa = operand(ins[0].shape, ta, views[0])
    ob = operand(ins[1].shape, tb, views[1])
    work = 2 * batch * m * n * k + out.nbytes
    # Too little work for threads (see parallel.emit_kernel_call): one share, packed once.
    sp = split(batch, m, n, bl, THREADS if work >= PARALLEL_MIN_WORK else 1)
    fn, b, lo, hi, (c,), ptrs = kb.function(name, [out.dtype], [t.dtype for t in ins])
    # Its packing buffers are a large stack frame: inlined into the entry, several products'
    # frames could add up.
    fn.attributes.add("noinline")
    gemm_kernel(b, lo, hi, c, ptrs[0], ptrs[1], ptrs[2:], out.dtype, bshape, m, n, k, oa,
                ob, sp, bl, epilogue)
    b.ret_void()
    return Kernel(fn, batch * sp.parts, work)
