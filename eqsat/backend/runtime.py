"""The Executable: compiled entry functions called on numpy arrays."""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from typing import Any

import numpy as np

from ..errors import InterpretError
from ..ir.interpreter import bind_arguments, check_inputs
from ..ir.module import Function, Module
from .executable import BaseExecutable, CompiledFunction
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


_char_at = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def _address(a: np.ndarray) -> int:
    """The address of an array's first byte (through the buffer protocol: ~5x cheaper than
    `a.ctypes.data`, which read-only and empty arrays still need)."""
    try:
        return _addressof(_char_at(a))
    except (TypeError, ValueError):
        return a.ctypes.data


class _Entry(CompiledFunction):
    """One IR function's native entry point, callable on numpy arrays: what `exe.f` is.

    Everything a call needs is prepared here, once, so a call with arrays of exactly the
    parameter types does little besides taking their addresses (see `__call__`). It holds the
    machine code (an `exe.f` kept after `exe` is dropped still runs) but not the Executable,
    so no reference cycle keeps the code alive after both are gone.
    """

    target = "cpu"

    def __init__(self, func: Function, arena_bytes: int, address: int, code: Code,
                 local: threading.local, align: int, module: Module):
        super().__init__(func, module)
        self.arena_bytes = arena_bytes
        self.native = _ENTRY(address)  # ctypes releases the GIL for the call
        self.results = [(t.shape, t.dtype.np, t.nbytes >= STREAM_MIN)
                        for t in func.result_types]
        self.params = [(p.type.shape, p.type.dtype.np) for p in func.params]
        # The entry's arrays of input and output pointers are bytes objects packed per call
        # (ctypes passes a bytes object to a void* as its buffer): packed ~4x faster than a
        # ctypes array is built, and passed ~2x faster; each call (each thread) has its own.
        self.pack_ins = struct.Struct(f"{len(self.params)}P").pack
        self.pack_outs = struct.Struct(f"{len(self.results)}P").pack
        # No result streamed or empty (the common case): every result is a plain np.empty
        # whose address the buffer protocol gives without the fallback _address needs.
        self.plain = all(not streamed and math.prod(shape)
                         for shape, _, streamed in self.results)
        self._code = code
        self._local = local
        self._align = align

    def __call__(self, *arrays: Any, **named: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run the function on numpy arrays (or values numpy can convert), passed in order or
        by parameter name; see Executable."""
        if named:
            arrays = bind_arguments(self.func.name, self.func.params, arrays, named)
        ins = self._addresses(arrays)
        if ins is None:
            arrays = tuple(np.ascontiguousarray(a) for a in check_inputs(self.func, arrays))
            ins = list(map(_address, arrays))
        try:
            if self.plain:
                outputs = [np.empty(shape, dtype) for shape, dtype, _ in self.results]
                outs = [_addressof(_char_at(o)) for o in outputs]
            else:
                outputs = [_aligned(shape, dtype, self._align) if streamed
                           else np.empty(shape, dtype) for shape, dtype, streamed in self.results]
                outs = list(map(_address, outputs))
            arena = self._arena()
        except MemoryError:
            raise InterpretError(_out_of_memory(self)) from None
        self.native(self.pack_ins(*ins), self.pack_outs(*outs), arena)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _addresses(self, arrays: tuple[Any, ...]) -> list[int] | None:
        """The addresses of `arrays` if they can be passed as they are: C-contiguous numpy
        arrays of exactly the parameter types (the common case, checked without building
        anything); else None."""
        if len(arrays) != len(self.params):
            return None
        addresses = []
        for a, (shape, dtype) in zip(arrays, self.params):
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype:
                return None
            try:  # refused for a non-contiguous, read-only or empty array
                addresses.append(_addressof(_char_at(a)))
            except (TypeError, ValueError):
                if not a.flags.c_contiguous:
                    return None
                addresses.append(a.ctypes.data)
        return addresses

    def _arena(self) -> int:
        """This thread's scratch arena (its aligned address), grown as needed and kept between
        calls (one per thread, shared by the executable's functions)."""
        arena = getattr(self._local, "arena", None)
        if arena is None or arena[0] < self.arena_bytes:
            buf = np.empty(self.arena_bytes + self._align, np.uint8)
            addr = _address(buf)
            arena = self._local.arena = (self.arena_bytes, addr + (-addr % self._align), buf)
        return arena[1]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its module and name, compiled again where it is loaded (as Executable
        is): `pool.map(exe.f, batches)` sends it to multiprocessing workers."""
        return (_compiled_function, (self._module, self.func.name))


def _compiled_function(module: Module, name: str) -> _Entry:
    """Function `name` of `module` compiled (how a pickled `exe.f` is loaded)."""
    from .cpu import compile_module

    return compile_module(module)._entries[name]


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


class Executable(BaseExecutable):
    """Compiled functions of a module: `exe("f", *arrays)` or `exe.f(*arrays)`.

    Inputs are checked against the parameter types (an `eqsat.Error` says which differs) and
    may be non-contiguous; every call returns fresh arrays: one result as an array (0-d for a
    scalar), several as a tuple. Calls from several Python threads at once are safe.
    """

    def __init__(self, module: Module, code: Code, layout: dict[str, Any], key: str = "",
                 source: Module | None = None):
        self.module = module
        self.key = key
        self._source = source
        self._code = code  # keeps the machine code alive as long as the entries
        # layout (cpu._layout): {"align": bytes, "functions": {name: {"symbol", "arena_bytes"}}}
        align = int(layout["align"])
        local = threading.local()  # each thread's scratch arena
        funcs = {f.name: f for f in module.functions}
        self._install({name: _Entry(funcs[name], int(e["arena_bytes"]),
                                    code.address(e["symbol"]), code, local, align, module)
                       for name, e in layout["functions"].items()})

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (and copied) as its module, compiled again where it is loaded (a cache hit:
        milliseconds): machine code and ctypes pointers cannot go to another process."""
        return (_recompiled, (self.module, self._source))

    def __repr__(self) -> str:
        return f"<eqsat.Executable @{self.module.name}: {', '.join(self.functions)}>"


def _recompiled(module: Module, source: Module | None) -> Executable:
    """An Executable back from pickle: `module` compiled again, with its source module."""
    from .cpu import compile_module

    return compile_module(module, source=source)
