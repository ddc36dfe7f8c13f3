"""Correctness of the CPU backend's performance machinery against the interpreter: row-chunked
kernel groups (chunks.py), the arena rules they rely on, and threads over odd sizes. No timing
assertions: the benchmarks in bench/ measure speed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.backend import chunks, compile_module, cpu, entry
from eqsat.backend.cpu import lower
from eqsat.ir import parse

SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def softmax_text(r: int, c: int, dtype: str = "f32") -> str:
    t, red, kd = f"{dtype}[{r},{c}]", f"{dtype}[{r}]", f"{dtype}[{r},1]"
    return f"""module @m
func @f(%x: {t}) -> {t} {{
  %m = map_reduce %x, body=$0, reduce=max, axes=[1] : {red}
  %m1 = reshape %m : {kd}
  %s = map_reduce %x, %m1, body=exp(sub($0, $1)), reduce=sum, axes=[1] : {red}
  %r = map %s, body=recip($0) : {red}
  %r1 = reshape %r : {kd}
  %y = map %x, %m1, %r1, body=mul(exp(sub($0, $1)), $2) : {t}
  return %y
}}
"""


def layernorm_core_text(r: int, c: int) -> str:
    t, kd = f"f64[{r},{c}]", f"f64[{r},1]"
    return f"""module @m
func @f(%x: {t}, %g: f64[{c}]) -> ({t}, f64[{r}]) {{
  %s = sum %x, axes=[1] : f64[{r}]
  %s1 = reshape %s : {kd}
  %n = const {float(c)} : {kd}
  %mu = div %s1, %n : {kd}
  %mub = broadcast %mu : {t}
  %d = sub %x, %mub : {t}
  %d2 = mul %d, %d : {t}
  %v = sum %d2, axes=[1] : f64[{r}]
  %v1 = reshape %v : {kd}
  %ve = div %v1, %n : {kd}
  %rs = rsqrt %ve : {kd}
  %rb = broadcast %rs : {t}
  %y0 = mul %d, %rb : {t}
  %gb = broadcast %g : {t}
  %y = mul %y0, %gb : {t}
  return %y, %v
}}
"""


def check(text: str, *args: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> str:
    """Compile, compare every result with the interpreter, return the unoptimized LLVM IR."""
    m = parse(text)
    got = compile_module(m, cache_dir=None)("f", *args)
    want = eqsat.interpret(m, "f", *args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return lower(m)[0]


def test_row_kernels_run_as_one_chunked_group(fresh) -> None:
    fresh(1, 1 << 22)
    x = np.random.default_rng(0).standard_normal((300, 77)).astype(np.float32)
    text = check(softmax_text(300, 77), x)
    entry = text.split('define void @"eqsat.fn.f"')[1].split("\n}\n")[0]
    assert entry.count("chunked") == 1 and "map_reduce" not in entry


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chunked_groups_split_over_threads_with_odd_sizes(fresh, threads: int) -> None:
    fresh(threads, 0)  # every kernel threaded, however small
    rng = np.random.default_rng(threads)
    for r, c in [(1, 1), (2, 3), (17, 1), (1, 513), (129, 1031)]:
        x = rng.standard_normal((r, c)).astype(np.float32) * 10
        check(softmax_text(r, c), x)


def test_core_ops_of_different_extents_group_together(fresh) -> None:
    fresh(2, 0)
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((67, 45)), rng.standard_normal(45)
    text = check(layernorm_core_text(67, 45), x, g, rtol=1e-9)
    assert "chunked" in text  # broadcasts (67 rows) and elementwise ops (67*45) in one group


def test_unaligned_consumers_are_not_chunked(fresh) -> None:
    """A transpose reads every row of its operand, a slice starts mid-buffer: neither may run
    inside a group with its producer."""
    fresh(2, 0)
    text = """module @m
