"""The CUDA target: an optimized module lowered to PTX (llvmlite's NVPTX back end), one kernel
per statement, and a launch plan per function that the CUDA runtime replays.

Calls are inlined, reshapes are views of their operand's buffer, and every other value gets a
range of one device arena per function, reused once the value is dead (the CPU backend's
first-fit `Arena`). `emit_ptx` shows the PTX with the launch plan as a comment at its top;
`compile_module` loads it on the GPU and returns an executable called with numpy arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..ir.fused import EXPANSIONS, unfuse_function
from ..errors import Error
from ..ir.module import Function, Module, Stmt, inlined_sizes
from ..ir.types import TensorType
from ..ir.verifier import plain_module
from . import nvptx_target as T
from .entry import Arena
from .nvptx_kernels import GpuKernel, GpuKernelBuilder, build_gpu_kernel


@dataclass
class Launch:
    """One kernel launch: the kernel and the values it writes and reads, in parameter order."""

    kernel: GpuKernel
    values: tuple[str, ...]


@dataclass
class GpuPlan:
    """Where each value of one (call-inlined) function lives and the launches that compute it.

    `where[v]` is ("in", k) for the k-th parameter (copied into the arena at `param_at[k]`
    unless the caller passes a device array) or ("arena", byte offset)."""

    func: Function
    launches: list[Launch] = field(default_factory=list)
    where: dict[str, tuple[str, int]] = field(default_factory=dict)
    param_at: list[int] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)
    arena_bytes: int = 0


@dataclass
class PtxProgram:
    """The PTX of a module and the launch plan of each of its functions."""

    ptx: str
    plans: dict[str, GpuPlan]
    arch: str


def inline_calls(module: Module, func: Function) -> Function:
    """`func` with every call replaced by its callee's statements under fresh names."""
    funcs = {f.name: f for f in module.functions}
    body: list[Stmt] = []
    counter = [0]

    def expand(f: Function, rename: dict[str, str], prefix: str) -> list[str]:
        for s in f.body:
            if s.op != "call":
                names = tuple(prefix + r for r in s.results)
                rename.update(zip(s.results, names))
                body.append(Stmt(names, s.op, tuple(rename[o] for o in s.operands), s.attrs,
                                 s.types))
                continue
            callee = funcs[s.attr["callee"]]
            counter[0] += 1
            inner = {p.name: rename[o] for p, o in zip(callee.params, s.operands)}
            # "/" never appears in an IR name, so an inlined value cannot take the name of one
            # of the caller's values (a caller's %g1.y and call @g's %y did: one buffer, both
            # kernels writing it).
            results = expand(callee, inner, f"{prefix}{callee.name}{counter[0]}/")
            rename.update(zip(s.results, results))
        return [rename[r] for r in f.returns]

    rename = {p.name: p.name for p in func.params}
    returns = expand(func, rename, "")
    return Function(func.name, func.params, func.result_types, tuple(body), tuple(returns))


def _over_parameter_space(s: Stmt, types: Mapping[str, TensorType]) -> bool:
    """A fused statement reading more operands than one kernel's parameters hold: it is
    lowered as its expansion into core ops, each a kernel of a few operands."""
    return s.op in EXPANSIONS and len(s.operands) > T.MAX_KERNEL_INPUTS


def plan_function(module: Module, func: Function, kb: GpuKernelBuilder) -> GpuPlan:
    """Kernels for the live statements of `func` (calls inlined) and their buffers."""
    flat = unfuse_function(inline_calls(module, func), only=_over_parameter_space)
    types = flat.types()
    needed = set(flat.returns)
    live: list[Stmt] = []
    for s in reversed(flat.body):
        if any(r in needed for r in s.results):
            live.append(s)
            needed.update(s.operands)
    live.reverse()
    plan = GpuPlan(flat, types=types)
    root = {p.name: p.name for p in flat.params}  # a reshape views its operand's buffer
    for s in live:
        for r in s.results:
            root[r] = root[s.operands[0]] if s.op == "reshape" else r
    last: dict[str, int] = {}
    for pos, s in enumerate(live):
        for o in s.operands:
            last[root[o]] = pos
    for r in flat.returns:
        last[root[r]] = len(live)
    arena = Arena()
    for k, p in enumerate(flat.params):  # parameters stay for the whole call
        plan.where[p.name] = ("in", k)
        plan.param_at.append(arena.take(p.type.nbytes))
    held: dict[str, tuple[int, int]] = {}
    for pos, s in enumerate(live):
        for r, t in zip(s.results, s.types):
            if root[r] == r:
                held[r] = (arena.take(t.nbytes), t.nbytes)
                plan.where[r] = ("arena", held[r][0])
        if s.op == "concat" and s.type.size > 0:
            plan.launches.extend(_concat_launches(kb, s, [types[o] for o in s.operands]))
        elif s.op != "reshape" and s.type.size > 0:
            kernel = build_gpu_kernel(kb, s, [types[o] for o in s.operands])
            plan.launches.append(Launch(kernel, (*s.results, *s.operands)))
        # Freed only after the results are placed, so no kernel writes over its own inputs.
        for v in {root[o] for o in s.operands} | {root[r] for r in s.results}:
            if v in held and last.get(v, pos) <= pos:
                arena.give(*held.pop(v))
    for v, r in root.items():
        if v != r:
            plan.where[v] = plan.where[r]
    plan.arena_bytes = arena.top
    return plan


