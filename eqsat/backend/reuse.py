"""Sharing a reduction's element values with the map after it (softmax's exp, computed once).

A softmax optimizes to `s = map_reduce x, m, body=exp(sub($0, $1)), reduce=sum` followed by
`y = map x, m, s, body=div(exp(sub($0, $1)), $2)`: the map recomputes every exp the reduction
already computed. When the map's result has the reduction's domain, the reduction can store its
element values straight into the map's result buffer, and the map then reads them back in place
of the repeated sub-body (`div($3, $2)` with $3 = y itself): one exp per element instead of two,
and the second read of y comes from cache when the entry runs the pair row-chunked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir import fused
from ..ir.module import Function, Stmt
from ..ir.scalar_expr import App, Arg, Expr, body_args, check_body, substitute

Buffer = tuple[str, int, int]  # as chunks.Buffer: (kind, offset or index, bytes)


@dataclass
class Share:
    """The reduction at `producer` stores its elements into `target` (the map's result); the
    map at `consumer` becomes `stmt`, which reads `target` as its last operand."""

    producer: int
    consumer: int
    target: str
    stmt: Stmt


def _replace(e: Expr, old: Expr, new: Expr) -> tuple[Expr, bool]:
    if e == old:
        return new, True
    if isinstance(e, App):
        parts = [_replace(a, old, new) for a in e.args]
        if any(hit for _, hit in parts):
            return App(e.op, tuple(p for p, _ in parts)), True
    return e, False


def _overlap(a: Buffer, b: Buffer) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] != "arena":
        return a[1] == b[1]
    return a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def find_shares(func: Function, live: Sequence[int], root: Callable[[str], str],
                where: Callable[[str], Buffer]) -> dict[int, Share]:
    """Every (map_reduce, map) pair of `func` that can share element values, by statement
    index (both the producer's and the consumer's index map to the same Share)."""
    types = func.types()
    body = func.body
    out: dict[int, Share] = {}
    for pos, idx in enumerate(live):
        r = body[idx]
        if r.op != "map_reduce" or idx in out:
            continue
        # The consumer must come next, reshapes aside: nothing else may touch its buffer
        # between the reduction writing it and the map reading it.
        nxt = pos + 1
        while nxt < len(live) and body[live[nxt]].op == "reshape":
            nxt += 1
        if nxt == len(live):
            continue
        m = body[live[nxt]]
        if m.op != "map" or live[nxt] in out:
            continue
        domain = fused.domain([types[o] for o in r.operands])
        element = check_body(r.attr["body"], [types[o].dtype for o in r.operands])
        if tuple(m.type.shape) != tuple(domain) or m.type.dtype != element:
            continue
        key = [(root(o), types[o]) for o in m.operands]
        mapping: dict[int, Expr] = {}
        for i in body_args(r.attr["body"]):
            want = (root(r.operands[i]), types[r.operands[i]])
            if want not in key:
                break
            mapping[i] = Arg(key.index(want))
        else:
            shared = substitute(r.attr["body"], mapping)
            if not isinstance(shared, App):
                continue  # a bare operand is no work to save
            new_body, hit = _replace(m.attr["body"], shared, Arg(len(m.operands)))
            y = m.results[0]
            mine = where(root(y))
            if not hit or any(_overlap(mine, where(root(v))) for v in (*r.operands, *r.results)):
                continue
            attrs = {**m.attr, "body": new_body}
            stmt = Stmt(m.results, "map", (*m.operands, y), attrs, m.types)
            out[idx] = out[live[nxt]] = Share(idx, live[nxt], y, stmt)
    return out

