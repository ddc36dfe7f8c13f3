"""Loop kernels for the ops of an optimized module, one LLVM function per statement.

Every kernel has the signature `void k(i64 lo, i64 hi, T* out..., T* in...)`: it computes the
part [lo, hi) of its outermost loop (`Kernel.extent` long), so the entry function can split the
work over threads. `KERNELS` maps an op family to its builder; `build_kernel` is the one
dispatcher and names the op it cannot lower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llvmlite import ir

from ..ir.module import Stmt
from ..ir.op_costs import element_cost
from ..ir.ops import lookup
from ..ir.types import DType, TensorType
from .loops import (Dims, collapse, for_range, i64, nest, row_major_strides, stream_dims,
                    streamed_nest, tiled_nest, with_trig_fallback)
from .scalar import (I8, I64, LoweringError, const, declare, emit_scalar, intrinsic,
                     llvm_type)

# The alignment of every result array the runtime allocates (so a streamed row needs no
# unaligned head, see loops.streamed_nest).
STREAM_ALIGN = 64
# A kernel costing more than this per element (the op table's element_cost, in simple float
# operations) is compute-bound here.
STREAM_MAX_COST = 12
# A compute-bound loop (costlier than STREAM_MAX_COST per element) runs this many vectors side
# by side (see loops.interleaved).
INTERLEAVE = 4


def interleave_for(cost: float) -> int:
    """The vectors a loop costing `cost` simple operations per element runs side by side
    (0: LLVM's own choice)."""
    return INTERLEAVE if cost > STREAM_MAX_COST else 0


@dataclass
class Kernel:
    """A built kernel: its function, the length of its splittable outer loop, and its work."""

    fn: ir.Function
    extent: int
    work: int  # bytes touched plus arithmetic operations: decides whether threads pay
    # Per pointer (outputs, then inputs): iteration r of the outer loop touches exactly the
    # elements [r*block, (r+1)*block) of it, or None where it does not (a broadcast read, a
    # transpose). None for the whole tuple: unknown. Lets the entry run kernels row-chunked.
    blocks: tuple[int | None, ...] | None = None


def outer_blocks(extent: int, strides: Sequence[int], sizes: Sequence[int]
                 ) -> tuple[int | None, ...]:
    """`Kernel.blocks` of a row-major loop nest whose outer loop (of `extent`) advances each
    pointer by `strides` elements, over arrays of `sizes` elements: a stride that tiles the whole
    array is a block (inner loops of row-major strides stay inside it)."""
    return tuple(s if s > 0 and s * extent == n else None for s, n in zip(strides, sizes))


class KernelBuilder:
    """Creates kernel functions in one LLVM module under unique names."""

    def __init__(self, module: ir.Module):
        self.module = module
        self.count = 0
        # Whether lone products on the BLAS may use its own threads: cleared by the entry in
        # modules whose large products run on the generated GEMM (see matmul_kernels._blas_matmul).
        self.blas_threads = True
        # Set by the entry while it builds a kernel whose output is a large result of the
        # function: nobody here reads it again, so its stores bypass the caches
        # (see loops.streamed_nest).
        self.stream = False
        # Set by the entry while it builds a kernel some of whose operands are views (see
        # views.py): per operand, its element strides, or None where it is contiguous. Only the
        # builders of READS_VIEWS ever see one.
        self.layouts: Sequence[list[int] | None] = []
        # Kernels built, by what determines their code: a statement repeated on the same types
        # (a forward value recomputed by the gradient, a long chain of one op) is built once.
        self.built: dict[tuple, Kernel] = {}

    def function(self, name: str, outs: Sequence[DType], ins: Sequence[DType]
                 ) -> tuple[ir.Function, ir.IRBuilder, ir.Value, ir.Value, list[ir.Value],
                            list[ir.Value]]:
        """A new internal kernel; returns it, a builder in its body, lo, hi, outs and ins."""
        self.count += 1
        ptrs = [llvm_type(d).as_pointer() for d in (*outs, *ins)]
        fnty = ir.FunctionType(ir.VoidType(), [I64, I64, *ptrs])
        fn = ir.Function(self.module, fnty, f"k{self.count}.{name}")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        for a in fn.args[2:]:
            # The arena planner never lets a kernel's output share memory with its inputs.
            a.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        lo, hi, *rest = fn.args
        return fn, b, lo, hi, list(rest[: len(outs)]), list(rest[len(outs):])

    def strides(self, k: int, t: TensorType) -> list[int]:
        """The element strides operand `k`, of type `t`, is read through."""
        layout = self.layouts[k] if k < len(self.layouts) else None
        return list(layout) if layout is not None else row_major_strides(t.shape)

    def sizes(self, ins: Sequence[TensorType]) -> list[int]:
        """The operands' element counts for `outer_blocks`, -1 for a view (no block of it
        is a contiguous run of its own elements)."""
        return [-1 if k < len(self.layouts) and self.layouts[k] is not None else t.size
                for k, t in enumerate(ins)]

    def streams(self, out: TensorType, cost: float) -> bool:
        """Whether the kernel being built should stream its output `out`: floats only, and
        only memory-bound kernels (`cost`: see `element_cost`); a compute-bound one would
        just pay for the extra copy through the tile."""
        return self.stream and out.dtype.is_float and cost <= STREAM_MAX_COST

    def end_kernel(self, b: ir.IRBuilder) -> None:
        """`ret void`, after a store fence where the kernel streamed (non-temporal stores are
        weakly ordered: another thread must see them once this kernel is joined)."""
        if self.stream:
            b.call(declare(self.module, "llvm.x86.sse.sfence", ir.VoidType(), []), [])
        b.ret_void()


Builder = Callable[[KernelBuilder, Stmt, Sequence[TensorType]], Kernel]


def _load(b: ir.IRBuilder, ptr: ir.Value, off: ir.Value) -> ir.Value:
    return b.load(b.gep(ptr, [off], inbounds=True))


def _store(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, off: ir.Value) -> None:
    b.store(value, b.gep(ptr, [off], inbounds=True))


# ---------------------------------------------------------------- elementwise and const


def elementwise(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """One loop nest over the result, each operand read through its strides (the IR inserts
    broadcasts, so they are the result's own unless the operand is a view); a flat streamed
    loop where the result goes past the caches."""
    out = s.type
    dtype = ins[-1].dtype  # select's branches, the other ops' operands
    fn, b, lo, hi, (o,), ptrs = kb.function(s.op, [out.dtype], [t.dtype for t in ins])
    work = out.nbytes + sum(t.nbytes for t in ins) + int(out.size * element_cost(s.op, dtype))
    contiguous = all(layout is None for layout in kb.layouts)
    dims = (stream_dims([(out.size, [1] * (1 + len(ins)))])
            if contiguous and kb.streams(out, element_cost(s.op)) else None)
    if dims is not None:
        streamed_nest(b, dims, lo, hi, o, lambda offs: emit_scalar(
            b, s.op, [_load(b, p, i) for p, i in zip(ptrs, offs)], dtype, out.dtype),
            out.dtype.itemsize)
        kb.end_kernel(b)
        return Kernel(fn, dims[0][0], work, outer_blocks(dims[0][0], dims[0][1],
                                                         [out.size] * (1 + len(ins))))
    dims = collapse(out.shape, [row_major_strides(out.shape),
                                *(kb.strides(k, t) for k, t in enumerate(ins))])

    def loops() -> None:
        nest(b, dims, [0] * (1 + len(ins)), lambda offs: _store(b, emit_scalar(
            b, s.op, [_load(b, p, i) for p, i in zip(ptrs, offs[1:])], dtype, out.dtype),
            o, offs[0]), outer=(lo, hi), interleave=interleave_for(element_cost(s.op)))

    with_trig_fallback(b, loops)  # sin and cos: cheap pass first (see loops.py)
    b.ret_void()
    return Kernel(fn, dims[0][0], work,
                  outer_blocks(dims[0][0], dims[0][1], [out.size, *kb.sizes(ins)]))


def constant(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """Fill the result with the literal."""
    out = s.type
    value = s.attr["value"]
    fn, b, lo, hi, (o,), _ = kb.function("const", [out.dtype], [])
    c = const(llvm_type(out.dtype), int(value) if not out.dtype.is_float else float(value))
    with for_range(b, lo, hi) as i:
        _store(b, c, o, i)
    b.ret_void()
    return Kernel(fn, out.size, out.nbytes, (1,))


# ---------------------------------------------------------------- data movement


# A transposing copy reads down its source's columns, one cache line per element, and reuses
# each line for the next output rows while it stays in cache. A source row of a multiple of
# 1 KiB puts a column's lines into few cache sets, which evicts them first: the copy then walks
# square blocks of 256 elements made of 8x8 tiles (loops.tiled_nest). Measured on f32 squares
# (ms, one call, 2 threads): 1024: 1.66 -> 0.38, 1536: 3.30 -> 0.80, 2048: 12.0 -> 1.58, 4096:
# 66 -> 11.7; without the conflict, plain rows are faster (1000: 0.33 against 0.50 tiled, 2000:
# 2.01 against 2.56).
TRANSPOSE_TILES = (256, 8)
CONFLICT_STRIDE = 1024


def _transposing(dims: Dims, itemsize: int) -> tuple[int, int] | None:
    """For a copy whose innermost loop reads down its source's columns with a conflicting
    stride (see CONFLICT_STRIDE): the loop reading along the source's rows (stride 1) and the
    innermost one, to walk in tiles; else None."""
    if len(dims) < 2 or dims[-1][1][1] in (0, 1) or dims[-1][1][0] != 1:
        return None
    if dims[-1][1][1] * itemsize % CONFLICT_STRIDE:
        return None
    k = next((k for k, (_, (_, si)) in enumerate(dims[:-1]) if si == 1), None)
    return None if k is None else (k, len(dims) - 1)


def _copy_kernel(kb: KernelBuilder, name: str, out: TensorType,
                 pieces: Sequence[tuple[TensorType, list[int], int, list[int], int]],
                 src_size: int = 0) -> Kernel:
    """Strided copies: each piece is (shape, out strides, out offset, in strides, in offset);
    `src_size` is the element count of a single piece's source."""
    fn, b, lo, hi, (o,), ptrs = kb.function(name, [out.dtype], [out.dtype] * len(pieces))
    extent, blocks = 1, None
    all_dims = [collapse(shape.shape, [ostr, istr]) for shape, ostr, _, istr, _ in pieces]
    # Pieces whose outer loops all have one extent (a concat along an inner axis: each piece
    # has the result's leading axes) are split over threads by that loop, row by row.
    rows = {d[0][0] for d in all_dims} if all(len(d) > 1 for d in all_dims) else set()
    shared = len(pieces) > 1 and len(rows) == 1
    for k, (shape, ostr, ooff, istr, ioff) in enumerate(pieces):
        dims = all_dims[k]
        p = ptrs[k]

        def body(offs: list[ir.Value], p: ir.Value = p) -> None:
            _store(b, _load(b, p, offs[1]), o, offs[0])

        pair = _transposing(dims, out.dtype.itemsize)
        if len(pieces) == 1 and pair is not None and ooff == 0 and ioff == 0:
            extent = tiled_nest(b, dims, pair, TRANSPOSE_TILES, body, (lo, hi))
        elif len(pieces) == 1:
            extent = dims[0][0]
            if ooff == 0 and ioff == 0:
                blocks = outer_blocks(extent, dims[0][1], [out.size, src_size])
            nest(b, dims, [ooff, ioff], body, outer=(lo, hi))
        elif shared:
            extent = dims[0][0]
            nest(b, dims, [ooff, ioff], body, outer=(lo, hi))
        else:
            nest(b, dims, [ooff, ioff], body)
    b.ret_void()
    return Kernel(fn, extent, 2 * out.nbytes, blocks)


def broadcast_strides(shape: Sequence[int], to: Sequence[int],
                      strides: Sequence[int] | None = None) -> list[int]:
    """Element strides that read an array of `shape` (row-major, or laid out by `strides`) as
    broadcast to `to` (numpy's right-aligned rule): 0 on the axes it is repeated along."""
    xs = row_major_strides(shape) if strides is None else strides
    lead = len(to) - len(shape)
    return [0 if d < lead or shape[d - lead] == 1 else xs[d - lead] for d in range(len(to))]


def broadcast(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """Read each output element from the input through strides that are 0 on broadcast axes."""
    out = s.type
    istr = broadcast_strides(ins[0].shape, out.shape)
    return _copy_kernel(kb, "broadcast", out, [(out, row_major_strides(out.shape), 0, istr, 0)],
                        ins[0].size)


def transpose(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """Output axis j reads input axis perm[j]."""
    xs = row_major_strides(ins[0].shape)
    istr = [xs[p] for p in s.attr["perm"]]
    out = s.type
    return _copy_kernel(kb, "transpose", out, [(out, row_major_strides(out.shape), 0, istr, 0)],
                        ins[0].size)


def slice_(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """A window of the input: its strides, shifted by the start offset."""
    xs = row_major_strides(ins[0].shape)
    start = sum(a * st for a, st in zip(s.attr["start"], xs))
    out = s.type
    return _copy_kernel(kb, "slice", out, [(out, row_major_strides(out.shape), 0, xs, start)],
                        ins[0].size)


def _stacked(kb: KernelBuilder, out: TensorType, ins: Sequence[TensorType], axis: int
             ) -> Kernel:
    """A concat whose pieces are consecutive blocks of the result (every axis before `axis`
    of length 1): threads split the result's rows along `axis`, each copying the part of
    every piece that falls in its rows (4 x 4 MiB along axis 0: 0.70 ms on one thread, 0.40-0.45
    on two)."""
    fn, b, lo, hi, (o,), ptrs = kb.function("concat", [out.dtype], [t.dtype for t in ins])
    inner = math.prod(out.shape[axis + 1:])
    at = 0
    for t, p in zip(ins, ptrs):
        rows = t.shape[axis]
        first = b.select(b.icmp_signed(">", lo, i64(at)), lo, i64(at))
        last = b.select(b.icmp_signed("<", hi, i64(at + rows)), hi, i64(at + rows))
        with for_range(b, b.mul(first, i64(inner)), b.mul(last, i64(inner))) as i:
            _store(b, _load(b, p, b.sub(i, i64(at * inner))), o, i)
        at += rows
    b.ret_void()
    return Kernel(fn, out.shape[axis], 2 * out.nbytes, (inner, *[None] * len(ins)))


def concat(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """Each operand copied into its window of the result."""
    out, axis = s.type, s.attr["axis"]
    if math.prod(out.shape[:axis]) == 1 and len(ins) > 1 and out.size:
        return _stacked(kb, out, ins, axis)
    os_ = row_major_strides(out.shape)
    pieces, at = [], 0
    for t in ins:
        pieces.append((t, os_, at * os_[axis], row_major_strides(t.shape), 0))
        at += t.shape[axis]
    return _copy_kernel(kb, "concat", out, pieces)


# ---------------------------------------------------------------- reductions

# Sums carry no nsz: numpy's start from +0.0, and under nsz LLVM folds 0.0 + x to x, so a sum
# of one -0.0 would stay -0.0. Max and min do (numpy's own order the zeros as they meet them).
_FLOAT_COMBINE = {"sum": lambda b, a, x: b.fadd(a, x, flags=("reassoc",)),
                  "max": lambda b, a, x: intrinsic(b, "maximum", a, x, flags=("nsz",)),
                  "min": lambda b, a, x: intrinsic(b, "minimum", a, x, flags=("nsz",))}
_INT_COMBINE = {"sum": lambda b, a, x: b.add(a, x),
                "max": lambda b, a, x: intrinsic(b, "smax", a, x),
                "min": lambda b, a, x: intrinsic(b, "smin", a, x)}
_BOOL_COMBINE = {"max": lambda b, a, x: intrinsic(b, "umax", a, x),
                 "min": lambda b, a, x: intrinsic(b, "umin", a, x)}


def _identity(op: str, dtype: DType) -> ir.Constant:
    ty = llvm_type(dtype)
    if op == "sum":
        return const(ty, 0.0 if dtype.is_float else 0)
    if dtype.is_float:
        return const(ty, -math.inf if op == "max" else math.inf)
    if dtype is DType.bool:
        return const(I8, 0 if op == "max" else 1)
    bits = ty.width
    return const(ty, -(2 ** (bits - 1)) if op == "max" else 2 ** (bits - 1) - 1)


Element = Callable[[ir.IRBuilder, list[ir.Value], list[ir.Value]], ir.Value]

# A float sum along a long innermost axis adds blocks of this many elements, each from zero (the
# vectorized loop keeps a few vectors of accumulators per block), into a partial sum that joins
# the total every SUM_BLOCKS blocks: rounding error grows with about 64 + 64 + n / 2^18 adds
# instead of n / lanes (the sum of 4e6 copies of 0.1f was 6e-4 off; numpy's pairwise sum 1e-7).
SUM_BLOCK = 4096
SUM_BLOCKS = 64


def _blocked_sum(b: ir.IRBuilder, acc_ptr: ir.Value, n: int,
                 value: Callable[[ir.Value], ir.Value],
                 add: Callable[[ir.Value, ir.Value], ir.Value], zero: ir.Constant) -> None:
    """*acc_ptr += the sum of value(j) for j < n, in blocks (see SUM_BLOCK)."""
    with b.goto_entry_block():
        part, mid = b.alloca(zero.type, name="part"), b.alloca(zero.type, name="mid")
    b.store(zero, mid)
    with for_range(b, 0, -(-n // SUM_BLOCK), name="blk") as k:
        start = b.mul(k, i64(SUM_BLOCK))
        stop = b.add(start, i64(SUM_BLOCK))
        stop = b.select(b.icmp_signed("<", stop, i64(n)), stop, i64(n))
        b.store(zero, part)
        with for_range(b, start, stop, name="r") as j:
            b.store(add(b.load(part), value(j)), part)
        b.store(add(b.load(mid), b.load(part)), mid)
        # every SUM_BLOCKS blocks the partial sum joins the total (through memory: the
        # total is loop-carried only here, so the inner loop keeps its registers)
        flush = b.icmp_signed("==", b.and_(k, i64(SUM_BLOCKS - 1)), i64(SUM_BLOCKS - 1))
        with b.if_then(flush):
            b.store(add(b.load(acc_ptr), b.load(mid)), acc_ptr)
            b.store(zero, mid)
    b.store(add(b.load(acc_ptr), b.load(mid)), acc_ptr)


def reduce_kernel(kb: KernelBuilder, name: str, op: str, domain: Sequence[int], axes: set[int],
                  out: TensorType, ins: Sequence[TensorType], in_strides: Sequence[list[int]],
                  element: Element, cost: float = 1.0) -> Kernel:
    """`op` over `axes` of `element(builder, input pointers, offsets)` on the `domain` index
    space. The domain is walked in row-major order with output stride 0 on reduced axes: an
    innermost reduced axis keeps a register accumulator (vectorized, reassociating float sums),
    an innermost kept axis updates a row of the output (vectorized across it). `cost`: simple
    operations per element of the domain (see element_cost), for threading and interleaving."""
    kept_strides = iter(row_major_strides(out.shape))
    ostr = [0 if d in axes else next(kept_strides) for d in range(len(domain))]
    dims = collapse(domain, [ostr, *in_strides])
    dtype = out.dtype
    combine = (_FLOAT_COMBINE if dtype.is_float else
               _BOOL_COMBINE if dtype is DType.bool else _INT_COMBINE)[op]
    fn, b, lo, hi, (o,), ptrs = kb.function(name, [dtype], [t.dtype for t in ins])
    ident = _identity(op, dtype)
    size = math.prod(domain)
    # Threads may split the outermost loop when it is a kept axis with loops inside it. A sum
    # down the columns of a matrix (reduced rows outside, kept columns inside) walks the rows in
    # memory order in one unit: split by columns, every thread walked every row for its part of
    # it (4096x1024 f32: 0.76-0.87 ms on two threads against 0.38-0.49 on one; 16 columns of
    # 65536 rows, both threads storing into one cache line of the output on every row, 2.7 ms
    # against 62 us). Lowering has already cut the large ones into parts along their rows
    # (reductions.py), whose outermost axis is then a kept one.
    split = len(dims) > 1 and dims[0][1][0] != 0 and size > 0
    if split:
        row = i64(dims[0][1][0])
        init_lo, init_hi = b.mul(lo, row), b.mul(hi, row)
    else:
        init_lo, init_hi = i64(0), i64(out.size)
    n_inner, (so, *sis) = dims[-1]
    interleave = interleave_for(cost)
    with b.goto_entry_block():
        acc_slot = b.alloca(llvm_type(dtype), name="acc")

    def value_at(offs: list[ir.Value], j: ir.Value) -> ir.Value:
        return element(b, ptrs, [b.add(off, b.mul(j, i64(si))) for off, si in zip(offs, sis)])

    def inner(offs: list[ir.Value]) -> None:
        if so == 0 and op == "sum" and dtype.is_float and n_inner > SUM_BLOCK:
            _blocked_sum(b, b.gep(o, [offs[0]], inbounds=True), n_inner,
                         lambda j: value_at(offs[1:], j), lambda x, y: combine(b, x, y), ident)
        elif so == 0:
            # A stack slot that SROA turns into a register: the loop-carried accumulator.
            acc_ptr = b.gep(o, [offs[0]], inbounds=True)
            b.store(b.load(acc_ptr), acc_slot)
            with for_range(b, 0, n_inner, name="r", interleave=interleave) as j:
                b.store(combine(b, b.load(acc_slot), value_at(offs[1:], j)), acc_slot)
            b.store(b.load(acc_slot), acc_ptr)
        else:
            with for_range(b, 0, n_inner, name="r", interleave=interleave) as j:
                oo = b.add(offs[0], b.mul(j, i64(so)))
                _store(b, combine(b, _load(b, o, oo), value_at(offs[1:], j)), o, oo)

    zeros = [0] * (1 + len(ins))

    def loops() -> None:
        with for_range(b, init_lo, init_hi, name="init") as i:
            _store(b, ident, o, i)
        if len(dims) == 1:
            inner([i64(0)] * len(zeros))
        else:
            nest(b, dims, zeros, inner, outer=(lo, hi) if split else None, depth=len(dims) - 1)

    # sin and cos in a fused body: cheap pass first, as elementwise kernels (see loops.py); the
    # second pass starts again from the identity
    with_trig_fallback(b, loops)
    b.ret_void()
    work = sum(t.nbytes for t in ins) + out.nbytes + int(size * cost)
    if not split:
        return Kernel(fn, 1, work)
    return Kernel(fn, dims[0][0], work,
                  outer_blocks(dims[0][0], dims[0][1], [out.size, *kb.sizes(ins)]))


def reduce(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """sum / max / min over axes."""
    x = ins[0]
    return reduce_kernel(kb, s.op, s.op, x.shape, set(s.attr["axes"]), s.type, [x],
                         [kb.strides(0, x)], lambda b, ptrs, offs: _load(b, ptrs[0], offs[0]))


# ---------------------------------------------------------------- the dispatcher

# By op name first (fused ops share families), then by family.
KERNELS: dict[str, Builder] = {
    "unary": elementwise,
    "binary": elementwise,
    "compare": elementwise,
    "select": elementwise,
    "cast": elementwise,
    "const": constant,
    "broadcast": broadcast,
    "transpose": transpose,
    "slice": slice_,
    "concat": concat,
    "reduce": reduce,
}
# The op names and families (as KERNELS) whose builders read operands through kb.layouts: any
# strides, and an offset the entry puts into the pointer (see views.py).
READS_VIEWS = {family: True for family in
               ("unary", "binary", "compare", "select", "cast", "reduce", "map", "map_reduce")}


def build_kernel(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """The kernel computing statement `s` from operands of types `ins`."""
    from . import fused_kernels, matmul_kernels  # noqa: F401  (they register their builders)
    builder = lookup(KERNELS, s.op)
    if builder is None:
        raise LoweringError(f"the CPU backend cannot lower op {s.op!r} "
                            f"(%{', %'.join(s.results)} = {s.op} ...: no kernel for it)")
    layouts = tuple(None if v is None else tuple(v) for v in kb.layouts)
    if any(v is not None for v in layouts) and lookup(READS_VIEWS, s.op) is None:
        raise LoweringError(f"the CPU backend cannot read views in op {s.op!r} "
                            f"(%{', %'.join(s.results)} = {s.op} ...)")
    # repr keeps -0.0 apart from 0.0 and nan equal to nan
    key = (s.op, repr(s.attrs), s.types, tuple(ins), kb.stream, kb.blas_threads, layouts)
    kernel = kb.built.get(key)
    if kernel is None:
        kernel = kb.built[key] = builder(kb, s, ins)
    return kernel
