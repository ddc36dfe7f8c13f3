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

The code is shared: a module has one driver (blocking loops, packing, micro-kernel) per
dtype, taking the shapes, the operands' strides and the thread's share as arguments; each
product's kernel is a thin wrapper calling it with its constants, and passes its epilogue as
a function pointer. Cold compiles pay LLVM for one GEMM per module instead of one per
product (train_step: 9 products, LLVM 0.85 -> ~0.4 s).
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
    # Not inlined into the driver: LLVM's loop passes over the driver's nest would take
    # several times as long, for nothing (a call per tile of MR x NR x KC steps).
    fn.attributes.add("noinline")
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
                      s_w: ir.Value, lanes: int, name: str) -> None:
    """A whole panel of r (a multiple of the lanes) read along its contiguous depth: W x W
    blocks loaded as W vectors and transposed in registers, where element by element would
    scatter each store (slow on Zen 4); the rest of the depth element by element."""
    ety = dst.type.pointee
    size = 4 if isinstance(ety, ir.FloatType) else 8
    vty = ir.VectorType(ety, lanes)
    full = b.mul(b.udiv(depth, i64(lanes)), i64(lanes))
    # The panel's groups of W rows in a loop, not unrolled: one transpose's code, not r / W.
    with for_range(b, 0, b.udiv(depth, i64(lanes)), name=f"{name}.tp") as pq:
        p0 = b.mul(pq, i64(lanes))
        with for_range(b, 0, i64(r // lanes), name=f"{name}.tg") as g:
            first = b.mul(g, i64(lanes))
            base = b.gep(src, [b.add(b.mul(first, s_w), p0)], inbounds=True)
            vecs = [b.load(b.bitcast(b.gep(base, [b.mul(i64(i), s_w)], inbounds=True),
                                     vty.as_pointer()), align=size)
                    for i in range(lanes)]
            for j, v in enumerate(_transpose(b, vecs)):
                at = b.add(b.mul(b.add(p0, i64(j)), i64(r)), first)
                b.store(v, b.bitcast(b.gep(dst, [at], inbounds=True), vty.as_pointer()),
                        align=lanes * size)  # panels of r * depth: 64-byte aligned
    with for_range(b, full, depth, name=f"{name}.tr") as p:
        out = b.gep(dst, [b.mul(p, i64(r))], inbounds=True)
        with for_range(b, 0, i64(r), name=f"{name}.ti") as i:
            b.store(_rare_load(b, src, b.add(b.mul(i, s_w), p)),
                    b.gep(out, [i], inbounds=True))


def _pack_steps(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, depth: ir.Value, r: int,
                s_w: ir.Value | int, s_d: ir.Value, lanes: int, name: str) -> None:
    """A whole panel step by step along the depth: r loads (unrolled), one contiguous store.
    With s_w the constant 1 the loads are contiguous too, and become vectors."""
    stride = i64(s_w) if isinstance(s_w, int) else s_w
    if not isinstance(s_w, int) and r > 16:
        # Strided both ways (a view's B): rare, so a loop, not r unrolled loads.
        with for_range(b, 0, depth, name=f"{name}.p") as p:
            row = b.gep(src, [b.mul(p, s_d)], inbounds=True)
            out = b.gep(dst, [b.mul(p, i64(r))], inbounds=True)
            with for_range(b, 0, i64(r), name=f"{name}.i") as i:
                b.store(_rare_load(b, row, b.mul(i, stride)),
                        b.gep(out, [i], inbounds=True))
        return
    with for_range(b, 0, depth, name=f"{name}.p") as p:
        row = b.gep(src, [b.mul(p, s_d)], inbounds=True)
        out = b.gep(dst, [b.mul(p, i64(r))], inbounds=True)
        ety = dst.type.pointee
        size = 4 if isinstance(ety, ir.FloatType) else 8
        if isinstance(s_w, int) and s_w == 1 and r % lanes == 0:
            # Contiguous: whole vectors, written as such (not left to the SLP vectorizer).
            vp = ir.VectorType(ety, lanes).as_pointer()
            for v in range(r // lanes):
                b.store(b.load(b.bitcast(b.gep(row, [i64(v * lanes)], inbounds=True), vp),
                               align=size),
                        b.bitcast(b.gep(out, [i64(v * lanes)], inbounds=True), vp),
                        align=lanes * size)  # panels of r * depth: aligned
            return
        for i in range(r):
            at = i64(i * s_w) if isinstance(s_w, int) else b.mul(i64(i), stride)
            b.store(b.load(b.gep(row, [at], inbounds=True)), b.gep(out, [i64(i)], inbounds=True))


def _rare_load(b: ir.IRBuilder, base: ir.Value, index: ir.Value) -> ir.Value:
    """base[index] in a loop that runs rarely (edge panels, doubly strided views), the index
    passed through an empty inline asm: LLVM can neither vectorize the loop into gathers and
    scatters, which cost more compile time than they could ever save, nor turn it into a
    library call (an atomic or volatile load would make it `memcpy.element.unordered.atomic`,
    a symbol the JIT lacks: measured, a crash)."""
    opaque = b.asm(ir.FunctionType(I64, [I64]), "", "=r,0", [index], side_effect=False)
    return b.load(b.gep(base, [opaque], inbounds=True))


def _pack_fn(module: ir.Module, dtype: DType, r: int, lanes: int) -> ir.Function:
    """`void pack(T* dst, T* src, i64 width, i64 depth, i64 s_w, i64 s_d)`, shared by every
    product of the module: dst = the `width` x `depth` block at src (element strides s_w
    across, s_d along the depth) as panels of r: panel q holds dst[q*r*depth + p*r + i] =
    src[(q*r + i)*s_w + p*s_d], zero where q*r + i >= width (never written back, but stack
    garbage there could be denormals or NaNs, which slow the FMAs). The strides are run-time
    values; the layouts that have a fast path (contiguous across, or contiguous along the
    depth) are tested once per panel."""
    ety = llvm_type(dtype)
    name = f"eqsat.gemm.pack.{dtype}.{r}.{lanes}"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    p = ety.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [p, p, I64, I64, I64, I64]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")  # as the micro-kernel: a call per packed block
    for a in fn.args[:2]:
        a.add_attribute("noalias")
    dst, src, width, depth, s_w, s_d = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(ety, 0.0)
    unit_w = b.icmp_signed("==", s_w, i64(1))
    panels = b.udiv(b.add(width, i64(r - 1)), i64(r))
    with for_range(b, 0, panels, name="q") as q:
        first = b.mul(q, i64(r))
        srcq = b.gep(src, [b.mul(first, s_w)], inbounds=True)
        dstq = b.gep(dst, [b.mul(first, depth)], inbounds=True)
        valid = b.sub(width, first)
        with b.if_else(b.icmp_signed(">=", valid, i64(r))) as (whole, part):
            # A wide panel (B's NR) read along a contiguous depth goes by W x W blocks
            # transposed in registers; otherwise step by step: r loads, one contiguous store,
            # where row by row would scatter (slow on Zen 4).
            with whole:
                if r % lanes:
                    # A's narrow panel: r loads a step with the stride as it comes (a
                    # contiguous variant measured no faster).
                    _pack_steps(b, dstq, srcq, depth, r, s_w, s_d, lanes, "ps")
                else:
                    with b.if_else(unit_w) as (contiguous, strided):
                        with contiguous:
                            _pack_steps(b, dstq, srcq, depth, r, 1, s_d, lanes, "pc")
                        with strided:
                            along = b.icmp_signed("==", s_d, i64(1))
                            with b.if_else(along) as (tr, gen):
                                with tr:
                                    _pack_transposing(b, dstq, srcq, depth, r, s_w, lanes, "pt")
                                with gen:
                                    _pack_steps(b, dstq, srcq, depth, r, s_w, s_d, lanes, "ps")
            with part:
                with for_range(b, 0, depth, name="ep") as p:
                    row = b.gep(srcq, [b.mul(p, s_d)], inbounds=True)
                    out = b.gep(dstq, [b.mul(p, i64(r))], inbounds=True)
                    with for_range(b, 0, i64(r), name="ei") as i:
                        inside = b.icmp_signed("<", i, valid)
                        with b.if_else(inside) as (load, pad):
                            with load:
                                b.store(_rare_load(b, row, b.mul(i, s_w)),
                                        b.gep(out, [i], inbounds=True))
                            with pad:
                                b.store(zero, b.gep(out, [i], inbounds=True))
    b.ret_void()
    return fn


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


I8P = ir.IntType(8).as_pointer()


def _epilogue_type(dtype: DType) -> ir.FunctionType:
    """`void epi(i8** extras, T* c, i64 r0, i64 r1, i64 j0, i64 j1)`: rewrite columns [j0, j1)
    of C's flat rows [r0, r1), reading the extra operands' pointers from `extras`."""
    p = llvm_type(dtype).as_pointer()
    return ir.FunctionType(ir.VoidType(), [I8P.as_pointer(), p, I64, I64, I64, I64])


# The driver's parameters after the C, A and B pointers, in order.
DRIVER_ARGS = ("t", "m", "n", "k", "r0", "r1", "c0", "c1", "a_rows", "a_cols", "b_rows",
               "b_cols")


def _driver(module: ir.Module, dtype: DType, bl: Blocking) -> ir.Function:
    """`void drv(T* c, T* a, T* b, i64 t, m, n, k, r0, r1, c0, c1, a_rows, a_cols, b_rows,
    b_cols, epi*, i8** extras)`, once per module and dtype: C[t][r0:r1, c0:c1] (C: m x n
    matrices from c) = op(A) @ op(B), op(A) at a with element strides a_rows, a_cols (op(B)
    likewise), then `epi` (or null) over each finished block. Every product's kernel calls it
    with its own shapes and strides, so the packing and blocking code is emitted once.
    noinline: its packing buffers are a large stack frame, which must not add up in a
    caller."""
    ety = llvm_type(dtype)
    name = f"eqsat.gemm.drv.{dtype}.{bl.mr}x{bl.nr}"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    p = ety.as_pointer()
    epi_ty = _epilogue_type(dtype)
    fn = ir.Function(module, ir.FunctionType(
        ir.VoidType(), [p, p, p, *[I64] * len(DRIVER_ARGS), epi_ty.as_pointer(),
                        I8P.as_pointer()]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    for a in fn.args[:3]:
        a.add_attribute("noalias")
    c, pa, pb = fn.args[:3]
    t, m, n, k, r0, r1, c0, c1, sar, sac, sbr, sbc = fn.args[3:3 + len(DRIVER_ARGS)]
    epi, extras = fn.args[-2:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    uk = _micro_kernel(module, dtype, bl)
    pack_a, pack_b = _pack_fn(module, dtype, bl.mr, bl.lanes), _pack_fn(module, dtype, bl.nr,
                                                                         bl.lanes)
    abuf = b.alloca(ir.ArrayType(ety, bl.mc * bl.kc), name="apack")
    bbuf = b.alloca(ir.ArrayType(ety, bl.kc * bl.nc), name="bpack")
    abuf.align = bbuf.align = 64
    ap, bp = b.bitcast(abuf, p), b.bitcast(bbuf, p)
    has_epi = b.icmp_unsigned("!=", epi, ir.Constant(epi.type, None))

    def smin(x: ir.Value, y: ir.Value) -> ir.Value:
        return b.select(b.icmp_signed("<", x, y), x, y)

    c_t = b.gep(c, [b.mul(t, b.mul(m, n))], inbounds=True)
    nblocks = b.udiv(b.add(b.sub(c1, c0), i64(bl.nc - 1)), i64(bl.nc))
    # Depth blocks of equal length (not KC and a short rest: a short block pays the C tile's
    # loads and stores for little work).
    kblocks = b.udiv(b.add(k, i64(bl.kc - 1)), i64(bl.kc))
    kstep = b.udiv(b.add(k, b.sub(kblocks, i64(1))), kblocks)
    mblocks = b.udiv(b.add(b.sub(r1, r0), i64(bl.mc - 1)), i64(bl.mc))
    with for_range(b, 0, nblocks, name="jc") as jb:
        jc = b.add(c0, b.mul(jb, i64(bl.nc)))
        nc = smin(i64(bl.nc), b.sub(c1, jc))
        with for_range(b, 0, kblocks, name="pc") as pb_:
            pc = b.mul(pb_, kstep)
            kc = smin(kstep, b.sub(k, pc))
            first = b.icmp_signed("!=", pb_, i64(0))  # accumulate into C after block 0
            last = b.icmp_signed(">=", b.add(pc, kc), k)
            bsrc = b.gep(pb, [b.add(b.mul(pc, sbr), b.mul(jc, sbc))], inbounds=True)
            b.call(pack_b, [bp, bsrc, nc, kc, sbc, sbr])
            with for_range(b, 0, mblocks, name="ic") as ib:
                ic = b.add(r0, b.mul(ib, i64(bl.mc)))
                mc = smin(i64(bl.mc), b.sub(r1, ic))
                asrc = b.gep(pa, [b.add(b.mul(ic, sar), b.mul(pc, sac))], inbounds=True)
                b.call(pack_a, [ap, asrc, mc, kc, sar, sac])
                cblk = b.gep(c_t, [b.add(b.mul(ic, n), jc)], inbounds=True)
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
                        ctile = b.gep(cblk, [b.add(b.mul(ir_, n), jr)], inbounds=True)
                        b.call(uk, [apan, bpan, kc, ctile, n, rows, cols, first])
                with b.if_then(b.and_(last, has_epi)):
                    row = b.add(b.mul(t, m), ic)
                    b.call(epi, [extras, c, row, b.add(row, mc), jc, b.add(jc, nc)])
    b.ret_void()
    return fn


def _epilogue_fn(kb: KernelBuilder, name: str, dtype: DType, extras: Sequence[DType],
                 epilogue: BlockEpilogue) -> ir.Function:
    """The driver's `epi` for one kernel (see `_epilogue_type`): loads the extras' pointers
    and calls the body, a function taking them as noalias arguments (C and the extras never
    share memory), so that its row loop vectorizes without run-time alias checks."""
    module = kb.module
    p = llvm_type(dtype).as_pointer()
    eps = [llvm_type(d).as_pointer() for d in extras]
    body = ir.Function(module, ir.FunctionType(ir.VoidType(), [p, *eps, *[I64] * 4]),
                       f"{name}.epi.body")
    body.linkage = "internal"
    body.attributes.add("nounwind")
    for a in body.args[:1 + len(eps)]:
        a.add_attribute("noalias")
    b = ir.IRBuilder(body.append_basic_block("entry"))
    c, *ptrs = body.args[:1 + len(eps)]
    r0, r1, j0, j1 = body.args[1 + len(eps):]
    with for_range(b, r0, r1, name="erow") as r:
        epilogue(b, list(ptrs), c, r, (j0, j1))
    b.ret_void()
    fn = ir.Function(module, _epilogue_type(dtype), f"{name}.epi")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    ctx, c, *rest = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    loaded = [b.bitcast(b.load(b.gep(ctx, [i64(i)], inbounds=True)), ep)
              for i, ep in enumerate(eps)]
    b.call(body, [c, *loaded, *rest])
    b.ret_void()
    return fn


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
    drv = _driver(b.module, out.dtype, bl)
    epi_ty = _epilogue_type(out.dtype).as_pointer()
    epi, ctx = ir.Constant(epi_ty, None), ir.Constant(I8P.as_pointer(), None)
    if epilogue is not None:
        epi = _epilogue_fn(kb, fn.name, out.dtype, [t.dtype for t in ins[2:]], epilogue)
        if len(ins) > 2:
            with b.goto_entry_block():
                arr = b.alloca(ir.ArrayType(I8P, len(ins) - 2), name="extras")
            ctx = b.bitcast(arr, I8P.as_pointer())
            for i, ptr in enumerate(ptrs[2:]):
                b.store(b.bitcast(ptr, I8P), b.gep(ctx, [i64(i)], inbounds=True))

    def batch_offset(t: ir.Value, strides: Sequence[int]) -> ir.Value:
        off, inner = i64(0), 1
        for d in reversed(range(len(bshape))):
            if strides[d] and bshape[d] > 1:
                idx = b.urem(b.udiv(t, i64(inner)), i64(bshape[d]))
                off = b.add(off, b.mul(idx, i64(strides[d])))
            inner *= bshape[d]
        return off

    # Unit u is share u % parts of batch u // parts (see `split`).
    with for_range(b, lo, hi, name="unit") as u:
        t, part = b.udiv(u, i64(sp.parts)), b.urem(u, i64(sp.parts))
        a_t = b.gep(ptrs[0], [batch_offset(t, oa.batch)], inbounds=True)
        b_t = b.gep(ptrs[1], [batch_offset(t, ob.batch)], inbounds=True)
        start = b.mul(part, i64(sp.chunk))
        dim = n if sp.by_cols else m
        end = b.select(b.icmp_signed("<", b.add(start, i64(sp.chunk)), i64(dim)),
                       b.add(start, i64(sp.chunk)), i64(dim))
        c0, c1 = (start, end) if sp.by_cols else (i64(0), i64(n))
        r0, r1 = (i64(0), i64(m)) if sp.by_cols else (start, end)
        b.call(drv, [c, a_t, b_t, t, i64(m), i64(n), i64(k), r0, r1, c0, c1, i64(oa.rows),
                     i64(oa.cols), i64(ob.rows), i64(ob.cols), epi, ctx])
    b.ret_void()
    return Kernel(fn, batch * sp.parts, work)
