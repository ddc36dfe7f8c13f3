"""The Executable: compiled entry functions called on numpy arrays."""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InterpretError, UnknownFunction
from ..ir.dsl_function import function_name
from ..ir.interpreter import bind_arguments, check_inputs
from ..ir.module import Function, Module
from .jit import Code

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# Results of at least this many bytes (the L3 here) are written with non-temporal stores: one
# that large evicts the call's inputs from cache whichever way it is written. A smaller one is
# better stored plainly: the caller usually reads it next, and a result dropped before the next
# call leaves its buffer in cache for the next result (the allocator hands the same block back).
# Layer norm 4096x1024 (16 MiB out) in a loop, interleaved A/B, medians: 0.75-0.79 ms plain
# against 0.90-0.98 streamed; 3072 rows 0.59 / 0.74; only with two results kept alive did
# streaming win (0.96 against 1.03 ms). Only such results are allocated at a cache-line
# boundary (streamed rows then need no unaligned head).
STREAM_MIN = 32 << 20


class _Entry:
    """One IR function's native entry point and what calling it needs."""

    def __init__(self, func: Function, arena_bytes: int, address: int):
        self.func = func
        self.arena_bytes = arena_bytes
        self.native = _ENTRY(address)  # ctypes releases the GIL for the call
        self.results = [(t.shape, t.dtype.np, t.nbytes >= STREAM_MIN)
                        for t in func.result_types]
        self.params = [(p.type.shape, p.type.dtype.np) for p in func.params]
        self.ins_type = ctypes.c_void_p * max(1, len(self.params))
        self.outs_type = ctypes.c_void_p * max(1, len(self.results))

    def ready(self, arrays: tuple[Any, ...]) -> bool:
        """Whether `arrays` can be passed as they are: C-contiguous numpy arrays of exactly
        the parameter types (the common case, checked without building anything)."""
        if len(arrays) != len(self.params):
            return False
        for a, (shape, dtype) in zip(arrays, self.params):
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype \
                    or not a.flags.c_contiguous:
                return False
        return True


_char_at = ctypes.c_char.from_buffer


def _address(a: np.ndarray) -> int:
    """The address of an array's first byte (through the buffer protocol: ~5x cheaper than
    `a.ctypes.data`, which read-only arrays still need)."""
    try:
        return ctypes.addressof(_char_at(a))
    except (TypeError, ValueError):
        return a.ctypes.data


def _aligned(shape: tuple[int, ...], dtype: np.dtype, align: int) -> np.ndarray:
    """A fresh C-contiguous array at an `align`-byte boundary (for a result that kernels
    stream with non-temporal vector stores: see STREAM_MIN)."""
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.empty(nbytes + align, np.uint8)
    start = -_address(buf) % align
    return buf[start: start + nbytes].view(dtype).reshape(shape)


def _out_of_memory(entry: _Entry) -> str:
    """The message for a call whose results or scratch arena cannot be allocated (as the
    interpreter says it, rather than numpy's MemoryError)."""
    results = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype, _ in entry.results)
    return (f"out of memory calling @{entry.func.name}: its results take {results:,} bytes "
            f"and its working memory {entry.arena_bytes:,} bytes")


class Executable:
    """Compiled functions of a module: `exe("f", *arrays)` or `exe.f(*arrays)`.

    Inputs are checked against the parameter types (an `eqsat.Error` says which differs) and
    may be non-contiguous; every call returns fresh arrays: one result as an array (0-d for a
    scalar), several as a tuple. Calls from several Python threads at once are safe.
    """

    def __init__(self, module: Module, code: Code, layout: dict[str, Any], key: str = ""):
        self.module = module
        self.key = key
        self._code = code  # keeps the machine code alive as long as the entries
        # layout (cpu._layout): {"align": bytes, "functions": {name: {"symbol", "arena_bytes"}}}
        self._align = int(layout["align"])
        funcs = {f.name: f for f in module.functions}
        self._entries = {name: _Entry(funcs[name], int(e["arena_bytes"]),
                                      code.address(e["symbol"]))
                         for name, e in layout["functions"].items()}
        self._local = threading.local()

    @property
    def functions(self) -> tuple[str, ...]:
        """The names of the callable functions."""
        return tuple(self._entries)

    def _arena(self, nbytes: int) -> int:
        """This thread's scratch arena (its aligned address), grown as needed and kept between
        calls."""
        arena = getattr(self._local, "arena", None)
        if arena is None or arena[0].nbytes < nbytes + self._align:
            buf = np.empty(nbytes + self._align, np.uint8)
            addr = _address(buf)
            arena = self._local.arena = (buf, addr + (-addr % self._align))
        return arena[1]

    def __call__(self, name: str, /, *arrays: Any, **named: Any
                 ) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run function `name` (or the @eqsat.function itself) on numpy arrays (or values numpy
        can convert), passed in order or by parameter name."""
        name = function_name(name)
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownFunction.among("the executable", name, self._entries)
        if named:
            arrays = bind_arguments(name, entry.func.params, arrays, named)
        if not entry.ready(arrays):
            arrays = tuple(np.ascontiguousarray(a) for a in check_inputs(entry.func, arrays))
        try:
            outputs = [_aligned(shape, dtype, self._align) if streamed
                       else np.empty(shape, dtype) for shape, dtype, streamed in entry.results]
            arena = self._arena(entry.arena_bytes)
        except MemoryError:
            raise InterpretError(_out_of_memory(entry)) from None
        ins = entry.ins_type(*map(_address, arrays))
        outs = entry.outs_type(*map(_address, outputs))
        entry.native(ins, outs, arena)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __getattr__(self, name: str) -> Callable[..., np.ndarray | tuple[np.ndarray, ...]]:
        """`exe.f` for function @f (`module`, `key` and `functions` are the executable's own
        attributes: call functions of those names as `exe("module", ...)`). A partial of the
        executable, so it pickles as the executable does: `pool.map(exe.f, batches)` sends it
        to multiprocessing workers (a lambda could not be pickled)."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._entries:
            raise UnknownFunction.among("the executable", name, self._entries)
        return functools.partial(self, name)

    def __dir__(self) -> list[str]:
        """The attributes and the callable functions (for tab completion)."""
        return sorted(set(super().__dir__()) | set(self._entries))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (and copied) as its module, compiled again where it is loaded (a cache hit:
        milliseconds): machine code and ctypes pointers cannot go to another process."""
        from .cpu import compile_module

        return (compile_module, (self.module,))

    def __repr__(self) -> str:
        return f"<eqsat.Executable @{self.module.name}: {', '.join(self.functions)}>"
