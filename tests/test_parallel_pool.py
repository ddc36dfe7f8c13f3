"""The thread pool under stress: entries with many consecutive parallel kernels, called many
times and from several Python threads at once, against the interpreter; the pool runtime's
protocol (spin, then sleep) with tiny tasks, idle gaps and forked children."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import eqsat
from eqsat.backend import compile_module, emit_llvm, jit, parallel
from eqsat.ir import parse

N = 1024  # a 1024x1024 f32 kernel is well above PARALLEL_MIN_WORK
STAGES = 6

pytestmark = pytest.mark.skipif(parallel.THREADS < 2, reason="one core: no pool")


def _chain(stages: int) -> str:
    """Each stage: a row or column sum (its own kernel), broadcast back, an elementwise tanh."""
    t = f"f32[{N},{N}]"
    lines = [f"module @chain\nfunc @f(%x: {t}, %y: {t}) -> {t} {{", f"  %v0 = mul %x, %y : {t}"]
    for k in range(stages):
        axis = k % 2
        lines += [f"  %s{k} = sum %v{k}, axes=[{axis}] : f32[{N}]",
                  f"  %b{k} = broadcast %s{k} : {t}",
                  f"  %d{k} = sub %v{k}, %b{k} : {t}",
                  f"  %e{k} = mul %d{k}, %y : {t}",
                  f"  %v{k + 1} = tanh %e{k} : {t}"]
    lines += [f"  return %v{stages}", "}"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def chain():
    m = parse(_chain(STAGES))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, N)).astype(np.float32)
    y = (rng.standard_normal((N, N)) * 0.01).astype(np.float32)
    return m, compile_module(m, cache_dir=None), (x, y), eqsat.interpret(m, "f", x, y)


def test_the_chain_runs_many_kernels_on_the_pool(chain):
    m = chain[0]
    assert emit_llvm(m).count(f"call void @{jit.POOL_SYMBOL}") >= STAGES


def test_many_consecutive_calls_are_exact_and_match_interpret(chain):
    _, exe, args, want = chain
    first = exe.f(*args)
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-5)
    for k in range(60):
        if k % 15 == 0:
            time.sleep(0.01)  # an idle gap: the workers went to sleep on their semaphores
        # the same splits every call: any race shows as a difference
        np.testing.assert_array_equal(exe.f(*args), first)


def test_calls_from_several_python_threads(chain):
    _, exe, args, want = chain
    first = exe.f(*args)
    failures: list[str] = []

    def work() -> None:
        for _ in range(15):
            got = exe.f(*args)
            if not np.array_equal(got, first):
                failures.append(f"max diff {np.abs(got - first).max()}")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-5)


def _counting_entry() -> tuple[object, ctypes.Array]:
    """An entry `bench(iters, counters)` calling the pool `iters` times with a task that
    atomically counts its runs in counters[share * 8]: the pool's protocol alone."""
    from llvmlite import ir

    from eqsat.backend.scalar import I32, I64

    m = ir.Module("count")
    m.triple, m.data_layout = jit.host()[0], jit.data_layout()
    task = ir.Function(m, parallel.TASK, "count")
    b = ir.IRBuilder(task.append_basic_block("entry"))
    b.atomic_rmw("add", b.bitcast(task.args[0], I64.as_pointer()), ir.Constant(I64, 1),
                 "monotonic")
    b.ret(ir.Constant(parallel.VOIDP, None))
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [I64, parallel.VOIDP]), "bench")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    from eqsat.backend.loops import for_range

    with for_range(b, 0, fn.args[0]):
        b.call(parallel.declare_pool(m), [task, fn.args[1], ir.Constant(I64, 64),
                                          ir.Constant(I32, parallel.THREADS)])
    b.ret_void()
    code = jit.Code(jit.compile_object(str(m)))
    run = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(code.address("bench"))
    return (code, run), (ctypes.c_int64 * (8 * parallel.THREADS))()


def test_tiny_tasks_every_share_runs_once_per_call():
    (code, run), counters = _counting_entry()
    total = 0
    for iters, gap in [(1, 0.0), (20000, 0.0), (1, 0.005), (3, 0.0005), (5000, 0.0)] * 3:
        time.sleep(gap)
        run(iters, ctypes.addressof(counters))
        total += iters
        assert [counters[8 * t] for t in range(parallel.THREADS)] == [total] * parallel.THREADS


