"""GPU kernels for the statements of an optimized module: one `ptx_kernel` per statement.

Every kernel takes `(T addrspace(1)* out, T addrspace(1)* in...)` and carries its own launch
configuration, chosen from its shape when it is built. `GPU_KERNELS` maps an op (or its
family) to a builder; `build_gpu_kernel` is the one dispatcher and names the op it cannot lower.
The building blocks shared by the kernel families (grid-stride loops, index decomposition,
loads through strides) live here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from ..ir.module import Stmt
from ..ir.ops import lookup
from ..ir.types import DType, TensorType
from . import nvptx_target as T
from .loops import counted
from .scalar import I32, I64, LoweringError, llvm_type

# Grid-stride kernels never launch more blocks than this: enough to fill an H100/H200
# (132 SMs x 8 resident blocks of 256 threads, twice over); each thread then loops.
MAX_BLOCKS = 2112
BLOCK = 256
# Index arithmetic is 32-bit (cheaper division by constants) below this many items.
I32_LIMIT = 2**30


@dataclass
class GpuKernel:
    """A built kernel: its PTX entry name, its launch configuration, and a short description."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    what: str = ""

    @property
    def threads(self) -> int:
        g, bl = self.grid, self.block
        return g[0] * g[1] * g[2] * bl[0] * bl[1] * bl[2]


class GpuKernelBuilder:
    """Creates kernels in one NVPTX module under unique names."""

    def __init__(self, module: ir.Module):
        self.module = module
        self.count = 0
        # Kernels built, by what determines their code: a statement repeated on the same types
        # (a forward value the gradient recomputes, a chain of one op, inlined calls of one
        # function) is one kernel, launched once per statement.
        self.built: dict[tuple, GpuKernel] = {}

    def function(self, op: str, outs: Sequence[DType], ins: Sequence[DType]
                 ) -> tuple[ir.Function, ir.IRBuilder, list[ir.Value], list[ir.Value]]:
        """A new kernel; returns it, a builder in its entry block, its outputs and inputs."""
        self.count += 1
        name = f"k{self.count}_{op}"
        params = [T.global_ptr(llvm_type(d)) for d in (*outs, *ins)]
        fn = T.kernel_function(self.module, name, params)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        return fn, b, list(fn.args[: len(outs)]), list(fn.args[len(outs):])

    def shared(self, ty: ir.Type, count: int) -> ir.Value:
        """A new shared-memory array for the kernel being built."""
        return T.shared_array(self.module, f"smem{self.count}_{len(self.module.globals)}", ty,
                              count)


Builder = Callable[[GpuKernelBuilder, Stmt, Sequence[TensorType]], GpuKernel]


# ---------------------------------------------------------------- index arithmetic


def index_type(items: int) -> ir.IntType:
    """i32 when every index of a kernel with `items` work items fits with room for the step."""
    return I32 if items <= I32_LIMIT else I64


def cint(ty: ir.IntType, v: int) -> ir.Constant:
    """An integer constant."""
    return ir.Constant(ty, v)


def widen(b: ir.IRBuilder, v: ir.Value, ty: ir.IntType) -> ir.Value:
    """An unsigned index in another integer type."""
    if v.type == ty:
        return v
    return b.zext(v, ty) if v.type.width < ty.width else b.trunc(v, ty)


def grid_1d(items: int, per_block: int = BLOCK) -> tuple[int, int, int]:
    """Blocks for a grid-stride loop over `items` with `per_block` items per block per step."""
    return (max(1, min(MAX_BLOCKS, -(-items // per_block))), 1, 1)


@contextmanager
def grid_stride(b: ir.IRBuilder, n: int, ity: ir.IntType, per_block: int | None = None,
                lane_groups: int = 1, name: str = "i") -> Iterator[ir.Value]:
    """`for (i = first; i < n; i += step)` across the whole grid.

    With `lane_groups` g > 1 the block is split into g groups (warps, say), each taking one i:
    i starts at blockIdx.x * g + group and steps by gridDim.x * g; `per_block` is ignored then.
    Without it every thread takes one i: i starts at the global thread index."""
    if lane_groups > 1:
        group = b.udiv(T.tid(b), cint(I32, BLOCK // lane_groups))
        first = b.add(b.mul(T.ctaid(b), cint(I32, lane_groups)), group)
        step = b.mul(T.nctaid(b), cint(I32, lane_groups))
    else:
        first = b.add(b.mul(T.ctaid(b), T.ntid(b)), T.tid(b))
        step = b.mul(T.nctaid(b), T.ntid(b))
    first, step = widen(b, first, ity), widen(b, step, ity)
    with counted(b, first, cint(ity, n), step, name, signed=False) as i:
        yield i


Dims = list[tuple[int, list[int]]]


def offsets(b: ir.IRBuilder, i: ir.Value, dims: Dims, bases: Sequence[int],
            inner_scale: int = 1) -> list[ir.Value]:
    """Each pointer's element offset (i64) of flat index `i` over `dims` (outermost first,
    (extent, strides) each); the innermost index is multiplied by `inner_scale` (the vector
    width, when `i` counts vectors)."""
    ity = i.type
    offs = [cint(I64, base) for base in bases]
    rest = i
    for d in reversed(range(len(dims))):
        extent, strides = dims[d]
        if d == len(dims) - 1 and inner_scale > 1:
            extent //= inner_scale
        if d == 0:
            idx = rest
        else:
            idx = b.urem(rest, cint(ity, extent))
            rest = b.udiv(rest, cint(ity, extent))
        wide = widen(b, idx, I64)
        scale = inner_scale if d == len(dims) - 1 else 1
        offs = [b.add(o, b.mul(wide, cint(I64, s * scale))) if s else o
                for o, s in zip(offs, strides)]
    return offs


def load(b: ir.IRBuilder, ptr: ir.Value, off: ir.Value) -> ir.Value:
    """One element at an element offset."""
    return b.load(b.gep(ptr, [off], inbounds=True))


def store(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, off: ir.Value) -> None:
    """Store one element at an element offset."""
    b.store(value, b.gep(ptr, [off], inbounds=True))


# ---------------------------------------------------------------- the dispatcher

# By op name first (fused ops share families), then by family; filled by the kernel modules.
GPU_KERNELS: dict[str, Builder] = {}


def build_gpu_kernel(kb: GpuKernelBuilder, s: Stmt, ins: Sequence[TensorType]) -> GpuKernel:
    """The GPU kernel computing statement `s` from operands of types `ins`."""
    from . import nvptx_matmul, nvptx_pointwise, nvptx_reduce  # noqa: F401  (fill the table)

    builder = lookup(GPU_KERNELS, s.op)
    if builder is None:
        raise LoweringError(f"the CUDA backend cannot lower op {s.op!r} "
                            f"(%{', %'.join(s.results)} = {s.op} ...: no GPU kernel for it)")
    key = (s.op, repr(s.attrs), s.types, tuple(ins))  # repr: -0.0 is not 0.0, nan is nan
    kernel = kb.built.get(key)
    if kernel is None:
        kernel = kb.built[key] = builder(kb, s, ins)
    return kernel
