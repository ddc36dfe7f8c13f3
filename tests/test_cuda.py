"""The CUDA backend: PTX for every model and random program assembles with ptxas (sm_90),
carries the code shapes we designed for (CHECK-style), runs like `interpret` on a GPU (tests
marked gpu), and fails with a clean eqsat.Error where there is no GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import eqsat
from eqsat.ad import differentiate
from eqsat.backend import cuda, cuda_runtime
from eqsat.backend import nvptx_target as T
from eqsat.backend.nvptx_kernels import GpuKernelBuilder
from eqsat.testing import inputs, modules

EXAMPLES = Path(eqsat.__file__).parent / "examples"
GPU = cuda_runtime.gpu_available()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not GPU, reason="no GPU: " + str(cuda_runtime.gpu_unavailable()))


def assemble(ptx: str, tmp_path: Path, name: str = "m") -> None:
    """ptxas -arch=sm_90 accepts the PTX (skips cleanly without ptxas)."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas is not on PATH")
    path = tmp_path / f"{name}.ptx"
    path.write_text(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90", "-o", "/dev/null", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"ptxas rejected {name}:\n{r.stderr[:3000]}"


def example(name: str) -> eqsat.Module:
    return differentiate(eqsat.parse((EXAMPLES / f"{name}.eqir").read_text()))


def one(text: str) -> eqsat.Module:
    return eqsat.parse("module @t\n" + text)


def kernel_text(ptx: str, name_part: str) -> str:
    """The PTX of the first kernel whose entry name contains `name_part`."""
    start = ptx.rindex(".entry", 0, ptx.index(f"_{name_part}("))
    end = ptx.find(".entry", start + 1)
    return ptx[start: end if end > 0 else len(ptx)]


# ---------------------------------------------------------------- ptxas on every model


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_examples_assemble(name, tmp_path):
    ptx = cuda.emit_ptx(example(name))
    assert ".target sm_90" in ptx
    assemble(ptx, tmp_path, name)


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(m=modules(max_functions=2, max_stmts=6))
def _lower_random(kb, m):
    for f in m.functions:
        cuda.plan_function(m, f, kb)


def test_random_programs_assemble(tmp_path):
    # Every drawn program's kernels go into one NVPTX module: one O3 run and one ptxas call.
    llmod = T.new_module("fuzz")
    kb = GpuKernelBuilder(llmod)
    _lower_random(kb)
    assert kb.count > 80
    assemble(T.to_ptx(llmod), tmp_path, "fuzz")


SHAPES = """
func @f(%x: f32[256,512], %y: f32[256,512], %b: f32[512], %w: f32[512,96], %v: f64[96,40],
        %k: i32[48,64], %c: bool[256,512]) -> (f32[256,512], f32[256], f32[512], f32[],
        f32[512,256], f32[256,96], f32[96,256], f32[4,96,128], f64[40], i32[64,48], f32[256,1024],
        f32[256,512], f32[256,96], i64[48,64], f32[256,512]) {
  %bb = broadcast %b : f32[256,512]
  %e = map %x, %y, %b, body=tanh(add(mul($0, $1), $2)) : f32[256,512]
  %rows = map_reduce %x, %y, body=mul(sub($0, $1), sub($0, $1)), reduce=sum, axes=[1] : f32[256]
  %cols = sum %x, axes=[0] : f32[512]
  %all = max %e, axes=[0,1] : f32[]
  %t = transpose %x, perm=[1,0] : f32[512,256]
  %mm = matmul %x, %w : f32[256,96]
  %mt = matmul_t %w, %x, ta=1, tb=1 : f32[96,256]
  %r3 = reshape %x : f32[4,64,512]
  %w3 = reshape %w : f32[4,128,96]
  %sl = slice %r3, start=[0,0,0], stop=[4,64,128] : f32[4,64,128]
  %bm = matmul %sl, %w3 : f32[4,64,96]
  %p = transpose %bm, perm=[0,2,1] : f32[4,96,64]
  %q = concat %p, %p, axis=2 : f32[4,96,128]
  %vs = sum %v, axes=[0] : f64[40]
  %kt = transpose %k, perm=[1,0] : i32[64,48]
  %cc = concat %x, %y, axis=1 : f32[256,1024]
  %sel = select %c, %x, %bb : f32[256,512]
  %b2 = const 0.5 : f32[96]
  %ep = matmul_epi %x, %w, %b2, ta=0, tb=0, body=relu(add($0, $1)) : f32[256,96]
  %ki = cast %k : i64[48,64]
  %ex = exp %x : f32[256,512]
  return %e, %rows, %cols, %all, %t, %mm, %mt, %q, %vs, %kt, %cc, %sel, %ep, %ki, %ex
}
"""


def test_degenerate_transposes_assemble(tmp_path):
    # rank 0 and size-1 axes: nothing moves, so no tiles (found by the random-program test)
    m = one("""func @f(%x: f32[], %y: f32[1,5], %z: f32[0,3]) -> (f32[], f32[5,1], f32[3,0]) {
  %a = transpose %x, perm=[] : f32[]
  %b = transpose %y, perm=[1,0] : f32[5,1]
  %c = transpose %z, perm=[1,0] : f32[3,0]
  return %a, %b, %c
}""")
    assemble(cuda.emit_ptx(m), tmp_path)


@pytest.fixture(scope="module")
def shapes_module():
    return one(SHAPES)


@pytest.fixture(scope="module")
def shapes_ptx(shapes_module):
    return cuda.emit_ptx(shapes_module)


def test_designed_kernels_assemble(shapes_ptx, tmp_path):
    assemble(shapes_ptx, tmp_path, "shapes")


# ---------------------------------------------------------------- CHECK-style assertions


# LLVM 22 spells 16-byte float accesses `ld.global.nc.v4.b32` (read-only path), older ones
# `ld.global.v4.f32`.
V4_LOAD = re.compile(r"ld\.global(\.nc)?\.v4\.(f32|b32)")
V4_STORE = re.compile(r"st\.global\.v4\.(f32|b32)")


def test_aligned_elementwise_is_vectorized(shapes_ptx):
    k = kernel_text(shapes_ptx, "map")
    assert V4_LOAD.search(k) and V4_STORE.search(k)
    assert "tanh" not in k and "call" not in k  # our own tanh, inlined
    assert V4_LOAD.search(kernel_text(shapes_ptx, "exp"))
    # the bool mask: 4 bytes at once beside the f32 vectors
    assert re.search(r"ld\.global(\.nc)?\.(v4\.u8|u32|b32)", kernel_text(shapes_ptx, "select"))


def test_unaligned_elementwise_stays_scalar():
    ptx = cuda.emit_ptx(one("func @f(%x: f32[3,7]) -> f32[3,7] {\n"
                            "  %y = neg %x : f32[3,7]\n  return %y\n}"))
    assert ".v4." not in ptx and re.search(r"ld\.global(\.nc)?\.(f32|b32)", ptx)


def test_reductions_use_warp_shuffles(shapes_ptx):
    rows = kernel_text(shapes_ptx, "map_reduce")
    assert "shfl.sync.down.b32" in rows and "bar.sync" not in rows  # a warp per row
    whole = kernel_text(shapes_ptx, "max")
    assert "shfl.sync.down.b32" in whole and ".shared" in whole and "bar.sync" in whole
    assert "shfl.sync" not in kernel_text(shapes_ptx, "sum")  # columns: a thread per output


def test_matmul_is_tiled_through_shared_memory(shapes_ptx):
    for part in ("matmul", "matmul_t", "matmul_epi"):
        k = kernel_text(shapes_ptx, part)
        assert ".shared" in k and "bar.sync" in k and "fma.rn.f32" in k, part
        assert re.search(r"ld\.shared\.(f32|b32)", k)
    # the relu epilogue: a max, or (numpy's tie rule for -0/+0) a float compare and select
    epi = kernel_text(shapes_ptx, "matmul_epi")
    assert re.search(r"\bmax(\.NaN)?\.f32|\bsetp\.[a-z]+\.f32", epi)


def test_transposes_go_through_shared_tiles(shapes_ptx):
    assert ".shared" in kernel_text(shapes_ptx, "transpose_tiled")
    assert shapes_ptx.count("_transpose_tiled(") >= 3  # f32 2-D, batched f32, i32


def test_launch_plan_is_described(shapes_ptx):
    head = shapes_ptx.split(".version")[0]
    assert "// @f:" in head and "grid=" in head and "block=(256, 1, 1)" in head
    assert "block=(32, 8, 1)" in head  # the tiled transposes


def test_calls_are_inlined_and_reshapes_are_views():
    prog = cuda.build(example("mlp"))
    loss = prog.plans["loss"]
    assert not any(ln.kernel.name.endswith("_call") for ln in loss.launches)
    assert len(loss.launches) == 9  # predict's 4 + loss's own 5
    r = one("func @f(%x: f32[4,8]) -> f32[32] {\n  %y = reshape %x : f32[32]\n"
            "  %z = neg %y : f32[32]\n  return %z\n}")
    plan = cuda.build(r).plans["f"]
    assert [ln.kernel.name for ln in plan.launches] == ["k1_neg"]


def test_inlined_call_values_keep_their_own_buffers():
    # A caller's %g1.y was the name inlining gave call @g's %y: one buffer for both values.
    m = one("""func @g(%x: f32[8]) -> f32[8] {
  %y = neg %x : f32[8]
  return %y
}
func @f(%x: f32[8]) -> f32[8] {
  %g1.y = exp %x : f32[8]
  %a = call @g(%x) : f32[8]
  %b = add %a, %g1.y : f32[8]
  return %b
}""")
    plan = cuda.build(m).plans["f"]
    written = [ln.values[0] for ln in plan.launches]
    assert len(set(written)) == 3
    add = plan.launches[-1]
    assert add.values[1] != add.values[2]
    assert plan.where[add.values[1]] != plan.where[add.values[2]]


def test_long_concat_is_split_across_kernels(tmp_path):
    # 1000 operands in one kernel were 8008 bytes of parameters; PTX 8.0 allows 4352.
    n = 1000
    ps = ", ".join(f"%x{i}: f32[2]" for i in range(n))
    ops = ", ".join(f"%x{i}" for i in range(n))
    m = one(f"func @f({ps}) -> f32[{2 * n}] {{\n  %y = concat {ops}, axis=0 : f32[{2 * n}]\n"
            f"  return %y\n}}")
    prog = cuda.build(m)
    launches = prog.plans["f"].launches
    assert len(launches) > 1
    assert [v for ln in launches for v in ln.values[1:]] == [f"x{i}" for i in range(n)]
    assert all(ln.values[0] == "y" for ln in launches)
    assemble(prog.ptx, tmp_path)


def test_a_map_of_more_operands_than_kernel_parameters_is_expanded(tmp_path):
    # 600 pointers are 4808 bytes of parameters, past PTX 8.0's 4352: ptxas refused the kernel
    n = 600
    ps = ", ".join(f"%x{i}: f32[8]" for i in range(n))
    terms = [f"${i}" for i in range(n)]
    while len(terms) > 1:
        terms = [f"add({a}, {b})" for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms)
                                                                                & ~1:]
    ops = ", ".join(f"%x{i}" for i in range(n))
    m = one(f"func @f({ps}) -> f32[8] {{\n  %y = map {ops}, body={terms[0]} : f32[8]\n"
            f"  return %y\n}}")
    prog = cuda.build(m)
    assert all(len(ln.values) <= 3 for ln in prog.plans["f"].launches)
    assemble(prog.ptx, tmp_path)


