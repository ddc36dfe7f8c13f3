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


def _total(b: Builder, v: str, parts: list[str]) -> str:
    """The sum of the adjoint contributions to `v`, named `%v.adj`."""
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
