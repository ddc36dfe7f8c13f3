"""Loop building blocks for kernels: counted loops, strided loop nests, dimension collapsing."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from llvmlite import ir

from .scalar import I64, internal_function

Dims = list[tuple[int, list[int]]]  # (extent, stride of each pointer in elements) per loop


def i64(value: int) -> ir.Constant:
    """An i64 constant."""
    return ir.Constant(I64, value)


def strided_offset(b: ir.IRBuilder, index: ir.Value, shape: Sequence[int],
                   strides: Sequence[int]) -> ir.Value:
    """The element offset, through `strides`, of the flat row-major `index` into `shape` (a
    batch or row number read as its index along each axis; axes of stride 0 or extent 1 add
    nothing)."""
    off, inner = i64(0), 1
    for d in reversed(range(len(shape))):
        if strides[d] and shape[d] > 1:
            idx = b.urem(b.udiv(index, i64(inner)), i64(shape[d]))
            off = b.add(off, b.mul(idx, i64(strides[d])))
        inner *= shape[d]
    return off


def interleaved(branch: ir.Instruction, count: int) -> None:
    """Ask LLVM's loop vectorizer to run `count` vectors of the loop whose back edge is
    `branch` side by side. Its own choice for a long body is one, and a long chain of
    dependent operations then waits on latency: tanh(exp(x)) measured 1.4-1.9x slower than exp
    and tanh as two kernels (1024x1024, f32 and f64), and as fast as them with four."""
    module = branch.function.module
    hint = module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"),
                                ir.Constant(ir.IntType(32), count)])
    # a loop ID is a node whose first operand is itself (so no two loops share one); the
    # placeholder only keeps add_metadata from handing back another loop's node
    unique = ir.MetaDataString(module, f"eqsat.loop.{len(module.metadata)}")
    loop_id = module.add_metadata([unique])
    loop_id.operands = (loop_id, hint)
    branch.set_metadata("llvm.loop", loop_id)


@contextmanager
def counted(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, step: ir.Value, name: str = "i",
            signed: bool = True, interleave: int = 0) -> Iterator[ir.Value]:
    """`for (i = lo; i < hi; i += step)` in lo's integer type (compared `signed` or not): the
    body is emitted inside the `with` block. `interleave` > 1: see `interleaved`."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(lo.type, name=name)
    i.add_incoming(lo, pre)
    less = b.icmp_signed if signed else b.icmp_unsigned
    b.cbranch(less("<", i, hi), body, done)
    b.position_at_end(body)
    yield i
    i.add_incoming(b.add(i, step, name=f"{name}.next"), b.block)
    back = b.branch(head)
    if interleave > 1:
        interleaved(back, interleave)
    b.position_at_end(done)


@contextmanager
def for_range(b: ir.IRBuilder, lo: ir.Value | int, hi: ir.Value | int,
              name: str = "i", interleave: int = 0) -> Iterator[ir.Value]:
    """`for i in range(lo, hi)` over i64: the body is emitted inside the `with` block."""
    lo = i64(lo) if isinstance(lo, int) else lo
    hi = i64(hi) if isinstance(hi, int) else hi
    with counted(b, lo, hi, i64(1), name, interleave=interleave) as i:
        yield i


def nest(b: ir.IRBuilder, dims: Dims, offsets: Sequence[ir.Value | int],
         body: Callable[[list[ir.Value]], None], outer: tuple[ir.Value, ir.Value] | None = None,
         depth: int | None = None, interleave: int = 0) -> None:
    """Loops over `dims` (outermost first), calling `body` with each pointer's element offset.

    `outer` restricts the outermost loop to [lo, hi) (a thread's share); `depth` stops after
    that many loops (the caller writes the innermost one itself); `interleave` applies to the
    innermost loop (see `interleaved`)."""
    offs = [i64(o) if isinstance(o, int) else o for o in offsets]
    depth = len(dims) if depth is None else depth
    if depth == 0:
        body(offs)
        return
    extent, strides = dims[0]
    lo, hi = outer if outer is not None else (i64(0), i64(extent))
    last = depth == 1 and len(dims) == 1
    with for_range(b, lo, hi, name=f"d{len(dims)}", interleave=interleave if last else 0) as i:
        inner = [b.add(o, b.mul(i, i64(s))) if s else o for o, s in zip(offs, strides)]
        nest(b, dims[1:], inner, body, None, depth - 1, interleave)


