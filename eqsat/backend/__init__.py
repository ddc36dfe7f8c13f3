"""Code generation: the CPU target (llvmlite, MCJIT) turns an optimized module into an
Executable; `emit_llvm` shows the LLVM IR it compiles."""

from .compile_workers import start as start_compile_workers
from .cpu import compile_module, emit_llvm
from .runtime import Executable
from .scalar import LoweringError

__all__ = ["Executable", "LoweringError", "compile_module", "emit_llvm", "start_compile_workers"]
