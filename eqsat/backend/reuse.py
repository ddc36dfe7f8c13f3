"""Sharing a reduction's element values with the map after it (softmax's exp, computed once).

A softmax optimizes to `s = map_reduce x, m, body=exp(sub($0, $1)), reduce=sum` followed by
`y = map x, m, s, body=div(exp(sub($0, $1)), $2)`: the map recomputes every exp the reduction
already computed. When the map's result has the reduction's domain, the reduction can store its
element values straight into the map's result buffer, and the map then reads them back in place
of the repeated sub-body (`div($3, $2)` with $3 = y itself): one exp per element instead of two,
and the second read of y comes from cache when the entry runs the pair row-chunked. A few
statements may come in between (the optimizer's softmax takes the reciprocal of its sums there)
as long as none of them touches y's buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir import fused
from ..ir.module import Function, Stmt
from ..ir.scalar_expr import App, Arg, Expr, body_args, check_body, substitute

Buffer = tuple[str, int, int]  # (kind, offset or index, bytes): where a value lives
LOOKAHEAD = 4  # statements between a reduction and the map that may share its elements


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


def overlap(a: Buffer, b: Buffer) -> bool:
    """Whether two buffers share memory: arena ranges that intersect, or one input or output
    array (a value and a view of it, see views.py)."""
    if a[0] != b[0]:
        return False
    if a[0] != "arena":
        return a[1] == b[1]
    return a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def _consumer(body: Sequence[Stmt], live: Sequence[int], pos: int,
              domain: tuple[int, ...]) -> int | None:
    """The position in `live` of the first map over `domain` after `pos`, looking at most
    LOOKAHEAD statements ahead and not past a call (its callee's arena is out of sight)."""
    for k in range(pos + 1, min(len(live), pos + 1 + LOOKAHEAD)):
        s = body[live[k]]
        if s.op == "call":
            return None
        if s.op == "map" and tuple(s.type.shape) == domain:
            return k
    return None


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
        # The consumer is the first map over the reduction's domain within a few statements
        # (a softmax may take the reciprocal of its sums in between); nothing in between may
        # touch the consumer's buffer, which the reduction writes early.
        domain = tuple(fused.domain([types[o] for o in r.operands]))
        element = check_body(r.attr["body"], [types[o].dtype for o in r.operands])
        nxt = _consumer(body, live, pos, domain)
        if nxt is None or live[nxt] in out:
            continue
        m = body[live[nxt]]
        if m.type.dtype != element:
            continue
        between = {root(v) for i in live[pos + 1:nxt] for v in (*body[i].operands,
                                                                 *body[i].results)}
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
            others = {root(v) for v in (*r.operands, *r.results)} | between
            if not hit or any(overlap(mine, where(v)) for v in others):
                continue
            attrs = {**m.attr, "body": new_body}
            stmt = Stmt(m.results, "map", (*m.operands, y), attrs, m.types)
            out[idx] = out[live[nxt]] = Share(idx, live[nxt], y, stmt)
    return out

