"""The CPU target: lower a module to LLVM IR, compile it (with memory and disk caches) and
wrap the entry points in an Executable."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from llvmlite import ir

from ..ir.module import Module
from ..ir.verifier import plain_module
from . import jit
from .entry import Plan, emit_module, plan_module
from . import gemm, parallel
from .runtime import Executable

_DEFAULT = object()
_memory: dict[str, jit.Code] = {}
_lock = threading.Lock()


def lower(module: Module) -> tuple[str, dict[str, Plan]]:
    """The LLVM IR text (before optimization) and the buffer plans of a verified module."""
    plans = plan_module(module)
    llmod = ir.Module(name=module.name)
    llmod.triple = jit.host()[0]
    llmod.data_layout = jit.data_layout()
    emit_module(module, plans, llmod)
    return str(llmod), plans


def emit_llvm(module: Module) -> str:
    """The optimized LLVM IR text of the whole module, as the CPU target compiles it."""
    text, _ = lower(plain_module(module, "compile_module"))
    return str(jit.optimize(text))


def cache_key(module: Module) -> str:
    """What identifies compiled code: the module text, the target and the code generator."""
    h = hashlib.sha256(str(module).encode())
    h.update(f"{jit.fingerprint()}:{parallel.THREADS}".encode())
    h.update(f"gemm {gemm.ENABLED} {gemm.LONE_PRODUCTS}".encode())
    return h.hexdigest()[:40]


def compile_module(module: Module, cache_dir: Path | str | None | object = _DEFAULT) -> Executable:
    """Compile a verified module of plain functions for this CPU.

    Compiled code is cached in memory and under `cache_dir` (default ~/.cache/eqsat; None
    turns the disk cache off), keyed by the module text, target and code generator.
    """
    module = plain_module(module, "compile_module")
    directory = jit.default_cache_dir() if cache_dir is _DEFAULT else (
        Path(cache_dir) if cache_dir is not None else None)
    key = cache_key(module)
    plans = plan_module(module)
    with _lock:
        code = _memory.get(key)
        if code is None:
            obj = jit.cache_load(directory, key)
            if obj is None:
                text, _ = lower(module)
                obj = jit.compile_object(text)
                jit.cache_store(directory, key, obj)
            code = _memory[key] = jit.Code(obj)
    return Executable(module, code, plans, key)
