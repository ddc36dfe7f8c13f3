"""llvmlite plumbing: the host target machine, the optimization pipeline, object code,
the disk cache of object code, the runtime libraries programs call, and loading object code
into MCJIT."""

from __future__ import annotations

import atexit
import ctypes.util
import functools
import hashlib
import os
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite
import llvmlite.binding as llvm

from .. import cache
from . import blas

POOL_SYMBOL = "eqsat_parallel"  # what kernels call to run on the pool (parallel.py)
POOL_ENTRY = "eqsat.pool.run"  # the pool runtime's function bound to POOL_SYMBOL
POOL_AFTER_FORK = "eqsat.pool.after_fork"  # run in a forked child: frees the pool's flag


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # Explicitly, so math symbols never depend on what the host process happened to load.
    # By its usual soname first: find_library runs ldconfig (a few ms of a cached compile).
    try:
        llvm.load_library_permanently("libm.so.6")
    except RuntimeError:
        libm = ctypes.util.find_library("m")
        if libm:
            llvm.load_library_permanently(libm)


@functools.cache
def _bind_blas() -> None:
    # Only for code that calls it: importing scipy.linalg costs a few hundred milliseconds.
    for symbol, address in blas.addresses().items():
        llvm.add_symbol(symbol, address)


@functools.cache
def host() -> tuple[str, str, str]:
    """The process triple, host CPU name and host CPU features."""
    _init()
    features = llvm.get_host_cpu_features().flatten()
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), features


def target_machine() -> llvm.TargetMachine:
    """A fresh O3 target machine for the host CPU (each engine owns its own)."""
    triple, cpu, features = host()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, jit=True)


@functools.cache
def data_layout() -> str:
    """The host's data layout string."""
    return str(target_machine().target_data)


def vector_bits() -> int:
    """The vector width loops should use: 512 on AVX-512 hosts, else 256."""
    return 512 if "+avx512f" in host()[2].split(",") else 256


def lanes(itemsize: int) -> int:
    """Elements of `itemsize` bytes in one vector of `vector_bits`."""
    return vector_bits() // (8 * itemsize)


