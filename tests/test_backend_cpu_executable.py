"""CPU executables beyond each op's results: calls with several and returned results, input
checking and fresh outputs, pickling, what the backend refuses, the LLVM IR it emits, arena
reuse, threads, the caches, and compiling in a forked child."""

from __future__ import annotations

import copy
import os
import pickle
import signal
import threading
import time

import numpy as np
import pytest

import eqsat
from eqsat.backend import LoweringError, compile_module, cpu, emit_llvm
from eqsat.backend.entry import plan_module
from eqsat.backend.llvm_kernels import KernelBuilder, build_kernel
from eqsat.ir import DType, Stmt, parse

from cpu_helpers import assert_matches, compiled, run_both


# ---------------------------------------------------------------- calls, results, inputs


def test_calls_multiple_results_and_returned_params() -> None:
    m = parse("""module @m
func @g(%x: f64[4], %y: f64[4]) -> (f64[4], f64[4]) {
  %s = add %x, %y : f64[4]
  %d = sub %x, %y : f64[4]
  return %s, %d
}
func @f(%x: f64[4], %y: f64[4]) -> (f64[4], f64[4], f64[4], f64[2,2], f64[4]) {
  %a, %b = call @g(%x, %y) : f64[4], f64[4]
  %c, %d = call @g(%a, %b) : f64[4], f64[4]
  %r = reshape %c : f64[2,2]
  return %c, %x, %c, %r, %d
}""")
    x, y = np.arange(4.0), np.array([1.0, -2.0, 0.5, 3.0])
    exe = compile_module(m, cache_dir=None)
    got = exe.f(x, y)
    assert_matches(got, eqsat.interpret(m, "f", x, y), ulps=0)
    assert got[1] is not x and not np.shares_memory(got[0], got[2])
    assert_matches(exe("g", x, y), eqsat.interpret(m, "g", x, y), ulps=0)


def test_input_checking_and_fresh_outputs() -> None:
    exe = compiled("module @m\nfunc @f(%x: f32[2,3]) -> f32[3,2] {\n"
                   "  %t = transpose %x, perm=[1,0] : f32[3,2]\n  return %t\n}")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(eqsat.Error, match="shape"):
        exe.f(np.zeros((3, 2), np.float32))
    with pytest.raises(eqsat.Error, match="float64"):
        exe.f(x.astype(np.float64))
    with pytest.raises(eqsat.Error, match="argument"):
        exe.f(x, x)
    with pytest.raises(eqsat.Error, match="no function @g"):
        exe("g", x)
    with pytest.raises(eqsat.UnknownFunction, match="no function @g; it has @f"):
        exe.g  # an eqsat.Error and an AttributeError, so hasattr works:
    assert not hasattr(exe, "g") and getattr(exe, "g", None) is None and hasattr(exe, "f")
    wide = np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]  # not contiguous
    np.testing.assert_array_equal(exe.f(wide), wide.T)
    r1, r2 = exe.f(x), exe.f(x)
    assert r1 is not r2 and not np.shares_memory(r1, r2)
    # below runtime.STREAM_MIN a result is a plain array of its own (resize works); only a
    # result kernels may stream into is a view at a cache-line boundary
    assert r1.flags.owndata
    r1.resize(6)


MIXED = """module @m
func @f(%x: f32[2,3], %e: f32[0], %s: f64[]) -> (f32[3,2], f32[0], f64[], f32[]) {
  %t = transpose %x, perm=[1,0] : f32[3,2]
  %u = exp %t : f32[3,2]
  %n = neg %e : f32[0]
  %d = mul %s, %s : f64[]
  %k = sum %u, axes=[0,1] : f32[]
  return %u, %n, %d, %k
}"""