func @f(%x: f32[40,40]) -> f32[40,40] {
  %e = exp %x : f32[40,40]
  %t = transpose %e, perm=[1,0] : f32[40,40]
  %u = add %t, %x : f32[40,40]
  %s = slice %u, start=[1,0], stop=[40,40] : f32[39,40]
  %z = const 0.0 : f32[1,40]
  %c = concat %z, %s, axis=0 : f32[40,40]
  %y = mul %c, %u : f32[40,40]
  return %y
}
"""
    x = np.random.default_rng(2).standard_normal((40, 40)).astype(np.float32)
    check(text, x)


def test_arena_reuse_inside_a_run_of_kernels(fresh) -> None:
    """Large intermediates reuse dead buffers; kernels sharing memory must not be chunked
    together (a later kernel would overwrite rows an earlier one has yet to read)."""
    fresh(2, 0)
    n = 300  # 300x300 f64 = 720 kB, above entry.KEEP_SMALL
    lines = ["%a = exp %x", "%b = sin %a", "%c = cos %b", "%d = add %c, %a",
             "%e = mul %d, %b", "%f = sub %e, %c"]
    body = "".join(f"  {s} : f64[{n},{n}]\n" for s in lines)
    text = f"module @m\nfunc @f(%x: f64[{n},{n}]) -> f64[{n},{n}] {{\n{body}  return %f\n}}\n"
    x = np.random.default_rng(3).standard_normal((n, n))
    check(text, x, rtol=1e-9)


def test_chunk_smaller_than_a_row(fresh, monkeypatch) -> None:
    fresh(2, 0)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1)  # one row per chunk
    x = np.random.default_rng(4).standard_normal((33, 70)).astype(np.float32)
    check(softmax_text(33, 70), x)


@SETTINGS
@given(r=st.integers(1, 90), c=st.integers(1, 90), threads=st.integers(1, 3),
       chunk=st.sampled_from([1, 256, 1 << 17]))
def test_random_row_shapes(fresh, monkeypatch, r: int, c: int, threads: int, chunk: int) -> None:
    fresh(threads, 0)
    monkeypatch.setattr(cpu, "_memory", {})
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk)
    rng = np.random.default_rng(r * 100 + c)
    check(layernorm_core_text(r, c), rng.standard_normal((r, c)) + 3, rng.standard_normal(c),
          rtol=1e-9)


def softmax_opt_text(r: int, c: int, dtype: str = "f32", out: str = "") -> str:
    """The optimizer's softmax: exp(x - m) both summed and divided (reuse.py shares it)."""
    t, red, kd = f"{dtype}[{r},{c}]", f"{dtype}[{r}]", f"{dtype}[{r},1]"
    return f"""module @m
func @f(%x: {t}) -> {t} {{
  %m = max %x, axes=[1] : {red}
  %m1 = reshape %m : {kd}
  %s = map_reduce %x, %m1, body=exp(sub($0, $1)), reduce=sum, axes=[1] : {red}
  %s1 = reshape %s : {kd}
  %y = map %x, %m1, %s1, body=div(exp(sub($0, $1)), $2) : {t}
  {out or "return %y"}
}}
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_reduction_shares_its_elements_with_the_map(fresh, threads: int) -> None:
    fresh(threads, 0)
    rng = np.random.default_rng(5)
    for r, c in [(1, 1), (3, 17), (129, 1031)]:
        for dtype in ("f32", "f64"):
            x = (rng.standard_normal((r, c)) * 10).astype(dtype.replace("f", "float"))
            text = check(softmax_opt_text(r, c, dtype), x)
            assert "map_reduce_keeping" in text and "map_reduce\"" not in text
            assert text.count("@\"eqsat.exp.") <= 2  # the definition and one call


@pytest.mark.parametrize("threads", [1, 2])
def test_sharing_across_the_reciprocal_of_the_sums(fresh, threads: int) -> None:
    """The optimizer's softmax multiplies by the reciprocal of the sums, computed between the
    reduction and the map: the exp is still computed once, the whole softmax one group."""
    fresh(threads, 0)
    x = np.random.default_rng(8).standard_normal((129, 1031)).astype(np.float32) * 10
    text = check(softmax_text(129, 1031), x)
    assert "map_reduce_keeping" in text and text.count("@\"eqsat.exp.") <= 2
    fn = text.split('define void @"eqsat.fn.f"')[1].split("\n}\n")[0]
    assert fn.count("chunked") == 1


def test_no_sharing_over_a_buffer_read_in_between(fresh) -> None:
    """The map's buffer reuses that of %t, read between the reduction and the map: the
    reduction must not write the map's elements early (it would overwrite %t)."""
    fresh(1, 1 << 30)
    text = """module @m
func @f(%x: f64[300,300], %w: f64[300,300]) -> f64[300,300] {
  %t = mul %w, %w : f64[300,300]
  %m = max %x, axes=[1] : f64[300]
  %m1 = reshape %m : f64[300,1]
  %s = map_reduce %x, %m1, body=exp(sub($0, $1)), reduce=sum, axes=[1] : f64[300]
  %u = sum %t, axes=[1] : f64[300]
  %u1 = reshape %u : f64[300,1]
  %s1 = reshape %s : f64[300,1]
  %y = map %x, %m1, %s1, %u1, body=div(exp(sub($0, $1)), add($2, $3)) : f64[300,300]
  %z = add %y, %x : f64[300,300]
  return %z
}
"""
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((300, 300)), rng.standard_normal((300, 300)) + 5
    plan = entry.plan_function(parse(text).functions[0], {})
    assert plan.where["y"] == plan.where["t"]  # the hazard this test is about
    assert "map_reduce_keeping" not in check(text, x, w, rtol=1e-9)