def test_tiny_tasks_from_several_threads_and_a_forked_child():
    (code, run), counters = _counting_entry()
    threads = [threading.Thread(target=run, args=(3000, ctypes.addressof(counters)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # a concurrent caller runs its shares alone: every share still ran once per call
    assert [counters[8 * t] for t in range(parallel.THREADS)] == [9000] * parallel.THREADS
    if sys.platform != "linux":
        return
    pid = os.fork()
    if pid == 0:  # the child: its workers did not survive the fork; the pool starts anew
        ok = False
        try:
            run(2000, ctypes.addressof(counters))
            ok = all(counters[8 * t] == 11000 for t in range(parallel.THREADS))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(sys.platform != "linux", reason="fork and /proc")
def test_a_child_forked_during_a_pooled_call_gets_workers_of_its_own():
    # the child inherited the pool's busy flag, set by a thread it does not have, and ran
    # every call serially; now it frees the flag at fork and starts workers on its first call
    (code, run), counters = _counting_entry()
    caller = threading.Thread(target=run, args=(400000, ctypes.addressof(counters)))
    caller.start()
    time.sleep(0.05)  # the caller is inside its (long) loop of pooled calls
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            signal.alarm(60)  # a hang fails the test rather than the whole run
            run(2000, ctypes.addressof(counters))
            ok = len(os.listdir("/proc/self/task")) > 1  # the pool's workers run here too
        finally:
            os._exit(0 if ok else 1)
    caller.join(timeout=120)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and not caller.is_alive()


@pytest.mark.parametrize("rows", [5, 1001])
def test_chunked_extents_cover_every_row_once(rows: int) -> None:
    """Kernels whose extent is not a multiple of the chunks the threads take (1001 rows: a
    short last chunk; 5: fewer rows than chunks) still compute every row exactly once."""
    cols = (1 << 22) // rows + 1  # enough work for the pool
    t = f"f32[{rows},{cols}]"
    m = parse(f"module @c\nfunc @f(%x: {t}) -> {t} {{\n  %e = exp %x : {t}\n"
              f"  %s = sum %e, axes=[1] : f32[{rows}]\n  %r = reshape %s : f32[{rows},1]\n"
              f"  %b = broadcast %r : {t}\n  %y = div %e, %b : {t}\n  return %y\n}}")
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    exe = compile_module(m, cache_dir=None)
    want = eqsat.interpret(m, "f", x)
    for _ in range(5):
        np.testing.assert_allclose(exe.f(x), want, rtol=2e-6, atol=1e-12)


def _thread_masks() -> dict[int, set[int]]:
    """The CPU mask of every thread of this process, by thread id."""
    masks = {}
    for t in os.listdir("/proc/self/task"):
        try:
            masks[int(t)] = os.sched_getaffinity(int(t))
        except OSError:  # a thread that ended meanwhile
            continue
    return masks


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs at least two CPUs to steer between")
def test_a_worker_woken_from_sleep_is_kept_off_the_callers_cpu():
    """After an idle gap the workers sleep; the call that posts them first lets each run on
    every CPU of the process but the caller's (left to the scheduler, a woken worker often
    queued behind the caller on its CPU: a call after a gap ran almost serially)."""
    (code, run), counters = _counting_entry()
    allowed = os.sched_getaffinity(0)
    before = {int(t) for t in os.listdir("/proc/self/task")}
    run(1, ctypes.addressof(counters))  # starts the workers (if this is the first pool use)
    time.sleep(0.05)  # the workers spin ~50 us, then sleep
    run(1, ctypes.addressof(counters))
    masks = _thread_masks()
    steered = [tid for tid, m in masks.items()
               if len(m) == len(allowed) - 1 and m < allowed]
    assert steered, (allowed, masks, before)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs at least two CPUs to steer between")
def test_steering_obeys_an_affinity_narrowed_after_the_pool_started():
    """`taskset -p` on a running process narrows every thread's mask; waking a worker must
    not widen it again to CPUs of the mask the process had when the pool started."""
    (code, run), counters = _counting_entry()
    run(1, ctypes.addressof(counters))  # the pool runs
    allowed = os.sched_getaffinity(0)
    one = {min(allowed)}
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    try:
        for t in tids:
            os.sched_setaffinity(t, one)
        time.sleep(0.05)  # the workers spin ~50 us, then sleep
        run(1, ctypes.addressof(counters))  # posts them awake
        masks = _thread_masks()
        assert all(m <= one for m in masks.values()), (one, masks)
    finally:
        for t in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(t), allowed)
            except OSError:
                pass
    before = counters[0]
    run(3, ctypes.addressof(counters))
    assert [counters[8 * t] for t in range(parallel.THREADS)] == [before + 3] * parallel.THREADS


# A fresh process where every thread the C library starts by default gets a 256 KiB stack
# over a 2 MiB guard (as `ulimit -s` or musl's 128 KiB default would): a product whose shares
# run on the pool, called until a worker has taken shares.
SMALL_STACKS = """
import ctypes
attr = ctypes.create_string_buffer(128)
libc = ctypes.CDLL(None)
assert libc.pthread_attr_init(attr) == 0
assert libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(256 << 10)) == 0
assert libc.pthread_attr_setguardsize(attr, ctypes.c_size_t(2 << 20)) == 0
assert libc.pthread_setattr_default_np(attr) == 0
import numpy as np
import eqsat
from eqsat.backend import compile_module
m = eqsat.parse('''module @wide
func @f(%a: f32[64,512], %b: f32[512,2048]) -> f32[64,2048] {
  %0 = matmul %a, %b : f32[64,2048]
  return %0
}''')
a = np.linspace(-1, 1, 64 * 512, dtype=np.float32).reshape(64, 512)
b = np.cos(np.arange(512 * 2048, dtype=np.float32)).reshape(512, 2048)
exe = compile_module(m, cache_dir=None)
print(all(np.allclose(exe.f(a, b), a @ b, rtol=1e-4, atol=1e-3) for _ in range(50)))
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "pthread_setattr_default_np"),
                    reason="no glibc")
def test_workers_have_stacks_for_the_gemm_whatever_the_default():
    """Workers took the C library's default stack (RLIMIT_STACK on glibc, 128 KiB on musl);
    a GEMM share's packing buffers (~0.7 MiB) overflowed a small one: a segfault, or another
    mapping overwritten."""
    out = subprocess.run([sys.executable, "-c", SMALL_STACKS], capture_output=True, text=True,
                         timeout=120)
    assert (out.returncode, out.stdout.strip()) == (0, "True"), out.stderr[-2000:]
