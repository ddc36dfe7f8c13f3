"""The Executable: compiled entry functions called on numpy arrays."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import Error
from ..ir.interpreter import check_inputs
from ..ir.module import Module
from .entry import ALIGN, Plan, entry_symbol
from .jit import Code

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class _Entry:
    """One IR function's native entry point and what calling it needs."""

    def __init__(self, plan: Plan, address: int):
        self.func = plan.func
        self.arena_bytes = plan.arena_bytes
        self.native = _ENTRY(address)  # ctypes releases the GIL for the call
        self.results = plan.func.result_types
        self.param_names = {p.name for p in plan.func.params}


def _aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A fresh C-contiguous array at an ALIGN-byte boundary (kernels that stream a result
    with non-temporal vector stores rely on it)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    return buf[start: start + nbytes].view(dtype).reshape(shape)


class Executable:
    """Compiled functions of a module: `exe("f", *arrays)` or `exe.f(*arrays)`.

    Inputs are checked against the parameter types (an `eqsat.Error` says which differs) and
    may be non-contiguous; every call returns fresh arrays: one result as an array (0-d for a
    scalar), several as a tuple. Calls from several Python threads at once are safe.
    """

    def __init__(self, module: Module, code: Code, plans: dict[str, Plan], key: str = ""):
        self.module = module
        self.key = key
        self._code = code  # keeps the machine code alive as long as the entries
        self._entries = {name: _Entry(plan, code.address(entry_symbol(name)))
                         for name, plan in plans.items()}
        self._local = threading.local()

    @property
    def functions(self) -> tuple[str, ...]:
        """The names of the callable functions."""
        return tuple(self._entries)

    def _arena(self, nbytes: int) -> int:
        """This thread's scratch arena, grown as needed and kept between calls."""
        buf = getattr(self._local, "arena", None)
        if buf is None or buf.nbytes < nbytes + ALIGN:
            buf = np.empty(nbytes + ALIGN, np.uint8)
            self._local.arena = buf
        addr = buf.ctypes.data
        return addr + (-addr % ALIGN)

    def __call__(self, name: str, *arrays: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run function `name` on numpy arrays (or values numpy can convert)."""
        entry = self._entries.get(name)
        if entry is None:
            raise Error(f"the executable has no function @{name}; it has "
                        f"{', '.join('@' + n for n in self._entries) or 'none'}")
        inputs = [np.ascontiguousarray(a) for a in check_inputs(entry.func, arrays)]
        outputs = [_aligned(t.shape, t.dtype.np) for t in entry.results]
        ins = (ctypes.c_void_p * max(1, len(inputs)))(*[a.ctypes.data for a in inputs])
        outs = (ctypes.c_void_p * max(1, len(outputs)))(*[a.ctypes.data for a in outputs])
        entry.native(ins, outs, self._arena(entry.arena_bytes))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __getattr__(self, name: str) -> Callable[..., np.ndarray | tuple[np.ndarray, ...]]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._entries:
            raise AttributeError(f"the executable has no function @{name}")
        return lambda *arrays: self(name, *arrays)

    def __repr__(self) -> str:
        return f"<eqsat.Executable @{self.module.name}: {', '.join(self.functions)}>"