def test_sharing_into_an_arena_buffer(fresh) -> None:
    """The map's result lives in the arena (then is used again): still correct."""
    fresh(2, 0)
    x = np.random.default_rng(6).standard_normal((300, 300))
    text = softmax_opt_text(300, 300, "f64", out="%z = add %y, %x : f64[300,300]\n  return %z")
    assert "map_reduce_keeping" in check(text, x, rtol=1e-9)


def test_no_sharing_when_the_map_has_another_shape(fresh) -> None:
    fresh(1, 1 << 22)
    text = """module @m
func @f(%x: f32[8,5], %v: f32[5]) -> f32[5] {
  %s = map_reduce %x, %v, body=exp(sub($0, $1)), reduce=sum, axes=[0] : f32[5]
  %y = map %v, %s, body=add(exp(sub($0, $1)), $1) : f32[5]
  return %y
}
"""
    rng = np.random.default_rng(7)
    ir_text = check(text, rng.standard_normal((8, 5)).astype(np.float32),
                    rng.standard_normal(5).astype(np.float32))
    assert "map_reduce_keeping" not in ir_text


@pytest.mark.parametrize("threads", [1, 3])
def test_streamed_results(fresh, monkeypatch, threads: int) -> None:
    """Large results of memory-bound kernels go out through a tile and non-temporal stores:
    odd row lengths, unaligned heads and tails, flat lengths with and without a tile divisor."""
    fresh(threads, 0)
    monkeypatch.setattr(entry, "STREAM_MIN", 1)
    rng = np.random.default_rng(8)
    for r, c in [(1, 1), (3, 7), (5, 4099), (64, 4096), (2, 8192), (1, 8191)]:
        for dtype in ("f32", "f64"):
            t = f"{dtype}[{r},{c}]"
            text = f"""module @m
func @f(%x: {t}, %g: {dtype}[{c}]) -> ({t}, {t}) {{
  %y = map %x, %g, body=add(mul($0, $1), 1.5) : {t}
  %z = add %x, %x : {t}
  return %y, %z
}}
"""
            x = rng.standard_normal((r, c)).astype(dtype.replace("f", "float"))
            g = rng.standard_normal(c).astype(x.dtype)
            ir_text = check(text, x, g)
            assert "stream_copy" in ir_text or c * r > 4096 and c % 4096 and c > 4096


def test_no_streaming_for_compute_bound_or_reread_results(fresh, monkeypatch) -> None:
    fresh(1, 1 << 22)
    monkeypatch.setattr(entry, "STREAM_MIN", 1)
    text = """module @m
func @f(%x: f32[64,64]) -> (f32[64,64], f32[64,64]) {
  %e = map %x, body=tanh($0) : f32[64,64]
  %y = map %e, body=log(add($0, 2.0)) : f32[64,64]
  return %e, %y
}
"""
    x = np.random.default_rng(9).standard_normal((64, 64)).astype(np.float32)
    assert "stream_copy" not in check(text, x)


