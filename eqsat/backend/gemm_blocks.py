"""The packed GEMM's building blocks: blocking sizes, the register-tile micro-kernel and the
routines packing panels of A and B (see gemm.py for the structure they serve)."""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..ir.types import DType
from . import jit
from .loops import for_range, i64
from .scalar import I1, I64, declare, internal_function, llvm_type


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
    lanes = jit.lanes(dtype.itemsize)
    mr, nr = 6, (4 if jit.vector_bits() >= 512 else 2) * lanes
    kc = 256 if dtype.itemsize == 4 else 128
    return Blocking(mr=mr, nr=nr, kc=kc, mc=24 * mr, nc=8 * nr, lanes=lanes)


# ---------------------------------------------------------------- the micro-kernel


def micro_kernel(module: ir.Module, dtype: DType, bl: Blocking) -> ir.Function:
    """`void uk(T* ap, T* bp, i64 kc, T* c, i64 ldc, i64 rows, i64 cols, i1 acc)`: the tile
    C[rows x cols] (acc: +)= ap[kc x MR]^T @ bp[kc x NR], both packed panels."""
    ety = llvm_type(dtype)
    p = ety.as_pointer()
    # Not inlined into the driver: LLVM's loop passes over the driver's nest would take
    # several times as long, for nothing (a call per tile of MR x NR x KC steps).
    fn, new = internal_function(
        module, f"eqsat.gemm.uk.{dtype}.{bl.mr}x{bl.nr}",
        ir.FunctionType(ir.VoidType(), [p, p, I64, p, I64, I64, I64, I1]),
        ("nounwind", "noinline"))
    if not new:
        return fn
    for a in (fn.args[0], fn.args[1], fn.args[3]):
        a.add_attribute("noalias")
    ap, bp, kc, c, ldc, rows, cols, acc = fn.args
    w, mr, nv = bl.lanes, bl.mr, bl.nr // bl.lanes
    vty = ir.VectorType(ety, w)
    vptr = vty.as_pointer()
    fma = declare(module, f"llvm.fma.v{w}{_sfx(dtype)}", vty, [vty, vty, vty])
    zero = ir.Constant(vty, None)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # Fetch the C tile (for writing) while the depth loop runs: its lines are far from L1 by
    # now, and waiting for them at the end costs a good part of a tile. Prefetches never fault,
    # so the rows and columns of an edge tile beyond C need no guard.
    pf = declare(module, "llvm.prefetch.p0", ir.VoidType(),
                 [ir.IntType(8).as_pointer(), *[ir.IntType(32)] * 3])
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


def pack_fn(module: ir.Module, dtype: DType, r: int, lanes: int) -> ir.Function:
    """`void pack(T* dst, T* src, i64 width, i64 depth, i64 s_w, i64 s_d)`, shared by every
    product of the module: dst = the `width` x `depth` block at src (element strides s_w
    across, s_d along the depth) as panels of r: panel q holds dst[q*r*depth + p*r + i] =
    src[(q*r + i)*s_w + p*s_d], zero where q*r + i >= width (never written back, but stack
    garbage there could be denormals or NaNs, which slow the FMAs). The strides are run-time
    values; the layouts that have a fast path (contiguous across, or contiguous along the
    depth) are tested once per panel."""
    ety = llvm_type(dtype)
    p = ety.as_pointer()
    # noinline as the micro-kernel: a call per packed block
    fn, new = internal_function(module, f"eqsat.gemm.pack.{dtype}.{r}.{lanes}",
                                ir.FunctionType(ir.VoidType(), [p, p, I64, I64, I64, I64]),
                                ("nounwind", "noinline"))
    if not new:
        return fn
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