def _concat_launches(kb: GpuKernelBuilder, s: Stmt, ins: list[TensorType]) -> list[Launch]:
    """A concat as kernels of at most CONCAT_MAX_INPUTS operands each (a kernel's parameters
    are limited), every one writing its operands' windows of the one result."""
    from .nvptx_layout import CONCAT_MAX_INPUTS, concat

    axis, launches, at = s.attr["axis"], [], 0
    for first in range(0, len(ins), CONCAT_MAX_INPUTS):
        part = ins[first: first + CONCAT_MAX_INPUTS]
        if any(t.size for t in part):
            kernel = concat(kb, s, part, at)
            launches.append(Launch(kernel, (*s.results,
                                            *s.operands[first: first + CONCAT_MAX_INPUTS])))
        at += sum(t.shape[axis] for t in part)
    return launches


def describe(plans: dict[str, GpuPlan]) -> str:
    """The launch plan as PTX comment lines: per function, each kernel's grid, block, values."""
    lines = []
    for name, plan in plans.items():
        lines.append(f"// @{name}: {len(plan.launches)} launches, arena {plan.arena_bytes} bytes")
        for ln in plan.launches:
            k = ln.kernel
            values = ", ".join("%" + v for v in ln.values)
            lines.append(f"//   {k.name} grid={k.grid} block={k.block} ({values}): {k.what}")
    return "\n".join(lines)


# A GPU call runs its callees inlined, one launch per statement: functions that each call the
# one before twice double that at every level (8 deep took 51 s of PTX generation when each
# statement had a kernel of its own), so beyond this many statements a function is refused.
MAX_INLINED_STATEMENTS = 100_000


def build(module: Module, arch: str = T.DEFAULT_ARCH) -> PtxProgram:
    """Lower a module of plain functions to PTX and launch plans."""
    module = plain_module(module, "the CUDA backend")
    for name, size in inlined_sizes({f.name: f for f in module.functions}).items():
        if size > MAX_INLINED_STATEMENTS:
            raise Error(f"the CUDA backend runs @{name} with its calls inlined: {size:,} "
                        f"statements, each a launch, more than the {MAX_INLINED_STATEMENTS:,} "
                        f"it generates code for (a function called twice by each of a chain "
                        f"of callers is copied once per call); the CPU target calls functions "
                        f"out of line")
    llmod = T.new_module(module.name, arch)
    kb = GpuKernelBuilder(llmod)
    plans = {f.name: plan_function(module, f, kb) for f in module.functions}
    ptx = T.to_ptx(llmod, arch)
    return PtxProgram(f"{describe(plans)}\n{ptx}", plans, arch)


def emit_ptx(module: Module, arch: str = T.DEFAULT_ARCH) -> str:
    """The PTX for the whole module (one kernel per statement), with each function's launch
    plan as a comment at its top; assembles with `ptxas -arch=<arch>`."""
    return build(module, arch).ptx


def compile_module(module: Module, arch: str = T.DEFAULT_ARCH,
                   source: Module | None = None):  # -> CudaExecutable
    """Compile for the GPU: returns an executable whose calls run there and return numpy
    arrays. Raises eqsat.Error when cuda-bindings, the driver or a GPU is missing. `source`:
    as for the CPU's compile_module."""
    from .cuda_runtime import CudaExecutable, require_gpu

    require_gpu()
    return CudaExecutable(module, build(module, arch), source)
