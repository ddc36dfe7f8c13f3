"""Splitting a kernel's outer loop over threads: a persistent pool of POSIX threads.

A kernel computes [lo, hi) of its outer loop, and every builder guarantees that disjoint
ranges write disjoint memory, so the shares need no locks. Kernels hand their shares to
`eqsat_parallel`, a small runtime (`runtime_ir`, compiled once per process and bound like the
BLAS, so cached object code stays valid) whose workers live as long as the process: no thread
start per kernel (~20-50 us each), and OpenBLAS keeps each worker's packing buffers instead of
faulting in fresh ones for every new thread. Between calls workers spin ~50 us, then sleep on
semaphores (see "the pool runtime" below); a worker woken from its semaphore is kept off the
waking caller's CPU (see CPU_WORDS). Work goes to threads only where it clearly
outweighs the ~10-30 us of waking a sleeping one. Batched BLAS products split here too (whole
batches), each thread calling the BLAS single-threaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from ..host import PARALLEL_MIN_WORK
from . import blas, settings
from .jit import POOL_AFTER_FORK, POOL_ENTRY, POOL_SYMBOL
from .llvm_kernels import Kernel
from .loops import for_range, i64
from .scalar import I8, I32, I64, declare, internal_function

THREADS = settings.default_threads()
# POOL_SYMBOL: void (i8* (i8*)* fn, i8* ctxs, i64 ctx_bytes, i32 n), bound to POOL_ENTRY
CHUNKS_PER_THREAD = 4  # a kernel's extent is taken in this many chunks per thread
MAX_WORKERS = 63  # shares beyond this many workers run on the calling thread
SEM_BYTES = 64  # room for a sem_t (32 bytes on 64-bit glibc), one cache line each

VOIDP = I8.as_pointer()
TASK = ir.FunctionType(VOIDP, [VOIDP])


def _trampoline(kernel: Kernel, ctx_ty: ir.LiteralStructType) -> ir.Function:
    """`void *k.thread(void *ctx)`: take chunks [start, start + chunk) of the kernel's extent
    from the shared counter (next start, extent, chunk, pointers...) and run them until none
    is left."""
    module = kernel.fn.module
    fn, new = internal_function(module, f"{kernel.fn.name}.thread", TASK)
    if not new:
        return fn
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    setter = (blas.declare_threads(module)
              if blas.calls_gemm(module) else None)
    if setter is not None:
        # A pool thread: OpenBLAS on it alone too (else concurrent calls queue for its pool).
        b.call(setter, [ir.Constant(I32, 1)])
    ctx = b.bitcast(fn.args[0], ctx_ty.as_pointer())
    counter, extent, chunk, *args = [
        b.load(b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
        for k in range(len(ctx_ty.elements))]
    take, done = fn.append_basic_block("take"), fn.append_basic_block("done")
    run = fn.append_basic_block("run")
    b.branch(take)
    b.position_at_end(take)
    start = b.atomic_rmw("add", counter, chunk, "monotonic")
    b.cbranch(b.icmp_unsigned("<", start, extent), run, done)
    b.position_at_end(run)
    end = b.add(start, chunk)
    end = b.select(b.icmp_unsigned("<", end, extent), end, extent)
    b.call(kernel.fn, [start, end, *args])
    b.branch(take)
    b.position_at_end(done)
    b.ret(ir.Constant(VOIDP, None))
    return fn


def declare_pool(module: ir.Module) -> ir.Function:
    """The runtime's entry (see POOL_SYMBOL): run fn(ctxs + t * ctx_bytes) for t < n."""
    return declare(module, POOL_SYMBOL, ir.VoidType(), [TASK.as_pointer(), VOIDP, I64, I32])


