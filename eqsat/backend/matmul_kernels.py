"""Matrix products for the CPU: the generated packed GEMM (gemm.py) for large float products,
vector code for narrow, small and integer ones (narrow_matmul.py), the host BLAS for the large
ones the GEMM's tiles fit badly (and for all, with EQSAT_GEMM=0), generated loops for small
products with B transposed; epilogues (a `matmul_epi`'s body) rewrite finished rows or blocks
in place."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from llvmlite import ir

from ..ir.module import Function, Stmt
from ..ir.types import TensorType
from . import blas
from .llvm_kernels import KERNELS, Kernel, KernelBuilder, _load, _store
from .loops import for_range, i64, row_major_strides, strided_offset
from .narrow_matmul import narrow_matmul, narrow_pays, small_pays
from .scalar import I8, I32, LoweringError, const, llvm_type

# Products with at least this many multiply-adds go to the host BLAS; smaller ones are loops
# (a BLAS call costs about a microsecond before it does any work).
BLAS_MIN_FLOPS = 64 * 64 * 64


# An epilogue: given the builder, the extra operands' pointers, the output pointer, the flat
# index of a row of the product and its length, rewrite that row in place.
Epilogue = Callable[[ir.IRBuilder, list[ir.Value], ir.Value, ir.Value], None]


def _operand_strides(t: TensorType, transposed: bool) -> tuple[int, int]:
    """Element strides of op(x)'s last two axes (rows, columns) in x's row-major storage."""
    r, c = t.shape[-1], 1
    return (c, r) if transposed else (r, c)


Layout = list[int]  # element strides of an operand read in place (a transpose's source)


def _gemm_operand(shape: Sequence[int], trans: bool, view: Layout | None
                  ) -> tuple[bool, int, list[int]]:
    """(transposed, leading dimension, batch strides) of a gemm operand of logical `shape`
    (after `trans`): stored contiguously, or read in place through `view`'s strides, which
    must pass `gemm_layout_ok` (the BLAS needs one matrix axis contiguous; any other layout
    would be read as if it were transposed, silently wrong)."""
    if view is None:
        rows, cols = shape[-2:]  # as stored: transposed, cols x rows
        return trans, (rows if trans else cols), row_major_strides(shape)[:-2]
    form = _in_place_form(view, shape)
    if form is None:
        raise LoweringError(f"internal error: the BLAS cannot read an operand of shape "
                            f"{list(shape)} in place through strides {list(view)} (see "
                            f"gemm_layout_ok)")
    return (*form, view[:-2])


def _in_place_form(view: Layout, shape: Sequence[int]) -> tuple[bool, int] | None:
    """(transposed, leading dimension) with which gemm reads an operand of `shape` through
    strides `view` in place, or None: one matrix axis contiguous, the other's stride a valid
    leading dimension. Both forms are tried, as a size-1 axis may have stride 1 without being
    the contiguous one (a [k,1] column transposed to [1,k] has strides [1,1]: only the
    transposed form has a valid leading dimension, and OpenBLAS refused the other one)."""
    (rows, cols), (r, c) = shape[-2:], view[-2:]
    if c == 1 and r >= max(1, cols):
        return False, r
    if r == 1 and c >= max(1, rows):
        return True, c
    return None


def gemm_layout_ok(view: Layout, shape: Sequence[int]) -> bool:
    """Whether gemm can read an operand of `shape` through strides `view` in place (see
    `_in_place_form`). The host BLAS needs this (`_gemm_operand` refuses other layouts); the
    generated GEMM reads any strides."""
    return _in_place_form(view, shape) is not None


def _blas_matmul(kb: KernelBuilder, name: str, out: TensorType, ins: Sequence[TensorType],
                 ta: bool, tb: bool, epilogue: Epilogue | None,
                 views: Sequence[Layout | None] = (None, None)) -> Kernel:
    """op(A) @ op(B) per batch through the host's Fortran gemm. Row-major C is column-major
    C^T = op(B)^T op(A)^T: gemm with B first, and each operand's storage read as its own
    transpose. `views` give an operand's strides where it is read in place (no transpose
    materialized: gemm's transpose flag and leading dimension absorb it)."""
    a = ins[0]
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    batch = math.prod(out.shape[:-2])
    gemm = blas.declare_gemm(kb.module, out.dtype)
    fn, b, lo, hi, (c,), ptrs = kb.function(name, [out.dtype], [t.dtype for t in ins])
    pa, pb = ptrs[0], ptrs[1]
    ety = llvm_type(out.dtype)

    def slot(ty: ir.Type, value: int | float) -> ir.Value:
        ptr = b.alloca(ty)
        b.store(const(ty, value), ptr)
        return ptr

    bshape = out.shape[:-2]
    ta, lda_v, bsa = _gemm_operand((*bshape, m, k), ta, views[0])
    tb, ldb_v, bsb = _gemm_operand((*bshape, k, n), tb, views[1])
    trans_b, trans_a = slot(I8, ord("T" if tb else "N")), slot(I8, ord("T" if ta else "N"))
    bi = blas.int_type()
    mm, nn, kk = slot(bi, n), slot(bi, m), slot(bi, k)
    ldb, lda, ldc = slot(bi, ldb_v), slot(bi, lda_v), slot(bi, n)
    alpha, beta = slot(ety, 1.0), slot(ety, 0.0)

    # Our threads split batches, each calling the BLAS single-threaded (the entry sets it so);
    # a lone product runs on the BLAS's own threads, which split it better than row blocks
    # (the operand each block shares is packed once, not per block), except in a module whose
    # large products run on the generated GEMM (`KernelBuilder.blas_threads`): OpenBLAS's
    # workers spin for ~0.1 s after each call, taking a core from our pool's next kernels
    # (mlp_fwd with its narrow last product on them: 1.7x slower), so there the narrow
    # products the BLAS still gets run on this thread alone.
    from .parallel import THREADS  # here: parallel imports this module
    blas_pool = batch == 1 and THREADS > 1 and kb.blas_threads
    setter = blas.declare_threads(kb.module) if blas_pool else None
    if setter is not None:
        b.call(setter, [ir.Constant(I32, THREADS)])
    with for_range(b, lo, hi, name="batch") as t:
        pa_t = b.gep(pa, [strided_offset(b, t, bshape, bsa)], inbounds=True)
        pb_t = b.gep(pb, [strided_offset(b, t, bshape, bsb)], inbounds=True)
        pc_t = b.gep(c, [b.mul(t, i64(m * n))], inbounds=True)
        b.call(gemm, [trans_b, trans_a, mm, nn, kk, alpha, pb_t, ldb, pa_t, lda, beta, pc_t, ldc])
        if epilogue is not None:
            with for_range(b, 0, m, name="erow") as i:
                epilogue(b, ptrs[2:], c, b.add(b.mul(t, i64(m)), i))
    if setter is not None:
        b.call(setter, [ir.Constant(I32, 1)])
    b.ret_void()
    return Kernel(fn, batch, 2 * batch * m * n * k)