def test_matmul_grid_past_65535_batches_or_row_tiles(tmp_path):
    m = one("""func @f(%a: f32[70000,2,3], %b: f32[70000,3,2], %c: f32[4200000,1], %d: f32[1,3])
        -> (f32[70000,2,2], f32[4200000,3]) {
  %y = matmul %a, %b : f32[70000,2,2]
  %z = matmul %c, %d : f32[4200000,3]
  return %y, %z
}""")
    prog = cuda.build(m)
    grids = [ln.kernel.grid for ln in prog.plans["f"].launches]
    assert all(g[1] <= 65535 and g[2] <= 65535 for g in grids)
    assemble(prog.ptx, tmp_path)


def test_axes_past_2_to_32_keep_64_bit_bounds():
    # A bound of 2^32 + 4 was truncated to 32 bits: the kernels covered 4 columns.
    n = 2**32 + 4
    m = one(f"""func @f(%a: f32[1,1], %b: f32[1,{n}], %x: bool[2,{n}])
        -> (f32[1,{n}], bool[{n},2]) {{
  %y = matmul %a, %b : f32[1,{n}]
  %t = transpose %x, perm=[1,0] : bool[{n},2]
  return %y, %t
}}""")
    ptx = cuda.emit_ptx(m)
    bounds = {int(v) for v in re.findall(r"setp\.[a-z]+\.u(?:32|64)\s+%p\d+, %r\w+, (\d+);", ptx)}
    assert n in bounds or n - 1 in bounds or 2 * n in bounds or 2 * n - 1 in bounds
    assert not bounds & {3, 4}
    assert "setp.lt.u32" not in kernel_text(ptx, "matmul")


