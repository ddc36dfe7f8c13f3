"""Running PTX on an NVIDIA GPU through CUDA's driver API (`cuda-bindings`, the optional
`cuda` extra, imported only when used).

`gpu_unavailable()` says why no GPU can be used (no package, no driver, no device) or None;
`require_gpu()` turns that into an `eqsat.Error`. `CudaExecutable` loads a module's PTX once,
keeps one device arena per function, and per call copies the inputs in (device arrays that
expose `__cuda_array_interface__` are read in place), launches the planned kernels in order on
the default stream, and copies the results back as numpy arrays.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import Error
from ..ir.interpreter import bind_arguments, check_inputs
from ..ir.module import Module
from .cuda import GpuPlan, PtxProgram
from .executable import BaseExecutable, CompiledFunction
from .loops import row_major_strides


class CudaError(Error):
    """The CUDA driver refused something (out of memory, a bad launch, an invalid PTX)."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        raise CudaError("the CUDA target needs the cuda-bindings package: "
                        "pip install 'eqsat[cuda]'") from None
    return driver


def _check(result: Any, what: str) -> Any:
    """The value(s) of a driver call's (err, value...) result; raises CudaError on failure."""
    drv = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        try:
            _, text = drv.cuGetErrorString(err)
            text = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # the error string is a courtesy; the code alone must do
            text = ""
        raise CudaError(f"CUDA {what} failed: {getattr(err, 'name', err)} {text}".rstrip())
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def gpu_unavailable() -> str | None:
    """Why the GPU cannot be used (a sentence), or None when a device and driver are there."""
    try:
        drv = _driver()
    except CudaError as e:
        return str(e)
    try:
        # Without a driver library, cuInit raises instead of returning an error code.
        result = drv.cuInit(0)
    except Exception as e:  # noqa: BLE001  (any failure to load the driver means "no GPU")
        return f"no NVIDIA driver: {type(e).__name__}: {e}"
    try:
        _check(result, "cuInit")
        if _check(drv.cuDeviceGetCount(), "cuDeviceGetCount") < 1:
            return "the NVIDIA driver reports no GPU"
    except CudaError as e:
        return str(e)
    return None


def gpu_available() -> bool:
    """True when a GPU, its driver and cuda-bindings are all present."""
    return gpu_unavailable() is None


def require_gpu() -> None:
    """Raise eqsat.Error (CudaError) saying what is missing unless a GPU can be used."""
    reason = gpu_unavailable()
    if reason is not None:
        raise CudaError(f"cannot run on the GPU: {reason}")


@functools.cache
def _context() -> Any:
    """The primary context of device 0, made current for this process."""
    drv = _driver()
    dev = _check(drv.cuDeviceGet(0), "cuDeviceGet")
    ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def synchronize() -> None:
    """Wait for all launched work (timing helpers use it)."""
    _check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")


