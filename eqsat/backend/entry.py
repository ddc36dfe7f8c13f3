"""One native entry function per IR function, running its kernels over a planned buffer arena.

The entry has the C signature `void f(void **ins, void **outs, char *arena)`. Intermediates
live in one arena whose layout is planned here from value lifetimes: a buffer is reused once its
value (and every reshape viewing it) is dead. Returned values are computed straight into the
caller's output arrays; a call gets scratch space for its callee's arena inside the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llvmlite import ir

from ..ir.module import Function, Module
from ..ir.types import TensorType
from . import blas, fused_kernels  # (importing fused_kernels registers the fused ops' kernels)
from .chunks import Group, Member, group_kernel, try_join
from .llvm_kernels import STREAM_ALIGN, Kernel, KernelBuilder, build_kernel
from .matmul_kernels import matmul_viewed, uses_packed_gemm
from .loops import i64
from .parallel import emit_kernel_call
from .reuse import Buffer, find_shares
from .runtime import STREAM_MIN
from .scalar import I8, I32, I64, declare
from .views import find_views

ALIGN = STREAM_ALIGN  # bytes: a cache line, and the widest vector
# Buffers up to this size are never reused within a call: row statistics (a softmax's maxima
# and sums) then never share memory with each other, which lets their kernels run row-chunked
# together (see chunks.py), for a few extra kilobytes of arena.
KEEP_SMALL = 1 << 18
# An entry calling more kernels than this keeps them out of line: LLVM would inline each
# (internal, called once) into the entry, and its pipeline takes time superlinear in one
# function's size (a chain of 400 small maps: 12 s, 100 ms per kernel). A call costs
# nanoseconds beside a kernel's work.
MAX_INLINED_KERNELS = 32
# A function of more statements than this runs them in parts of this many, each an out-of-line
# function of its own: LLVM's code generation is superlinear in one function's size, and one
# entry holding thousands of calls kept every buffer pointer live across all of them.
PART_STATEMENTS = 256
VOIDP = I8.as_pointer()
ENTRY_TYPE = ir.FunctionType(ir.VoidType(), [VOIDP.as_pointer(), VOIDP.as_pointer(), VOIDP])


def entry_symbol(name: str) -> str:
    """The native symbol of IR function `name`."""
    return f"eqsat.fn.{name}"


class Arena:
    """First-fit allocation of aligned byte ranges, freed blocks coalesced."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self.top = 0

    def take(self, nbytes: int) -> int:
        """The offset of a fresh block of at least `nbytes`."""
        size = -(-nbytes // ALIGN) * ALIGN
        if size == 0:
            return 0
        for k, (off, n) in enumerate(self.free):
            if n >= size:
                self.free[k: k + 1] = [(off + size, n - size)] if n > size else []
                return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
            off = self.free.pop()[0]  # grow the last free block instead of leaving a hole
        else:
            off = self.top
        self.top = off + size
        return off

    def give(self, off: int, nbytes: int) -> None:
        """Return a block taken with `take`."""
        size = -(-nbytes // ALIGN) * ALIGN
        if size == 0:
            return
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self.free = merged


@dataclass
class Plan:
    """Where each value of one function lives and what the entry function runs."""

    func: Function
    live: list[int]  # indices of the statements that contribute to a result
    where: dict[str, tuple[str, int]] = field(default_factory=dict)  # ("in"|"out"|"arena", k)
    scratch: dict[int, int] = field(default_factory=dict)  # call statement -> arena offset
    copies: list[tuple[int, str]] = field(default_factory=list)  # (output, value) copied at exit
    # Views never materialized (see views.py): value -> its element strides into its root's
    # buffer, and its element offset there where not 0.
    views: dict[str, list[int]] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    # value -> the value whose buffer holds it: itself, or for a reshape or a view its
    # operand's root
    root: dict[str, str] = field(default_factory=dict)
    arena_bytes: int = 0


def plan_function(func: Function, callee_arena: dict[str, int]) -> Plan:
    """Dead statements dropped, buffers assigned from lifetimes (see the module docstring)."""
    body = func.body
    needed = set(func.returns)
    live = []
    for idx in reversed(range(len(body))):
        if any(r in needed for r in body[idx].results):
            live.append(idx)
            needed.update(body[idx].operands)
    live.reverse()
    views, offsets = find_views(func, live)
    plan = Plan(func, live, views=views, offsets=offsets)
    params = {p.name: k for k, p in enumerate(func.params)}
    root = plan.root
    root.update((p, p) for p in params)
    for idx in live:
        s = body[idx]
        for r in s.results:
            root[r] = root[s.operands[0]] if s.op == "reshape" or r in plan.views else r
    end = len(live)
    last: dict[str, int] = {}
    for pos, idx in enumerate(live):
        for o in body[idx].operands:
            last[root[o]] = pos
    for r in func.returns:
        last[root[r]] = end
    out_of: dict[str, int] = {}
    for k, r in enumerate(func.returns):
        if root[r] in params or root[r] in out_of:
            plan.copies.append((k, r))
        else:
            out_of[root[r]] = k
    arena = Arena()
    held: dict[str, tuple[int, int]] = {}
    for pos, idx in enumerate(live):
        s = body[idx]
        for r, t in zip(s.results, s.types):
            if root[r] != r:
                continue
            if r in out_of:
                plan.where[r] = ("out", out_of[r])
            else:
                held[r] = (arena.take(t.nbytes), t.nbytes)
                plan.where[r] = ("arena", held[r][0])
        if s.op == "call":
            need = callee_arena[s.attr["callee"]]
            plan.scratch[idx] = arena.take(need)
            arena.give(plan.scratch[idx], need)
        # Freed only after the results are placed, so no kernel writes over its own inputs.
        for v in {root[o] for o in s.operands} | {root[r] for r in s.results}:
            if v in held and last.get(v, pos) <= pos and held[v][1] > KEEP_SMALL:
                arena.give(*held.pop(v))
    for p, k in params.items():
        plan.where[p] = ("in", k)
    for v, r in root.items():
        if v != r:
            plan.where[v] = plan.where[r]
    plan.arena_bytes = arena.top
    return plan


def plan_module(module: Module) -> dict[str, Plan]:
    """A plan for every plain function of the module."""
    plans: dict[str, Plan] = {}
    for f in module.callees_first():
        plans[f.name] = plan_function(f, {n: p.arena_bytes for n, p in plans.items()})
    return plans


def _pointer(b: ir.IRBuilder, fn: ir.Function, where: tuple[str, int]) -> ir.Value:
    ins, outs, arena = fn.args
    kind, k = where
    if kind == "arena":
        return b.gep(arena, [i64(k)], inbounds=True)
    return b.load(b.gep(ins if kind == "in" else outs, [i64(k)], inbounds=True))


def _pointer_array(b: ir.IRBuilder, ptrs: Sequence[ir.Value]) -> ir.Value:
    arr = b.alloca(VOIDP, size=max(1, len(ptrs)))
    for k, p in enumerate(ptrs):
        b.store(p, b.gep(arr, [i64(k)]))
    return arr


def _one_blas_thread(fn: ir.Function, b: ir.IRBuilder, setter: ir.Function | None) -> None:
    """Run the entry with the BLAS on the calling thread alone, restoring its setting at exit
    (`b` is at the end of the entry's code)."""
    if setter is None:
        return
    end = b.block
    b.position_at_start(fn.entry_basic_block)
    old = b.call(setter, [ir.Constant(I32, 1)])
    b.position_at_end(end)
    b.call(setter, [old])


def emit_module(module: Module, plans: dict[str, Plan], llmod: ir.Module) -> None:
    """Emit every function's kernels and its entry function into `llmod`."""
    kb = KernelBuilder(llmod)
    kb.blas_threads = not any(uses_packed_gemm(p.func) for p in plans.values())
    entries = {name: ir.Function(llmod, ENTRY_TYPE, entry_symbol(name)) for name in plans}
    memcpy = declare(llmod, "llvm.memcpy.p0.p0.i64", ir.VoidType(),
                     [VOIDP, VOIDP, I64, ir.IntType(1)])
    callees = {s.attr["callee"] for p in plans.values() for s in p.func.body if s.op == "call"}
    for name, plan in plans.items():
        entry = entries[name]
        entry.attributes.add("nounwind")
        top = ir.IRBuilder(entry.append_basic_block("entry"))
        fn, b = entry, top
        parts = len(plan.live) > PART_STATEMENTS
        types = plan.func.types()
        ptr: dict[str, ir.Value] = {}

        def get(v: str) -> ir.Value:
            if v not in ptr:
                with b.goto_entry_block():
                    ptr[v] = _pointer(b, fn, plan.where[v])
                    if v in plan.offsets:
                        step = plan.offsets[v] * types[v].dtype.itemsize
                        ptr[v] = b.gep(ptr[v], [i64(step)], inbounds=True)
            return ptr[v]

        def new_part(k: int) -> None:
            """Continue in out-of-line function number `k`, which the entry calls next."""
            nonlocal fn, b, ptr
            if fn is not entry:
                b.ret_void()
            fn = ir.Function(llmod, ENTRY_TYPE, f"{entry_symbol(name)}.part{k}")
            fn.linkage = "internal"
            fn.attributes.add("nounwind")
            fn.attributes.add("noinline")
            b, ptr = ir.IRBuilder(fn.append_basic_block("entry")), {}
            top.call(fn, list(entry.args))

        root = plan.root
        group = Group()

        def where(v: str) -> Buffer:
            kind, k = plan.where[v]
            return kind, k, types[root[v]].nbytes

        def ref(v: str) -> str:
            """The name a kernel's pointer goes by: a view's own (its pointer is offset and
            its elements strided), else its root's."""
            return v if v in plan.views else root[v]

        called: list[ir.Function] = []

        def flush() -> None:
            nonlocal group
            done, group = group, Group()
            if len(done.members) == 1:
                m = done.members[0]
                args = [b.bitcast(get(v), t)
                        for v, t in zip(m.values, m.kernel.fn.function_type.args[2:])]
                emit_kernel_call(b, m.kernel, args)
                called.append(m.kernel.fn)
            elif done.members:
                kernel, values = group_kernel(kb, done)
                emit_kernel_call(b, kernel, [get(v) for v in values])
                called.append(kernel.fn)

        shares = find_shares(plan.func, plan.live, ref, where)
        # Results read back inside the call, or by a caller, are better left in cache.
        reread = {root[o] for idx in plan.live for o in plan.func.body[idx].operands}
        nested = name in callees
        for pos, idx in enumerate(plan.live):
            s = plan.func.body[idx]
            if parts and pos % PART_STATEMENTS == 0:
                flush()
                new_part(pos // PART_STATEMENTS)
            if s.op == "reshape" or any(r in plan.views for r in s.results):
                continue
            if s.op == "call":
                flush()
                ins_arr = _pointer_array(b, [get(o) for o in s.operands])
                outs_arr = _pointer_array(b, [get(r) for r in s.results])
                scratch = b.gep(fn.args[2], [i64(plan.scratch[idx])], inbounds=True)
                b.call(entries[s.attr["callee"]], [ins_arr, outs_arr, scratch])
                continue
            in_types: list[TensorType] = [types[o] for o in s.operands]
            kb.stream = (plan.where[root[s.results[0]]][0] == "out"
                         and types[s.results[0]].nbytes >= STREAM_MIN and not nested
                         and root[s.results[0]] not in reread and idx not in shares)
            share = shares.get(idx)
            kb.layouts = [plan.views.get(o) for o in s.operands]
            kernel: Kernel
            if s.op == "matmul" and any(o in plan.views for o in s.operands):
                kernel = matmul_viewed(kb, s, in_types, kb.layouts)
                vals = [ref(v) for v in (*s.results, *s.operands)]
            elif share is None:
                kernel = build_kernel(kb, s, in_types)
                vals = [ref(v) for v in (*s.results, *s.operands)]
            elif share.producer == idx:
                kernel = fused_kernels.map_reduce_keeping(kb, s, in_types, types[share.target])
                vals = [ref(v) for v in (*s.results, *s.operands, share.target)]
            else:
                s = share.stmt
                kernel = fused_kernels.map_in_place(kb, s, [types[o] for o in s.operands])
                vals = [ref(v) for v in (*s.results, *s.operands)]
            kb.stream, kb.layouts = False, []
            also = (vals[-1],) if share is not None and share.producer == idx else ()
            m = Member(kernel, vals, [types[v].dtype.itemsize for v in vals], also)
            if not try_join(group, m, where):
                flush()
                if not try_join(group, m, where):
                    group.members.append(m)  # runs alone
                    flush()
        flush()
        if fn is not entry:
            b.ret_void()
            fn, b, ptr = entry, top, {}
        if len(called) > MAX_INLINED_KERNELS:
            for k in called:
                k.attributes.add("noinline")
        if blas.calls_gemm(llmod):
            _one_blas_thread(fn, b, blas.declare_threads(llmod))
        for k, v in plan.copies:
            out = b.load(b.gep(fn.args[1], [i64(k)], inbounds=True))
            b.call(memcpy, [out, get(v), i64(types[v].nbytes), ir.Constant(ir.IntType(1), 0)])
        b.ret_void()
