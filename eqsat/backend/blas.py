"""The host BLAS: sgemm/dgemm function pointers from scipy's `cython_blas`, bound to symbols
that generated code calls (`eqsat_sgemm`, `eqsat_dgemm`), so cached object code stays valid
across processes."""

from __future__ import annotations

import ctypes
import functools

from llvmlite import ir

from ..ir.types import DType
from .scalar import I8, I32, declare, llvm_type

SYMBOLS = {DType.f32: ("eqsat_sgemm", "sgemm"), DType.f64: ("eqsat_dgemm", "dgemm")}


@functools.cache
def addresses() -> dict[str, int]:
    """The address of each gemm by the symbol generated code uses; empty without scipy."""
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


def declare_gemm(module: ir.Module, dtype: DType) -> ir.Function:
    """The Fortran gemm signature: every argument by pointer (transa, transb, m, n, k, alpha,
    a, lda, b, ldb, beta, c, ldc)."""
    e = llvm_type(dtype).as_pointer()
    i, c = I32.as_pointer(), I8.as_pointer()
    args = [c, c, i, i, i, e, e, i, e, i, e, e, i]
    return declare(module, SYMBOLS[dtype][0], ir.VoidType(), args)
