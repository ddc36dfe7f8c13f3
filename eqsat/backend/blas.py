"""The host BLAS: sgemm/dgemm of the OpenBLAS bundled with numpy (ILP64) or scipy, else
`cython_blas`'s function pointers, bound to symbols that generated code calls (`eqsat_sgemm`,
`eqsat_dgemm`, with a suffix for 64-bit integers), so cached object code stays valid across
processes."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

from llvmlite import ir

from ..ir.types import DType
from .scalar import I8, I32, I64, declare, llvm_type

SYMBOLS = {DType.f32: ("eqsat_sgemm", "sgemm"), DType.f64: ("eqsat_dgemm", "dgemm")}
# `int f(int n)`: set the calling thread's OpenBLAS thread count, returning the old one. Our
# own threads call the BLAS single-threaded; a lone large product uses OpenBLAS's threads.
THREADS_SYMBOL, THREADS_NAME = "eqsat_blas_threads", "openblas_set_num_threads_local"
# Where the BLAS takes 64-bit integers its gemms are bound under these names instead, so code
# built for one integer width never links to the other's BLAS (object code is cached on disk).
ILP64_SUFFIX = "64"
# The OpenBLAS builds bundled with the wheels, best first: (package, library glob, the gemms'
# name suffix, 64-bit integers). numpy's comes first: its thread pool is the one numpy's own
# products have just woken, so our products do not queue behind a second pool's spinning
# workers (measured: 2.3 ms versus 4.1-5.8 ms for 256x784 @ 784x1024 right after numpy's).
_BUNDLED = (("numpy", "libscipy_openblas64_*.so*", "_64_", True),
            ("scipy", "libscipy_openblas-*.so*", "_", False))


@functools.cache
def _bundled() -> dict[str, int]:
    """The gemms of an OpenBLAS bundled with numpy's or scipy's wheel, found by path and loaded
    with ctypes: importing scipy.linalg for them would cost a cached compile ~0.2 s."""
    for package, pattern, suffix, ilp64 in _BUNDLED:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        libs = Path(next(iter(spec.submodule_search_locations))).parent / f"{package}.libs"
        for path in sorted(libs.glob(pattern)):
            try:
                lib = ctypes.CDLL(str(path))
                found = {symbol: ctypes.cast(getattr(lib, f"scipy_{name}{suffix}"),
                                             ctypes.c_void_p).value
                         for symbol, name in SYMBOLS.values()}
            except (OSError, AttributeError):
                continue
            if not all(found.values()):
                continue
            try:
                setter = getattr(lib, THREADS_NAME)
                found[THREADS_SYMBOL] = ctypes.cast(setter, ctypes.c_void_p).value
            except AttributeError:
                pass
            if ilp64:
                found = {(k + ILP64_SUFFIX if k != THREADS_SYMBOL else k): v
                         for k, v in found.items()}
            return {k: int(v) for k, v in found.items() if v}
    return {}


@functools.cache
def addresses() -> dict[str, int]:
    """The address of each gemm by the symbol generated code uses; empty without a BLAS."""
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


def binding() -> str:
    """Which BLAS symbols this process binds (so the gemms' integer width, and whether the
    thread-count setter is there), known without importing scipy: object code that calls
    symbols another environment bound (a cache shared by two virtual environments, one with
    numpy's ILP64 OpenBLAS and one with scipy's) calls null pointers, so it is part of the
    object cache's key."""
    return ",".join(sorted(_bundled())) or "cython_blas"


def available() -> bool:
    """Whether the host BLAS can be called."""
    return bool(addresses())


def int_type() -> ir.IntType:
    """The BLAS's integer type: 64 bits for numpy's ILP64 OpenBLAS, else 32."""
    return I64 if SYMBOLS[DType.f32][0] + ILP64_SUFFIX in addresses() else I32


def gemm_symbol(dtype: DType) -> str:
    """The symbol generated code calls for `dtype`'s gemm in this process."""
    return SYMBOLS[dtype][0] + (ILP64_SUFFIX if int_type() is I64 else "")


def all_gemm_symbols() -> list[str]:
    """Every gemm symbol generated code may call, whatever the integer width."""
    return [sym + sfx for sym, _ in SYMBOLS.values() for sfx in ("", ILP64_SUFFIX)]


def calls_gemm(module: ir.Module) -> bool:
    """Whether `module` declares a gemm."""
    return any(sym in module.globals for sym in all_gemm_symbols())


def declare_threads(module: ir.Module) -> ir.Function | None:
    """The OpenBLAS thread-count setter (see THREADS_SYMBOL), or None where unavailable."""
    if THREADS_SYMBOL not in addresses():
        return None
    return declare(module, THREADS_SYMBOL, I32, [I32])


def declare_gemm(module: ir.Module, dtype: DType) -> ir.Function:
    """The Fortran gemm signature: every argument by pointer (transa, transb, m, n, k, alpha,
    a, lda, b, ldb, beta, c, ldc)."""
    e = llvm_type(dtype).as_pointer()
    i, c = int_type().as_pointer(), I8.as_pointer()
    args = [c, c, i, i, i, e, e, i, e, i, e, e, i]
    return declare(module, gemm_symbol(dtype), ir.VoidType(), args)