def test_every_input_form_runs_alike_through_exe_f_and_exe_call() -> None:
    """exe.f is the function's prepared entry and exe("f") dispatches to it: a call with
    arrays of exactly the parameter types takes a shorter path than any other input, and
    both paths must give the interpreter's results and the same errors."""
    m = parse(MIXED)
    exe = compile_module(m, cache_dir=None)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    e, s = np.zeros(0, np.float32), np.float64(1.5)
    frozen = x.copy()
    frozen.flags.writeable = False
    forms = {
        "exact": (x, e, np.array(s)),
        "read-only": (frozen, e, np.array(s)),
        "strided": (np.repeat(x, 2, axis=1)[:, ::2], e, np.array(s)),
        "fortran": (np.asfortranarray(x), e, np.array(s)),
        "lists": (x.tolist(), [], 1.5),
        "numpy scalar": (x, e, s),
        "byte-swapped": (x.astype(">f4"), e, np.array(s, ">f8")),
        "subclass": (x.view(np.matrix), e, np.array(s)),
    }
    want = eqsat.interpret(m, "f", x, e, s)
    for form, args in forms.items():
        for got in (exe.f(*args), exe("f", *args), exe.f(**dict(zip("xes", args)))):
            assert_matches(got, want, ulps=2)
            assert all(type(r) is np.ndarray for r in got), form
    bad = [((x.astype(np.float64), e, s), "float64"), ((x.T, e, s), "shape"),
           ((x, e), "argument"), ((x, e, s, s), "argument"), ((x, np.zeros(1, np.float32), s),
                                                             "shape")]
    for args, message in bad:
        for call in (exe.f, lambda *a: exe("f", *a)):
            with pytest.raises(eqsat.Error, match=message):
                call(*args)
    assert not frozen.flags.writeable and np.array_equal(frozen, x)  # inputs left as they were


def test_a_function_outlives_its_executable() -> None:
    """exe.f holds the machine code itself, so keeping it alone keeps it callable; it
    pickles as its module and name."""
    m = parse(MIXED.replace("@m", "@outlived"))
    exe = compile_module(m, cache_dir=None)
    f, want = exe.f, exe.f(np.ones((2, 3), np.float32), np.zeros(0, np.float32), 2.0)
    del exe
    got = f(np.ones((2, 3), np.float32), np.zeros(0, np.float32), 2.0)
    assert_matches(got, want, ulps=0)
    assert "@f" in repr(f) and "@outlived" in repr(f)
    assert_matches(pickle.loads(pickle.dumps(f))(np.ones((2, 3), np.float32), [], 2.0),
                   want, ulps=0)


def test_a_function_is_named_and_documented_as_the_ir_function() -> None:
    """exe.f had no __name__ (functools.wraps, logging and tracebacks of a pool.map(exe.f, ...)
    failed or said nothing) and its __doc__ was its class's; it is named as the IR function,
    a renamed one as it is in the module, and its doc states the signature."""
    def layers(scale: float) -> eqsat.TracedFunction:
        @eqsat.function
        def layer(x: eqsat.f32[2, 3], k: eqsat.f32[()]):
            return x * k * scale, x.sum(axis=1)

        return layer

    exe = compile_module(eqsat.Module(layers(1.0), layers(2.0)), cache_dir=None)
    assert exe.functions == ("layer", "layer_2")
    for name in exe.functions:
        f = getattr(exe, name)
        assert f.__name__ == f.__qualname__ == f.func.name == name
        assert f.__doc__.startswith(f"{name}(x: f32[2,3], k: f32[]) -> (f32[2,3], f32[2])\n")
        assert f"@{name} of module @main" in f.__doc__ and "a tuple of 2 arrays" in f.__doc__
        again = pickle.loads(pickle.dumps(f))
        assert (again.__name__, again.__doc__) == (f.__name__, f.__doc__)
    one = compile_module(parse("module @m\nfunc @g(%a: i32[4]) -> i32[4] {\n  return %a\n}"),
                         cache_dir=None).g
    assert one.__doc__.startswith("g(a: i32[4]) -> i32[4]\n")
    assert "returns one array" in one.__doc__ and "for the cpu target" in one.__doc__