# ---------------------------------------------------------------- errors


def test_gradient_declarations_are_refused():
    with pytest.raises(eqsat.Error, match="differentiate"):
        cuda.emit_ptx(eqsat.parse((EXAMPLES / "mlp.eqir").read_text()))


@pytest.mark.parametrize("arch", ["sm_60", "gfx90a"])
def test_bad_arch_is_an_error(arch):
    with pytest.raises(eqsat.Error, match="arch"):
        cuda.emit_ptx(example("mlp"), arch=arch)


@pytest.mark.parametrize("arch", ["sm_100", "sm_120", "sm_121"])
def test_newer_archs_get_their_ptx_version(arch):
    # PTX 8.0 for sm_100 made LLVM abort the whole process ("PTX version 8.0 does not
    # support target 'sm_100'"); LLVM runs in this process, so the check runs in another.
    code = ("from pathlib import Path; import eqsat; from eqsat.backend import cuda; "
            "m = eqsat.differentiate(eqsat.parse((Path(eqsat.__file__).parent / 'examples' / "
            f"'mlp.eqir').read_text())); "
            f"print(cuda.emit_ptx(m, arch={arch!r}).split('.address_size')[0])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f".target {arch}" in r.stdout


def test_unknown_newer_arch_is_an_error():
    with pytest.raises(eqsat.Error, match="arch"):
        cuda.emit_ptx(example("mlp"), arch="sm_95")


@pytest.mark.skipif(GPU, reason="this machine has a GPU")
def test_no_gpu_is_a_clean_error():
    with pytest.raises(eqsat.Error, match="GPU"):
        cuda.compile_module(example("mlp"))


def test_compile_for_a_missing_gpu_fails_before_optimizing(monkeypatch):
    # it optimized first (a second on a transformer block), then said there was no GPU
    monkeypatch.setattr(cuda_runtime, "gpu_unavailable", lambda: "no NVIDIA driver: test")

    def never(*args, **kwargs):
        raise AssertionError("optimized before checking for a GPU")

    monkeypatch.setattr(eqsat, "_optimize_cached", never)
    with pytest.raises(eqsat.Error, match="cannot run on the GPU: no NVIDIA driver"):
        eqsat.compile(example("mlp"), target="cuda")


def test_missing_driver_or_package_is_reported(monkeypatch):
    class NoDriver:
        def cuInit(self, flags):
            raise RuntimeError("libcuda.so.1 not found")

    cuda_runtime.gpu_unavailable.cache_clear()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: NoDriver())
    try:
        assert "no NVIDIA driver" in cuda_runtime.gpu_unavailable()
        with pytest.raises(eqsat.Error, match="libcuda"):
            cuda_runtime.require_gpu()
    finally:
        cuda_runtime.gpu_unavailable.cache_clear()
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    try:
        assert "cuda-bindings" in cuda_runtime.gpu_unavailable()
    finally:
        cuda_runtime.gpu_unavailable.cache_clear()