def blas_pays(out: TensorType, k: int) -> bool:
    """Whether a product of result `out` and inner length `k` goes to the host BLAS."""
    m, n = out.shape[-2], out.shape[-1]
    return out.dtype.is_float and m * n * k >= BLAS_MIN_FLOPS and blas.available()


def gemm_pays(out: TensorType, k: int) -> bool:
    """Whether a product goes to the generated packed GEMM (gemm.py): float products as
    large as the BLAS's, where a BLAS is missing, else batched ones (see gemm.LONE_PRODUCTS)
    unless so narrow that most of its tiles would be padding."""
    from . import gemm
    m, n = out.shape[-2], out.shape[-1]
    if not gemm.supports(out.dtype) or m * n * k < BLAS_MIN_FLOPS:
        return False
    return not blas.available() or (
        (gemm.LONE_PRODUCTS or math.prod(out.shape[:-2]) > 1)
        and gemm.tile_use(out.dtype, m, n) >= gemm.MIN_TILE_USE)


def uses_packed_gemm(func: Function) -> bool:
    """Whether any product of `func` runs on the generated GEMM (see `gemm_pays`)."""
    types = func.types()
    for s in func.body:
        if s.op in ("matmul", "matmul_t", "matmul_epi") and s.type.dtype.is_float:
            a = types[s.operands[0]]
            k = a.shape[-2] if s.attr.get("ta") else a.shape[-1]
            if k and gemm_pays(s.type, k):
                return True
    return False


