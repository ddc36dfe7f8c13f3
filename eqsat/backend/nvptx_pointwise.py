"""Pointwise GPU kernels: elementwise ops, casts, constants and fused `map`s.

One grid-stride loop over the result. Each input is read through strides over the result's
index space (0 on broadcast axes), so broadcasts, slices and copies are pointwise kernels too.
Where the innermost axis allows it, every thread handles one 16-byte vector per step
(`ld.global.v4.f32` for f32): contiguous inputs are loaded as vectors, inputs repeated along
the innermost axis are loaded once and splat.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llvmlite import ir

from ..ir.module import Stmt
from ..ir.scalar_expr import body_args
from ..ir.types import DType, TensorType
from .fused_kernels import emit_body
from .llvm_kernels import broadcast_strides
from .loops import collapse, row_major_strides
from .nvptx_kernels import (BLOCK, GPU_KERNELS, GpuKernel, GpuKernelBuilder, grid_1d,
                            grid_stride, index_type, load, offsets, store)
from .scalar import const, emit_scalar, llvm_type
from .scalar import cast as cast_scalar

VECTOR_BYTES = 16
Typed = tuple[ir.Value, DType]
# One output element from the loaded inputs (None for inputs it does not read).
Element = Callable[[ir.IRBuilder, list[Typed | None]], ir.Value]


@dataclass
class Piece:
    """A strided copy-or-compute region: its index space, the output's strides and offset
    there, and for each input it reads (by kernel input number) strides and an offset."""

    shape: tuple[int, ...]
    out_strides: list[int]
    out_offset: int
    inputs: list[int]
    in_strides: list[list[int]]
    in_offsets: list[int]


def _vector_width(piece: Piece, dims: list[tuple[int, list[int]]], out: DType,
                  dtypes: Sequence[DType], offs: Sequence[int]) -> int:
    """Elements per 16-byte access, or 1 when the layout does not allow vector accesses:
    the innermost axis must split into whole vectors for the output and every contiguous input,
    with every other stride and offset a multiple of the width (16-byte aligned vectors)."""
    n, inner = dims[-1]
    widest = max([out.itemsize] + [d.itemsize for d, s in zip(dtypes, inner[1:]) if s])
    v = VECTOR_BYTES // widest
    if v <= 1 or n % v or inner[0] != 1:
        return 1
    for k, s in enumerate(inner):
        if s not in (0, 1):
            return 1
        if s == 1 and (offs[k] % v or any(st[k] % v for _, st in dims[:-1])):
            return 1
    return v


def _emit_piece(b: ir.IRBuilder, piece: Piece, out_ptr: ir.Value, ptrs: Sequence[ir.Value],
                out: DType, dtypes: Sequence[DType], element: Element) -> int:
    """The grid-stride loop of one piece; returns its work items (for the launch)."""
    size = math.prod(piece.shape)
    if size == 0:
        return 0
    strides = [piece.out_strides, *piece.in_strides]
    dims = collapse(piece.shape, strides)
    bases = [piece.out_offset, *piece.in_offsets]
    in_types = [dtypes[k] for k in piece.inputs]
    v = _vector_width(piece, dims, out, in_types, bases)
    items = size // v
    ity = index_type(items)
    with grid_stride(b, items, ity) as i:
        offs = offsets(b, i, dims, bases, inner_scale=v)
        lanes: list[list[Typed | None]] = [[None] * len(dtypes) for _ in range(v)]
        for j, k in enumerate(piece.inputs):
            ptr, off, d = ptrs[k], offs[1 + j], dtypes[k]
            if v > 1 and dims[-1][1][1 + j] == 1:
                vec = _vector_load(b, ptr, off, v, d)
                for lane in range(v):
                    lanes[lane][k] = (b.extract_element(vec, const(ir.IntType(32), lane)), d)
            else:
                x = load(b, ptr, off)
                for lane in range(v):
                    lanes[lane][k] = (x, d)
        values = [element(b, lane) for lane in lanes]
        if v == 1:
            store(b, values[0], out_ptr, offs[0])
        else:
            vec = ir.Constant(ir.VectorType(llvm_type(out), v), None)
            for lane, x in enumerate(values):
                vec = b.insert_element(vec, x, const(ir.IntType(32), lane))
            _vector_store(b, vec, out_ptr, offs[0], v, out)
    return items


def _vector_load(b: ir.IRBuilder, ptr: ir.Value, off: ir.Value, v: int, d: DType) -> ir.Value:
    vty = ir.VectorType(llvm_type(d), v)
    p = b.bitcast(b.gep(ptr, [off], inbounds=True), vty.as_pointer(ptr.type.addrspace))
    return b.load(p, align=v * d.itemsize)


def _vector_store(b: ir.IRBuilder, vec: ir.Value, ptr: ir.Value, off: ir.Value, v: int,
                  d: DType) -> None:
    p = b.bitcast(b.gep(ptr, [off], inbounds=True), vec.type.as_pointer(ptr.type.addrspace))
    b.store(vec, p, align=v * d.itemsize)


def pointwise(kb: GpuKernelBuilder, op: str, out: TensorType, ins: Sequence[TensorType],
              pieces: Sequence[Piece], element: Element) -> GpuKernel:
    """A kernel running each piece's grid-stride loop in turn."""
    fn, b, (o,), ptrs = kb.function(op, [out.dtype], [t.dtype for t in ins])
    dtypes = [t.dtype for t in ins]
    items = max([_emit_piece(b, p, o, ptrs, out.dtype, dtypes, element) for p in pieces] + [0])
    b.ret_void()
    return GpuKernel(fn.name, grid_1d(items), (BLOCK, 1, 1), f"{op} {out}")


