"""Column and full reductions cut into parts the threads can share (an IR -> IR lowering step).

The CPU backend splits a reduction among threads along its outermost kept axis; one whose
outermost axis is reduced (a sum down the columns of a matrix, a full sum) has none, and split
by columns instead every thread walked every row for its share of it, several times slower than
one thread walking the rows in order. So before lowering, such a reduction over a domain
[n, rest...] is written as its `host.REDUCTION_PARTS` = P partial reductions and their
combination:

    %x.rows = reshape %x : f32[P, n/P, rest...]
    %y.part = sum %x.rows, axes=[1, ...] : f32[P, kept...]    (threads split the P parts)
    %y      = sum %y.part, axes=[0]      : f32[kept...]

Each part walks its rows in memory order into a partial row of its own, in the arena. Maximum
and minimum are unchanged by the cut; a float sum is rounded as P partial sums added in order,
the same on every machine (P is fixed, not the thread count).
"""

from __future__ import annotations

from ..host import REDUCTION_PARTS, split_axis
from ..ir.fused import domain as broadcast_domain
from ..ir.module import Function, Module, Names, Stmt
from ..ir.ops import OPS, OpTypeError, ops_in
from ..ir.types import TensorType


def split_reductions(module: Module) -> Module:
    """The module with every reduction that `host.split_axis` picks cut into parts."""
    return module.replace([_split_function(it) if isinstance(it, Function) else it
                           for it in module.items])


def _split_function(f: Function) -> Function:
    types = f.types()
    names: Names | None = None
    body: list[Stmt] = []
    for s in f.body:
        cut = _cut(s, types)
        if cut is None:
            body.append(s)
            continue
        if names is None:
            names = Names(set(types))
        body.extend(_parts(s, types, cut, names))
    return f if names is None else Function(f.name, f.params, f.result_types, tuple(body),
                                            f.returns, f.loc, f.return_loc)


def _cut(s: Stmt, types: dict[str, TensorType]) -> tuple[tuple[int, ...], int, str] | None:
    """(the domain, the axis to cut, the reducer) of a reduction to split, else None."""
    # every reduction's partial results are combined by a second reduction of its kind
    if s.op in ops_in("reduce"):
        dom, reducer = types[s.operands[0]].shape, s.op
    elif s.op == "map_reduce":
        dom, reducer = broadcast_domain([types[o] for o in s.operands]), s.attr["reduce"]
    else:
        return None
    axis = split_axis(dom, set(s.attr["axes"]))
    return None if axis is None else (dom, axis, reducer)


def _parts(s: Stmt, types: dict[str, TensorType], cut: tuple[tuple[int, ...], int, str],
           names: Names) -> list[Stmt]:
    """The statements computing `s` as REDUCTION_PARTS partial reductions and their
    combination, or [s] where the types do not come out as `s`'s (never expected)."""
    dom, axis, reducer = cut
    n, rank = dom[axis], len(dom)
    out: list[Stmt] = []
    operands = []
    for o in s.operands:
        t = types[o]
        at = axis - (rank - t.rank)  # broadcasting aligns shapes on the right
        if at < 0:
            operands.append(o)
            continue
        pair = (REDUCTION_PARTS, n // REDUCTION_PARTS) if t.shape[at] == n else (1, 1)
        rt = t.with_shape(t.shape[:at] + pair + t.shape[at + 1:])
        name = names.fresh(f"{o}.rows")
        out.append(Stmt((name,), "reshape", (o,), (), (rt,)))
        types[name] = rt
        operands.append(name)
    axes = tuple(d if d < axis else d + 1 for d in s.attr["axes"])
    attrs = {**s.attr, "axes": axes}
    kept_before = sum(1 for d in range(axis) if d not in s.attr["axes"])
    try:
        pt = OPS[s.op].infer([types[o] for o in operands], attrs, None)
        whole = OPS[reducer].infer([pt], {"axes": (kept_before,)}, None)
    except OpTypeError:
        return [s]
    if whole != s.type:
        return [s]
    part = names.fresh(f"{s.results[0]}.part")
    types[part] = pt
    out.append(Stmt((part,), s.op, tuple(operands), attrs, (pt,), s.loc))
    out.append(Stmt(s.results, reducer, (part,), {"axes": (kept_before,)}, s.types, s.loc))
    return out