class FakeDriver:
    """Just enough of cuda.bindings.driver to load a module (nothing runs)."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __getattr__(self, name):
        values = {"cuDeviceGetCount": (1,), "cuModuleLoadData": ("module",),
                  "cuModuleGetFunction": ("function",), "cuDevicePrimaryCtxRetain": ("ctx",),
                  "cuDeviceGet": (0,), "cuMemAlloc": (4096,)}
        return lambda *args: (0, *values.get(name, ()))


def test_a_cuda_executable_pickles_as_its_module(monkeypatch):
    """As the CPU Executable does (multiprocessing workers, copy.copy); it raised TypeError
    ('cannot pickle _thread.lock')."""
    import copy
    import pickle

    cuda_runtime.gpu_unavailable.cache_clear()
    cuda_runtime._context.cache_clear()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: FakeDriver())
    try:
        m = example("mlp")
        exe = cuda_runtime.CudaExecutable(m, cuda.build(m, "sm_80"))
        for again in (pickle.loads(pickle.dumps(exe)), copy.copy(exe)):
            assert isinstance(again, cuda_runtime.CudaExecutable)
            assert again.module == m and again.program.arch == "sm_80"
            assert again.functions == exe.functions
        name = exe.functions[0]  # exe.f too: it was a lambda, which pickle refused
        again = pickle.loads(pickle.dumps(getattr(exe, name)))
        assert isinstance(again.func, cuda_runtime.CudaExecutable) and again.args == (name,)
    finally:
        cuda_runtime.gpu_unavailable.cache_clear()
        cuda_runtime._context.cache_clear()


class DeviceArray:
    """An object exposing `__cuda_array_interface__` (as CuPy and PyTorch arrays do)."""

    def __init__(self, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (256, False),
                                         "version": 3, "strides": strides}


def test_device_array_strides_are_checked_without_a_host_copy():
    """Contiguity was judged by allocating an empty host array of the device array's shape:
    one of 2^40 floats raised MemoryError, not an eqsat.Error."""
    f32 = eqsat.TensorType(eqsat.DType.f32, (4, 1, 8))
    assert cuda_runtime._device_pointer(DeviceArray((4, 1, 8), strides=(32, 4, 4)), f32, "x") \
        == 256
    with pytest.raises(eqsat.Error, match="x must be f32\\[4,1,8\\]"):
        cuda_runtime._device_pointer(DeviceArray((4, 1, 8), strides=(4, 4, 16)), f32, "x")
    huge = eqsat.TensorType(eqsat.DType.f32, (2**20, 2**20))
    with pytest.raises(eqsat.Error, match="C-contiguous"):
        cuda_runtime._device_pointer(DeviceArray((2**20, 2**20), strides=(4, 2**22)), huge, "x")


def test_argument_errors_name_the_position_among_all_arguments(monkeypatch):
    """With a device array before it, a bad host argument was numbered among the host ones
    only ('argument 1 of @predict (%w)' for the second argument); a bad device array was not
    named at all."""
    cuda_runtime.gpu_unavailable.cache_clear()
    cuda_runtime._context.cache_clear()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: FakeDriver())
    try:
        m = example("mlp")
        exe = cuda_runtime.CudaExecutable(m, cuda.build(m))
        x, b = DeviceArray((128, 784)), np.zeros(10, np.float32)
        with pytest.raises(eqsat.Error, match=r"argument 2 of @predict \(%w\) must have shape"):
            exe.predict(x, np.zeros((784, 9), np.float32), b)
        with pytest.raises(eqsat.Error, match=r"argument 2 of @predict \(%w\) must be "
                                              r"f32\[784,10\] .*float64"):
            exe.predict(x, DeviceArray((784, 10), "<f8"), b)
    finally:
        cuda_runtime.gpu_unavailable.cache_clear()
        cuda_runtime._context.cache_clear()


# ---------------------------------------------------------------- on the GPU


def close(got, want, rtol=2e-4, atol=2e-5):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


@gpu
@needs_gpu
def test_gpu_designed_kernels(shapes_module):
    rng = np.random.default_rng(0)
    f = shapes_module["f"]
    args = [(rng.standard_normal(p.type.shape) if p.type.dtype.is_float else
             rng.integers(-50, 50, p.type.shape)).astype(p.type.dtype.np)
            for p in f.params]
    exe = cuda.compile_module(shapes_module)
    close(exe.f(*args), eqsat.interpret(shapes_module, "f", *args), rtol=1e-3, atol=1e-4)


@gpu
@needs_gpu
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_gpu_examples(name):
    m = example(name)
    exe = cuda.compile_module(m)
    rng = np.random.default_rng(1)
    for f in m.functions:
        args = [(0.1 * rng.standard_normal(p.type.shape)).astype(p.type.dtype.np)
                for p in f.params]
        close(exe(f.name, *args), eqsat.interpret(m, f.name, *args), rtol=2e-3, atol=1e-4)


@gpu
@needs_gpu
@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=__import__("hypothesis").strategies.data(),
       m=modules(max_functions=2, max_stmts=6))
def test_gpu_random_programs(data, m):
    exe = cuda.compile_module(m)
    for f in m.functions:
        args = data.draw(inputs(f))
        try:
            want = eqsat.interpret(m, f.name, *args)
        except eqsat.Error:
            continue
        close(exe(f.name, *args), want, rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_child_forked_while_ptx_is_emitted_can_emit_ptx():
    """Fork waits for the NVPTX emitter's lock: a child forked while another thread held it
    inherited it held by no thread of its own and hung on its first emit."""
    import os
    import signal
    import threading

    from eqsat.backend import nvptx_target

    m = one("func @f(%x: f32[8]) -> f32[8] {\n  %y = exp %x : f32[8]\n  return %y\n}")
    held = threading.Event()

    def hold():
        with nvptx_target._lock:  # as an emit in progress does
            held.set()
            threading.Event().wait(0.3)

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            signal.alarm(60)
            ok = ".entry" in eqsat.emit(m, target="ptx")
        finally:
            os._exit(0 if ok else 1)
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
