"""Loop building blocks for kernels: counted loops, strided loop nests, dimension collapsing."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from llvmlite import ir

from .scalar import I64

Dims = list[tuple[int, list[int]]]  # (extent, stride of each pointer in elements) per loop


def i64(value: int) -> ir.Constant:
    """An i64 constant."""
    return ir.Constant(I64, value)


@contextmanager
def for_range(b: ir.IRBuilder, lo: ir.Value | int, hi: ir.Value | int,
              name: str = "i") -> Iterator[ir.Value]:
    """`for i in range(lo, hi)`: the body is emitted inside the `with` block."""
    lo = i64(lo) if isinstance(lo, int) else lo
    hi = i64(hi) if isinstance(hi, int) else hi
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), body, done)
    b.position_at_end(body)
    yield i
    nxt = b.add(i, i64(1), name=f"{name}.next")
    i.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)


def nest(b: ir.IRBuilder, dims: Dims, offsets: Sequence[ir.Value | int],
         body: Callable[[list[ir.Value]], None], outer: tuple[ir.Value, ir.Value] | None = None,
         depth: int | None = None) -> None:
    """Loops over `dims` (outermost first), calling `body` with each pointer's element offset.

    `outer` restricts the outermost loop to [lo, hi) (a thread's share); `depth` stops after
    that many loops (the caller writes the innermost one itself)."""
    offs = [i64(o) if isinstance(o, int) else o for o in offsets]
    depth = len(dims) if depth is None else depth
    if depth == 0:
        body(offs)
        return
    extent, strides = dims[0]
    lo, hi = outer if outer is not None else (i64(0), i64(extent))
    with for_range(b, lo, hi, name=f"d{len(dims)}") as i:
        inner = [b.add(o, b.mul(i, i64(s))) if s else o for o, s in zip(offs, strides)]
        nest(b, dims[1:], inner, body, None, depth - 1)


def row_major_strides(shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous row-major array."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> Dims:
    """Drop unit dimensions and merge neighbours that are contiguous for every pointer, so a
    copy of whole rows becomes one long loop that LLVM vectorizes. Never returns no dims."""
    dims: Dims = [(n, [s[d] for s in strides]) for d, n in enumerate(shape) if n != 1]
    merged: Dims = []
    for n, ss in dims:
        if merged:
            pn, pss = merged[-1]
            if all(ps == s * n for ps, s in zip(pss, ss)):
                merged[-1] = (pn * n, ss)
                continue
        merged.append((n, ss))
    return merged or [(1, [0] * len(strides))]
