"""The CPU target: lower a module to LLVM IR, compile it (with memory and disk caches) and
wrap the entry points in an Executable.

A compile whose object code is in the disk cache imports none of the kernel builders (entry,
gemm, parallel and what they import: ~40 ms of a fresh process where no bytecode is cached) and
plans no buffers: what the Executable needs of the plans (entry symbols, arena sizes) is stored
beside the object as `<key>.layout.json`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import cache
from ..errors import Error
from ..ir.fused import unfuse_module
from ..ir.module import Module, Stmt
from ..ir.types import TensorType
from ..ir.verifier import plain_module
from . import blas, compile_workers, jit, settings
from .runtime import Executable

if TYPE_CHECKING:
    from .entry import Plan

_DEFAULT = object()
# Loaded code lives while an Executable uses it: a process that compiles many programs (new
# shapes in a server) kept every engine (~150 KB each) for good.
_memory: weakref.WeakValueDictionary[str, jit.Code] = weakref.WeakValueDictionary()
_layouts: weakref.WeakKeyDictionary[jit.Code, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
jit.hold_across_fork(_lock)  # after jit's, which compiles take inside it


def _retypes(s: Stmt, types: Mapping[str, TensorType]) -> bool:
    """A `matmul_epi` whose body changes the dtype (`gt($0, 0.0)` on a float product: a bool
    result): the matmul kernels finish the product in the result's buffer, so such a statement
    is lowered as its expansion into core ops."""
    return s.op == "matmul_epi" and s.type.dtype != types[s.operands[0]].dtype


def lower(module: Module) -> tuple[str, dict[str, Plan]]:
    """The LLVM IR text (before optimization) and the buffer plans of a verified module."""
    from llvmlite import ir

    from .entry import emit_module, plan_module
    from .reductions import split_reductions

    module = split_reductions(unfuse_module(module, only=_retypes))
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


def _loaded(module: str, name: str, default: Any) -> Any:
    """Attribute `name` of backend module `module` where that is loaded (its attributes rule:
    tests set them), else `default`, its value at import. Also while another thread is still
    importing it (a first compile there): it is in sys.modules before `name` is assigned."""
    loaded = sys.modules.get(f"{__package__}.{module}")
    return default if loaded is None else getattr(loaded, name, default)


def gemm_switches() -> tuple[bool, bool]:
    """gemm.ENABLED and gemm.LONE_PRODUCTS, without importing gemm when it is not loaded yet
    (gemm reads them from the environment at import: settings.gemm_switches)."""
    enabled, lone = settings.gemm_switches()
    return bool(_loaded("gemm", "ENABLED", enabled)), bool(_loaded("gemm", "LONE_PRODUCTS", lone))


def threads() -> int:
    """parallel.THREADS, without importing parallel when it is not loaded yet."""
    return int(_loaded("parallel", "THREADS", settings.default_threads()))


def cache_key(module: Module) -> str:
    """What identifies compiled code: the module text, the target, the code generator and the
    BLAS it links against."""
    enabled, lone = gemm_switches()
    h = hashlib.sha256(str(module).encode())
    h.update(f"{jit.fingerprint()}:{threads()}".encode())
    h.update(f"gemm {enabled} {lone} blas {blas.binding()}".encode())
    return h.hexdigest()[:40]


def _layout(plans: dict[str, Plan]) -> dict[str, Any]:
    """What an Executable needs of the plans: each entry's symbol and arena size, the alignment."""
    from .entry import ALIGN, entry_symbol

    return {"align": ALIGN,
            "functions": {name: {"symbol": entry_symbol(name), "arena_bytes": p.arena_bytes}
                          for name, p in plans.items()}}


def _load_layout(directory: Path | None, key: str, module: Module) -> dict[str, Any] | None:
    """The stored layout of `key`, or None when missing, damaged or not this module's. It is
    checked against its digest like the object: an arena size changed by one digit still
    parsed, and the code then wrote past its arena (the process died)."""
    data = cache.load_checked(directory, f"{key}.layout.json")
    if data is None:
        return None
    try:
        layout = json.loads(data)
        names = {f.name for f in module.functions}
        ok = (isinstance(layout["align"], int) and set(layout["functions"]) == names and
              all(isinstance(e["symbol"], str) and isinstance(e["arena_bytes"], int)
                  for e in layout["functions"].values()))
    except (ValueError, KeyError, TypeError):
        return None
    return layout if ok else None


def _from_disk(directory: Path | None, key: str, module: Module
               ) -> tuple[jit.Code, dict[str, Any]] | None:
    """The cached code of `key` and its layout, or None when either is missing, damaged, or
    the layout names a symbol the object lacks (a hand-edited file): then it is compiled anew."""
    obj = jit.cache_load(directory, key)
    layout = _load_layout(directory, key, module) if obj is not None else None
    if obj is None or layout is None:
        return None
    code = jit.Code(obj, directory)
    try:
        for entry in layout["functions"].values():
            code.address(entry["symbol"])
    except KeyError:
        return None
    return code, layout


def compile_module(module: Module, cache_dir: Path | str | None | object = _DEFAULT,
                   source: Module | None = None) -> Executable:
    """Compile a verified module of plain functions for this CPU.

    `source` is the module `module` was made from (by differentiating and optimizing), where
    `exe(f, ...)` looks up the name of a traced function `f`; by default `module` itself.

    Compiled code is cached in memory (while an Executable of it lives) and under `cache_dir`
    (default ~/.cache/eqsat/objects; None turns the disk cache off; "" is refused), keyed by
    the module text, target and code generator.
    """
    module = plain_module(module, "compile_module")
    settings.requested_compile_workers()  # a bad value is an error at every compile
    if cache_dir == "":
        raise Error("cache_dir is empty: pass None to turn the disk cache off, or a directory "
                    "('.' for the current one)")
    directory = jit.default_cache_dir() if cache_dir is _DEFAULT else (
        Path(cache_dir) if cache_dir is not None else None)
    key = cache_key(module)
    with _lock:
        code = _memory.get(key)  # its layout lives in _layouts exactly as long as it does
        if code is not None:
            layout = _layouts[code]
        else:
            cached = _from_disk(directory, key, module)
            if cached is None:
                text, plans = lower(module)
                obj = compile_workers.compile_objects(text)
                layout = _layout(plans)
                # the layout first: an object without its layout is a miss, never a wrong call
                cache.store_checked(directory, f"{key}.layout.json",
                                    json.dumps(layout).encode())
                jit.cache_store(directory, key, obj)
                code = jit.Code(obj, directory)
            else:
                code, layout = cached
            _memory[key] = code
            _layouts[code] = layout
    return Executable(module, code, layout, key, source)