class DeviceBuffer:
    """Device memory freed when the object goes away."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = int(_check(_driver().cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))

    def __del__(self) -> None:
        try:
            _driver().cuMemFree(self.ptr)
        except Exception:  # noqa: BLE001  (interpreter shutdown: the driver may be gone)
            pass


def _c_contiguous(shape: tuple[int, ...], strides: Any, itemsize: int) -> bool:
    """Whether byte `strides` lay `shape` out in row-major order (an axis of length 1 may have
    any stride, as numpy's flags allow), computed without allocating the array: an empty
    host copy of a large device array's shape cost its size in host memory, or a MemoryError."""
    return len(strides) == len(shape) and all(
        n == 1 or s == r * itemsize
        for n, s, r in zip(shape, strides, row_major_strides(shape)))


def _device_pointer(a: Any, want: Any, what: str) -> int | None:
    """The device address of a contiguous, 16-byte aligned device array of the wanted type."""
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape, typestr = tuple(cai["shape"]), cai["typestr"]
    ptr = int(cai["data"][0])
    strides = cai.get("strides")
    contiguous = strides is None or _c_contiguous(shape, strides, np.dtype(typestr).itemsize)
    if shape != want.shape or np.dtype(typestr) != want.dtype.np or not contiguous:
        raise CudaError(f"{what} must be {want} (C-contiguous), got a device array of shape "
                        f"{list(shape)} and dtype {np.dtype(typestr)}")
    return ptr if ptr % 16 == 0 else None


class _Loaded:
    """A module's PTX loaded on the GPU: its kernels, one device arena per function and the
    lock that serializes calls (each function owns one arena). The executable and its
    functions share it; it holds neither of them."""

    def __init__(self, program: PtxProgram):
        drv = _driver()
        _context()
        self._cumod = _check(drv.cuModuleLoadData(program.ptx.encode() + b"\0"),
                             "cuModuleLoadData")
        names = {ln.kernel.name for p in program.plans.values() for ln in p.launches}
        self._fns = {n: _check(drv.cuModuleGetFunction(self._cumod, n.encode()),
                               "cuModuleGetFunction") for n in sorted(names)}
        self._arenas: dict[str, DeviceBuffer] = {}
        self.lock = threading.Lock()

    def arena(self, name: str, plan: GpuPlan) -> int:
        """The device address of function `name`'s arena, allocated on first use."""
        buf = self._arenas.get(name)
        if buf is None:
            buf = self._arenas[name] = DeviceBuffer(plan.arena_bytes)
        return buf.ptr

    def run(self, name: str, plan: GpuPlan, arrays: tuple[Any, ...]
            ) -> np.ndarray | tuple[np.ndarray, ...]:
        """One call of function `name` (under `lock`): inputs in, kernels, results out."""
        drv = _driver()
        base = self.arena(name, plan)
        params = plan.func.params
        on_device = {k for k, a in enumerate(arrays) if hasattr(a, "__cuda_array_interface__")}
        checked = check_inputs(plan.func, arrays, skip=on_device)
        device = [_device_pointer(a, p.type, f"argument {k + 1} of @{name} (%{p.name})")
                  if k in on_device else None
                  for k, (a, p) in enumerate(zip(arrays, params))]
        param_ptr = []
        for k, (a, d, p) in enumerate(zip(arrays, device, params)):
            at = base + plan.param_at[k]
            if d is not None:
                param_ptr.append(d)
            elif k in on_device:  # a misaligned device array: copy it on the device
                src = int(a.__cuda_array_interface__["data"][0])
                _check(drv.cuMemcpyDtoD(at, src, p.type.nbytes), "cuMemcpyDtoD")
                param_ptr.append(at)
            else:
                host = np.ascontiguousarray(checked[k])
                if host.nbytes:
                    _check(drv.cuMemcpyHtoD(at, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
                param_ptr.append(at)

        def pointer(v: str) -> int:
            kind, k = plan.where[v]
            return param_ptr[k] if kind == "in" else base + k

        self.launch(plan, pointer)
        outputs = []
        for v, t in zip(plan.func.returns, plan.func.result_types):
            host = np.empty(t.shape, t.dtype.np)
            if host.nbytes:
                _check(drv.cuMemcpyDtoH(host.ctypes.data, pointer(v), host.nbytes),
                       "cuMemcpyDtoH")
            outputs.append(host)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def launch(self, plan: GpuPlan, pointer: Callable[[str], int]) -> None:
        """Launch `plan`'s kernels in order on the default stream, each value at `pointer`."""
        drv = _driver()
        for ln in plan.launches:
            k = ln.kernel
            ptrs = tuple(pointer(v) for v in ln.values)
            args = (ptrs, (ctypes.c_void_p,) * len(ptrs))
            _check(drv.cuLaunchKernel(self._fns[k.name], *k.grid, *k.block, 0, 0, args, 0),
                   f"launch of {k.name}")


class _GpuFunction(CompiledFunction):
    """One function of a loaded module, called on numpy or device arrays: what `exe.f` is."""

    target = "cuda"

    def __init__(self, plan: GpuPlan, loaded: _Loaded, module: Module, arch: str):
        super().__init__(plan.func, module)
        self.plan = plan
        self._loaded = loaded
        self._arch = arch

    def __call__(self, *arrays: Any, **named: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run the function on numpy arrays (or device arrays), passed in order or by
        parameter name; see CudaExecutable."""
        if named:
            arrays = bind_arguments(self.func.name, self.func.params, arrays, named)
        with self._loaded.lock:
            return self._loaded.run(self.func.name, self.plan, arrays)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its module, arch and name, compiled again where it is loaded."""
        return (_compiled_function, (self._module, self._arch, self.func.name))


class CudaExecutable(BaseExecutable):
    """Compiled functions of a module on the GPU: `exe("f", *arrays)` or `exe.f(*arrays)`.

    Returns fresh numpy arrays, one result as an array and several as a tuple, like the CPU
    Executable. Calls are serialized (each function owns one device arena)."""

    def __init__(self, module: Module, program: PtxProgram, source: Module | None = None):
        self.module = module
        self._source = source
        self.program = program
        self.ptx = program.ptx
        self._loaded = _Loaded(program)
        self._install({name: _GpuFunction(plan, self._loaded, module, program.arch)
                       for name, plan in program.plans.items()})

    def time_launches(self, name: str, *arrays: Any, repeat: int = 20) -> float:
        """Seconds one call's kernels take on the GPU (inputs uploaded once, results not
        copied back): the median of `repeat` timed runs after a warm-up call."""
        self(name, *arrays)  # uploads the inputs into the arena; compiles lazily in the driver
        plan = self.program.plans[name if type(name) is str else self._resolve(name)]
        loaded = self._loaded
        base = loaded.arena(name, plan)

        def pointer(v: str) -> int:
            kind, k = plan.where[v]
            return base + (plan.param_at[k] if kind == "in" else k)

        times = []
        with loaded.lock:
            for _ in range(repeat):
                synchronize()
                t0 = time.perf_counter()
                loaded.launch(plan, pointer)
                synchronize()
                times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (and copied) as its module and arch, compiled again where it is loaded, as
        the CPU Executable is: a loaded driver module, device memory and a lock cannot go to
        another process."""
        return (_recompiled, (self.module, self.program.arch, self._source))

    def __repr__(self) -> str:
        return f"<eqsat.CudaExecutable @{self.module.name}: {', '.join(self.functions)}>"


def _recompiled(module: Module, arch: str, source: Module | None) -> CudaExecutable:
    """A CudaExecutable back from pickle: `module` compiled again, with its source module."""
    from .cuda import compile_module

    return compile_module(module, arch, source)


def _compiled_function(module: Module, arch: str, name: str) -> _GpuFunction:
    """Function `name` of `module` compiled for `arch` (how a pickled `exe.f` is loaded)."""
    from .cuda import compile_module

    return compile_module(module, arch)._entries[name]
