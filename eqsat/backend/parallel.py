"""Splitting a kernel's outer loop over threads: a persistent pool of POSIX threads.

A kernel computes [lo, hi) of its outer loop, and every builder guarantees that disjoint
ranges write disjoint memory, so the shares need no locks. Kernels hand their shares to
`eqsat_parallel`, a small runtime (`runtime_ir`, compiled once per process and bound like the
BLAS, so cached object code stays valid) whose workers live as long as the process and sleep
on semaphores between calls: no thread start per kernel (~20-50 us each), nothing spinning
while the BLAS or the next kernel runs, and OpenBLAS keeps each worker's packing buffers
instead of faulting in fresh ones for every new thread. Work goes to threads only where it
clearly outweighs the ~10-30 us of waking them. Batched BLAS products split here too (whole
batches), each thread calling the BLAS single-threaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from llvmlite import ir

from . import blas
from .llvm_kernels import Kernel
from .loops import for_range, i64
from .scalar import I8, I32, I64, declare

# Bytes plus operations below which a kernel runs on the calling thread alone.
PARALLEL_MIN_WORK = 1 << 22
THREADS = max(1, min(os.cpu_count() or 1, 16))
POOL_SYMBOL = "eqsat_parallel"  # void (i8* (i8*)* fn, i8* ctxs, i64 ctx_bytes, i32 n)
MAX_WORKERS = 63  # shares beyond this many workers run on the calling thread
SEM_BYTES = 64  # room for a sem_t (32 bytes on 64-bit glibc), one cache line each

VOIDP = I8.as_pointer()
TASK = ir.FunctionType(VOIDP, [VOIDP])


def _trampoline(kernel: Kernel, ctx_ty: ir.LiteralStructType) -> ir.Function:
    """`void *k.thread(void *ctx)`: unpack (lo, hi, pointers...) and run the kernel."""
    module = kernel.fn.module
    name = f"{kernel.fn.name}.thread"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    fn = ir.Function(module, TASK, name)
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    setter = (blas.declare_threads(module)
              if blas.calls_gemm(module) else None)
    if setter is not None:
        # A pool thread: OpenBLAS on it alone too (else concurrent calls queue for its pool).
        b.call(setter, [ir.Constant(I32, 1)])
    ctx = b.bitcast(fn.args[0], ctx_ty.as_pointer())
    fields = [b.load(b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
              for k in range(len(ctx_ty.elements))]
    b.call(kernel.fn, fields)
    b.ret(ir.Constant(VOIDP, None))
    return fn


def declare_pool(module: ir.Module) -> ir.Function:
    """The runtime's entry (see POOL_SYMBOL): run fn(ctxs + t * ctx_bytes) for t < n."""
    return declare(module, POOL_SYMBOL, ir.VoidType(), [TASK.as_pointer(), VOIDP, I64, I32])


def emit_kernel_call(b: ir.IRBuilder, kernel: Kernel, args: Sequence[ir.Value]) -> None:
    """Run `kernel` over its whole extent, on THREADS threads when that pays."""
    threads = min(THREADS, kernel.extent)
    if threads < 2 or kernel.work < PARALLEL_MIN_WORK:
        b.call(kernel.fn, [i64(0), i64(kernel.extent), *args])
        return
    ctx_ty = ir.LiteralStructType([I64, I64, *[a.type for a in args]])
    tramp = _trampoline(kernel, ctx_ty)
    bounds = [kernel.extent * t // threads for t in range(threads + 1)]
    with b.goto_entry_block():
        ctxs = b.alloca(ctx_ty, size=threads)
    for t in range(threads):
        ctx = b.gep(ctxs, [i64(t)])
        for k, v in enumerate([i64(bounds[t]), i64(bounds[t + 1]), *args]):
            b.store(v, b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
    size = b.ptrtoint(b.gep(ir.Constant(ctx_ty.as_pointer(), None), [i64(1)]), I64)
    b.call(declare_pool(b.module), [tramp, b.bitcast(ctxs, VOIDP), size,
                                    ir.Constant(I32, threads)])


# ---------------------------------------------------------------- the pool runtime

def _serial(b: ir.IRBuilder, fn: ir.Value, ctxs: ir.Value, size: ir.Value, lo: ir.Value,
            hi: ir.Value) -> None:
    with for_range(b, lo, hi, name="own") as t:
        b.call(fn, [b.gep(ctxs, [b.mul(t, size)])])


def _retry(b: ir.IRBuilder, call: ir.Function, arg: ir.Value, name: str) -> None:
    """Call `int call(arg)` until it returns 0 (sem_wait returns -1 on EINTR)."""
    loop = b.append_basic_block(f"{name}.again")
    done = b.append_basic_block(f"{name}.done")
    b.branch(loop)
    b.position_at_end(loop)
    rc = b.call(call, [arg])
    b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), done, loop)
    b.position_at_end(done)


