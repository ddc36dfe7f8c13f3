"""Values the entry function never materializes: slices, broadcasts and transposes that every
consumer reads in place, through element strides and an offset into their source's buffer.

A slice copied before the map that reads it costs a read and a write of the whole window: an
LSTM cell's four gate slices of one [1024, 4096] product took a fifth of its time. The loop
kernels (elementwise ops, maps, reductions) read any operand through strides whose memory order
follows the index order (slices and broadcasts); BLAS-sized matmuls read transposes and slices
within what their GEMM accepts (`_reads_in_place`). A view of a view composes; a view that some
consumer cannot read (a reshape, a call, a small matmul, a returned value) is materialized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir.module import Function, Stmt
from ..ir.ops import lookup
from ..ir.types import TensorType
from .llvm_kernels import READS_VIEWS
from .loops import row_major_strides
from .matmul_kernels import blas_pays, gemm_layout_ok, gemm_pays

Layout = tuple[list[int], int]  # element strides per axis, element offset into the root buffer


def _transposed(s: Stmt, src: TensorType, layout: Layout) -> Layout:
    strides, offset = layout
    return [strides[p] for p in s.attr["perm"]], offset


def _sliced(s: Stmt, src: TensorType, layout: Layout) -> Layout:
    strides, offset = layout
    return strides, offset + sum(a * st for a, st in zip(s.attr["start"], strides))


def _broadcast(s: Stmt, src: TensorType, layout: Layout) -> Layout:
    strides, offset = layout
    to = s.type.shape
    lead = len(to) - len(src.shape)
    return ([0 if d < lead or src.shape[d - lead] == 1 else strides[d - lead]
             for d in range(len(to))], offset)


# The layout of a view op's result, from its operand's type and layout.
VIEW_OPS: dict[str, Callable[[Stmt, TensorType, Layout], Layout]] = {
    "transpose": _transposed,
    "slice": _sliced,
    "broadcast": _broadcast,
}


def in_order(strides: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a layout walks memory in index order: the strides of the axes longer than one,
    zeros (broadcast axes) aside, strictly decrease. The loop kernels read such views as fast
    as contiguous arrays, row by row; a transposed read would gather across rows."""
    moving = [st for st, n in zip(strides, shape) if n > 1 and st != 0]
    return all(a > b for a, b in zip(moving, moving[1:]))


def _reads_in_place(user: Stmt, pos: int, types: dict[str, TensorType], strides: list[int],
                    shape: Sequence[int]) -> bool:
    """Whether `user` can read its operand at `pos`, of `shape`, through `strides` (its offset
    goes into the pointer the kernel gets)."""
    if user.op == "matmul":
        # a BLAS-sized product on the generated GEMM reads any strides but broadcast ones, one
        # on the host BLAS only what gemm_layout_ok allows
        k = types[user.operands[0]].shape[-1]
        return (pos < 2 and blas_pays(user.type, k)
                and all(st != 0 for st, n in zip(strides, shape) if n > 1)
                and (gemm_pays(user.type, k) or gemm_layout_ok(strides, shape)))
    return lookup(READS_VIEWS, user.op) is not None and in_order(strides, shape)


def find_views(func: Function, live: Sequence[int]) -> tuple[dict[str, list[int]],
                                                             dict[str, int]]:
    """The view ops of `func` that are never materialized: each one's element strides into its
    root buffer (that of the first value up its chain of views and reshapes), and its element
    offset there where not 0."""
    types = func.types()
    body = func.body
    users: dict[str, list[tuple[Stmt, int]]] = {}
    for idx in live:
        for pos, o in enumerate(body[idx].operands):
            users.setdefault(o, []).append((body[idx], pos))
    views = {body[idx].results[0]: body[idx] for idx in live
             if body[idx].op in VIEW_OPS and users.get(body[idx].results[0])
             and body[idx].results[0] not in func.returns}
    while True:
        layouts: dict[str, Layout] = {}
        for r, s in views.items():  # in program order: operands' layouts come first
            src = s.operands[0]
            base = layouts.get(src) or (row_major_strides(types[src].shape), 0)
            layouts[r] = VIEW_OPS[s.op](s, types[src], base)
        refused = {r for r in views
                   if not all(u.results[0] in views and u.op in VIEW_OPS
                              or _reads_in_place(u, pos, types, layouts[r][0], types[r].shape)
                              for u, pos in users[r])}
        if not refused:
            return ({r: strides for r, (strides, _) in layouts.items()},
                    {r: off for r, (_, off) in layouts.items() if off})
        views = {r: s for r, s in views.items() if r not in refused}