@functools.cache
def fingerprint() -> str:
    """What compiled code depends on besides the program: target, llvmlite, this backend's
    own source and the IR layer's it lowers with (fused ops' expansions, scalar bodies' folding,
    the op table and costs it decides threading and interleaving by, the host's limits), so a
    changed code generator never reuses stale objects. Computed once per process: the source a
    process runs is the source it imported."""
    h = hashlib.sha256()
    h.update("\0".join((*host(), llvmlite.__version__)).encode())
    package = Path(__file__).parent.parent
    for path in [*sorted(package.glob("backend/*.py")), *sorted(package.glob("ir/*.py")),
                 package / "host.py"]:
        h.update(path.relative_to(package).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


_DEFINE = re.compile(r"^(define [^\n]*?)$", re.MULTILINE)


def with_function_attributes(text: str) -> str:
    """Add the vector-width preference to every defined function (llvmlite's IR builder knows
    only enum attributes)."""
    attr = f' "prefer-vector-width"="{vector_bits()}"'
    return _DEFINE.sub(lambda m: m.group(1) + attr, text)


# The new pass manager's -O level, and whether its loop unroller runs. O2 has the same loop and
# SLP vectorizers as O3 (the vectorizer still interleaves the loops it vectorizes); the hot
# loops are vectorized by hand or by it, and unrolling them further bought nothing measurable
# while it multiplies the code LLVM must optimize and select instructions for. Measured on
# the benchmark workloads (llvmlite 0.50 / LLVM 22, 2 shared cores, kernel CPU time medians,
# interleaved): O3 -> O2 without unrolling cut pipeline plus code generation of train_step
# from 3.6 to 1.3 s, mlp_fwd 0.69 -> 0.26 s, transformer 1.5 -> 1.0 s, with every workload's
# kernels within ~2% of their O3 time at load ~2 (differences of either sign up to 6% at
# load 4: noise). A loop that does need unrolling can ask for it: the unroller still honours
# `llvm.loop.unroll.count` metadata when it is otherwise off.
SPEED_LEVEL = 2
UNROLL_LOOPS = False


def optimize(text: str) -> llvm.ModuleRef:
    """Parse, verify and run the optimization pipeline (`SPEED_LEVEL`, loop and SLP
    vectorization, unrolling as `UNROLL_LOOPS`) over LLVM IR text, duplicates merged first.

    Modules have several functions that run the same kernel on the same shapes (a forward
    value recomputed by the gradient function); merged first (callers of a copy call the kept
    one; a copy whose address is taken becomes a one-call thunk), each kernel costs the
    pipeline and code generation (a matmul: 0.1-0.2 s) once."""
    return optimize_attributed(with_function_attributes(text), SPEED_LEVEL, UNROLL_LOOPS)


def optimize_attributed(text: str, level: int, unroll: bool) -> llvm.ModuleRef:
    """`optimize` of text whose functions carry their attributes already, at -O`level`
    (a compile worker's entry: it gets the settings of the process it compiles for)."""
    _init()
    mod = llvm.parse_assembly(text)
    mod.verify()
    tm = target_machine()
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = unroll
    pb = llvm.create_pass_builder(tm, pto)
    merge_functions(mod, pb)
    run_passes(pb.getModulePassManager(), mod, pb)
    return mod


def merge_functions(mod: llvm.ModuleRef, pb: llvm.PassBuilder) -> None:
    """Keep one body of functions that are equal (LLVM's MergeFunctions), drop the rest."""
    merge = llvm.ModulePassManager()
    merge.add_merge_functions_pass()
    merge.add_global_dead_code_eliminate_pass()
    run_passes(merge, mod, pb)


def run_passes(pm: llvm.ModulePassManager, mod: llvm.ModuleRef, pb: llvm.PassBuilder) -> None:
    """Run pass manager `pm` over `mod`, then free it (every caller builds one per run)."""
    try:
        pm.run(mod, pb)
    finally:
        free_pass_manager(pm)


def free_pass_manager(pm: llvm.ModulePassManager) -> None:
    """Free `pm`'s native pass pipeline now. llvmlite 0.45-0.50 never does: ModulePassManager
    lists ObjectRef before NewPassManager among its bases, so ObjectRef's empty `_dispose`
    hides the one that deletes it, and every pipeline built stayed for the life of the process
    (~80 KB per cold compile: a process compiling 1000 programs grew by 84 MB). Where
    llvmlite's own `close` works it is used."""
    if pm.closed:
        return
    if type(pm)._dispose is llvm.ffi.ObjectRef._dispose:
        llvm.ffi.lib.LLVMPY_DisposeNewModulePassManger(pm)
        pm.detach()
    else:
        pm.close()


def compile_object(text: str) -> bytes:
    """Optimized machine code for LLVM IR text, as an object file."""
    return target_machine().emit_object(optimize(text))


_PACKED = b"eqsat-objects\0"


def pack_objects(objects: list[bytes]) -> bytes:
    """Several object files as one blob (a program compiled in parts); one stays as it is."""
    if len(objects) == 1:
        return objects[0]
    sizes = struct.pack(f"<{len(objects) + 1}Q", len(objects), *map(len, objects))
    return _PACKED + sizes + b"".join(objects)


def unpack_objects(blob: bytes) -> list[bytes]:
    """The object files of a `pack_objects` blob (a plain object file: itself)."""
    if not blob.startswith(_PACKED):
        return [blob]
    at = len(_PACKED)
    (count,) = struct.unpack_from("<Q", blob, at)
    sizes = struct.unpack_from(f"<{count}Q", blob, at + 8)
    at += 8 * (count + 1)
    out = []
    for size in sizes:
        out.append(blob[at:at + size])
        at += size
    if at != len(blob):
        raise ValueError("a packed object blob of the wrong length")
    return out


def hold_across_fork(lock: threading.Lock | threading.RLock | None) -> None:
    """Make os.fork wait for `lock` and give the child its own free: a child forked while
    another thread held it (compiling, or freeing an engine) inherited it held by no thread of
    its own, and its first compile hung; waiting also keeps the child's LLVM state from being
    caught mid-call. Fork takes the locks in the reverse of this order: register an outer lock
    after the ones taken inside it."""
    if lock is not None and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=lock.acquire, after_in_parent=lock.release,
                            after_in_child=lock.release)


# llvmlite's own lock around every call into LLVM (private: where it is missing, not held)
_LLVM_LOCK = getattr(getattr(llvm.ffi.lib, "_lock", None), "_lock", None)
hold_across_fork(_LLVM_LOCK)


def _keep_out_of_llvm_at_exit() -> None:
    """At the interpreter's exit, wait for the call into LLVM another thread is in, and keep
    every other thread out of LLVM from then on (the lock is reentrant: this thread's own
    finalization still frees what it holds). The process's exit tears down LLVM's global
    state: a daemon thread still compiling then crashed it (a segfault, or an LLVM assertion
    in the middle of its pass pipeline)."""
    if _LLVM_LOCK is not None:
        _LLVM_LOCK.acquire()


atexit.register(_keep_out_of_llvm_at_exit)


@dataclass(frozen=True)
class Runtime:
    """A library that compiled programs call, compiled once per machine and code generator
    (its object is cached beside the programs' as `runtime-NAME-FINGERPRINT.o`) and loaded once
    per process, where `exports` binds each symbol programs call to the library's own. Code
    every program would otherwise compile again (the GEMM's driver: ~0.2 s of LLVM per cold
    compile) belongs here."""

    name: str
    exports: dict[str, str]
    ir: Callable[[str, str], str]  # (triple, data layout) -> the library's LLVM IR
    optimized: bool  # through the optimization pipeline, or emitted as built
    on_load: Callable[[Code], None] | None = None


