"""Cost models: the seconds a kernel takes on a target, and the seconds of a whole module.

A `CostModel` prices one statement from its op, attributes, operand types and result types.
The `Roofline` model does it from what the kernel must do (`Work`: floating-point operations,
bytes moved, kernel launches): max(flops / peak, bytes / bandwidth) plus a launch overhead per
kernel. Work per op comes from a small table keyed by the op table's families, so a new op of a
known family is priced without a new entry; other ops (fused kernels) register theirs with
`register_work`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..cache import cache_dir
from ..errors import Error
from ..host import PARALLEL_MIN_WORK, split_axis, usable_cores
from ..ir.fused import body_flops, compute_dtype, domain
from ..ir.module import Function, Module
from ..ir.op_costs import element_cost
from ..ir.ops import OPS
from ..ir.types import TensorType
from ..ir.verifier import verify

Attrs = Mapping[str, Any]
Types = Sequence[TensorType]


@dataclass(frozen=True)
class Work:
    """What one statement makes the machine do."""

    flops: float = 0.0
    bytes: float = 0.0
    kernels: int = 0
    one_core: bool = False  # the backend runs it on one thread, whatever its size


@runtime_checkable
class CostModel(Protocol):
    """Prices statements in seconds; `name` is the target it models."""

    name: str

    def stmt_cost(self, op: str, attrs: Attrs, operands: Types, results: Types) -> float:
        """Seconds of one statement (a `call` counts only itself, not its callee)."""
        ...


# Views cost nothing themselves: a reshape is the same buffer. A broadcast or a slice left
# standing is a copy kernel on the GPU (a fused kernel reads its operands through broadcast
# strides, so a broadcast fused away costs nothing); the CPU backend reads both in place
# (`Roofline.in_place`, backend/views.py). A transpose is a copy on both: reading across the
# inner dimension is what layout optimization is meant to avoid.
VIEW_OPS = frozenset({"reshape"})

WorkFn = Callable[[str, Attrs, Types, Types], Work]
_WORK: dict[str, WorkFn] = {}


def register_work(op: str, fn: WorkFn) -> None:
    """Teach every roofline model the work of `op` (for ops outside the core families)."""
    _WORK[op] = fn


def _nbytes(types: Types) -> float:
    return float(sum(t.nbytes for t in types))


def _moved(ins: Types, outs: Types) -> float:
    return _nbytes(ins) + _nbytes(outs)


# Work.flops is in units of the peak rate, which counts a fused multiply-add as two flops. A
# simple elementwise operation (an add, a compare) also takes one vector instruction per lane,
# so each of the op table's element_cost units is worth this many flops.
LANE_FLOPS = 2.0


def elementwise_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """The op's element_cost in its operands' dtype (measured on the generated code:
    transcendentals are polynomials of a dozen or more multiply-adds, sin's argument reduction
    is long) times elements; reads every operand, writes the result: one kernel."""
    per = element_cost(op, compute_dtype(ins or outs)) * LANE_FLOPS
    return Work(per * sum(t.size for t in outs), _moved(ins, outs), 1)


def one_thread(domain: Sequence[int], axes: Sequence[int]) -> bool:
    """Whether a reduction over `axes` of `domain` runs on one thread. The CPU backend
    (`llvm_kernels.reduce_kernel`) splits an outermost kept axis among threads, and cuts one
    whose outermost axis is reduced (a column sum, a full sum) into parts the threads share
    where `host.split_axis` says so (backend/reductions.py); the rest, small or with an odd
    outer extent, runs on one core. Measured (1024x1024 f32, 2 cores): a fused full sum of
    tanh(x) took 260 us on one core against 229 as tanh on both cores and then the sum."""
    reduced = [d in axes for d, n in enumerate(domain) if n != 1]
    if not reduced:
        return True
    return reduced[0] and split_axis(tuple(domain), set(axes)) is None


def reduction_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """One simple operation (the combine, in the input's dtype) per input element."""
    per = element_cost(op, compute_dtype(ins)) * LANE_FLOPS
    return Work(per * sum(t.size for t in ins), _moved(ins, outs), 1,
                one_thread(ins[0].shape, attrs["axes"]))


def matmul_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """2*m*n*k per batch, twice that in f64 (half the lanes). With a = [..., m, k] (in any
    stored layout), a.size * n = batch*m*k*n, so transposed-operand variants are priced by the
    same formula."""
    n = outs[0].shape[-1] if outs[0].rank else 1
    lanes = 2.0 if compute_dtype(ins[:2]).itemsize == 8 else 1.0
    return Work(2.0 * lanes * ins[0].size * n, _moved(ins, outs), 1)


def copy_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """Data movement only (transpose, concat)."""
    return Work(0.0, _moved(ins, outs), 1)


def slice_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """Reads its window of the input and writes it."""
    return Work(0.0, 2 * _nbytes(outs), 1)


def const_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """A scalar constant is an immediate; a larger one is a fill kernel writing its bytes."""
    if all(t.size <= 1 for t in outs):
        return Work()
    return Work(0.0, _nbytes(outs), 1)


def _free(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    return Work()


# A fused kernel reads its operands once (at their own size: broadcasting happens in
# registers) and writes only its result; the intermediates of its body never touch memory.
def map_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """Body operations over the output, one kernel."""
    return Work(LANE_FLOPS * body_flops(attrs["body"], ins, outs[0].shape), _moved(ins, outs), 1)


def map_reduce_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """Body operations plus one reduction operation per element of the broadcast domain."""
    shape = tuple(domain(list(ins))) if ins else ()
    combine = element_cost(attrs["reduce"], compute_dtype(ins))
    ops = body_flops(attrs["body"], ins, shape) + combine * math.prod(shape)
    return Work(LANE_FLOPS * ops, _moved(ins, outs), 1, one_thread(shape, attrs["axes"]))


def matmul_epi_work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """A product (as matmul_work) whose epilogue runs on the result in registers."""
    product = matmul_work(op, attrs, ins[:2], outs)
    epilogue = LANE_FLOPS * body_flops(attrs["body"], [outs[0], *ins[2:]], outs[0].shape)
    return Work(product.flops + epilogue, _moved(ins, outs), 1)


_BY_FAMILY: dict[str, WorkFn] = {
    "unary": elementwise_work, "binary": elementwise_work, "compare": elementwise_work,
    "select": elementwise_work, "reduce": reduction_work, "matmul": matmul_work,
    "transpose": copy_work, "concat": copy_work, "const": const_work,
    # a call's own statement is free; module_cost adds the callee's cost
    "call": _free,
}
# matmul_t's transposed operands are read by the same BLAS / tiled kernel with other strides
# (gemm's transa/transb), so its layout costs nothing beyond matmul's own work.
_WORK.update({"map": map_work, "map_reduce": map_reduce_work, "matmul_t": matmul_work,
              "matmul_epi": matmul_epi_work, "broadcast": copy_work, "slice": slice_work})


def work(op: str, attrs: Attrs, ins: Types, outs: Types) -> Work:
    """The work of one statement, from `register_work`, the view set or the op's family."""
    if op in _WORK:
        return _WORK[op](op, attrs, ins, outs)
    if op in VIEW_OPS:
        return Work()
    opdef = OPS.get(op)
    if opdef is None:
        raise Error(f"the cost model knows no op {op!r}; known ops: {', '.join(sorted(OPS))}")
    fn = _BY_FAMILY.get(opdef.family)
    if fn is None and "elementwise" in opdef.traits:
        fn = elementwise_work
    if fn is None:
        raise Error(f"the cost model has no work formula for op {op!r} (family "
                    f"{opdef.family!r}); register one with eqsat.extract.cost.register_work")
    return fn(op, attrs, ins, outs)


# The share of a kernel's lesser roofline term (compute or memory) that does not overlap with
# the greater, on the CPU. Measured here on kernels where both are of a size (1024x1024, 2
# cores): the fused tanh(exp(x)) took its compute time plus 0.8 of its memory time, a fused
# f64 mul(tanh(x), y) about the sum. At 0.1 the model hid a recomputed tanh under memory
# traffic and fused it into three consumers, 1.2x slower than computing it once. A GPU hides
# memory latency behind other warps; its model keeps the earlier, unmeasured 0.1.
OVERLAP = 0.5


@dataclass(frozen=True)
class Roofline:
    """max(flops / peak_flops, bytes / bandwidth), plus `overlap` times the smaller of the two,
    plus launch seconds per kernel (`serial_launch` for one that runs on one core, where set).

    `peak_flops` in FLOP/s, `bandwidth` in bytes/s, `launch` in seconds. Compute and memory
    traffic overlap well but not perfectly; the small share of the lesser term also means that
    of two kernels moving the same bytes, the one computing less is the cheaper (a pure max
    would call x*x and pow(x, 2) equal in any memory-bound kernel and leave the pick to chance).
    A kernel whose bytes plus simple operations fall below `serial_work` runs on one of the
    `cores` that `peak_flops` counts, at that core's share of the peak (the CPU backend keeps
    such kernels off its threads), and so does one whose Work says `one_core`. A kernel moving
    at most `cache_bytes` moves them at
    `cache_bandwidth` (the kernel before it left them in the cache): that is what fusing such a
    kernel saves, far less than fusing one whose data comes from memory. The ops in `in_place`
    cost nothing: the target's kernels read them through strides where they are consumed.
    """

    name: str
    peak_flops: float
    bandwidth: float
    launch: float
    cores: int = 1
    serial_work: float = 0.0
    cache_bytes: float = 0.0
    cache_bandwidth: float = 0.0
    overlap: float = OVERLAP
    in_place: frozenset[str] = frozenset()
    serial_launch: float | None = None

    def __post_init__(self) -> None:
        for field_name in ("peak_flops", "bandwidth") + (("cache_bandwidth",)
                                                          if self.cache_bytes else ()):
            v = getattr(self, field_name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise Error(f"Roofline {self.name!r}: {field_name} must be a positive number, "
                            f"got {v!r}")
        if not (math.isfinite(self.launch) and self.launch >= 0):
            raise Error(f"Roofline {self.name!r}: launch must be >= 0 seconds, got {self.launch!r}")
        if self.serial_launch is not None and not (math.isfinite(self.serial_launch)
                                                   and self.serial_launch >= 0):
            raise Error(f"Roofline {self.name!r}: serial_launch must be >= 0 seconds, "
                        f"got {self.serial_launch!r}")
        if not (isinstance(self.cores, int) and self.cores >= 1):
            raise Error(f"Roofline {self.name!r}: cores must be an int >= 1, got {self.cores!r}")
        if not (isinstance(self.overlap, (int, float)) and 0 <= self.overlap <= 1):
            raise Error(f"Roofline {self.name!r}: overlap must be in [0, 1], got {self.overlap!r}")
        if not (math.isfinite(self.cache_bytes) and self.cache_bytes >= 0):
            raise Error(f"Roofline {self.name!r}: cache_bytes must be >= 0, "
                        f"got {self.cache_bytes!r}")
        if not (math.isfinite(self.serial_work) and self.serial_work >= 0):
            raise Error(f"Roofline {self.name!r}: serial_work must be >= 0, "
                        f"got {self.serial_work!r}")

    def seconds(self, w: Work) -> float:
        """The roofline time of some work."""
        if w.kernels == 0 and w.flops == 0 and w.bytes == 0:
            return 0.0
        kernels = max(1, w.kernels)
        serial = self.cores > 1 and (w.one_core or
                                     w.bytes + w.flops / LANE_FLOPS < self.serial_work * kernels)
        peak = self.peak_flops / self.cores if serial else self.peak_flops
        # A model without a cache (cache_bytes 0) has no cache bandwidth to move them at.
        cached = 0 < self.cache_bytes and w.bytes <= self.cache_bytes * kernels
        bandwidth = self.cache_bandwidth if cached else self.bandwidth
        compute, memory = w.flops / peak, w.bytes / bandwidth
        launch = self.serial_launch if serial and self.serial_launch is not None else self.launch
        return max(compute, memory) + self.overlap * min(compute, memory) + w.kernels * launch

    def stmt_cost(self, op: str, attrs: Attrs, operands: Types, results: Types) -> float:
        """Seconds of one statement on this target."""
        if op in self.in_place:
            return 0.0
        return self.seconds(work(op, attrs, operands, results))


# An H100/H200-class GPU: fp32 without tensor cores ~60 TFLOP/s, HBM3(e) ~4 TB/s, and a few
# microseconds from one kernel's launch to the next.
CUDA = Roofline("cuda", peak_flops=60e12, bandwidth=4e12, launch=3e-6, overlap=0.1)

# A CPU "launch" is a call from the entry function into a kernel's loop nest. Handing a
# kernel to the thread pool costs about a microsecond: a chain of 41 exps of 4096 floats, made
# to run threaded, took 0.96 us more per kernel than one. A kernel run on the calling core
# is a call and a loop's setup: chains of 41 small kernels ran 3-4 ns per kernel slower than
# one, and at a microsecond apiece the optimizer paid for fewer of them with recomputation
# (an attention's gradient at 2x7x8 ran in 13.9 us optimized, 10.8 us as written).
CPU_LAUNCH = 1e-6
CPU_SERIAL_LAUNCH = 2e-8

# The view ops the CPU backend's kernels read in place (backend/views.py): an LSTM cell whose
# gates are slices of one product ran in 1.24 ms, as fast as on four separate arrays, where the
# slices' copies took 1.63 ms.
CPU_IN_PLACE = frozenset({"slice", "broadcast"})

TARGETS = ("cpu", "cuda")


@functools.lru_cache(maxsize=8)
def _cpu_model(cache: str) -> Roofline:
    from .machine import cpu_rates

    rates = cpu_rates(cache)
    return Roofline("cpu", rates.gflops * 1e9, rates.bandwidth_gbs * 1e9, CPU_LAUNCH,
                    cores=usable_cores(), serial_work=PARALLEL_MIN_WORK,
                    cache_bytes=rates.cache_bytes, cache_bandwidth=rates.cache_bandwidth_gbs * 1e9,
                    in_place=CPU_IN_PLACE, serial_launch=CPU_SERIAL_LAUNCH)


def cost_model(target: str | CostModel, cache: str | None = None) -> CostModel:
    """The cost model of a target by name ("cpu", "cuda"), or a CostModel given as is.

    The cpu model measures this machine on first use (cached on disk; `cache` overrides the
    cache directory).
    """
    if not isinstance(target, str):
        if isinstance(target, CostModel):
            return target
        raise Error(f"a target is a name ({', '.join(TARGETS)}) or a CostModel, "
                    f"not {type(target).__name__}")
    if target == "cuda":
        return CUDA
    if target == "cpu":
        # keyed by the directory itself, so that a later EQSAT_CACHE_DIR is obeyed
        return _cpu_model(str(cache_dir(cache)))
    raise Error(f"unknown target {target!r}; valid targets: {', '.join(TARGETS)}")


def _expanded(module: Module) -> Module:
    verify(module)
    if not module.grad_decls:
        return module
    try:
        from ..ad import differentiate
    except ImportError:
        raise Error("this module has gradient declarations and eqsat.ad is not available to "
                    "expand them; cost eqsat.differentiate(module) instead") from None
    return differentiate(module)


def function_costs(module: Module, target: str | CostModel = "cpu") -> dict[str, float]:
    """Seconds of every function of `module` (a call counts its callee; gradient declarations
    are expanded first)."""
    model = cost_model(target)
    module = _expanded(module)
    done: dict[str, float] = {}
    for f in module.callees_first():
        done[f.name] = own_cost(f, model, done)
    return {f.name: done[f.name] for f in module.functions}


def own_cost(f: Function, model: CostModel, callee_costs: Mapping[str, float]) -> float:
    """Seconds of `f`'s own statements, each call adding `callee_costs[callee]`."""
    env = f.types()
    total = 0.0
    for s in f.body:
        total += model.stmt_cost(s.op, s.attr, [env[o] for o in s.operands], s.types)
        if s.op == "call":
            total += callee_costs[s.attr["callee"]]
    return total


def module_cost(module: Module, target: str | CostModel = "cpu") -> float:
    """The cost model's estimate in seconds for all functions of `module` (eqsat.cost)."""
    return float(sum(function_costs(module, target).values()))