def test_small_calls_from_many_threads_get_their_own_results() -> None:
    """Each call packs its own pointer arrays and each thread has its own scratch arena: calls
    that release the GIL at once never see another call's inputs, outputs or intermediates."""
    m = parse("""module @m
func @f(%x: f32[64], %y: f32[64]) -> (f32[64], f32[]) {
  %a = mul %x, %y : f32[64]
  %b = exp %a : f32[64]
  %c = sum %b, axes=[0] : f32[]
  %d = add %b, %x : f32[64]
  return %d, %c
}""")
    exe = compile_module(m, cache_dir=None)
    inputs = [(np.full(64, k / 8, np.float32), np.linspace(-1, 1, 64, dtype=np.float32))
              for k in range(6)]
    wants = [exe.f(*args) for args in inputs]
    failures: list[int] = []

    def work(k: int) -> None:
        for _ in range(2000):
            got = exe.f(*inputs[k]) if k % 2 else exe("f", *inputs[k])
            if not all(np.array_equal(g, w) for g, w in zip(got, wants[k])):
                failures.append(k)
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_executables_pickle_and_copy() -> None:
    """An executable goes to a worker process (multiprocessing pickles it) or through
    copy.deepcopy as its module, compiled again there; ctypes pointers refused pickling."""
    exe = eqsat.compile(eqsat.parse("func @f(%x: f32[3]) -> f32[3] {\n  %y = exp %x : f32[3]\n"
                                    "  return %y\n}"), optimize=False)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    for copied in (pickle.loads(pickle.dumps(exe)), copy.deepcopy(exe), copy.copy(exe)):
        assert copied.module == exe.module and copied.key == exe.key
        np.testing.assert_array_equal(copied.f(x), exe.f(x))
    # `pool.map(exe.f, batches)` pickles the function: it was a lambda (AttributeError)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(exe.f))(x), exe.f(x))


def test_gradient_declarations_are_refused() -> None:
    m = parse("module @m\nfunc @f(%x: f32[]) -> f32[] {\n  %y = mul %x, %x : f32[]\n"
              "  return %y\n}\nfunc @g = grad @f wrt %x")
    with pytest.raises(eqsat.Error, match="differentiate"):
        compile_module(m, cache_dir=None)


def test_dispatcher_names_the_op_it_cannot_lower() -> None:
    from llvmlite import ir

    s = Stmt(("r",), "call", ("x",), (("callee", "g"),), (DType.f32[2],))
    with pytest.raises(LoweringError, match="'call'"):
        build_kernel(KernelBuilder(ir.Module()), s, [DType.f32[2]])


# ---------------------------------------------------------------- generated code


CHAIN = """module @m
func @f(%x: f32[4096], %w: f32[4096], %b: f32[4096]) -> f32[4096] {
  %0 = mul %x, %w : f32[4096]
  %1 = add %0, %b : f32[4096]
  %2 = tanh %1 : f32[4096]
  %3 = sigmoid %x : f32[4096]
  %4 = mul %2, %3 : f32[4096]
  %5 = sum %4, axes=[0] : f32[]
  %6 = broadcast %5 : f32[4096]
  %7 = div %4, %6 : f32[4096]
  return %7
}"""


def test_llvm_ir_is_vectorized() -> None:
    text = emit_llvm(parse(CHAIN))
    assert "define void @\"eqsat.fn.f\"" in text or "define void @eqsat.fn.f" in text
    assert "<16 x float>" in text or "<8 x float>" in text
    assert "fadd reassoc" in text  # the sum's vector accumulator
    assert "@tanhf" not in text and "@llvm.tanh" not in text  # no scalar libm in the loop


def test_arena_reuses_dead_buffers() -> None:
    # Larger than entry.KEEP_SMALL: small buffers are deliberately never reused.
    lines = [f"  %{i + 1} = exp %{i if i else 'x'} : f64[40000]" for i in range(10)]
    text = ("module @m\nfunc @f(%x: f64[40000]) -> f64[40000] {\n" + "\n".join(lines)
            + "\n  return %10\n}")
    m = parse(text)
    plan = plan_module(m)["f"]
    assert plan.arena_bytes <= 2 * 320064  # ten intermediates, two buffers in turn
    got, want = run_both(m, "f", np.linspace(-1, 1, 40000))
    assert_matches(got, want, ulps=8)