def whole(out: TensorType, ins: Sequence[TensorType], offsets_: Sequence[int] | None = None,
          strides: Sequence[list[int]] | None = None) -> Piece:
    """The piece covering the whole result, each input broadcast to it (numpy's rule)."""
    return Piece(out.shape, row_major_strides(out.shape), 0, list(range(len(ins))),
                 list(strides) if strides is not None else
                 [broadcast_strides(t.shape, out.shape) for t in ins],
                 list(offsets_) if offsets_ is not None else [0] * len(ins))


# ---------------------------------------------------------------- the ops


def elementwise(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """An op of the unary, binary, compare or select family, or a cast."""
    dtype, out = ins[-1].dtype, s.type.dtype

    def element(b: ir.IRBuilder, args: list[Typed | None]) -> ir.Value:
        return emit_scalar(b, s.op, [a[0] for a in args if a is not None], dtype, out)

    return pointwise(kb, s.op, s.type, ins, [whole(s.type, ins)], element)


def cast(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """numpy's astype, element by element."""
    src, dst = ins[0].dtype, s.type.dtype
    return pointwise(kb, "cast", s.type, ins, [whole(s.type, ins)],
                     lambda b, args: cast_scalar(b, args[0][0], src, dst))


def constant(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """Every element the literal."""
    d = s.type.dtype
    value = s.attr["value"]
    c = const(llvm_type(d), float(value) if d.is_float else int(value))
    return pointwise(kb, "const", s.type, [], [whole(s.type, [])], lambda b, args: c)


def map_(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """A fused elementwise kernel: the body over the inputs, each broadcast to the result."""
    body, out = s.attr["body"], s.type
    used = body_args(body)
    piece = whole(out, ins)
    # Inputs the body never reads are not loaded at all.
    keep = [k for k in piece.inputs if k in used]
    piece = Piece(piece.shape, piece.out_strides, 0, keep,
                  [piece.in_strides[k] for k in keep], [0] * len(keep))
    return pointwise(kb, "map", out, ins, [piece],
                     lambda b, args: emit_body(b, body, args, out.dtype))


GPU_KERNELS.update({
    "unary": elementwise,
    "binary": elementwise,
    "compare": elementwise,
    "select": elementwise,
    "cast": cast,
    "const": constant,
    "map": map_,
})

from . import nvptx_layout  # noqa: E402,F401  (registers the layout kernels)
