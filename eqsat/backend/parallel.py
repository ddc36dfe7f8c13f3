"""Splitting a kernel's outer loop over threads (POSIX threads, created per kernel call).

A kernel computes [lo, hi) of its outer loop, and every builder guarantees that disjoint
ranges write disjoint memory, so the halves need no locks. Threads are created only where the
kernel's work clearly outweighs the ~20-50 us a thread costs to start and join. BLAS products
split here too (batches or row blocks), each thread calling the BLAS single-threaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from llvmlite import ir

from . import blas
from .llvm_kernels import Kernel
from .loops import i64
from .scalar import I8, I32, I64, declare

# Bytes plus operations below which a kernel runs on the calling thread alone.
PARALLEL_MIN_WORK = 1 << 22
THREADS = max(1, min(os.cpu_count() or 1, 16))

VOIDP = I8.as_pointer()


def _trampoline(kernel: Kernel, ctx_ty: ir.LiteralStructType) -> ir.Function:
    """`void *k.thread(void *ctx)`: unpack (lo, hi, pointers...) and run the kernel."""
    module = kernel.fn.module
    name = f"{kernel.fn.name}.thread"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    fn = ir.Function(module, ir.FunctionType(VOIDP, [VOIDP]), name)
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    setter = (blas.declare_threads(module)
              if any(sym in module.globals for sym, _ in blas.SYMBOLS.values()) else None)
    if setter is not None:
        # A fresh thread: OpenBLAS on it alone too (else concurrent calls queue for its pool).
        b.call(setter, [ir.Constant(I32, 1)])
    ctx = b.bitcast(fn.args[0], ctx_ty.as_pointer())
    fields = [b.load(b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
              for k in range(len(ctx_ty.elements))]
    b.call(kernel.fn, fields)
    b.ret(ir.Constant(VOIDP, None))
    return fn


def emit_kernel_call(b: ir.IRBuilder, kernel: Kernel, args: Sequence[ir.Value]) -> None:
    """Run `kernel` over its whole extent, on THREADS threads when that pays."""
    threads = min(THREADS, kernel.extent)
    if threads < 2 or kernel.work < PARALLEL_MIN_WORK:
        b.call(kernel.fn, [i64(0), i64(kernel.extent), *args])
        return
    module = b.module
    ctx_ty = ir.LiteralStructType([I64, I64, *[a.type for a in args]])
    tramp = _trampoline(kernel, ctx_ty)
    create = declare(module, "pthread_create", I32, [I64.as_pointer(), VOIDP,
                                                      tramp.type, VOIDP])
    join = declare(module, "pthread_join", I32, [I64, VOIDP.as_pointer()])
    bounds = [kernel.extent * t // threads for t in range(threads + 1)]
    with b.goto_entry_block():
        tids = b.alloca(I64, size=threads)
        ctxs = b.alloca(ctx_ty, size=threads)
        started = b.alloca(ir.IntType(1), size=threads)
    for t in range(1, threads):
        ctx = b.gep(ctxs, [i64(t)])
        for k, v in enumerate([i64(bounds[t]), i64(bounds[t + 1]), *args]):
            b.store(v, b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
        rc = b.call(create, [b.gep(tids, [i64(t)]), ir.Constant(VOIDP, None), tramp,
                             b.bitcast(ctx, VOIDP)])
        ok = b.icmp_signed("==", rc, ir.Constant(I32, 0))
        b.store(ok, b.gep(started, [i64(t)]))
        with b.if_then(b.not_(ok)):
            # No thread to be had: do its share here rather than fail.
            b.call(tramp, [b.bitcast(ctx, VOIDP)])
    b.call(kernel.fn, [i64(bounds[0]), i64(bounds[1]), *args])
    for t in range(1, threads):
        with b.if_then(b.load(b.gep(started, [i64(t)]))):
            b.call(join, [b.load(b.gep(tids, [i64(t)])), ir.Constant(VOIDP.as_pointer(), None)])
