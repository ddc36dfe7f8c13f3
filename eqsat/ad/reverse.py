"""The one backward pass: from a straight-line function to its adjoint function.

The generated function is the primal body followed by the adjoint statements, in reverse
order of the primal, then dead-code elimination and readable naming (`%x.adj` is the adjoint
of `%x`; `%x.adj.1`, `%x.adj.2` are contributions that sum to it; `%y.bwd` are intermediates
of the rule of `%y`).
"""

from __future__ import annotations

from collections import defaultdict

from ..errors import VerifyError
from ..ir import OPS, Function, Param, Stmt
from ..ir.verifier import seed_names
from .builder import Builder, is_placeholder
from ..ir.module import Names
from .inline import FLATTENED
from .vjp_rules import VJP_RULES


def adjoint(f: Function, kind: str, wrt: tuple[str, ...], name: str) -> Function:
    """The `kind` ("grad", "value_and_grad" or "vjp") function of call-free `f` w.r.t. `wrt`."""
    seeds = ()
    if kind == "vjp":
        seeds = tuple(Param(n, t) for n, t in zip(seed_names(f.params, len(f.returns)),
                                                  f.result_types))
    b = Builder({**f.types(), **{p.name: p.type for p in seeds}}, f.body)
    contribs: dict[str, list[str]] = defaultdict(list)
    for i, (r, t) in enumerate(zip(f.returns, f.result_types)):
        if t.dtype.is_float:
            contribs[r].append(seeds[i].name if seeds else b.const(1.0, t, name=f"{r}.adj"))

    for s in reversed(f.body):
        r = s.results[0]
        if r not in contribs or not b.types[r].dtype.is_float:
            continue
        rule = VJP_RULES.get(s.op)
        if rule is None:
            if any(b.types[o].dtype.is_float for o in s.operands):
                raise VerifyError(f"cannot differentiate @{f.name}: op {s.op!r} (in %{r}) has "
                                  f"no gradient rule")
            continue
        g = _total(b, r, contribs.pop(r))
        b.context = r
        for operand, c in zip(s.operands, rule(b, s, g)):
            if c is not None and b.types[operand].dtype.is_float:
                contribs[operand].append(c)

    grads = []
    for w in wrt:
        b.context = w
        total = _total(b, w, contribs.pop(w)) if w in contribs else None
        if total is None:
            total = b.const(0.0, b.types[w])
            b.claim(total, f"{w}.adj")
        grads.append(total)
    returns = (f.returns if kind == "value_and_grad" else ()) + tuple(grads)
    result_types = tuple(b.types[r] for r in returns)
    body = _live(list(f.body) + b.stmts, returns)
    taken = {p.name for p in f.params + seeds} | {r for s in body for r in s.results
                                                    if not is_placeholder(r)}
    body, returns = _name(body, returns, b.preferred, Names(taken))
    return Function(name, f.params + seeds, result_types, body, returns)


def _pad(b: Builder, part: str) -> tuple[int, int, int, str] | None:
    """(axis, start, stop, piece) where `part` is a concat of zeros and one piece along an
    axis (the adjoint of a slice along that axis, see vjp_rules._slice); else None."""
    s = b.defining(part)
    if s is None or s.op != "concat":
        return None
    pieces = [k for k, o in enumerate(s.operands) if b.known(o) != 0.0]
    if len(pieces) != 1:
        return None
    axis = s.attr["axis"]
    start = sum(b.types[o].shape[axis] for o in s.operands[: pieces[0]])
    piece = s.operands[pieces[0]]
    return axis, start, start + b.types[piece].shape[axis], piece


def _joined(b: Builder, v: str, parts: list[str]) -> list[str]:
    """`parts` with the adjoints of disjoint slices along one axis joined into one concat:
    an LSTM's four gate slices of one product gave four zero-padded copies of the product's
    shape, summed (five passes over it); they are now one concat of the four pieces."""
    pads = [_pad(b, p) for p in parts]  # a part may come twice (add %x, %x)
    by_axis: dict[int, list[int]] = defaultdict(list)
    for k, pad in enumerate(pads):
        if pad is not None:
            by_axis[pad[0]].append(k)
    out = [p for p, pad in zip(parts, pads) if pad is None]
    for axis, group in by_axis.items():
        group.sort(key=lambda k: pads[k][1])
        chosen, end = [], 0
        for k in group:
            if pads[k][1] >= end:
                chosen.append(k)
                end = pads[k][2]
            else:
                out.append(parts[k])  # overlapping windows are added
        if len(chosen) < 2:
            out.extend(parts[k] for k in chosen)
            continue
        t, pieces, at = b.types[v], [], 0
        for k in chosen:
            _, start, stop, piece = pads[k]
            if start > at:
                gap = t.shape[:axis] + (start - at,) + t.shape[axis + 1:]
                pieces.append(b.const(0.0, t.with_shape(gap)))
            pieces.append(piece)
            at = stop
        if at < t.shape[axis]:
            gap = t.shape[:axis] + (t.shape[axis] - at,) + t.shape[axis + 1:]
            pieces.append(b.const(0.0, t.with_shape(gap)))
        out.append(b.emit("concat", *pieces, axis=axis))
    return out


def _total(b: Builder, v: str, parts: list[str]) -> str:
    """The sum of the adjoint contributions to `v`, named `%v.adj`."""
    if len(parts) > 1:
        parts = _joined(b, v, parts)
    if len(parts) == 1:
        b.claim(parts[0], f"{v}.adj")
        return parts[0]
    for k, p in enumerate(parts, 1):
        b.claim(p, f"{v}.adj.{k}")
    total = parts[0]
    for k, p in enumerate(parts[1:], 2):
        total = b.emit("add", total, p, name=f"{v}.adj" if k == len(parts) else f"{v}.adj.sum")
    return total


def _live(body: list[Stmt], returns: tuple[str, ...]) -> list[Stmt]:
    """The statements the returned values depend on, in order."""
    needed = set(returns)
    kept = []
    for s in reversed(body):
        if any(r in needed for r in s.results):
            kept.append(s)
            needed.update(s.operands)
    return kept[::-1]


def _name(body: list[Stmt], returns: tuple[str, ...], preferred: dict[str, str],
          names: Names) -> tuple[list[Stmt], tuple[str, ...]]:
    """Readable names for the generated values, in order of definition."""
    rename: dict[str, str] = {}
    out = []
    for s in body:
        for r in s.results:
            if is_placeholder(r):
                rename[r] = names.fresh(preferred[r])
        out.append(Stmt(tuple(rename.get(r, r) for r in s.results), s.op,
                        tuple(rename.get(o, o) for o in s.operands), s.attrs, s.types))
    return out, tuple(rename.get(r, r) for r in returns)


def needs_rule(op: str) -> bool:
    """Whether the reverse pass needs a VJP rule for `op`: every differentiable op but those
    that flattening replaces (call, fused kernels)."""
    return op not in FLATTENED and "differentiable" in OPS[op].traits
