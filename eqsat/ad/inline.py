"""Flattening before the reverse pass: calls inlined, fused kernels expanded into core ops.

The reverse pass then sees one straight-line body of core ops, and the adjoint of a call reuses
the callee's primal values. A callee's values are renamed with its name as a prefix
(`%predict.0`); the value a callee returns takes the caller's name for it, so
`%p = call @predict(...)` still defines `%p`. Fused statements (`map`, `matmul_t`, ... made by
the optimizer) expand with `eqsat.ir.fused.unfuse`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Function, Stmt
from ..ir.module import Names
from ..ir.fused import EXPANSIONS, unfuse

# Ops the reverse pass never sees: flattening replaces them by what they stand for.
FLATTENED = frozenset({"call"} | set(EXPANSIONS))


def flatten(f: Function, functions: Mapping[str, Function], reserved: set[str]) -> Function:
    """`f` with every call (transitively) replaced by the callee's body, fused kernels unfused.

    `reserved` are names the result must not define (a vjp's seed parameters); `f`'s own
    names are kept unless they clash with them.
    """
    own = [p.name for p in f.params] + [r for s in f.body for r in s.results]
    names = Names(reserved | set(own))
    env = {p.name: p.name for p in f.params}
    for s in f.body:
        for r in s.results:
            env[r] = names.fresh(r + ".primal") if r in reserved else r
    body: list[Stmt] = []
    types = {p.name: p.type for p in f.params}
    inlined: dict[str, int] = {}

    def run(func: Function, env: dict[str, str]) -> None:
        for s in func.body:
            operands = tuple(env[o] for o in s.operands)
            if s.op != "call":
                stmt = Stmt(tuple(env[r] for r in s.results), s.op, operands, s.attrs, s.types)
                for t in unfuse(stmt, types, names.taken):
                    body.append(t)
                    types.update(zip(t.results, t.types))
                continue
            callee = functions[s.attr["callee"]]
            inlined[callee.name] = k = inlined.get(callee.name, 0) + 1
            prefix = callee.name if k == 1 else f"{callee.name}.{k}"
            inner = {p.name: a for p, a in zip(callee.params, operands)}
            defined = {r for t in callee.body for r in t.results}
            for ret, mine in zip(callee.returns, s.results):
                if ret in defined and ret not in inner:
                    inner[ret] = env[mine]
            for t in callee.body:
                for r in t.results:
                    if r not in inner:
                        inner[r] = names.fresh(f"{prefix}.{r}")
            run(callee, inner)
            # A callee that returns a parameter, or one value twice: the caller's name aliases.
            for ret, mine in zip(callee.returns, s.results):
                env[mine] = inner[ret]

    run(f, env)
    return Function(f.name, f.params, f.result_types, body, tuple(env[r] for r in f.returns))