def _loop_matmul(kb: KernelBuilder, name: str, out: TensorType, ins: Sequence[TensorType],
                 ta: bool, tb: bool, epilogue: Epilogue | None) -> Kernel:
    """Rows of C in [lo, hi): C[r, :] = sum_p A[r, p] * B[p, :], vectorized along the row; with
    B transposed (its rows contiguous along the depth), each C[r, j] as one dot product instead,
    vectorized along the depth (a float sum reassociated, as any vectorized reduction)."""
    a, bt = ins[0], ins[1]
    m, n = out.shape[-2], out.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    rows = math.prod(out.shape[:-1])
    (sa_i, sa_p), (sb_p, sb_j) = _operand_strides(a, ta), _operand_strides(bt, tb)
    fn, b, lo, hi, (c,), ptrs = kb.function(name, [out.dtype], [t.dtype for t in ins])
    pa, pb = ptrs[0], ptrs[1]
    is_float = out.dtype.is_float
    flags = ("contract", "reassoc") if is_float else ()
    zero = const(llvm_type(out.dtype), 0.0 if is_float else 0)

    def fma(acc: ir.Value, av: ir.Value, bv: ir.Value) -> ir.Value:
        if is_float:
            return b.fadd(acc, b.fmul(av, bv, flags=flags), flags=flags)
        return b.add(acc, b.mul(av, bv))

    with for_range(b, lo, hi, name="row") as r:
        crow = b.mul(r, i64(n))
        batch = b.udiv(r, i64(m))
        arow = b.add(b.mul(batch, i64(m * k)), b.mul(b.urem(r, i64(m)), i64(sa_i)))
        bmat = b.mul(batch, i64(k * n))
        if sb_p == 1:
            with for_range(b, 0, n, name="j") as j:
                bcol = b.add(bmat, b.mul(j, i64(sb_j)))
                with b.goto_entry_block():
                    slot = b.alloca(zero.type, name="dot")
                b.store(zero, slot)
                with for_range(b, 0, k, name="p") as q:
                    av = _load(b, pa, b.add(arow, b.mul(q, i64(sa_p))))
                    b.store(fma(b.load(slot), av, _load(b, pb, b.add(bcol, q))), slot)
                _store(b, b.load(slot), c, b.add(crow, j))
        else:
            with for_range(b, 0, n, name="z") as j:
                _store(b, zero, c, b.add(crow, j))
            with for_range(b, 0, k, name="p") as q:
                av = _load(b, pa, b.add(arow, b.mul(q, i64(sa_p))))
                brow = b.add(bmat, b.mul(q, i64(sb_p)))
                with for_range(b, 0, n, name="j") as j:
                    co = b.add(crow, j)
                    bv = _load(b, pb, b.add(brow, b.mul(j, i64(sb_j))))
                    _store(b, fma(_load(b, c, co), av, bv), c, co)
        if epilogue is not None:
            epilogue(b, ptrs[2:], c, r)
    b.ret_void()
    return Kernel(fn, rows, 2 * rows * n * k + out.nbytes)


def matmul_kernel(kb: KernelBuilder, name: str, out: TensorType, ins: Sequence[TensorType],
                  ta: bool = False, tb: bool = False, epilogue: Epilogue | None = None) -> Kernel:
    """op(A) @ op(B) (then an epilogue per row): the generated packed GEMM (gemm.py) for
    float products large enough to pay (`gemm_pays`), the host BLAS for those it leaves,
    generated loops otherwise."""
    from . import gemm  # here: gemm builds `Kernel`s of this module
    k = ins[0].shape[-2] if ta else ins[0].shape[-1]
    if k and gemm_pays(out, k):
        return gemm.gemm_matmul(kb, name, out, ins, ta, tb, epilogue)
    if k and narrow_pays(out):
        return narrow_matmul(kb, name, out, ins, ta, tb, epilogue)
    if blas_pays(out, k):
        return _blas_matmul(kb, name, out, ins, ta, tb, epilogue)
    if k and small_pays(out, tb):
        return narrow_matmul(kb, name, out, ins, ta, tb, epilogue)
    return _loop_matmul(kb, name, out, ins, ta, tb, epilogue)


def matmul(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """np.matmul with equal batch dimensions."""
    return matmul_kernel(kb, "matmul", s.type, ins)


def matmul_viewed(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType],
                  views: Sequence[Layout | None]) -> Kernel:
    """A BLAS-sized np.matmul reading operands through `views` (see `_blas_matmul`): the
    generated GEMM where it pays (`gemm_pays`), else the host BLAS."""
    from . import gemm
    if ins[0].shape[-1] and gemm_pays(s.type, ins[0].shape[-1]):
        return gemm.gemm_matmul(kb, "matmul_viewed", s.type, ins, False, False, None, views)
    return _blas_matmul(kb, "matmul_viewed", s.type, ins, False, False, None, views)


KERNELS["matmul"] = matmul