def _pool_ir(triple: str, layout: str) -> str:
    from . import parallel  # here: parallel imports the kernel builders

    return parallel.runtime_ir(triple, layout)


def _pool_loaded(code: Code) -> None:
    if hasattr(os, "register_at_fork"):
        after_fork = ctypes.CFUNCTYPE(None)(code.address(POOL_AFTER_FORK))
        _runtime_hooks.append(after_fork)
        os.register_at_fork(after_in_child=after_fork)


def _gemm_ir(dtype: str) -> Callable[[str, str], str]:
    def build(triple: str, layout: str) -> str:
        from . import gemm  # the kernel builders: only where the object is not cached

        return gemm.runtime_ir(dtype, triple, layout)
    return build


def gemm_driver(dtype: str) -> str:
    """The symbol of the packed GEMM's driver for `dtype` (see gemm.runtime_ir)."""
    return f"eqsat.gemm.drv.{dtype}"


# The thread pool is control code, as fast as its semaphores either way: built unoptimized, it
# is ready sooner. The GEMM driver (blocking loops, packing, micro-kernel) takes every shape and
# stride as an argument, so one object serves every product of its dtype.
RUNTIMES: tuple[Runtime, ...] = (
    Runtime("pool", {POOL_SYMBOL: POOL_ENTRY}, _pool_ir, optimized=False, on_load=_pool_loaded),
    *(Runtime(f"gemm-{d}", {gemm_driver(d): gemm_driver(d)}, _gemm_ir(d), optimized=True)
      for d in ("f32", "f64")),
)
_loaded: dict[str, Code] = {}  # runtime name -> its engine, kept alive for the process
_runtime_hooks: list[Any] = []  # the pool's after-fork function as a ctypes callable, kept alive
_runtime_lock = threading.Lock()
hold_across_fork(_runtime_lock)


def _bind(rt: Runtime, directory: Path | None) -> None:
    """Load runtime `rt` once per process (from the object cache in `directory`, or built) and
    bind its exports."""
    with _runtime_lock:
        if rt.name in _loaded:
            return
        # Cached beside the kernels' objects (the fingerprint covers this backend's source), so
        # a cached compile neither imports the kernel builders nor builds IR.
        name = f"runtime-{rt.name}-{fingerprint()[:40]}.o"
        obj = cache.load_checked(directory, name)
        if obj is None:
            triple, cpu, features = host()
            text = rt.ir(triple, data_layout())
            if rt.optimized:
                obj = compile_object(text)
            else:
                mod = llvm.parse_assembly(text)
                mod.verify()
                tm = llvm.Target.from_triple(triple).create_target_machine(
                    cpu=cpu, features=features, opt=0)
                obj = tm.emit_object(mod)
            cache.store_checked(directory, name, obj)
        code = Code(obj, directory, runtimes=False)
        _loaded[rt.name] = code
        for symbol, own in rt.exports.items():
            llvm.add_symbol(symbol, code.address(own))
        if rt.on_load is not None:
            rt.on_load(code)


class Code:
    """Object code loaded into an MCJIT engine: symbol addresses stay valid while it lives."""

    def __init__(self, obj: bytes, directory: Path | None = None, runtimes: bool = True):
        """Load `obj` (an object file, or several packed by `pack_objects`), binding first the runtimes it calls (`runtimes`: a runtime itself calls
        none); `directory` is the object cache they may come from."""
        _init()
        if any(symbol.encode() in obj for symbol in blas.all_gemm_symbols()) or \
                blas.THREADS_SYMBOL.encode() in obj:
            _bind_blas()
        if runtimes:
            for rt in RUNTIMES:
                if any(symbol.encode() in obj for symbol in rt.exports):
                    _bind(rt, directory)
        triple = host()[0]
        empty = llvm.parse_assembly(f'target triple = "{triple}"\n')
        self.engine = llvm.create_mcjit_compiler(empty, target_machine())
        for part in unpack_objects(obj):
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(part))
        self.engine.finalize_object()

    def address(self, symbol: str) -> int:
        """The address of a defined symbol."""
        addr = self.engine.get_function_address(symbol)
        if not addr:
            raise KeyError(symbol)
        return addr


def default_cache_dir() -> Path:
    """Where compiled objects go: `objects/` in eqsat's cache directory."""
    return cache.cache_dir() / "objects"


def cache_load(directory: Path | None, key: str) -> bytes | None:
    """Object code stored under `key`, or None."""
    return cache.load_checked(directory, f"{key}.o")


def cache_store(directory: Path | None, key: str, obj: bytes) -> None:
    """Store object code; a cache that cannot be written is skipped, never an error."""
    cache.store_checked(directory, f"{key}.o", obj)