def emit_kernel_call(b: ir.IRBuilder, kernel: Kernel, args: Sequence[ir.Value]) -> None:
    """Run `kernel` over its whole extent, on THREADS threads when that pays. The extent is
    cut into CHUNKS_PER_THREAD chunks per thread that the threads take from a shared counter,
    so a thread that starts late (a core busy elsewhere, or slow to wake) leaves its chunks to
    the others instead of holding up the call; which thread runs a chunk never changes what
    it computes."""
    threads = min(THREADS, kernel.extent)
    if threads < 2 or kernel.work < PARALLEL_MIN_WORK:
        b.call(kernel.fn, [i64(0), i64(kernel.extent), *args])
        return
    ctx_ty = ir.LiteralStructType([I64.as_pointer(), I64, I64, *[a.type for a in args]])
    tramp = _trampoline(kernel, ctx_ty)
    chunks = min(kernel.extent, threads * CHUNKS_PER_THREAD)
    chunk = -(-kernel.extent // chunks)
    with b.goto_entry_block():
        ctx = b.alloca(ctx_ty)
        counter = b.alloca(I64)
    b.store(i64(0), counter)
    for k, v in enumerate([counter, i64(kernel.extent), i64(chunk), *args]):
        b.store(v, b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
    # every share gets the same context (ctx_bytes 0): they differ only in what they take
    b.call(declare_pool(b.module), [tramp, b.bitcast(ctx, VOIDP), i64(0),
                                    ir.Constant(I32, threads)])


# ---------------------------------------------------------------- the pool runtime
#
# Waking a sleeping worker through its semaphore costs ~10-30 us plus the time its core takes to
# come back, and the caller then sleeps on `done` just as long; an entry runs dozens of parallel
# kernels back to back. So both sides spin briefly before they sleep: a worker that finished a
# share watches its slot's ticket for SPIN_ITERS pauses, and the caller that finished its own
# share watches `pending` as long. Spinning is bounded (~SPIN_ITERS * 40 ns, see SPIN_ITERS) so
# an idle pool, or one whose caller went back to Python, costs a core only that long.
#
# Whether a sleeper needs its semaphore posted is settled Dekker-style, all seq_cst: the sleeper
# sets its flag, then reads the ticket (or `pending`); the waker publishes the ticket (or its
# decrement), then exchanges the flag for 0 and posts only if it was set. One of the two sees
# the other's write; a sleeper that sees the work after all takes its flag back with cmpxchg and
# consumes the post when the waker was first. Every post thus meets exactly one wait.

# Pauses a waiting side spins before it sleeps on its semaphore: ~50 us at the ~25 ns a pause
# takes here (AMD EPYC; Intel since Skylake ~40 ns). Measured on 2 shared cores: a round trip
# of back-to-back pool calls 4-5 us -> 0.3-0.6 us; bench/run.py (eqsat opt, two runs each,
# interleaved, load ~1) softmax 1.52/1.39 -> 1.05/1.09 ms, layernorm 0.93/1.09 -> 0.83/0.83
# (CPU 1.5 -> 0.85 ms), mlp_fwd 5.07/5.02 -> 4.82/4.90, train_step 13.5/13.3 -> 12.6/14.5
# (CPU 25 -> 25/27.5). A lone call after the pool slept (a gap over ~50 us) pays the
# semaphores as before, and on a loaded machine up to ~50 us more: the caller spins while the
# woken worker may be waiting for its core. (Tried: the caller sleeping at once when it had
# to post a worker, sched_yield in the spin: neither helped that case in a micro-benchmark,
# and the first can keep both sides sleeping through a run of back-to-back kernels.)
SPIN_ITERS = 2000
SLOT = ir.LiteralStructType([I32, I32, TASK.as_pointer(), VOIDP, I32, ir.ArrayType(I8, 36)])
TICKET, SLEEPING, SLOT_TASK, SLOT_ARG, SLOT_TID = 0, 1, 2, 3, 4  # one cache line per worker
# Where a woken worker runs. Left to itself, Linux often wakes a worker onto the CPU of the
# thread that posted it (wake-affine) while the other CPUs sleep, and there it waits until the
# load balancer moves it: after an idle gap of 20 ms or more, mlp_fwd ran almost serially (9-10
# ms instead of 5). So before posting a sleeping worker the caller allows it every CPU of its
# own affinity mask (read then, so a later `taskset -p` is obeyed) except the one it is on (two
# syscalls, on this path only; a spinning worker is already on a CPU of its own).
# CPU_WORDS: the mask's 64-bit words.
CPU_WORDS = 16
# Each worker's stack. Left to the C library's default, a worker's stack is what RLIMIT_STACK
# says on glibc (often 8 MiB, but `ulimit -s` or pthread_setattr_default_np lower it) and 128 KiB
# on musl (Alpine), while a share of a product runs the GEMM driver, whose ~0.7 MiB of packing
# buffers were a stack frame until they moved to the heap (they still fall back to the stack
# where malloc fails): such a worker overflowed its stack and the process died.
# Reserved address space, touched only as deep as the kernels go. ATTR_BYTES: room for a
# pthread_attr_t (56 bytes on 64-bit glibc and musl).
WORKER_STACK = 8 << 20
ATTR_BYTES = 128
# The gettid system call's number per architecture (glibc's own gettid() is only 2.30+); where
# it is unknown, workers publish no id and are not steered.
SYS_GETTID = {"x86_64": 186, "aarch64": 178}


def _spin(b: ir.IRBuilder, ready: Callable[[ir.IRBuilder, str], ir.Value],
          pause: ir.Function | None,
          name: str) -> tuple[ir.Block, ir.Block]:
    """Check `ready` up to SPIN_ITERS times, pausing between: the blocks reached when it held
    and when it never did (the builder is left in neither)."""
    pre = b.block
    head, more = b.append_basic_block(f"{name}.spin"), b.append_basic_block(f"{name}.pause")
    hit, miss = b.append_basic_block(f"{name}.hit"), b.append_basic_block(f"{name}.miss")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I32)
    k.add_incoming(ir.Constant(I32, 0), pre)
    b.cbranch(ready(b, "acquire"), hit, more)
    b.position_at_end(more)
    if pause is not None:
        b.call(pause, [])
    k1 = b.add(k, ir.Constant(I32, 1))
    k.add_incoming(k1, b.block)
    b.cbranch(b.icmp_unsigned("<", k1, ir.Constant(I32, SPIN_ITERS)), head, miss)
    return hit, miss


def _retry(b: ir.IRBuilder, call: ir.Function, arg: ir.Value, name: str) -> None:
    """Call `int call(arg)` until it returns 0 (sem_wait returns -1 on EINTR)."""
    loop = b.append_basic_block(f"{name}.again")
    done = b.append_basic_block(f"{name}.done")
    b.branch(loop)
    b.position_at_end(loop)
    rc = b.call(call, [arg])
    b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), done, loop)
    b.position_at_end(done)


