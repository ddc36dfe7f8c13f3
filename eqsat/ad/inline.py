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
from ..ir.module import Names, inlined_sizes
from ..ir.fused import EXPANSIONS, unfuse

# Ops the reverse pass never sees: flattening replaces them by what they stand for.
FLATTENED = frozenset({"call"} | set(EXPANSIONS))

# Flattening copies a callee at every call, so functions that each call the one before twice
# grow it exponentially (14 deep: 49,000 statements and 1.4 s, doubling with each level; 26
# deep would be 100 million); beyond this many a gradient is refused instead.
MAX_FLAT_STATEMENTS = 1_000_000


def flat_size(f: Function, functions: Mapping[str, Function]) -> int:
    """How many statements other than calls `f` runs with its calls inlined (each callee
    counted at every call), computed without inlining."""
    return inlined_sizes({**functions, f.name: f})[f.name]


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
    # Frames [function, env, next statement] on an explicit stack, so call depth is bounded by
    # memory, not by Python's recursion limit (as in the interpreter).
    stack: list[list] = [[f, env, 0]]
    while stack:
        frame = stack[-1]
        func, inner, pc = frame
        if pc == len(func.body):
            stack.pop()
            if stack:  # a callee returned: the caller's names for its results alias its values
                caller, outer, next_pc = stack[-1]
                for ret, mine in zip(func.returns, caller.body[next_pc - 1].results):
                    outer[mine] = inner[ret]
            continue
        frame[2] = pc + 1
        s = func.body[pc]
        operands = tuple(inner[o] for o in s.operands)
        if s.op == "call":
            callee = functions[s.attr["callee"]]
            stack.append([callee, _callee_env(callee, s, operands, inner, names, inlined), 0])
            continue
        stmt = Stmt(tuple(inner[r] for r in s.results), s.op, operands, s.attrs, s.types)
        for t in unfuse(stmt, types, names.taken):
            body.append(t)
            types.update(zip(t.results, t.types))
    return Function(f.name, f.params, f.result_types, body, tuple(env[r] for r in f.returns))


def _callee_env(callee: Function, call: Stmt, operands: tuple[str, ...], env: dict[str, str],
                names: Names, inlined: dict[str, int]) -> dict[str, str]:
    """The names `callee`'s values take when inlined at `call`: its parameters the arguments,
    a value it returns the caller's name for it, the rest fresh names prefixed by its name."""
    inlined[callee.name] = k = inlined.get(callee.name, 0) + 1
    prefix = callee.name if k == 1 else f"{callee.name}.{k}"
    inner = {p.name: a for p, a in zip(callee.params, operands)}
    defined = {r for t in callee.body for r in t.results}
    for ret, mine in zip(callee.returns, call.results):
        if ret in defined and ret not in inner:
            inner[ret] = env[mine]
    for t in callee.body:
        for r in t.results:
            if r not in inner:
                inner[r] = names.fresh(f"{prefix}.{r}")
    return inner