def test_threads_split_large_kernels_without_wrong_answers() -> None:
    m = parse("""module @m
func @f(%x: f32[1024,2048], %y: f32[1024,2048], %a: i32[512,64], %b: i32[64,64]) -> (f32[1024,2048], f32[1024], f32[2048,1024], i32[512,64]) {
  %m = mul %x, %y : f32[1024,2048]
  %s = sum %m, axes=[1] : f32[1024]
  %t = transpose %m, perm=[1,0] : f32[2048,1024]
  %p = matmul %a, %b : i32[512,64]
  return %m, %s, %t, %p
}""")
    assert "eqsat_parallel" in emit_llvm(m)  # the thread pool (parallel.py)
    rng = np.random.default_rng(4)
    args = [rng.standard_normal((1024, 2048)).astype(np.float32) for _ in range(2)]
    args += [rng.integers(-100, 100, s).astype(np.int32) for s in ((512, 64), (64, 64))]
    exe = compile_module(m, cache_dir=None)
    want = eqsat.interpret(m, "f", *args)
    results: list = [None] * 3

    def work(i: int) -> None:
        results[i] = exe.f(*args)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        # The row sums of 2048 products cancel: an absolute tolerance scaled to their terms.
        assert_matches(got, want, ulps=8, rtol=1e-5, atol=1e-2)


# ---------------------------------------------------------------- caches


def test_disk_cache_hit_is_faster(tmp_path) -> None:
    m = parse(CHAIN.replace("4096", "4097"))
    cpu._memory.pop(cpu.cache_key(m), None)
    t0 = time.perf_counter()
    exe1 = compile_module(m, cache_dir=tmp_path)
    cold = time.perf_counter() - t0
    assert list(tmp_path.glob("*.o"))
    cpu._memory.pop(cpu.cache_key(m), None)
    t0 = time.perf_counter()
    exe2 = compile_module(m, cache_dir=tmp_path)
    warm = time.perf_counter() - t0
    assert warm < cold
    x = np.linspace(-2, 2, 4097, dtype=np.float32)
    np.testing.assert_array_equal(exe1.f(x, x, x), exe2.f(x, x, x))
    t0 = time.perf_counter()
    compile_module(m, cache_dir=tmp_path)  # the memory cache
    assert time.perf_counter() - t0 < warm + 0.01


@pytest.mark.parametrize("lock", ["compile", "llvmlite"])
def test_a_child_forked_while_another_thread_compiles_can_compile(lock: str) -> None:
    """A child forked while another thread held the compile lock (or llvmlite's, freeing an
    engine) inherited it held by no thread: its first eqsat.compile hung for good (a
    multiprocessing pool started beside a compiling thread). Fork now waits for both."""
    import llvmlite.binding as llvm

    held_lock = cpu._lock if lock == "compile" else llvm.ffi.lib._lock
    m = parse(f"module @forked_{lock}\nfunc @f(%x: f32[4]) -> f32[4] {{\n"
              "  %y = sqrt %x : f32[4]\n  return %y\n}")
    held = threading.Event()

    def compiling() -> None:
        with held_lock:
            held.set()
            time.sleep(0.3)

    t = threading.Thread(target=compiling)
    t.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        signal.alarm(20)
        x = np.array([0.0, 1.0, 4.0, 9.0], np.float32)
        ok = np.array_equal(compile_module(m, cache_dir=None).f(x), np.sqrt(x))
        os._exit(0 if ok else 3)
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_dir_lists_the_functions():
    exe = eqsat.compile(eqsat.parse("func @first(%x: f32[2]) -> f32[2] {\n  %y = neg %x : f32[2]\n"
                                    "  return %y\n}"), optimize=False)
    assert "first" in dir(exe) and "functions" in dir(exe)