def test_transposes_read_in_place_by_blas(fresh) -> None:
    """Attention's head split: transposes feeding only BLAS matmuls are never materialized
    (gemm's flags and leading dimensions read them); the sources stay alive until then."""
    fresh(2, 0)
    text = """module @m
func @f(%x: f32[2,64,4,64], %y: f32[2,64,4,64], %w: f32[256,256]) -> (f32[2,4,64,64], f32[128,256]) {
  %q = transpose %x, perm=[0,2,1,3] : f32[2,4,64,64]
  %k = transpose %y, perm=[0,2,3,1] : f32[2,4,64,64]
  %x2 = reshape %x : f32[128,256]
  %big = matmul %x2, %w : f32[128,256]
  %e = exp %big : f32[128,256]
  %s = matmul %q, %k : f32[2,4,64,64]
  %wt = transpose %w, perm=[1,0] : f32[256,256]
  %z = matmul %e, %wt : f32[128,256]
  return %s, %z
}
"""
    rng = np.random.default_rng(10)
    args = [rng.standard_normal((2, 64, 4, 64)).astype(np.float32),
            rng.standard_normal((2, 64, 4, 64)).astype(np.float32),
            rng.standard_normal((256, 256)).astype(np.float32) * 0.05]
    ir_text = check(text, *args, rtol=1e-4)
    assert "matmul_viewed" in ir_text and ".transpose" not in ir_text


def test_transposes_with_other_users_are_materialized(fresh) -> None:
    fresh(1, 1 << 22)
    text = """module @m
func @f(%x: f32[64,64]) -> (f32[64,64], f32[64,64]) {
  %t = transpose %x, perm=[1,0] : f32[64,64]
  %p = matmul %x, %t : f32[64,64]
  return %p, %t
}
"""
    x = np.random.default_rng(11).standard_normal((64, 64)).astype(np.float32)
    assert ".transpose" in check(text, x, rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blas_products_split_over_threads(fresh, threads: int) -> None:
    """A lone product (odd row counts, transposed operands, an epilogue) runs on the BLAS's own
    threads; whole batches run on ours, each calling the BLAS on one thread."""
    fresh(threads, 0)
    rng = np.random.default_rng(12)
    for m in (129, 300):
        text = f"""module @m
func @f(%a: f32[{m},96], %bt: f32[80,96], %c: f32[80], %x: f32[6,70,64], %y: f32[6,64,70]) -> (f32[{m},80], f32[6,70,70]) {{
  %p = matmul_epi %a, %bt, %c, ta=0, tb=1, body=relu(add($0, $1)) : f32[{m},80]
  %q = matmul %x, %y : f32[6,70,70]
  return %p, %q
}}
"""
        args = [rng.standard_normal(s).astype(np.float32)
                for s in [(m, 96), (80, 96), (80,), (6, 70, 64), (6, 64, 70)]]
        # Sums of 64-96 f32 products of unit normals: the BLAS's kernel and numpy's may add in
        # different orders, so results near zero differ by a few 1e-6 absolute.
        check(text, *args, rtol=1e-4, atol=5e-5)


def test_cached_blas_code_loads_without_scipy_linalg(tmp_path) -> None:
    """A cached compile binds the BLAS symbols from a wheel's bundled OpenBLAS by path: no
    scipy.linalg import (a few hundred milliseconds) on the way."""
    pytest.importorskip("scipy")
    script = f"""
import sys
import numpy as np
from eqsat.ir import parse
from eqsat.backend import compile_module
m = parse('''module @m
func @f(%a: f32[96,96], %b: f32[96,96]) -> f32[96,96] {{
  %c = matmul %a, %b : f32[96,96]
  return %c
}}
''')
a = np.arange(96 * 96, dtype=np.float32).reshape(96, 96) / 9216
got = compile_module(m, cache_dir={str(tmp_path)!r}).f(a, a)
assert np.allclose(got, a @ a, rtol=1e-4), "wrong product"
print("scipy.linalg" in sys.modules)
"""
    for _ in range(2):  # cold, then from the disk cache
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True).stdout.split()
        assert out[-1] == "False"


POOL_TEXT = """module @m
func @f(%x: f32[512,1024], %y: f32[512,1024]) -> f32[512] {
  %m = mul %x, %y : f32[512,1024]
  %s = sum %m, axes=[1] : f32[512]
  return %s
}
"""


