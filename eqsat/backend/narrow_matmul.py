"""Products the packed GEMM and the host BLAS serve badly, as explicit vector code: narrow
float ones (at most a vector of columns: a classifier's 10 classes, 16 f32 lanes on AVX-512),
small ones (below the BLAS's size) and integer ones (which no BLAS has).

The GEMM's 6 x 64 tiles would be mostly padding on a narrow product; the BLAS runs one at a
third of its speed (28 us for 128x784 @ 784x10), and a small product's scalar loops (C
re-read per step of the depth) ran at a tenth of numpy's speed. Three forms, each reading its
operands where they lie (nothing packed, so a thread's share costs only its own rows):

- `rows` (op(B) with contiguous rows, op(A) any way): a block of ROWS rows of C and up to
  COLUMN_VECTORS vectors of columns (the last masked) in registers; per step of the depth, a
  load of B's row segment per vector, a broadcast of each row's A element, an FMA each.
- `columns` (A read transposed, as in a weight gradient x^T @ dz; narrow products): a block
  of C's rows is a few vectors along A's contiguous rows; per step of the depth, those loads,
  a broadcast of B per column, an FMA per column and vector. The accumulators hold the block
  transposed; it is written back through a stack tile (n * rows stores against n * rows * k
  FMAs).
- `dots` (A as stored, B transposed, as in x @ W^T with a torch-style [out, in] weight; narrow
  products): each element of C is a dot product of two rows contiguous along the depth; a few
  rows of C at a time, W steps of the depth per vector (the tail masked), summed across the
  lanes at the end.

No operand is read out of bounds (loads are masked, or read a valid row again) and rows of C
past its end are never stored. Sums run in depth order, one rounding per FMA (integers wrap,
as numpy's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from llvmlite import ir

from ..ir.types import DType, TensorType
from . import jit
from .loops import for_range, i64, row_major_strides, strided_offset
from .scalar import I32, LoweringError, declare, llvm_type

# Vector registers the accumulators may take (of 32 with AVX-512; loads and broadcasts need
# the rest).
ACC_REGISTERS = 24
# The `rows` form's block: rows of C (each sharing the block's loads of B) and vectors of columns.
ROWS = 4
COLUMN_VECTORS = 4

_NUMERIC = (DType.f32, DType.f64, DType.i32, DType.i64)
Epilogue = Callable[[ir.IRBuilder, list[ir.Value], ir.Value, ir.Value], None]
I1 = ir.IntType(1)


def lanes(dtype: DType) -> int:
    """Elements of `dtype` in one vector register of this host."""
    return jit.lanes(dtype.itemsize)


def narrow_pays(out: TensorType) -> bool:
    """Whether a float product of result `out` too narrow for the GEMM's tiles runs here: at
    most a vector of columns (each layout of A and B has a form, see the module docstring)."""
    return out.dtype.is_float and 0 < out.shape[-1] <= lanes(out.dtype)


def small_pays(out: TensorType, tb: bool) -> bool:
    """Whether a product below the BLAS's size (the caller decides that), or an integer one,
    runs here: op(B)'s rows must be contiguous."""
    return out.dtype in _NUMERIC and out.shape[-1] > 0 and not tb


