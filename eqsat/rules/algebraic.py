"""The algebraic family: identities, directed distributivity, matrix-chain reordering,
transpose of a product, broadcast algebra, and constant folding (analysis rules).

Full associativity-commutativity of `add` is left out on purpose (3^k e-nodes for k terms).
The broadcast rules are generated from the op table, one per elementwise op.
"""

from __future__ import annotations

from .lang import RuleSet, parse, through_elementwise
from .typing import declare_well_typed

IDENTITIES = """
rule mul_one: mul(?x, const(1.0)) => ?x
rule one_mul: mul(const(1.0), ?x) => ?x
rule add_zero: add(?x, neg(const(0.0))) => ?x
rule zero_add: add(neg(const(0.0)), ?x) => ?x
rule sub_zero: sub(?x, const(0.0)) => ?x
rule div_one: div(?x, const(1.0)) => ?x
rule neg_neg: neg(neg(?x)) => ?x
rule log_exp: log(exp(?x)) => ?x
rule sub_self_neg: sub(neg(const(0.0)), ?x) => neg(?x)
rule mul_neg_one: mul(?x, const(-1.0)) => neg(?x)
rule exp_add: mul(exp(?x), exp(?y)) => exp(add(?x, ?y))
rule recip_rsqrt: recip(sqrt(?x)) => rsqrt(?x)
rule div_recip: div(const(1.0), ?x) => recip(?x) if is_float(?x)
rule relu_relu: relu(relu(?x)) => relu(?x)
rule abs_abs: abs(abs(?x)) => abs(?x)
rule abs_neg: abs(neg(?x)) => abs(?x)
"""

# Small constant exponents as products (numpy special-cases most of them too): a multiply
# instead of a whole pow, exactly rounded for 2 and -1, within an ulp for 3. Half-integer ones
# through sqrt, with pow's own values where sqrt differs: pow(-inf, y) is inf (y > 0) or 0
# (y < 0) where sqrt gives NaN, and pow(-0.0, 0.5) is +0.0 where sqrt gives -0.0 (adding 0.0
# makes it +0.0 and changes nothing else).
POWERS = """
rule pow_zero: pow(?x, const(0.0)) => const(1.0, like=?x)
rule pow_one: pow(?x, const(1.0)) => ?x
rule pow_two: pow(?x, const(2.0)) => mul(?x, ?x)
rule pow_three: pow(?x, const(3.0)) => mul(mul(?x, ?x), ?x)
rule pow_neg_one: pow(?x, const(-1.0)) => recip(?x)
rule pow_two_int: pow(?x, const(2)) => mul(?x, ?x)
rule pow_half: pow(?x, const(0.5)) => select(eq(?x, const(-inf, like=?x)), const(inf, like=?x), add(sqrt(?x), const(0.0, like=?x)))
rule pow_neg_half: pow(?x, const(-0.5)) => select(eq(?x, const(-inf, like=?x)), const(0.0, like=?x), recip(add(sqrt(?x), const(0.0, like=?x))))
rule pow_three_halves: pow(?x, const(1.5)) => select(eq(?x, const(-inf, like=?x)), const(inf, like=?x), mul(?x, sqrt(?x)))
"""

DISTRIBUTIVITY = """
rule factor_mul_add: add(mul(?a, ?b), mul(?a, ?c)) => mul(?a, add(?b, ?c))
rule factor_mul_sub: sub(mul(?a, ?b), mul(?a, ?c)) => mul(?a, sub(?b, ?c))
rule factor_add_mul: add(mul(?b, ?a), mul(?c, ?a)) => mul(add(?b, ?c), ?a)
rule neg_add: add(neg(?x), neg(?y)) => sub(neg(?x), ?y)
rule matmul_factor_left: add(matmul(?a, ?b), matmul(?a, ?c)) => matmul(?a, add(?b, ?c))
rule matmul_factor_right: add(matmul(?a, ?c), matmul(?b, ?c)) => matmul(add(?a, ?b), ?c)
"""

MATMUL = """
rule mm_assoc_right: matmul(matmul(?a, ?b), ?c) => matmul(?a, matmul(?b, ?c)) if rank(?a) == 2
rule mm_assoc_left: matmul(?a, matmul(?b, ?c)) => matmul(matmul(?a, ?b), ?c) if rank(?a) == 2
rule transpose_product: transpose(matmul(?a, ?b), perm=[1,0]) => matmul(transpose(?b, perm=[1,0]), transpose(?a, perm=[1,0]))
rule product_of_transposes: matmul(transpose(?b, perm=[1,0]), transpose(?a, perm=[1,0])) => transpose(matmul(?a, ?b), perm=[1,0])
"""

BROADCAST = """
rule sum_bcast_scalar: sum(broadcast(?x, shape=?s), axes=?ax) => mul(?x, const(size(?s), like=?x)) if rank(?x) == 0, len(?ax) == len(?s), is_float(?x)
rule bcast_bcast: broadcast(broadcast(?x, shape=?s), shape=?t) => broadcast(?x, shape=?t)
rule bcast_same: broadcast(?x, shape=?s) => ?x if shape(?x) == ?s
rule reshape_same: reshape(?x, shape=?s) => ?x if shape(?x) == ?s
rule div_bcast_recip: div(?a, broadcast(?b, shape=?s)) => mul(?a, broadcast(recip(?b), shape=?s)) if is_float(?b)
"""

def _broadcast_rules() -> str:
    return through_elementwise("broadcast({}, shape=?s)", "{op}_of_bcast", "{op}_of_bcasts",
                               "shape(?x) == shape(?y)")


def _folding_rules() -> str:
    lines = []
    for op, expr in (("add", "?a + ?b"), ("sub", "?a - ?b"), ("mul", "?a * ?b"),
                     ("div", "?a / ?b")):
        lines.append(f"analysis rule fold_{op}: {op}(const(?a, dtype=?d, shape=?s), "
                     f"const(?b, dtype=?d, shape=?s)) => const({expr}, dtype=?d, shape=?s)")
    lines.append("analysis rule fold_neg: neg(const(?a, dtype=?d, shape=?s)) => "
                 "const(-?a, dtype=?d, shape=?s)")
    lines.append("analysis rule fold_bcast: broadcast(const(?a, dtype=?d), shape=?s) => "
                 "const(?a, dtype=?d, shape=?s)")
    return "\n".join(lines)


def algebraic() -> RuleSet:
    """The algebraic rule set (identities, distributivity, matmul, broadcast, folding)."""
    text = "\n".join([IDENTITIES, POWERS, DISTRIBUTIVITY, MATMUL, BROADCAST, _broadcast_rules(),
                      _folding_rules()])
    return declare_well_typed(parse(text, "algebraic"))