def _sleep(b: ir.IRBuilder, flag: ir.Value, ready: Callable[[ir.IRBuilder, str], ir.Value],
           sem_wait: ir.Function, sem: ir.Value, name: str) -> None:
    """Sleep on `sem` unless `ready` holds once `flag` says so (see the protocol above); the
    builder ends where the work is ready and `flag` is 0 again."""
    one, zero = ir.Constant(I32, 1), ir.Constant(I32, 0)
    b.store_atomic(one, flag, "seq_cst", 4)
    late, asleep = b.append_basic_block(f"{name}.late"), b.append_basic_block(f"{name}.sleep")
    awake = b.append_basic_block(f"{name}.awake")
    b.cbranch(ready(b, "seq_cst"), late, asleep)
    b.position_at_end(late)
    took = b.extract_value(b.cmpxchg(flag, one, zero, "seq_cst", "seq_cst"), 1)
    b.cbranch(took, awake, asleep)  # not taken: the waker cleared it and posts, so wait for it
    b.position_at_end(asleep)
    _retry(b, sem_wait, sem, name)
    b.branch(awake)
    b.position_at_end(awake)


def _wake(b: ir.IRBuilder, flag: ir.Value, sem_post: ir.Function, sem: ir.Value,
          before: Callable[[ir.IRBuilder], None] | None = None) -> None:
    """Post `sem` when its sleeper set `flag` (after the work was published), calling `before`
    first."""
    was = b.atomic_rmw("xchg", flag, ir.Constant(I32, 0), "seq_cst")
    with b.if_then(b.icmp_signed("!=", was, ir.Constant(I32, 0))):
        if before is not None:
            before(b)
        b.call(sem_post, [sem])


def _steer(b: ir.IRBuilder, m: ir.Module, tid: ir.Value) -> None:
    """Let thread `tid` run on every CPU the calling thread may use but its current one (see
    CPU_WORDS), where that leaves one at least and `tid` is known."""
    getcpu = declare(m, "sched_getcpu", I32, [])
    getaff = declare(m, "sched_getaffinity", I32, [I32, I64, VOIDP])
    setaff = declare(m, "sched_setaffinity", I32, [I32, I64, VOIDP])
    zero = ir.Constant(I32, 0)
    size = i64(8 * CPU_WORDS)
    with b.goto_entry_block():
        mask = b.alloca(ir.ArrayType(I64, CPU_WORDS), name="mask")
    cpu = b.call(getcpu, [])
    ok = b.and_(b.icmp_signed(">", tid, zero), b.icmp_signed(">=", cpu, zero))
    ok = b.and_(ok, b.icmp_signed("<", cpu, ir.Constant(I32, 64 * CPU_WORDS)))
    with b.if_then(ok):
        got = b.call(getaff, [zero, size, b.bitcast(mask, VOIDP)])
        with b.if_then(b.icmp_signed("==", got, zero)):
            at = b.gep(mask, [zero, b.lshr(cpu, ir.Constant(I32, 6))])
            bit = b.shl(ir.Constant(I64, 1), b.zext(b.and_(cpu, ir.Constant(I32, 63)), I64))
            b.store(b.and_(b.load(at), b.not_(bit)), at)
            left = ir.Constant(I64, 0)
            for w in range(CPU_WORDS):
                left = b.or_(left, b.load(b.gep(mask, [zero, ir.Constant(I32, w)])))
            with b.if_then(b.icmp_unsigned("!=", left, ir.Constant(I64, 0))):
                b.call(setaff, [tid, size, b.bitcast(mask, VOIDP)])