class _Vec:
    """Vector helpers for one kernel: W lanes of the element type."""

    def __init__(self, b: ir.IRBuilder, dtype: DType):
        self.b = b
        self.w = lanes(dtype)
        self.size = dtype.itemsize
        self.ety = llvm_type(dtype)
        self.vty = ir.VectorType(self.ety, self.w)
        self.mty = ir.VectorType(I1, self.w)
        self.is_float = dtype.is_float
        elem = {DType.f32: "f32", DType.f64: "f64"}.get(dtype, f"i{8 * dtype.itemsize}")
        sfx = self.sfx = f"v{self.w}{elem}"
        mod = b.module
        self.fma_fn = declare(mod, f"llvm.fma.{sfx}", self.vty, [self.vty] * 3) \
            if self.is_float else None
        self.mload_fn = declare(mod, f"llvm.masked.load.{sfx}.p0", self.vty,
                                [self.vty.as_pointer(), I32, self.mty, self.vty])
        self.mstore_fn = declare(mod, f"llvm.masked.store.{sfx}.p0", ir.VoidType(),
                                 [self.vty, self.vty.as_pointer(), I32, self.mty])
        self.zero = ir.Constant(self.vty, None)
        self.lane_ids = ir.Constant(ir.VectorType(ir.IntType(64), self.w), list(range(self.w)))

    def splat(self, s: ir.Value) -> ir.Value:
        """A vector of W copies of scalar `s` (of the element type, or i64 for masks)."""
        undef = ir.Constant(ir.VectorType(s.type, self.w), ir.Undefined)
        mask = ir.Constant(ir.VectorType(I32, self.w), [0] * self.w)
        return self.b.shuffle_vector(self.b.insert_element(undef, s, ir.Constant(I32, 0)),
                                     undef, mask)

    def fma(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        """x * y + z: one rounding for floats, wrapping for integers (as numpy's)."""
        if self.is_float:
            return self.b.call(self.fma_fn, [x, y, z])
        return self.b.add(self.b.mul(x, y), z)

    def first(self, count: ir.Value) -> ir.Value:
        """The mask of lanes below `count` (an i64)."""
        return self.b.icmp_signed("<", self.lane_ids, self.splat(count))

    def total(self, x: ir.Value) -> ir.Value:
        """The sum of x's lanes (in any order for floats)."""
        b, elem = self.b, self.ety
        if self.is_float:
            fn = declare(b.module, f"llvm.vector.reduce.fadd.{self.sfx}", elem, [elem, self.vty])
            return b.call(fn, [ir.Constant(elem, -0.0), x], fastmath=("reassoc",))
        fn = declare(b.module, f"llvm.vector.reduce.add.{self.sfx}", elem, [self.vty])
        return b.call(fn, [x])

    def masked_load(self, ptr: ir.Value, mask: ir.Value) -> ir.Value:
        vptr = self.b.bitcast(ptr, self.vty.as_pointer())
        return self.b.call(self.mload_fn, [vptr, ir.Constant(I32, self.size), mask, self.zero])

    def masked_store(self, value: ir.Value, ptr: ir.Value, mask: ir.Value) -> None:
        vptr = self.b.bitcast(ptr, self.vty.as_pointer())
        self.b.call(self.mstore_fn, [value, vptr, ir.Constant(I32, self.size), mask])


def _accumulators(b: ir.IRBuilder, v: _Vec, count: int) -> list[ir.AllocaInstr]:
    """`count` zeroed vector accumulators (stack slots that LLVM keeps in registers)."""
    with b.goto_entry_block():
        slots = [b.alloca(v.vty, name=f"acc{i}") for i in range(count)]
    for s in slots:
        b.store(v.zero, s)
    return slots


def narrow_matmul(kb, name: str, out: TensorType, ins: Sequence[TensorType], ta: bool,
                  tb: bool, epilogue: Epilogue | None):
    """A `Kernel` computing op(A) @ op(B) (`narrow_pays` or `small_pays` must hold), then
    `epilogue` over each finished row of C: for a narrow product the `columns` form with A
    transposed, the `dots` form with B transposed; else the `rows` form (see the module
    docstring)."""
    from .llvm_kernels import Kernel  # llvm_kernels imports matmul_kernels, which imports this
    a, bt = ins[0], ins[1]
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    bshape = out.shape[:-2]
    batch = math.prod(bshape)
    sa = row_major_strides(a.shape)[:-2]
    sb = row_major_strides(bt.shape)[:-2]
    # op(A)[i, p] at i * sa_i + p * sa_p; op(B)[p, j] at p * sb_p + j * sb_j
    sa_i, sa_p = (1, m) if ta else (k, 1)
    sb_p, sb_j = (1, k) if tb else (n, 1)
    fn, b, lo, hi, (c,), ptrs = kb.function(name, [out.dtype], [t.dtype for t in ins])
    v = _Vec(b, out.dtype)
    narrow = n <= v.w and out.dtype.is_float
    form = "columns" if narrow and ta else "dots" if narrow and tb else "rows"
    if form == "rows" and tb:
        raise LoweringError("internal error: the rows form reads op(B)'s rows as vectors; "
                            "B transposed has them strided (see narrow_pays, small_pays)")
    kp = -(-k // v.w) * v.w
    if form == "columns":
        vecs = max(1, min(4, ACC_REGISTERS // n, -(-m // v.w)))
        per_block = vecs * v.w
        lane_work = -(-m // v.w) * v.w * n * k  # C's rows in whole vectors, its n columns
    elif form == "dots":
        per_block = max(1, min(ROWS, ACC_REGISTERS // n))
        lane_work = m * n * kp
    else:
        per_block = ROWS
        lane_work = m * -(-n // v.w) * v.w * k
    blocks = -(-m // per_block)
    with for_range(b, lo, hi, name="unit") as u:
        t, blk = b.udiv(u, i64(blocks)), b.urem(u, i64(blocks))
        a_t = b.gep(ptrs[0], [strided_offset(b, t, bshape, sa)], inbounds=True)
        b_t = b.gep(ptrs[1], [strided_offset(b, t, bshape, sb)], inbounds=True)
        c_t = b.gep(c, [b.mul(t, i64(m * n))], inbounds=True)
        i0 = b.mul(blk, i64(per_block))
        count = b.sub(i64(m), i0)
        count = b.select(b.icmp_signed("<", count, i64(per_block)), count, i64(per_block))
        if form == "columns":
            _columns(b, v, a_t, b_t, c_t, i0, count, m, n, k, vecs, sb_p, sb_j)
        elif form == "dots":
            _dots(b, v, a_t, b_t, c_t, i0, count, m, n, k, per_block)
        else:
            _rows(b, v, a_t, b_t, c_t, i0, count, m, n, k, sa_i, sa_p, sb_p)
        if epilogue is not None:
            with for_range(b, 0, count, name="erow") as r:
                epilogue(b, ptrs[2:], c, b.add(b.add(b.mul(t, i64(m)), i0), r))
    b.ret_void()
    # work: an FMA per lane (padding included) and a load of op(A) per row and depth step
    return Kernel(fn, batch * blocks, batch * (2 * lane_work + m * k) + out.nbytes)


def _row_starts(b: ir.IRBuilder, a_t: ir.Value, i0: ir.Value, rows: int, m: int,
                stride: int) -> list[ir.Value]:
    """Pointers to op(A)'s rows i0 .. i0 + rows - 1 (element stride `stride` between rows),
    rows past m pointing at row m - 1 again, so that a block's loads stay in bounds."""
    out = []
    for r in range(rows):
        i = b.add(i0, i64(r))
        i = b.select(b.icmp_signed("<", i, i64(m)), i, i64(m - 1))
        out.append(b.gep(a_t, [b.mul(i, i64(stride))], inbounds=True))
    return out


def _rows(b: ir.IRBuilder, v: _Vec, a_t: ir.Value, b_t: ir.Value, c_t: ir.Value, i0: ir.Value,
          count: ir.Value, m: int, n: int, k: int, sa_i: int, sa_p: int, sb_p: int) -> None:
    """C[i0 + r, :] for r < count (at most ROWS), COLUMN_VECTORS vectors of columns at a time:
    op(A)'s element of each row (a valid row again past C's end) times op(B)'s row segment."""
    vecs = min(COLUMN_VECTORS, -(-n // v.w))
    span = vecs * v.w
    arows = _row_starts(b, a_t, i0, ROWS, m, sa_i)
    accs = _accumulators(b, v, ROWS * vecs)
    with for_range(b, 0, -(-n // span), name="jb") as jb:
        j0 = b.mul(jb, i64(span))
        masks = [v.first(b.sub(i64(n), b.add(j0, i64(q * v.w)))) for q in range(vecs)]
        for slot in accs:
            b.store(v.zero, slot)
        with for_range(b, 0, k, name="p") as p:
            brow = b.gep(b_t, [b.add(b.mul(p, i64(sb_p)), j0)], inbounds=True)
            ys = [v.masked_load(b.gep(brow, [i64(q * v.w)], inbounds=True), masks[q])
                  for q in range(vecs)]
            for r in range(ROWS):
                x = v.splat(b.load(b.gep(arows[r], [b.mul(p, i64(sa_p))], inbounds=True)))
                for q in range(vecs):
                    slot = accs[r * vecs + q]
                    b.store(v.fma(x, ys[q], b.load(slot)), slot)
        for r in range(ROWS):
            with b.if_then(b.icmp_signed("<", i64(r), count)):
                row = b.gep(c_t, [b.add(b.mul(b.add(i0, i64(r)), i64(n)), j0)], inbounds=True)
                for q in range(vecs):
                    v.masked_store(b.load(accs[r * vecs + q]),
                                   b.gep(row, [i64(q * v.w)], inbounds=True), masks[q])


def _dots(b: ir.IRBuilder, v: _Vec, a_t: ir.Value, b_t: ir.Value, c_t: ir.Value,
          i0: ir.Value, count: ir.Value, m: int, n: int, k: int, rows: int) -> None:
    """C[i0 + r, j] for r < count (at most `rows`) and every j: A's row (a valid row again past
    C's end) dotted with B's row j as stored, W steps of the depth per vector, the tail
    masked; the lanes are summed at the end (reassociated, as any vectorized sum)."""
    arows = _row_starts(b, a_t, i0, rows, m, k)
    brows = [b.gep(b_t, [i64(j * k)], inbounds=True) for j in range(n)]
    accs = _accumulators(b, v, rows * n)

    def step(p0: ir.Value, mask: ir.Value | None) -> None:
        def load(row: ir.Value) -> ir.Value:
            ptr = b.gep(row, [p0], inbounds=True)
            if mask is not None:
                return v.masked_load(ptr, mask)
            return b.load(b.bitcast(ptr, v.vty.as_pointer()), align=v.size)
        xs = [load(row) for row in arows]
        for j in range(n):
            y = load(brows[j])
            for r in range(rows):
                slot = accs[r * n + j]
                b.store(v.fma(xs[r], y, b.load(slot)), slot)

    with for_range(b, 0, k // v.w, name="pv") as q:
        step(b.mul(q, i64(v.w)), None)
    if k % v.w:
        step(i64(k - k % v.w), v.first(i64(k % v.w)))
    for r in range(rows):
        with b.if_then(b.icmp_signed("<", i64(r), count)):
            row = b.gep(c_t, [b.mul(b.add(i0, i64(r)), i64(n))], inbounds=True)
            for j in range(n):
                b.store(v.total(b.load(accs[r * n + j])), b.gep(row, [i64(j)], inbounds=True))


def _columns(b: ir.IRBuilder, v: _Vec, a_t: ir.Value, b_t: ir.Value, c_t: ir.Value,
             i0: ir.Value, count: ir.Value, m: int, n: int, k: int, vecs: int, sb_p: int,
             sb_j: int) -> None:
    """C[i0 + r, :] for r < count (at most vecs * W): A^T's rows i0.. are contiguous in A's
    row p, so C's block is computed transposed, a vector per column and W rows."""
    masks = [v.first(b.sub(count, i64(q * v.w))) for q in range(vecs)]
    accs = _accumulators(b, v, n * vecs)
    with for_range(b, 0, k, name="p") as p:
        arow = b.gep(a_t, [b.add(b.mul(p, i64(m)), i0)], inbounds=True)
        xs = [v.masked_load(b.gep(arow, [i64(q * v.w)], inbounds=True), masks[q])
              for q in range(vecs)]
        brow = b.gep(b_t, [b.mul(p, i64(sb_p))], inbounds=True)
        for j in range(n):
            y = v.splat(b.load(b.gep(brow, [i64(j * sb_j)], inbounds=True)))
            for q in range(vecs):
                slot = accs[j * vecs + q]
                b.store(v.fma(y, xs[q], b.load(slot)), slot)
    # The block transposed into C's rows through a stack tile holding it as computed (a row per
    # column of C): whole-vector stores, then a loop over the rows (element-wise extraction of
    # every lane cost LLVM 0.25 s per kernel).
    span = vecs * v.w
    with b.goto_entry_block():
        tile = b.alloca(ir.ArrayType(v.ety, span * n), name="tile")
        tile.align = 64  # whole vectors go in at multiples of W elements
    tp = b.bitcast(tile, v.ety.as_pointer())
    for j in range(n):
        for q in range(vecs):
            ptr = b.bitcast(b.gep(tp, [i64(j * span + q * v.w)], inbounds=True),
                            v.vty.as_pointer())
            b.store(b.load(accs[j * vecs + q]), ptr, align=v.w * v.size)
    with for_range(b, 0, count, name="crow") as r:
        dst = b.gep(c_t, [b.mul(b.add(i0, r), i64(n))], inbounds=True)
        for j in range(n):
            b.store(b.load(b.gep(tp, [b.add(r, i64(j * span))], inbounds=True)),
                    b.gep(dst, [i64(j)], inbounds=True))
