"""A minimal JIT harness for the math library: one loop `out[i] = f(a[i] [, b[i]])`, compiled
for the host CPU at O3 with the new pass manager, callable on numpy arrays. Used by the tests
and the speed measurement; the CPU backend has its own, fuller plumbing."""

from __future__ import annotations

import ctypes
import functools

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from eqsat.backend import mathlib
from eqsat.backend.jit import run_passes


def _new_target_machine() -> llvm.TargetMachine:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3,
        jit=True)


@functools.cache
def _target_machine() -> llvm.TargetMachine:
    """The one for data layouts and pass pipelines; never handed to an engine."""
    return _new_target_machine()


def _loop_module(name: str, ty: ir.Type) -> ir.Module:
    """`void kernel(T* a, [T* b,] T* out, i64 n)` calling the math function on every element."""
    module = ir.Module(name=f"mathlib_{name}")
    module.triple = llvm.get_process_triple()
    module.data_layout = str(_target_machine().target_data)
    fn_math = mathlib.define(module, name, ty)
    arity = len(fn_math.args)
    ptr = ty.as_pointer()
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * (arity + 1) + [i64]), "kernel")
    for arg in fn.args[:-1]:
        arg.add_attribute("noalias")
    *ins, out, n = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, i64(0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(i64(0), entry)
    args = [b.load(b.gep(p, [i], inbounds=True)) for p in ins]
    b.store(b.call(fn_math, args), b.gep(out, [i], inbounds=True))
    nxt = b.add(i, i64(1), flags=["nsw"])
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return module


class Kernel:
    """A compiled elementwise loop over one math function; `.ir` is the optimized LLVM IR."""

    def __init__(self, name: str, dtype: np.dtype | type):
        self.dtype = np.dtype(dtype)
        ty = ir.DoubleType() if self.dtype == np.float64 else ir.FloatType()
        text = str(_loop_module(name, ty))
        # llvmlite's builder knows only enum attributes; the width preference is a string one
        width = "512" if "+avx512f" in llvm.get_host_cpu_features().flatten() else "256"
        mod = llvm.parse_assembly(_with_attr(text, f'"prefer-vector-width"="{width}"'))
        mod.verify()
        tm = _target_machine()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(tm, pto)
        run_passes(pb.getModulePassManager(), mod, pb)
        self.ir = str(mod)
        # An engine owns (and frees) its target machine: a shared one would dangle once a
        # Kernel is garbage-collected.
        self._engine = llvm.create_mcjit_compiler(mod, _new_target_machine())
        self._engine.finalize_object()
        self.arity = 2 if name == "pow" else 1
        proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (self.arity + 1), ctypes.c_int64)
        self._fn = proto(self._engine.get_function_address("kernel"))

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        """Apply the function elementwise to contiguous arrays of the kernel's dtype."""
        ins = [np.ascontiguousarray(a, dtype=self.dtype) for a in arrays]
        if len(ins) != self.arity or len({a.shape for a in ins}) != 1:
            raise ValueError("expected equally shaped operands, one per function argument")
        out = np.empty_like(ins[0])
        self._fn(*[a.ctypes.data for a in ins], out.ctypes.data, out.size)
        return out


def _with_attr(text: str, attr: str) -> str:
    """Attach a string function attribute to @kernel's definition line."""
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if line.startswith('define void @"kernel"'):
            lines[k] = f"{line.rstrip()} {attr}"
    return "\n".join(lines)


@functools.cache
def kernel(name: str, dtype: str) -> Kernel:
    """A cached Kernel for math function `name` on dtype "float32" or "float64"."""
    return Kernel(name, np.dtype(dtype))
