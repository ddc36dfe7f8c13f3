"""A packed, register-blocked GEMM generated as LLVM IR: the Goto/BLIS structure.

C[m x n] = op(A)[m x k] @ op(B)[k x n] per batch. The columns of a thread's share go in
blocks of NC, the depth in blocks of KC, the rows in blocks of MC; each (KC x NC) block of B
and each (MC x KC) block of A is copied ("packed") into a contiguous buffer in
micro-panel order, read through the operand's own strides (so transposed or viewed operands
cost nothing extra) and zero-padded to whole panels. A micro-kernel then computes each
MR x NR tile of C from an MR-row panel of A and an NR-column panel of B with MR * NR / W
vector accumulators held in registers (W lanes: 16 f32 on AVX-512), one broadcast of A and
NR / W vector FMAs per row and step of the depth. Only the valid part of an edge tile is
written back. An epilogue rewrites each (MC x NC) block of C as soon as its last depth block
is done, while it is still in cache. Threads get whole products of a batch, or equal shares
of one product's columns or rows (`split`), each packing into its own heap buffers, so the
kernel is re-entrant.

The code is shared: one driver (blocking loops, packing, micro-kernel) per dtype, taking the
shapes, the operands' strides and the thread's share as arguments, lives in a runtime library
compiled once per machine (`runtime_ir`, jit.RUNTIMES); each product's kernel is a thin
wrapper calling it with its constants, and passes its epilogue as a function pointer. A cold
compile pays LLVM for no GEMM at all (it once paid for one per product: train_step's 9 took
0.85 s, then one per module, about 0.2 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from ..ir.types import DType, TensorType
from . import jit, settings
from .gemm_blocks import Blocking, blocking, micro_kernel, pack_fn
from .loops import for_range, i64, row_major_strides, strided_offset
from .scalar import I64, declare, llvm_type

if TYPE_CHECKING:  # llvm_kernels imports this module
    from .llvm_kernels import Kernel, KernelBuilder

# Rewrites rows of C in place: (builder, extra pointers, C, flat row index, (first column,
# end column) or None for the whole row).
BlockEpilogue = Callable[[ir.IRBuilder, list[ir.Value], ir.Value, ir.Value,
                          "tuple[ir.Value, ir.Value] | None"], None]


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


def _driver_type(dtype: DType) -> ir.FunctionType:
    p = llvm_type(dtype).as_pointer()
    return ir.FunctionType(ir.VoidType(), [p, p, p, *[I64] * len(DRIVER_ARGS),
                                           _epilogue_type(dtype).as_pointer(), I8P.as_pointer()])


def runtime_ir(dtype: str, triple: str, data_layout: str) -> str:
    """LLVM IR of the GEMM runtime for `dtype` (jit.RUNTIMES): the driver, exported as
    `jit.gemm_driver(dtype)`, with its packing routines and micro-kernel. Compiled once per
    machine rather than into every program (~0.2 s of LLVM per cold compile)."""
    module = ir.Module(f"eqsat_gemm_{dtype}")
    module.triple, module.data_layout = triple, data_layout
    dt = DType(dtype)
    _driver(module, dt, blocking(dt))
    return str(module)


def _driver(module: ir.Module, dtype: DType, bl: Blocking) -> ir.Function:
    """`void drv(T* c, T* a, T* b, i64 t, m, n, k, r0, r1, c0, c1, a_rows, a_cols, b_rows,
    b_cols, epi*, i8** extras)`: C[t][r0:r1, c0:c1] (C: m x n matrices from c) = op(A) @
    op(B), op(A) at a with element strides a_rows, a_cols (op(B) likewise), then `epi` (or
    null) over each finished block. Every product's kernel calls it with its own shapes and
    strides, so the packing and blocking code exists once (in the runtime). Its packing
    buffers come from the heap (`_packing_buffers`)."""
    fn = ir.Function(module, _driver_type(dtype), jit.gemm_driver(str(dtype)))
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    for a in fn.args[:3]:
        a.add_attribute("noalias")
    c, pa, pb = fn.args[:3]
    t, m, n, k, r0, r1, c0, c1, sar, sac, sbr, sbc = fn.args[3:3 + len(DRIVER_ARGS)]
    epi, extras = fn.args[-2:]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    uk = micro_kernel(module, dtype, bl)
    pack_a, pack_b = pack_fn(module, dtype, bl.mr, bl.lanes), pack_fn(module, dtype, bl.nr,
                                                                         bl.lanes)
    ap, bp, heap = _packing_buffers(b, dtype, bl)
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
    with b.if_then(b.icmp_unsigned("!=", heap, ir.Constant(I8P, None))):
        b.call(declare(module, "free", ir.VoidType(), [I8P]), [heap])
    b.ret_void()
    return fn


def _packing_buffers(b: ir.IRBuilder, dtype: DType, bl: Blocking
                     ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The packed blocks of A (MC x KC) and B (KC x NC), 64-byte aligned, and the heap block
    holding them (null where they are on the stack), for the caller to free. On the heap:
    they take ~0.7 MiB, which overflowed the stack of a thread calling a product from a small
    stack (Python's `threading.stack_size`, musl's 128 KiB default); after the first call
    malloc serves the block from its free list. On the stack only where malloc fails."""
    ety = llvm_type(dtype)
    a_elems, b_elems = bl.mc * bl.kc, bl.kc * bl.nc
    memalign = declare(b.module, "posix_memalign", ir.IntType(32), [I8P.as_pointer(), I64, I64])
    with b.goto_entry_block():
        slot = b.alloca(I8P, name="pack.slot")
    b.store(ir.Constant(I8P, None), slot)
    b.call(memalign, [slot, i64(64), i64((a_elems + b_elems) * dtype.itemsize)])
    heap = b.load(slot)  # still null where it failed
    came = b.block
    stack, ready = b.append_basic_block("pack.stack"), b.append_basic_block("pack.ready")
    b.cbranch(b.icmp_unsigned("!=", heap, ir.Constant(I8P, None)), ready, stack)
    b.position_at_end(stack)
    onstack = b.alloca(ir.ArrayType(ety, a_elems + b_elems), name="pack.onstack")
    onstack.align = 64
    onstack = b.bitcast(onstack, I8P)
    b.branch(ready)
    b.position_at_end(ready)
    buf = b.phi(I8P, name="pack.buf")
    buf.add_incoming(heap, came)
    buf.add_incoming(onstack, stack)
    first = b.bitcast(buf, ety.as_pointer())
    return first, b.gep(first, [i64(a_elems)], inbounds=True), heap


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
# on the calling thread alone (matmul_kernels._blas_matmul), so OpenBLAS's workers never wake
# and spin beside our pool (mixing the two pools made mlp_fwd 1.7x slower).
ENABLED, LONE_PRODUCTS = settings.gemm_switches()


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
    dty = _driver_type(out.dtype)
    drv = declare(b.module, jit.gemm_driver(str(out.dtype)), dty.return_type, dty.args)
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

    # Unit u is share u % parts of batch u // parts (see `split`).
    with for_range(b, lo, hi, name="unit") as u:
        t, part = b.udiv(u, i64(sp.parts)), b.urem(u, i64(sp.parts))
        a_t = b.gep(ptrs[0], [strided_offset(b, t, bshape, oa.batch)], inbounds=True)
        b_t = b.gep(ptrs[1], [strided_offset(b, t, bshape, ob.batch)], inbounds=True)
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
