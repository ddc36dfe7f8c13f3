"""The fusion family: elementwise ops lifted into `map` kernels, producers merged into their
consumers, maps fused into the reductions that read them, bias/activation epilogues attached
to matmuls.

Lifting is a rule per elementwise op of the table (an op reading a broadcast becomes a map
reading the broadcast's input), compiled to egglog like every rule and checked by
`eqsat.rules.check`; the pass lifts the other elementwise ops as it fuses them. The
rules whose right side substitutes one body into another (`fuse_producer`, `fuse_broadcast`,
`fuse_constant`, `fuse_reduce`, `fuse_epilogue`) cannot be egglog rewrites, because a body is
an attribute egglog stores as text: they are a Python pass (`fusion_pass`) that the runner
runs after each round whenever a rule set holds this family. Both only add equal forms;
extraction decides whether a fusion pays.
"""

from __future__ import annotations

from ..ir.ops import BINARY, OPS, UNARY
from ..ir.scalar_expr import elementwise_body
from .fusion_pass import FusionPass
from .lang import Rule, RuleSet, op, var
from .runner import register_pass
from .typing import declare_well_typed


def _lift(name: str) -> list[Rule]:
    # A lone op becomes a kernel where it reads a broadcast: the kernel broadcasts its operand
    # itself, so the broadcast is never materialized. (Lifting it over plain operands would
    # only tie with the op; the pass fuses ops into kernels over plain operands.)
    f, x, y, s, d = op.__getattr__(name), var("x"), var("y"), var("s"), var("d")
    body = elementwise_body(name)
    if OPS[name].arity == 1:
        return [Rule(f"lift_{name}", f(op.broadcast(x, shape=s, dtype=d)),
                     op.map(x, body=body, shape=s, dtype=d))]
    return [Rule(f"lift_{name}_l", f(op.broadcast(x, shape=s, dtype=d), y),
                 op.map(x, y, body=body, like=y)),
            Rule(f"lift_{name}_r", f(x, op.broadcast(y, shape=s, dtype=d)),
                 op.map(x, y, body=body, like=x))]


def lift_rules() -> RuleSet:
    """An elementwise op reading a broadcast becomes a `map` reading the broadcast's input, for
    each unary and binary op of the table (`lift_tanh: tanh(broadcast(?x, shape=?s, dtype=?d))
    => map(?x, body=tanh($0), shape=?s, dtype=?d)`)."""
    return declare_well_typed(
        RuleSet([r for name in sorted(UNARY | BINARY) for r in _lift(name)], "fusion"))


_PASS = FusionPass(frozenset(lift_rules().names()))
register_pass(_PASS)


def fusion() -> RuleSet:
    """The fusion rule set: the lifting rules, with the fusion pass enabled by their presence."""
    return lift_rules()
