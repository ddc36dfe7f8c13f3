"""The host BLAS: scipy's sgemm/dgemm (from its bundled OpenBLAS, else `cython_blas`'s function
pointers), bound to symbols that generated code calls (`eqsat_sgemm`, `eqsat_dgemm`), so cached
object code stays valid across processes."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

from llvmlite import ir

from ..ir.types import DType
from .scalar import I8, I32, declare, llvm_type

SYMBOLS = {DType.f32: ("eqsat_sgemm", "sgemm"), DType.f64: ("eqsat_dgemm", "dgemm")}
# `int f(int n)`: set the calling thread's OpenBLAS thread count, returning the old one. Our
# threads split products themselves; OpenBLAS's own workers spin after each call and would
# take the cores our next kernel needs.
THREADS_SYMBOL, THREADS_NAME = "eqsat_blas_threads", "openblas_set_num_threads_local"


def _bundled() -> dict[str, int]:
    """The gemms of the OpenBLAS bundled with scipy's wheel, found by path and loaded with
    ctypes: importing scipy.linalg for them would cost a cached compile ~0.2 s."""
    spec = importlib.util.find_spec("scipy")
    if spec is None or not spec.submodule_search_locations:
        return {}
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "scipy.libs"
    for path in sorted(libs.glob("libscipy_openblas-*.so*")):
        try:
            lib = ctypes.CDLL(str(path))
            found = {symbol: ctypes.cast(getattr(lib, f"scipy_{name}_"), ctypes.c_void_p).value
                     for symbol, name in SYMBOLS.values()}
        except (OSError, AttributeError):
            continue
        if all(found.values()):
            try:
                setter = getattr(lib, THREADS_NAME)
                found[THREADS_SYMBOL] = ctypes.cast(setter, ctypes.c_void_p).value
            except AttributeError:
                pass
            return {k: int(v) for k, v in found.items() if v}
    return {}


@functools.cache
def addresses() -> dict[str, int]:
    """The address of each gemm by the symbol generated code uses; empty without scipy."""
    found = _bundled()
    if found:
        return found
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return {}
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    out = {}
    for symbol, name in SYMBOLS.values():
        capsule = cython_blas.__pyx_capi__[name]
        out[symbol] = get_ptr(capsule, get_name(capsule))
    return out


def available() -> bool:
    """Whether the host BLAS can be called."""
    return bool(addresses())


def declare_threads(module: ir.Module) -> ir.Function | None:
    """The OpenBLAS thread-count setter (see THREADS_SYMBOL), or None where unavailable."""
    if THREADS_SYMBOL not in addresses():
        return None
    return declare(module, THREADS_SYMBOL, I32, [I32])


def declare_gemm(module: ir.Module, dtype: DType) -> ir.Function:
    """The Fortran gemm signature: every argument by pointer (transa, transb, m, n, k, alpha,
    a, lda, b, ldb, beta, c, ldc)."""
    e = llvm_type(dtype).as_pointer()
    i, c = I32.as_pointer(), I8.as_pointer()
    args = [c, c, i, i, i, e, e, i, e, i, e, e, i]
    return declare(module, SYMBOLS[dtype][0], ir.VoidType(), args)
