"""The CUDA runtime: clean eqsat.Errors where there is no GPU (no driver, no cuda-bindings, and
before any optimizing), executables that pickle and check their arguments (against a fake
driver), and on a GPU (tests marked gpu) results like `interpret`'s."""

from __future__ import annotations

import inspect
import pickle
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import eqsat
from eqsat.backend import cuda, cuda_runtime
from eqsat.testing import inputs, modules

from cuda_helpers import SHAPES, example
from cuda_helpers import module as one

GPU = cuda_runtime.gpu_available()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not GPU, reason="no GPU: " + str(cuda_runtime.gpu_unavailable()))


# ---------------------------------------------------------------- errors without a GPU


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
        assert again.func == getattr(exe, name).func and again._arch == "sm_80"
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


@pytest.fixture
def fake_driver(monkeypatch):
    """CudaExecutables made against FakeDriver (they load and 'run', computing nothing)."""
    cuda_runtime.gpu_unavailable.cache_clear()
    cuda_runtime._context.cache_clear()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: FakeDriver())
    yield
    cuda_runtime.gpu_unavailable.cache_clear()
    cuda_runtime._context.cache_clear()


def _scale_module():
    @eqsat.function
    def scale(x: eqsat.f32[2, 3], k: eqsat.f32[()]):
        """Multiply x by k."""
        return x * k

    return scale, eqsat.Module(scale)


def test_exe_f_is_one_prepared_function_as_on_the_cpu(fake_driver):
    """`exe.f` of the CUDA executable was a new functools.partial at each access (the CPU's
    is the function's prepared entry): a different object, repr and signature."""
    _, m = _scale_module()
    cpu = eqsat.backend.compile_module(m, cache_dir=None)
    gpu = cuda_runtime.CudaExecutable(m, cuda.build(m))
    for exe in (cpu, gpu):
        f = exe.scale
        assert exe.scale is f and "scale" in vars(exe)
        assert repr(f) == "<eqsat compiled function @scale of @main>"
        assert str(inspect.signature(f)) == str(inspect.signature(cpu.scale))
        assert getattr(f, "__name__", None) == getattr(cpu.scale, "__name__", None)
        assert "scale" in dir(exe) and exe.functions == ("scale",)
        assert repr(pickle.loads(pickle.dumps(f))) == repr(f)


def test_exe_f_is_named_and_documented_as_the_ir_function_on_both_targets(fake_driver):
    """exe.f had no __name__ and the docstring of its class, on the GPU as on the CPU."""
    _, m = _scale_module()
    cpu = eqsat.backend.compile_module(m, cache_dir=None)
    gpu = cuda_runtime.CudaExecutable(m, cuda.build(m))
    for exe, target in ((cpu, "cpu"), (gpu, "cuda")):
        f = exe.scale
        assert f.__name__ == f.__qualname__ == "scale"
        assert f.__doc__.startswith("scale(x: f32[2,3], k: f32[]) -> f32[2,3]\n")
        assert f"compiled by eqsat for the {target} target" in f.__doc__
        again = pickle.loads(pickle.dumps(f))
        assert (repr(again), again.__name__, again.__doc__) == (repr(f), "scale", f.__doc__)


def test_a_traced_function_is_resolved_once_as_on_the_cpu(fake_driver, monkeypatch):
    """exe(f, ...) compared f's IR with the module's at every call on the GPU."""
    scale, m = _scale_module()
    looked_up = []
    name_in = eqsat.ir.dsl.TracedFunction.name_in
    monkeypatch.setattr(eqsat.ir.dsl.TracedFunction, "name_in",
                        lambda self, module: looked_up.append(self) or name_in(self, module))
    x, k = np.ones((2, 3), np.float32), np.float32(2)
    for exe in (eqsat.backend.compile_module(m, cache_dir=None, source=m),
                cuda_runtime.CudaExecutable(m, cuda.build(m), m)):
        looked_up.clear()
        for _ in range(3):
            assert exe(scale, x, k).shape == (2, 3)
            assert exe(scale, x=x, k=k).shape == (2, 3)
        assert looked_up == [scale]


def _errors(exe, other):
    """The message of each way a call can go wrong."""
    x, k = np.ones((2, 3), np.float32), np.float32(2)
    calls = [lambda: exe.nope, lambda: exe("nope", x, k), lambda: exe(other, x, k),
             lambda: exe(x, k), lambda: exe.scale(x), lambda: exe.scale(x, k, k),
             lambda: exe.scale(x.T, k), lambda: exe.scale(x.astype(np.float64), k),
             lambda: exe.scale(x, k=k, j=k), lambda: exe.scale(x, x=x),
             lambda: exe("scale", [["a"]], k)]
    messages = []
    for call in calls:
        with pytest.raises(eqsat.Error) as e:
            call()
        messages.append((type(e.value), str(e.value)))
    return messages


def test_call_errors_are_the_cpus(fake_driver):
    _, m = _scale_module()

    @eqsat.function
    def other(x: eqsat.f32[2, 3], k: eqsat.f32[()]):  # not in m
        return x + k

    cpu = eqsat.backend.compile_module(m, cache_dir=None, source=m)
    gpu = cuda_runtime.CudaExecutable(m, cuda.build(m), m)
    assert _errors(gpu, other) == _errors(cpu, other)


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
def test_gpu_designed_kernels():
    shapes_module = one(SHAPES)
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
