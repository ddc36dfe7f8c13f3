"""Reduction GPU kernels: sum / max / min over axes, and fused `map_reduce`.

The domain splits into kept axes (the output index o) and reduced axes (r, R values per output).
Three shapes of kernel, chosen from the shape:
- the innermost axis is kept (column sums, bias gradients) or rows are tiny: one thread per
  output, looping over r; neighbouring threads read neighbouring addresses (coalesced, but
  few outputs leave the GPU idle: splitting r across warps would help there);
- short rows (R <= 1024): one warp per output, lanes striding over r, combined with
  `shfl.sync.down` (no shared memory, no barrier);
- long rows: one block per output; each warp combines with shuffles, warp leaders meet in
  shared memory, and the first warp combines their partial results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from llvmlite import ir

from ..ir import fused
from ..ir.module import Stmt
from ..ir.scalar_expr import body_args
from ..ir.types import DType, TensorType
from . import nvptx_target as T
from .fused_kernels import emit_body
from .llvm_kernels import _BOOL_COMBINE, _FLOAT_COMBINE, _INT_COMBINE, _identity, \
    broadcast_strides
from .loops import collapse, counted, row_major_strides
from .nvptx_kernels import (BLOCK, GPU_KERNELS, GpuKernel, GpuKernelBuilder, cint, grid_1d,
                            grid_stride, index_type, load, offsets, store, widen)
from .scalar import I32, llvm_type

WARPS = BLOCK // T.WARP
WARP_ROW_MAX = 1024

# (builder, input pointers, element offsets of each input) -> one element of the domain
Element = Callable[[ir.IRBuilder, list[ir.Value], list[ir.Value]], ir.Value]


def _combiner(op: str, dtype: DType) -> Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]:
    table = (_FLOAT_COMBINE if dtype.is_float else
             _BOOL_COMBINE if dtype is DType.bool else _INT_COMBINE)
    return table[op]


def strategy(domain: Sequence[int], axes: set[int], out_size: int) -> str:
    """"thread", "warp" or "block": how many threads cooperate on one output."""
    rank = len(domain)
    reduced = math.prod(domain[a] for a in axes)
    inner_kept = any(d not in axes and domain[d] > 1 for d in range(rank)) and \
        next((d for d in reversed(range(rank)) if domain[d] > 1), None) not in axes
    if reduced <= 8 or inner_kept:
        return "thread"
    return "warp" if reduced <= WARP_ROW_MAX else "block"


def reduce_kernel(kb: GpuKernelBuilder, name: str, op: str, domain: Sequence[int],
                  axes: set[int], out: TensorType, ins: Sequence[TensorType],
                  in_strides: Sequence[list[int]], element: Element) -> GpuKernel:
    """`op` over `axes` of `element` on the `domain` index space (see the module docstring)."""
    kept = [d for d in range(len(domain)) if d not in axes]
    red = sorted(axes)
    kdims = collapse([domain[d] for d in kept], [[s[d] for d in kept] for s in in_strides]) \
        if in_strides else collapse([domain[d] for d in kept], [[0]])
    rdims = collapse([domain[d] for d in red], [[s[d] for d in red] for s in in_strides]) \
        if in_strides else collapse([domain[d] for d in red], [[0]])
    n_out = out.size
    n_red = math.prod(domain[d] for d in red)
    how = strategy(domain, axes, n_out)
    dtype = out.dtype
    combine = _combiner(op, dtype)
    ident = _identity(op, dtype)
    fn, b, (o,), ptrs = kb.function(name, [dtype], [t.dtype for t in ins])
    n_in = len(ins)
    ity = index_type(max(n_out, n_red, 1))
    rty = index_type(n_red + BLOCK)

    def partial(row: ir.Value, lo: ir.Value, step: ir.Value) -> ir.Value:
        """This thread's combination of the row's elements lo, lo + step, ..."""
        base = offsets(b, row, kdims, [0] * n_in) if n_in else []
        acc_slot = _entry_alloca(b, llvm_type(dtype))
        b.store(ident, acc_slot)
        with counted(b, lo, cint(rty, n_red), step, "r", signed=False) as r:
            roffs = offsets(b, r, rdims, [0] * n_in) if n_in else []
            value = element(b, ptrs, [b.add(x, y) for x, y in zip(base, roffs)])
            b.store(combine(b, b.load(acc_slot), value), acc_slot)
        return b.load(acc_slot)

    if how == "thread":
        with grid_stride(b, n_out, ity) as row:
            store(b, partial(row, cint(rty, 0), cint(rty, 1)), o, widen(b, row, ir.IntType(64)))
        grid = grid_1d(n_out)
    else:
        lane = b.urem(T.tid(b), cint(I32, T.WARP))
        if how == "warp":
            with grid_stride(b, n_out, ity, lane_groups=WARPS, name="row") as row:
                acc = _warp_reduce(b, partial(row, widen(b, lane, rty), cint(rty, T.WARP)),
                                   combine)
                with b.if_then(b.icmp_unsigned("==", lane, cint(I32, 0))):
                    store(b, acc, o, widen(b, row, ir.IntType(64)))
            grid = (max(1, min(-(-n_out // WARPS), 65535)), 1, 1)
        else:
            smem = kb.shared(llvm_type(dtype), WARPS)
            warp = b.udiv(T.tid(b), cint(I32, T.WARP))
            with _block_rows(b, n_out, ity) as row:
                acc = _warp_reduce(b, partial(row, widen(b, T.tid(b), rty), cint(rty, BLOCK)),
                                   combine)
                first = b.icmp_unsigned("==", lane, cint(I32, 0))
                with b.if_then(first):
                    b.store(acc, b.gep(smem, [warp], inbounds=True))
                T.barrier(b)
                with b.if_then(b.icmp_unsigned("==", warp, cint(I32, 0))):
                    have = b.icmp_unsigned("<", lane, cint(I32, WARPS))
                    safe = b.select(have, lane, cint(I32, 0))
                    mine = b.select(have, b.load(b.gep(smem, [safe], inbounds=True)), ident)
                    total = _warp_reduce(b, mine, combine)
                    with b.if_then(first):
                        store(b, total, o, widen(b, row, ir.IntType(64)))
                T.barrier(b)  # the shared slots are reused by the next row
            grid = (max(1, min(n_out, 65535)), 1, 1)
    b.ret_void()
    return GpuKernel(fn.name, grid, (BLOCK, 1, 1), f"{name} {how}/output {out}")


def _block_rows(b: ir.IRBuilder, n: int, ity: ir.IntType):
    """`for (row = blockIdx.x; row < n; row += gridDim.x)`: every thread of a block together."""
    return counted(b, widen(b, T.ctaid(b), ity), ir.Constant(ity, n), widen(b, T.nctaid(b), ity),
                   name="row", signed=False)


def _entry_alloca(b: ir.IRBuilder, ty: ir.Type) -> ir.Value:
    with b.goto_entry_block():
        return b.alloca(ty)


def _warp_reduce(b: ir.IRBuilder, value: ir.Value,
                 combine: Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]) -> ir.Value:
    """Tree combination across a warp with shfl.sync.down; lane 0 ends with the result."""
    for delta in (16, 8, 4, 2, 1):
        value = combine(b, value, T.shfl_down(b, value, delta))
    return value


def reduce(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """sum / max / min over axes."""
    x = ins[0]
    return reduce_kernel(kb, s.op, s.op, x.shape, set(s.attr["axes"]), s.type, [x],
                         [row_major_strides(x.shape)],
                         lambda b, ptrs, offs: load(b, ptrs[0], offs[0]))


def map_reduce(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """A reduction whose elements are the body over the broadcast inputs."""
    body = s.attr["body"]
    domain = fused.domain(ins)
    strides = [broadcast_strides(t.shape, domain) for t in ins]
    used = body_args(body)

    def element(b: ir.IRBuilder, ptrs: list[ir.Value], offs: list[ir.Value]) -> ir.Value:
        args = [(load(b, p, off), t.dtype) if i in used else None
                for i, (p, off, t) in enumerate(zip(ptrs, offs, ins))]
        return emit_body(b, body, args, None)

    return reduce_kernel(kb, "map_reduce", s.attr["reduce"], domain, set(s.attr["axes"]),
                         s.type, ins, strides, element)


GPU_KERNELS.update({"reduce": reduce, "map_reduce": map_reduce})