def _serial(b: ir.IRBuilder, fn: ir.Value, ctxs: ir.Value, size: ir.Value, lo: ir.Value,
            hi: ir.Value) -> None:
    with for_range(b, lo, hi, name="own") as t:
        b.call(fn, [b.gep(ctxs, [b.mul(t, size)])])


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
    slots = glob("pool.slots", ir.ArrayType(SLOT, MAX_WORKERS))
    # each on its own cache line: workers hammer `pending`, the caller spins on it
    pending, waiting = glob("pool.pending", I32), glob("pool.waiting", I32)
    busy, started, pid = glob("pool.busy", I32), glob("pool.started", I32), glob("pool.pid", I32)
    seq = glob("pool.seq", I32)
    semp = I8.as_pointer()
    sem_init = declare(m, "sem_init", I32, [semp, I32, I32])
    sem_wait = declare(m, "sem_wait", I32, [semp])
    sem_post = declare(m, "sem_post", I32, [semp])
    getpid = declare(m, "getpid", I32, [])
    nr_gettid = SYS_GETTID.get(triple.split("-")[0])
    create = declare(m, "pthread_create", I32, [I64.as_pointer(), VOIDP, TASK.as_pointer(), VOIDP])
    attr_init = declare(m, "pthread_attr_init", I32, [VOIDP])
    attr_stack = declare(m, "pthread_attr_setstacksize", I32, [VOIDP, I64])
    attr_destroy = declare(m, "pthread_attr_destroy", I32, [VOIDP])
    detach = declare(m, "pthread_detach", I32, [I64])
    pause = (declare(m, "llvm.x86.sse2.pause", ir.VoidType(), [])
             if triple.startswith(("x86_64", "i386", "i686")) else None)
    zero, one = ir.Constant(I32, 0), ir.Constant(I32, 1)

    def go_sem(b: ir.IRBuilder, i: ir.Value) -> ir.Value:
        return b.bitcast(b.gep(go, [zero, i, zero]), semp)

    def slot(b: ir.IRBuilder, i: ir.Value, field: int) -> ir.Value:
        return b.gep(slots, [zero, i, ir.Constant(I32, field)])

    done_sem = done.bitcast(semp)

    # -- a worker: wait for a new ticket in its slot, run the share, count it done
    worker = ir.Function(m, TASK, "pool.worker")
    worker.linkage = "internal"
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    me = b.trunc(b.ptrtoint(worker.args[0], I64), I32)
    if nr_gettid is not None:
        syscall = declare(m, "syscall", I64, [I64], var_arg=True)
        tid = b.trunc(b.call(syscall, [i64(nr_gettid)]), I32)
        b.store_atomic(tid, slot(b, me, SLOT_TID), "release", 4)
    seen = b.alloca(I32)
    b.store(zero, seen)
    loop = b.append_basic_block("loop")
    b.branch(loop)
    b.position_at_end(loop)

    def fresh(b: ir.IRBuilder, order: str) -> ir.Value:
        ticket = b.load_atomic(slot(b, me, TICKET), order, 4)
        return b.icmp_unsigned("!=", ticket, b.load(seen))

    run, miss = _spin(b, fresh, pause, "wait")
    b.position_at_end(miss)
    _sleep(b, slot(b, me, SLEEPING), fresh, sem_wait, go_sem(b, me), "nap")
    b.branch(run)
    b.position_at_end(run)
    b.store(b.load_atomic(slot(b, me, TICKET), "acquire", 4), seen)
    b.call(b.load(slot(b, me, SLOT_TASK)), [b.load(slot(b, me, SLOT_ARG))])
    left = b.atomic_rmw("sub", pending, one, "seq_cst")
    with b.if_then(b.icmp_signed("==", left, one)):  # the last share: wake a sleeping caller
        _wake(b, waiting, sem_post, done_sem)
    b.branch(loop)

    # -- the caller: publish the shares, run its own, wait for the workers'
    impl = ir.Function(m, ir.FunctionType(ir.VoidType(), [TASK.as_pointer(), VOIDP, I64, I32]),
                       POOL_ENTRY)
    fn, ctxs, size, n = impl.args
    b = ir.IRBuilder(impl.append_basic_block("entry"))
    n64 = b.zext(n, I64)
    claim = b.cmpxchg(busy, zero, one, "acquire", "monotonic")
    with b.if_else(b.extract_value(claim, 1)) as (pooled, alone):
        with pooled:
            me = b.call(getpid, [])
            with b.if_then(b.icmp_signed("!=", b.load(pid), me)):
                # First use, or a forked child: semaphores and slots fresh, workers started anew.
                with for_range(b, 0, MAX_WORKERS, name="init") as i:
                    b.call(sem_init, [go_sem(b, b.trunc(i, I32)), zero, zero])
                    for field in (TICKET, SLEEPING, SLOT_TID):
                        b.store(zero, slot(b, i, field))
                b.call(sem_init, [done_sem, zero, zero])
                for g in (started, pending, waiting, seq):
                    b.store(zero, g)
                b.store(me, pid)
            want = b.sub(b.select(b.icmp_unsigned("<", n, ir.Constant(I32, MAX_WORKERS + 1)),
                                  n, ir.Constant(I32, MAX_WORKERS + 1)), one)
            tid = b.alloca(I64)
            attr = b.alloca(ir.ArrayType(I8, ATTR_BYTES))
            attr.align = 16
            attr = b.bitcast(attr, VOIDP)
            grow, grown = b.append_basic_block("grow"), b.append_basic_block("grown")
            b.branch(grow)
            b.position_at_end(grow)
            have = b.load(started)
            more = b.append_basic_block("more")
            b.cbranch(b.icmp_signed("<", have, want), more, grown)
            b.position_at_end(more)
            b.call(attr_init, [attr])
            b.call(attr_stack, [attr, i64(WORKER_STACK)])
            rc = b.call(create, [tid, attr, worker, b.inttoptr(b.zext(have, I64), VOIDP)])
            b.call(attr_destroy, [attr])
            ok = b.append_basic_block("created")
            b.cbranch(b.icmp_signed("==", rc, zero), ok, grown)  # no thread: fewer workers
            b.position_at_end(ok)
            b.call(detach, [b.load(tid)])
            b.store(b.add(have, one), started)
            b.branch(grow)
            b.position_at_end(grown)
            have = b.load(started)
            w32 = b.select(b.icmp_signed("<", have, want), have, want)
            w = b.zext(w32, I64)
            ticket = b.add(b.load(seq), one)
            ticket = b.select(b.icmp_signed("==", ticket, zero), one, ticket)  # 0: never run
            b.store(ticket, seq)
            b.store(w32, pending)  # published by the tickets' seq_cst stores below
            with for_range(b, 0, w, name="wake") as i:
                b.store(fn, slot(b, i, SLOT_TASK))
                b.store(b.gep(ctxs, [b.mul(b.add(i, i64(1)), size)]), slot(b, i, SLOT_ARG))
                b.store_atomic(ticket, slot(b, i, TICKET), "seq_cst", 4)
                tid = b.load_atomic(slot(b, i, SLOT_TID), "acquire", 4)
                _wake(b, slot(b, i, SLEEPING), sem_post, go_sem(b, b.trunc(i, I32)),
                      lambda b, tid=tid: _steer(b, m, tid))
            _serial(b, fn, ctxs, size, b.add(w, i64(1)), n64)
            _serial(b, fn, ctxs, size, i64(0), i64(1))

            def finished(b: ir.IRBuilder, order: str) -> ir.Value:
                return b.icmp_signed("==", b.load_atomic(pending, order, 4), zero)

            joined, miss = _spin(b, finished, pause, "join")
            b.position_at_end(miss)
            _sleep(b, waiting, finished, sem_wait, done_sem, "join")
            b.branch(joined)
            b.position_at_end(joined)
            b.store_atomic(zero, busy, "release", 4)
        with alone:
            _serial(b, fn, ctxs, size, i64(0), n64)
    b.ret_void()

    # A child forked while a caller used the workers inherits `busy` set by a thread it does
    # not have: every call would then run serially. The child frees it; its first call sees
    # another pid and starts workers of its own.
    reset = ir.Function(m, ir.FunctionType(ir.VoidType(), []), POOL_AFTER_FORK)
    rb = ir.IRBuilder(reset.append_basic_block("entry"))
    rb.store(zero, busy)
    rb.ret_void()
    return str(m)