def test_pool_serves_concurrent_callers(fresh) -> None:
    """Several Python threads calling threaded kernels at once: one holds the pool, the others
    run their shares on their own thread; every answer is right."""
    import threading
    fresh(3, 0)
    m = parse(POOL_TEXT)
    exe = compile_module(m, cache_dir=None)
    rng = np.random.default_rng(13)
    inputs = [[rng.standard_normal((512, 1024)).astype(np.float32) for _ in range(2)]
              for _ in range(4)]
    wants = [eqsat.interpret(m, "f", *args) for args in inputs]
    errors: list[str] = []

    def work(k: int) -> None:
        for _ in range(20):
            if not np.allclose(exe("f", *inputs[k]), wants[k], rtol=1e-4, atol=1e-3):
                errors.append(f"caller {k}: wrong sums")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_pool_rebuilt_in_forked_child() -> None:
    """A forked child has no pool workers (fork copies only the calling thread): the pool starts
    anew there instead of waiting forever on workers that do not exist."""
    script = f"""
import os, sys
import numpy as np
from eqsat.ir import parse
from eqsat.backend import compile_module, parallel
parallel.THREADS, parallel.PARALLEL_MIN_WORK = 2, 0
exe = compile_module(parse({POOL_TEXT!r}), cache_dir=None)
x = np.linspace(-1, 1, 512 * 1024, dtype=np.float32).reshape(512, 1024)
want = (x * x).sum(axis=1)
assert np.allclose(exe("f", x, x), want, rtol=1e-4)
pid = os.fork()
if pid == 0:
    os._exit(0 if np.allclose(exe("f", x, x), want, rtol=1e-4) else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out[-1] == "0"


def test_blas_integer_width_names_the_symbols() -> None:
    """Code built for a 64-bit-integer BLAS calls differently named gemms than code for a
    32-bit one, so cached objects never link to a BLAS of the other width."""
    from eqsat.backend import blas
    from eqsat.ir.types import DType
    if not blas.available():
        pytest.skip("no host BLAS")
    sym = blas.gemm_symbol(DType.f32)
    assert sym in blas.addresses()
    assert sym.endswith(blas.ILP64_SUFFIX) == (blas.int_type().width == 64)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_compute_bound_loops_interleave_vectors_and_stay_exact(dtype):
    """A long body waits on latency with one vector in flight, so compute-bound kernels ask
    LLVM for four side by side (loops.interleaved); cheap ones leave it to LLVM. Results must
    not change, remainders included (1003 is no multiple of any vector width)."""
    t = f"{dtype}[3,1003]"
    bodies = {"tanh(exp($0))": True, "mul(add($0, 1.0), $0)": False}
    for body, interleaved in bodies.items():
        m = parse(f"module @m\nfunc @f(%x: {t}) -> {t} {{\n"
                  f"  %y = map %x, body={body} : {t}\n  return %y\n}}\n")
        text, _ = lower(m)
        assert ('!"llvm.loop.interleave.count", i32 4' in text) == interleaved, body
        x = np.random.default_rng(0).uniform(-2, 2, (3, 1003)).astype(dtype.replace("f", "float"))
        np.testing.assert_allclose(compile_module(m).f(x), eqsat.interpret(m, "f", x),
                                   rtol=1e-5 if dtype == "f32" else 1e-12)
    single = parse(f"module @m\nfunc @f(%x: {t}) -> {t} {{\n  %y = sin %x : {t}\n  return %y\n}}\n")
    assert '!"llvm.loop.interleave.count", i32 4' in lower(single)[0]



def test_only_results_kernels_may_stream_into_are_cache_line_aligned(fresh, monkeypatch):
    """Streamed rows start at a cache line when the result does (no unaligned head); every
    other result is a plain array of its own, ~1.4 us cheaper a call to allocate."""
    from eqsat.backend import runtime

    monkeypatch.setattr(runtime, "STREAM_MIN", 4096)
    monkeypatch.setattr(entry, "STREAM_MIN", 4096)
    text = """module @m
func @f(%x: f32[33,65]) -> (f32[33,65], f32[3]) {
  %y = map %x, body=add(mul($0, 2.0), 1.5) : f32[33,65]
  %s = slice %x, start=[0,0], stop=[1,3] : f32[1,3]
  %r = reshape %s : f32[3]
  return %y, %r
}
"""
    x = np.random.default_rng(4).standard_normal((33, 65)).astype(np.float32)
    y, r = compile_module(parse(text), cache_dir=None).f(x)
    np.testing.assert_array_equal(y, x * 2 + 1.5)
    np.testing.assert_array_equal(r, x[0, :3])
    assert y.ctypes.data % 64 == 0 and not y.flags.owndata
    assert r.flags.owndata