def tiled_nest(b: ir.IRBuilder, dims: Dims, pair: tuple[int, int], tiles: Sequence[int],
               body: Callable[[list[ir.Value]], None], outer: tuple[ir.Value, ir.Value]) -> int:
    """Loops over `dims` like `nest`, but the two loops of `pair` (indices into dims) walked in
    square blocks inside the others, blocks of `tiles[0]` split into blocks of `tiles[1]`, and
    so on: a transposing copy then works on few pages and cache lines of both arrays at a
    time. `outer` restricts the outermost loop (the first other one, else the outermost
    blocks, numbered row by row); returns that loop's extent."""
    others = [d for k, d in enumerate(dims) if k not in pair]
    (na, sa), (nb, sb) = dims[pair[0]], dims[pair[1]]

    def clipped(start: ir.Value, size: int, end: ir.Value) -> ir.Value:
        stop = b.add(start, i64(size))
        return b.select(b.icmp_signed("<", stop, end), stop, end)

    def level(offs: list[ir.Value], k: int, a: tuple[ir.Value, ir.Value],
              bb: tuple[ir.Value, ir.Value], split: tuple[ir.Value, ir.Value] | None) -> None:
        if k == len(tiles):
            with for_range(b, *a, name="xa") as x:
                row = [b.add(o, b.mul(x, i64(s))) if s else o for o, s in zip(offs, sa)]
                with for_range(b, *bb, name="xb") as y:
                    body([b.add(o, b.mul(y, i64(s))) if s else o for o, s in zip(row, sb)])
            return
        t = tiles[k]

        def tile(a0: ir.Value, b0: ir.Value) -> None:
            level(offs, k + 1, (a0, clipped(a0, t, a[1])), (b0, clipped(b0, t, bb[1])), None)

        if split is not None:  # the outermost blocks, numbered row by row, split by threads
            cols = i64(-(-nb // t))
            with for_range(b, *split, name="blk") as n:
                tile(b.mul(b.udiv(n, cols), i64(t)), b.mul(b.urem(n, cols), i64(t)))
            return
        # tile numbers, relative to the enclosing block's start
        na_k = b.udiv(b.add(b.sub(a[1], a[0]), i64(t - 1)), i64(t))
        nb_k = b.udiv(b.add(b.sub(bb[1], bb[0]), i64(t - 1)), i64(t))
        with for_range(b, i64(0), na_k, name=f"ta{k}") as i:
            with for_range(b, i64(0), nb_k, name=f"tb{k}") as j:
                tile(b.add(a[0], b.mul(i, i64(t))), b.add(bb[0], b.mul(j, i64(t))))

    whole_a, whole_b = (i64(0), i64(na)), (i64(0), i64(nb))
    zeros = [i64(0)] * len(sa)
    if not others:
        level(zeros, 0, whole_a, whole_b, outer)
        return -(-na // tiles[0]) * -(-nb // tiles[0])
    nest(b, others, zeros, lambda offs: level(offs, 0, whole_a, whole_b, None), outer=outer)
    return others[0][0]


def with_trig_fallback(b: ir.IRBuilder, loops: Callable[[], None]) -> None:
    """Emits `loops` (a kernel's loop nest over its range) with sin and cos in their
    small-argument variants, then, where any element needed the full functions, `loops`
    again as before: every result ends up exactly what the full functions give. Kernels that
    call neither get `loops` once, unchanged. Only for kernels whose outputs never alias
    their inputs (the second pass rereads them)."""
    from . import mathlib

    with mathlib.fast_trig(b.function) as fast:
        loops()
    if fast.flag is None:
        return
    full = b.append_basic_block("trig.full")
    done = b.append_basic_block("trig.done")
    b.cbranch(b.icmp_unsigned("!=", b.load(fast.flag), fast.flag.type.pointee(0)), full, done)
    b.position_at_end(full)
    loops()
    b.branch(done)
    b.position_at_end(done)


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


# ---------------------------------------------------------------- streaming (non-temporal) rows

# Elements of one row computed into a stack tile before it is streamed out (fits in L1).
STREAM_TILE = 4096


def stream_dims(dims: Dims) -> Dims | None:
    """`dims` reshaped for `streamed_nest`: at least two loops, the innermost (unit output
    stride) at most STREAM_TILE long; None where that cannot be done exactly."""
    n, strides = dims[-1]
    if strides[0] != 1:
        return None
    if n <= STREAM_TILE:
        return dims if len(dims) > 1 else [(1, [0] * len(strides)), *dims]
    tile = next((t for t in range(STREAM_TILE, 255, -1) if n % t == 0), None)
    if tile is None:
        return None
    return [*dims[:-1], (n // tile, [s * tile for s in strides]), (tile, strides)]


def _stream_copy(module: ir.Module, ty: ir.Type, itemsize: int) -> ir.Function:
    """`void copy(T* dst, T* src, i64 n)`: dst[0:n] = src[0:n], the 64-byte-aligned middle of
    dst written with non-temporal vector stores (they skip the read of each destination line)."""
    p = ty.as_pointer()
    fn, new = internal_function(module, f"eqsat.stream_copy.{ty}",
                                ir.FunctionType(ir.VoidType(), [p, p, I64]), ("nounwind",))
    if not new:
        return fn
    dst, src, n = fn.args
    width = 64 // itemsize
    vec = ir.VectorType(ty, width)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    mis = b.and_(b.ptrtoint(dst, I64), i64(63))
    head = b.udiv(b.and_(b.sub(i64(64), mis), i64(63)), i64(itemsize))
    head = b.select(b.icmp_unsigned("<", head, n), head, n)
    body_n = b.mul(b.udiv(b.sub(n, head), i64(width)), i64(width))
    mid_end = b.add(head, body_n)

    def scalar(lo: ir.Value, hi: ir.Value, name: str) -> None:
        with for_range(b, lo, hi, name=name) as j:
            b.store(b.load(b.gep(src, [j], inbounds=True)), b.gep(dst, [j], inbounds=True))

    scalar(i64(0), head, "h")
    meta = module.add_metadata([ir.Constant(ir.IntType(32), 1)])
    pre = b.block
    hd, bd, dn = (fn.append_basic_block(f"v.{x}") for x in ("head", "body", "done"))
    b.branch(hd)
    b.position_at_end(hd)
    j = b.phi(I64, name="v")
    j.add_incoming(head, pre)
    b.cbranch(b.icmp_signed("<", j, mid_end), bd, dn)
    b.position_at_end(bd)
    v = b.load(b.bitcast(b.gep(src, [j], inbounds=True), vec.as_pointer()), align=itemsize)
    st = b.store(v, b.bitcast(b.gep(dst, [j], inbounds=True), vec.as_pointer()), align=64)
    st.set_metadata("nontemporal", meta)
    j.add_incoming(b.add(j, i64(width)), b.block)
    b.branch(hd)
    b.position_at_end(dn)
    scalar(mid_end, n, "t")
    b.ret_void()
    return fn


def streamed_nest(b: ir.IRBuilder, dims: Dims, lo: ir.Value, hi: ir.Value, out: ir.Value,
                  value: Callable[[list[ir.Value]], ir.Value], itemsize: int) -> None:
    """Loops over `dims` (from `stream_dims`) with the outermost restricted to [lo, hi): each
    innermost row's values (`value(offsets)`, offsets of the other pointers) go to a stack tile
    that is then streamed to `out` past the caches."""
    ty = out.type.pointee
    n, strides = dims[-1]
    with b.goto_entry_block():
        tile = b.alloca(ty, size=n, name="tile")
        tile.align = 64
    copy = _stream_copy(b.module, ty, itemsize)

    def row(offs: list[ir.Value]) -> None:
        with for_range(b, 0, n, name="s") as j:
            inner = [b.add(o, b.mul(j, i64(s))) if s else o for o, s in zip(offs, strides)]
            b.store(value(inner[1:]), b.gep(tile, [j], inbounds=True))
        b.call(copy, [b.gep(out, [offs[0]], inbounds=True), tile, i64(n)])

    nest(b, dims, [0] * len(strides), row, outer=(lo, hi), depth=len(dims) - 1)
