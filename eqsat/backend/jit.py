"""llvmlite plumbing: the host target machine, the O3 new-pass-manager pipeline, object code,
the disk cache of object code, and loading object code into MCJIT."""

from __future__ import annotations

import ctypes.util
import functools
import hashlib
import re
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from .. import cache
from . import blas


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # Explicitly, so math symbols never depend on what the host process happened to load.
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


def fingerprint() -> str:
    """What compiled code depends on besides the program: target, llvmlite, and this backend's
    own source (so a changed code generator never reuses stale objects)."""
    h = hashlib.sha256()
    h.update("\0".join((*host(), llvmlite.__version__)).encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


_DEFINE = re.compile(r"^(define [^\n]*?)$", re.MULTILINE)


def with_function_attributes(text: str) -> str:
    """Add the vector-width preference to every defined function (llvmlite's IR builder knows
    only enum attributes)."""
    attr = f' "prefer-vector-width"="{vector_bits()}"'
    return _DEFINE.sub(lambda m: m.group(1) + attr, text)


def optimize(text: str) -> llvm.ModuleRef:
    """Parse, verify and run the O3 pipeline (loop and SLP vectorization) over LLVM IR text."""
    _init()
    mod = llvm.parse_assembly(with_function_attributes(text))
    mod.verify()
    tm = target_machine()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_object(text: str) -> bytes:
    """Optimized machine code for LLVM IR text, as an object file."""
    return target_machine().emit_object(optimize(text))


_runtime: list["Code"] = []  # the thread pool's engine, kept alive for the process


@functools.cache
def _bind_pool() -> None:
    # Built once per process, unoptimized: control code, as fast as its semaphores either way,
    # and ready in ~12 ms instead of ~40 at O3 (a cached compile pays it).
    from . import parallel  # here: parallel imports the kernel builders, which need jit
    triple, cpu, features = host()
    mod = llvm.parse_assembly(parallel.runtime_ir(triple, data_layout()))
    mod.verify()
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=0)
    code = Code(tm.emit_object(mod))
    _runtime.append(code)
    llvm.add_symbol(parallel.POOL_SYMBOL, code.address("eqsat.pool.run"))


class Code:
    """Object code loaded into an MCJIT engine: symbol addresses stay valid while it lives."""

    def __init__(self, obj: bytes):
        _init()
        if any(symbol.encode() in obj for symbol in blas.all_gemm_symbols()) or \
                blas.THREADS_SYMBOL.encode() in obj:
            _bind_blas()
        if b"eqsat_parallel" in obj:
            _bind_pool()
        triple = host()[0]
        empty = llvm.parse_assembly(f'target triple = "{triple}"\n')
        self.engine = llvm.create_mcjit_compiler(empty, target_machine())
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
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
    return cache.load(directory, f"{key}.o")


def cache_store(directory: Path | None, key: str, obj: bytes) -> None:
    """Store object code; a cache that cannot be written is skipped, never an error."""
    cache.store(directory, f"{key}.o", obj)
