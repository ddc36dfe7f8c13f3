"""Kernels for the fused and layout ops optimization makes (`eqsat.ir.fused`): a `map` is one
loop evaluating its scalar body, a `map_reduce` a reduction of its body, `matmul_t` a matmul
reading transposed operands in place, `matmul_epi` a matmul rewriting each row of its product
with its body while the row is in cache."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from llvmlite import ir

from ..ir import fused
from ..ir.module import Stmt
from ..ir.ops import OPS
from ..ir.scalar_expr import body_args, body_cost, fold
from ..ir.types import DType, TensorType
from .llvm_kernels import (KERNELS, Kernel, KernelBuilder, _load, _store, broadcast_strides,
                           interleave_for, outer_blocks, reduce_kernel)
from .loops import (collapse, for_range, i64, nest, row_major_strides, stream_dims,
                    streamed_nest, strided_offset, with_trig_fallback)
from .matmul_kernels import matmul_kernel
from .scalar import const, emit_scalar, llvm_type

Typed = tuple[ir.Value, DType]


def emit_body(b: ir.IRBuilder, body: Any, args: Sequence[Typed | None],
              expected: DType | None) -> ir.Value:
    """The scalar code of a body over typed values (`None` for inputs the body never reads)."""

    def lit(node: Any, d: DType) -> Typed:
        value = float(node.value) if d.is_float else int(node.value)
        return const(llvm_type(d), value), d

    def app(node: Any, values: list[Typed]) -> Typed:
        dtypes = [d for _, d in values]
        out = OPS[node.op].infer([TensorType(d, ()) for d in dtypes], {}, None).dtype
        return emit_scalar(b, node.op, [v for v, _ in values], dtypes[-1], out), out

    return fold(body, list(args), lambda v: v[1], lit, app, expected)[0]


def _loads(b: ir.IRBuilder, used: set[int] | frozenset[int], ptrs: Sequence[ir.Value],
           offs: Sequence[ir.Value], ins: Sequence[TensorType]) -> list[Typed | None]:
    return [(_load(b, p, o), t.dtype) if i in used else None
            for i, (p, o, t) in enumerate(zip(ptrs, offs, ins))]


def map_(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType],
         trig_fallback: bool = True) -> Kernel:
    """One loop nest over the result; each input read through its broadcast strides. A body
    calling sin or cos runs twice where some argument needs the full reduction
    (`loops.with_trig_fallback`), unless `trig_fallback` is off (output aliasing an input)."""
    out, body = s.type, s.attr["body"]
    strides = [broadcast_strides(t.shape, out.shape, kb.strides(k, t))
               for k, t in enumerate(ins)]
    dims = collapse(out.shape, [row_major_strides(out.shape), *strides])
    fn, b, lo, hi, (o,), ptrs = kb.function("map", [out.dtype], [t.dtype for t in ins])
    used = body_args(body)

    def value(offs: list[ir.Value]) -> ir.Value:
        return emit_body(b, body, _loads(b, used, ptrs, offs, ins), out.dtype)

    inner = {k for k, st in enumerate(dims[-1][1][1:]) if st}  # inputs varying along a row
    cost = body_cost(body, inner)
    streamed = stream_dims(dims) if kb.streams(out, cost) else None
    if streamed is not None:
        dims = streamed
        streamed_nest(b, dims, lo, hi, o, value, out.dtype.itemsize)
        kb.end_kernel(b)
    else:
        def loops() -> None:
            nest(b, dims, [0] * (1 + len(ins)),
                 lambda offs: _store(b, value(offs[1:]), o, offs[0]), outer=(lo, hi),
                 interleave=interleave_for(cost))

        if trig_fallback:
            with_trig_fallback(b, loops)
        else:
            loops()
        b.ret_void()
    work = out.nbytes + sum(t.nbytes for t in ins) + int(fused.body_flops(body, ins, out.shape))
    return Kernel(fn, dims[0][0], work,
                  outer_blocks(dims[0][0], dims[0][1], [out.size, *kb.sizes(ins)]))


def _element_cost(body: Any, ins: Sequence[TensorType]) -> float:
    """Simple operations per element of a map_reduce: its body and the combine."""
    return 1.0 + body_cost(body, None, fused.compute_dtype(ins))


def map_reduce(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """A reduction whose elements are the body over the broadcast inputs."""
    body = s.attr["body"]
    domain = fused.domain(ins)
    strides = [broadcast_strides(t.shape, domain, kb.strides(k, t)) for k, t in enumerate(ins)]

    def element(b: ir.IRBuilder, ptrs: list[ir.Value], offs: list[ir.Value]) -> ir.Value:
        return emit_body(b, body, _loads(b, body_args(body), ptrs, offs, ins), None)

    return reduce_kernel(kb, "map_reduce", s.attr["reduce"], domain, set(s.attr["axes"]),
                         s.type, ins, strides, element, _element_cost(body, ins))


def map_reduce_keeping(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType],
                       keep: TensorType) -> Kernel:
    """`map_reduce` that also stores every element's value, row-major over the domain, into a
    last pointer of type `keep` (see reuse.py)."""
    body = s.attr["body"]
    domain = fused.domain(ins)
    strides = [broadcast_strides(t.shape, domain, kb.strides(k, t))
               for k, t in enumerate(ins)] + [row_major_strides(domain)]

    def element(b: ir.IRBuilder, ptrs: list[ir.Value], offs: list[ir.Value]) -> ir.Value:
        value = emit_body(b, body, _loads(b, body_args(body), ptrs[:-1], offs[:-1], ins), None)
        _store(b, value, ptrs[-1], offs[-1])
        return value

    return reduce_kernel(kb, "map_reduce_keeping", s.attr["reduce"], domain,
                         set(s.attr["axes"]), s.type, [*ins, keep], strides, element,
                         _element_cost(body, ins))


def map_in_place(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """`map` whose last operand is its own result (read, then overwritten, element by element):
    the two pointers are the same, so neither may be marked noalias."""
    kernel = map_(kb, s, ins, trig_fallback=False)
    for arg in (kernel.fn.args[2], kernel.fn.args[-1]):
        arg.attributes.discard("noalias")
    return kernel


def matmul_t(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """op(a) @ op(b) with the transposes read in place."""
    return matmul_kernel(kb, "matmul_t", s.type, ins, bool(s.attr["ta"]), bool(s.attr["tb"]))


def matmul_epi(kb: KernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> Kernel:
    """matmul_t, then the body over each finished row: $0 the product, $1.. the extra
    operands broadcast to the product's shape."""
    out, body = s.type, s.attr["body"]
    extras = list(ins[2:])
    n = out.shape[-1]
    lead = out.shape[:-1]
    strides = [broadcast_strides(t.shape, out.shape) for t in extras]
    used = {i - 1 for i in body_args(body) if i > 0}  # the extras the body reads

    def epilogue(b: ir.IRBuilder, ptrs: list[ir.Value], c: ir.Value, r: ir.Value,
                 cols: tuple[ir.Value, ir.Value] | None = None) -> None:
        # `cols`: only columns [j0, j1) of the row (the packed GEMM finishes C in blocks).
        # The extras' offsets of row r: r's index along each leading axis times their strides.
        bases = [strided_offset(b, r, lead, st) for st in strides]
        crow = b.mul(r, i64(n))
        with for_range(b, *(cols or (0, n)), name="e") as j:
            offs = [b.add(base, b.mul(j, i64(st[-1]))) for base, st in zip(bases, strides)]
            args = [(_load(b, c, b.add(crow, j)), out.dtype)]
            args += _loads(b, used, ptrs, offs, extras)
            _store(b, emit_body(b, body, args, out.dtype), c, b.add(crow, j))

    return matmul_kernel(kb, "matmul_epi", out, ins, bool(s.attr["ta"]), bool(s.attr["tb"]),
                         epilogue if math.prod(out.shape) else None)


KERNELS.update({"map": map_, "map_reduce": map_reduce, "matmul_t": matmul_t,
                "matmul_epi": matmul_epi})
