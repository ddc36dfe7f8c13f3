"""NVPTX plumbing: the target machine, kernel functions, thread indices, shared memory,
barriers and warp shuffles, and PTX emission (llvmlite's NVPTX target, O3 pipeline).

Everything emitted here must be selectable by LLVM's NVPTX back end: an intrinsic it cannot
select (`llvm.tanh.f32`) aborts the whole process, so kernels use only plain arithmetic, the
math library's fma/fabs/floor/rint/copysign/sqrt, and the `llvm.nvvm.*` intrinsics below.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import llvmlite.binding as llvm
from llvmlite import ir

from ..errors import Error
from .jit import hold_across_fork, run_passes
from .scalar import I32, I64, declare

TRIPLE = "nvptx64-nvidia-cuda"
DEFAULT_ARCH = "sm_90"
GLOBAL = 1  # address space of device memory: loads become ld.global
SHARED = 3  # address space of a block's shared memory
WARP = 32
FULL_MASK = 0xFFFFFFFF
# Operands of one kernel: PTX 8.0 allows 4352 bytes of kernel parameters, 543 pointers beside
# the output (ptxas refuses more); a longer concat is several kernels, a fused op with more
# operands its expansion into core ops.
MAX_KERNEL_INPUTS = 256

_lock = threading.Lock()
hold_across_fork(_lock)  # a child forked while another thread emitted PTX hung on its first


@functools.cache
def _init() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


# The PTX ISA each arch past sm_90 needs (LLVM aborts the process, uncatchably, when the PTX
# version is older than the target's minimum: "PTX version 8.0 does not support target
# 'sm_100'").
_NEWER_PTX = {100: "+ptx86", 101: "+ptx86", 103: "+ptx88", 110: "+ptx90", 120: "+ptx87",
              121: "+ptx88"}


def _ptx_features(arch: str) -> str:
    """The PTX ISA version an arch needs (sm_90 -> PTX 8.0, as the PITFALLS note measured)."""
    try:
        sm = int(arch.removeprefix("sm_").rstrip("af"))
    except ValueError:
        raise Error(f"unknown GPU arch {arch!r}; write it as sm_XY, e.g. sm_90") from None
    if sm < 70:
        raise Error(f"GPU arch {arch} is too old: eqsat needs sm_70 or newer (warp shuffles "
                    f"with masks, independent thread scheduling)")
    if sm > 90:
        if sm not in _NEWER_PTX:
            raise Error(f"unknown GPU arch {arch!r}: eqsat knows sm_70 to sm_90 and "
                        f"{', '.join(f'sm_{k}' for k in _NEWER_PTX)}")
        return _NEWER_PTX[sm]
    return "+ptx80" if sm >= 80 else "+ptx70"


def target_machine(arch: str = DEFAULT_ARCH) -> llvm.TargetMachine:
    """An O3 NVPTX target machine for `arch` (sm_70 and newer)."""
    _init()
    features = _ptx_features(arch)
    return llvm.Target.from_triple(TRIPLE).create_target_machine(
        cpu=arch, features=features, opt=3)


@functools.cache
def data_layout(arch: str = DEFAULT_ARCH) -> str:
    """The NVPTX data layout string."""
    return str(target_machine(arch).target_data)


def new_module(name: str, arch: str = DEFAULT_ARCH) -> ir.Module:
    """An empty LLVM module targeting NVPTX."""
    m = ir.Module(name=name)
    m.triple = TRIPLE
    m.data_layout = data_layout(arch)
    return m


def kernel_function(module: ir.Module, name: str, params: Sequence[ir.Type]) -> ir.Function:
    """A `ptx_kernel` entry point; pointer parameters are marked noalias (the buffer planner
    never lets a kernel's output overlap its inputs)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), list(params)), name)
    fn.calling_convention = "ptx_kernel"
    fn.attributes.add("nounwind")
    for a in fn.args:
        if isinstance(a.type, ir.PointerType):
            a.add_attribute("noalias")
    return fn


def global_ptr(ty: ir.Type) -> ir.PointerType:
    """A pointer to `ty` in device (global) memory."""
    return ty.as_pointer(GLOBAL)


# ---------------------------------------------------------------- special registers


def _sreg(b: ir.IRBuilder, name: str) -> ir.Value:
    fn = declare(b.module, f"llvm.nvvm.read.ptx.sreg.{name}", I32, [])
    return b.call(fn, [])


def tid(b: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """threadIdx.<axis> (i32)."""
    return _sreg(b, f"tid.{axis}")


def ntid(b: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """blockDim.<axis> (i32)."""
    return _sreg(b, f"ntid.{axis}")


def ctaid(b: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """blockIdx.<axis> (i32)."""
    return _sreg(b, f"ctaid.{axis}")


def nctaid(b: ir.IRBuilder, axis: str = "x") -> ir.Value:
    """gridDim.<axis> (i32)."""
    return _sreg(b, f"nctaid.{axis}")


def barrier(b: ir.IRBuilder) -> None:
    """__syncthreads()."""
    b.call(declare(b.module, "llvm.nvvm.barrier0", ir.VoidType(), []), [])


def shared_array(module: ir.Module, name: str, ty: ir.Type, count: int) -> ir.Value:
    """A block's shared array of `count` elements; returns a pointer to its first element."""
    arr_ty = ir.ArrayType(ty, count)
    g = ir.GlobalVariable(module, arr_ty, name, addrspace=SHARED)
    g.linkage = "internal"
    g.initializer = ir.Constant(arr_ty, None)
    g.align = 16
    return g.gep([ir.Constant(I32, 0), ir.Constant(I32, 0)])


def shfl_down(b: ir.IRBuilder, value: ir.Value, delta: int) -> ir.Value:
    """__shfl_down_sync(full mask, value, delta) for 8-, 32- and 64-bit scalars."""
    ty = value.type
    bits = 64 if isinstance(ty, ir.DoubleType) else 32 if isinstance(ty, ir.FloatType) \
        else ty.width
    if bits == 64:
        raw = b.bitcast(value, I64) if isinstance(ty, ir.DoubleType) else value
        lo = b.trunc(raw, I32)
        hi = b.trunc(b.lshr(raw, ir.Constant(I64, 32)), I32)
        lo, hi = _shfl_i32(b, lo, delta), _shfl_i32(b, hi, delta)
        joined = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
        return b.bitcast(joined, ty) if isinstance(ty, ir.DoubleType) else joined
    if isinstance(ty, ir.FloatType):
        fn = declare(b.module, "llvm.nvvm.shfl.sync.down.f32", ty, [I32, ty, I32, I32])
        return b.call(fn, [ir.Constant(I32, FULL_MASK), value, ir.Constant(I32, delta),
                           ir.Constant(I32, 0x1F)])
    if bits < 32:
        return b.trunc(_shfl_i32(b, b.zext(value, I32), delta), ty)
    return _shfl_i32(b, value, delta)


def _shfl_i32(b: ir.IRBuilder, value: ir.Value, delta: int) -> ir.Value:
    fn = declare(b.module, "llvm.nvvm.shfl.sync.down.i32", I32, [I32, I32, I32, I32])
    return b.call(fn, [ir.Constant(I32, FULL_MASK), value, ir.Constant(I32, delta),
                       ir.Constant(I32, 0x1F)])


# ---------------------------------------------------------------- PTX


def optimize(text: str, arch: str = DEFAULT_ARCH) -> llvm.ModuleRef:
    """Parse, verify and run the O3 pipeline over NVPTX LLVM IR text."""
    _init()
    mod = llvm.parse_assembly(text)
    mod.verify()
    tm = target_machine(arch)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    run_passes(pb.getModulePassManager(), mod, pb)
    return mod


def to_ptx(module: ir.Module, arch: str = DEFAULT_ARCH) -> str:
    """The PTX assembly of an NVPTX module, after the O3 pipeline."""
    with _lock:  # LLVM's NVPTX code generator is used from one thread at a time
        mod = optimize(str(module), arch)
        return target_machine(arch).emit_assembly(mod)
