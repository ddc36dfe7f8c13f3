"""Row-chunked execution of consecutive kernels: loop fusion at the entry function.

A softmax is three kernels over the same rows (a max, a sum of exps, a map); run one after the
other, each streams the whole input from memory. When every kernel's outer iteration r only
touches row r of the buffers the group itself produces (`Kernel.blocks`), the group can instead
run chunk by chunk: all kernels over rows [c, c + chunk), then the next chunk, so the rows a
kernel reads are still in cache from the kernel before it. The group is itself a kernel
(`void g(i64 lo, i64 hi, i8* buffers...)`), so threads split it like any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from llvmlite import ir

from .llvm_kernels import Kernel, KernelBuilder
from .loops import i64
from .reuse import Buffer, overlap
from .scalar import I8, I64

VOIDP = I8.as_pointer()

# The bytes one chunk of a group should touch: half a core's L1 data cache (32 KiB on Zen 4
# and Skylake), so what one kernel writes is still there when the next reads it. Measured on a
# softmax of 4096x1024 f32 (2 threads): 4-24 KiB 0.69 ms, 32 KiB and up (L2) 0.84 ms; layer
# norm, the transformer block and the training step alike at 16 and 128 KiB.
CHUNK_BYTES = 1 << 14
# Groups never chunk finer than this many outer iterations in all (too little work per call).
MIN_EXTENT = 16
# Kernels in one group, at most: LLVM inlines every member into the group's function, and its
# pipeline takes time superlinear in one function's size (as with an entry's kernels, see
# entry.MAX_INLINED_KERNELS). The benchmark workloads' largest group has 8.
MAX_MEMBERS = 16



@dataclass
class Member:
    """One kernel of a group, with the values of its pointers (outputs, then inputs)."""

    kernel: Kernel
    values: list[str]  # root value names, outputs first
    itemsizes: list[int]
    # Values it writes besides its output: a reduction storing its elements into the map
    # after it (reuse.py), whose buffer may reuse one the group still reads.
    also_writes: tuple[str, ...] = ()


@dataclass
class Group:
    """Consecutive kernels that may run row-chunked together."""

    members: list[Member] = field(default_factory=list)
    extent: int = 0
    produced: dict[str, int] = field(default_factory=dict)  # root -> bytes per group row

    def factor(self, m: Member, extent: int | None = None) -> int:
        return m.kernel.extent // (extent or self.extent)


def try_join(group: Group, m: Member, where: Callable[[str], Buffer]) -> bool:
    """Add `m` to `group` if the group stays correct when run chunk by chunk."""
    k = m.kernel
    if k.blocks is None or len(k.blocks) != len(m.values) or k.extent < 1:
        return False
    if not group.members:
        if any(b is None for b in k.blocks[: 1]):
            return False
        group.members.append(m)
        group.extent = k.extent
        group.produced = {m.values[0]: k.blocks[0] * m.itemsizes[0]}
        return True
    extent = math.gcd(group.extent, k.extent)
    if extent < MIN_EXTENT or k.blocks[0] is None or len(group.members) >= MAX_MEMBERS:
        return False
    # Bytes per group row of every buffer already produced, at the (maybe coarser) new rows.
    scale = group.extent // extent
    produced = {v: n * scale for v, n in group.produced.items()}
    f = k.extent // extent
    n_out = 1  # every kernel here has one output
    for idx, (v, blk, size) in enumerate(zip(m.values, k.blocks, m.itemsizes)):
        if v in produced and (idx < n_out or blk is None or blk * f * size != produced[v]):
            return False
    # No buffer the group writes may share memory with another it touches (the arena reuses
    # dead buffers: chunked, a later kernel would overwrite rows an earlier one has yet to
    # read). Buffers it only reads may: two slices of one product (see views.py).
    written = {v for g in (*group.members, m) for v in (g.values[0], *g.also_writes)}
    touched = {v for g in group.members for v in g.values} | set(m.values)
    for v in written:
        if any(overlap(where(v), where(u)) for u in touched if u != v):
            return False
    group.members.append(m)
    group.extent = extent
    produced[m.values[0]] = k.blocks[0] * f * m.itemsizes[0]
    group.produced = produced
    return True


def group_kernel(kb: KernelBuilder, group: Group) -> tuple[Kernel, list[str]]:
    """The kernel running the group chunk by chunk, and the root values of its i8* arguments."""
    values = list(dict.fromkeys(v for m in group.members for v in m.values))
    kb.count += 1
    fnty = ir.FunctionType(ir.VoidType(), [I64, I64, *[VOIDP] * len(values)])
    fn = ir.Function(kb.module, fnty, f"k{kb.count}.chunked")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    lo, hi, *ptrs = fn.args
    arg = dict(zip(values, ptrs))
    row_bytes = sum(n for n in _row_bytes(group).values())
    chunk = max(1, min(group.extent, CHUNK_BYTES // max(1, row_bytes)))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pre = b.block
    head, body, done = (fn.append_basic_block(n) for n in ("chunk.head", "chunk.body", "done"))
    b.branch(head)
    b.position_at_end(head)
    c = b.phi(I64, name="c")
    c.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", c, hi), body, done)
    b.position_at_end(body)
    nxt = b.add(c, i64(chunk))
    end = b.select(b.icmp_signed("<", nxt, hi), nxt, hi)
    for m in group.members:
        f = i64(group.factor(m))
        callee = m.kernel.fn
        tys = callee.function_type.args[2:]
        args = [b.bitcast(arg[v], t) for v, t in zip(m.values, tys)]
        b.call(callee, [b.mul(c, f), b.mul(end, f), *args])
    c.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    work = sum(m.kernel.work for m in group.members)
    return Kernel(fn, group.extent, work), values


def _row_bytes(group: Group) -> dict[str, int]:
    """Bytes per group row of each buffer the group touches (whole buffers where unaligned,
    counted once: they stay in cache too)."""
    out: dict[str, int] = {}
    for m in group.members:
        f = group.factor(m)
        for v, blk, size in zip(m.values, m.kernel.blocks or (), m.itemsizes):
            out[v] = max(out.get(v, 0), blk * f * size if blk is not None else 0)
    return out