def runtime_ir(triple: str, data_layout: str) -> str:
    """LLVM IR of the pool: `eqsat.pool.run` (see POOL_SYMBOL) and its workers. One
    caller at a time uses the workers (an atomic flag); a concurrent caller, or a forked child
    whose workers did not survive the fork until the pool is rebuilt, runs serially or anew."""
    m = ir.Module("eqsat_pool")
    m.triple, m.data_layout = triple, data_layout
    sem = ir.ArrayType(I8, SEM_BYTES)

    def glob(name: str, ty: ir.Type) -> ir.GlobalVariable:
        g = ir.GlobalVariable(m, ty, name)
        g.linkage, g.initializer, g.align = "internal", ir.Constant(ty, None), 64
        return g

    go = glob("pool.go", ir.ArrayType(sem, MAX_WORKERS))
    done = glob("pool.done", sem)
    task = glob("pool.task", ir.ArrayType(TASK.as_pointer(), MAX_WORKERS))
    arg = glob("pool.arg", ir.ArrayType(VOIDP, MAX_WORKERS))
    busy, started, pid = glob("pool.busy", I32), glob("pool.started", I32), glob("pool.pid", I32)
    semp = I8.as_pointer()
    sem_init = declare(m, "sem_init", I32, [semp, I32, I32])
    sem_wait = declare(m, "sem_wait", I32, [semp])
    sem_post = declare(m, "sem_post", I32, [semp])
    getpid = declare(m, "getpid", I32, [])
    create = declare(m, "pthread_create", I32, [I64.as_pointer(), VOIDP, TASK.as_pointer(), VOIDP])
    detach = declare(m, "pthread_detach", I32, [I64])
    zero = ir.Constant(I32, 0)

    def go_sem(b: ir.IRBuilder, i: ir.Value) -> ir.Value:
        return b.bitcast(b.gep(go, [zero, i, zero]), semp)

    done_sem = done.bitcast(semp)
    worker = ir.Function(m, TASK, "pool.worker")
    worker.linkage = "internal"
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    me = b.trunc(b.ptrtoint(worker.args[0], I64), I32)
    loop = b.append_basic_block("loop")
    b.branch(loop)
    b.position_at_end(loop)
    got = b.icmp_signed("==", b.call(sem_wait, [go_sem(b, me)]), zero)
    with b.if_then(got):
        fn = b.load(b.gep(task, [zero, me]))
        b.call(fn, [b.load(b.gep(arg, [zero, me]))])
        b.call(sem_post, [done_sem])
    b.branch(loop)

    impl = ir.Function(m, ir.FunctionType(ir.VoidType(), [TASK.as_pointer(), VOIDP, I64, I32]),
                       "eqsat.pool.run")
    fn, ctxs, size, n = impl.args
    b = ir.IRBuilder(impl.append_basic_block("entry"))
    n64 = b.zext(n, I64)
    claim = b.cmpxchg(busy, zero, ir.Constant(I32, 1), "acquire", "monotonic")
    with b.if_else(b.extract_value(claim, 1)) as (pooled, alone):
        with pooled:
            me = b.call(getpid, [])
            with b.if_then(b.icmp_signed("!=", b.load(pid), me)):
                # First use, or a forked child: semaphores fresh, workers started anew.
                with for_range(b, 0, MAX_WORKERS, name="init") as i:
                    b.call(sem_init, [go_sem(b, b.trunc(i, I32)), zero, zero])
                b.call(sem_init, [done_sem, zero, zero])
                b.store(zero, started)
                b.store(me, pid)
            want = b.sub(b.select(b.icmp_unsigned("<", n, ir.Constant(I32, MAX_WORKERS + 1)),
                                  n, ir.Constant(I32, MAX_WORKERS + 1)), ir.Constant(I32, 1))
            tid = b.alloca(I64)
            grow, grown = b.append_basic_block("grow"), b.append_basic_block("grown")
            b.branch(grow)
            b.position_at_end(grow)
            have = b.load(started)
            more = b.append_basic_block("more")
            b.cbranch(b.icmp_signed("<", have, want), more, grown)
            b.position_at_end(more)
            rc = b.call(create, [tid, ir.Constant(VOIDP, None), worker,
                                 b.inttoptr(b.zext(have, I64), VOIDP)])
            ok = b.append_basic_block("created")
            b.cbranch(b.icmp_signed("==", rc, zero), ok, grown)  # no thread: fewer workers
            b.position_at_end(ok)
            b.call(detach, [b.load(tid)])
            b.store(b.add(have, ir.Constant(I32, 1)), started)
            b.branch(grow)
            b.position_at_end(grown)
            have = b.load(started)
            w = b.zext(b.select(b.icmp_signed("<", have, want), have, want), I64)
            with for_range(b, 0, w, name="wake") as i:
                b.store(fn, b.gep(task, [zero, i]))
                b.store(b.gep(ctxs, [b.mul(b.add(i, i64(1)), size)]), b.gep(arg, [zero, i]))
                b.call(sem_post, [go_sem(b, i)])
            _serial(b, fn, ctxs, size, b.add(w, i64(1)), n64)
            _serial(b, fn, ctxs, size, i64(0), i64(1))
            with for_range(b, 0, w, name="join"):
                _retry(b, sem_wait, done_sem, "join")
            b.store_atomic(zero, busy, "release", 4)
        with alone:
            _serial(b, fn, ctxs, size, i64(0), n64)
    b.ret_void()
    return str(m)
