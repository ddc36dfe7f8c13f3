"""The layout family: transpose and reshape chains compose and cancel, transposes move through
elementwise ops and broadcasts, and transposes of a matmul's operands fold into `matmul_t`
(ta / tb read the operand transposed), so extraction chooses where data is physically rearranged.

Through a broadcast (same rank, from a scalar, or adding leading axes: the operand is first
reshaped to `lpad(shape(?x), ?s)`, its shape padded with 1s), in both directions (the leading-axes
case only outward), with the written shape
computed by the rule language's shape functions:
`transpose(broadcast(?x, shape=?s), perm=?p) => broadcast(transpose(?x, perm=?p),
shape=permute(?s, ?p))`, and back with `permute(?s, inverse(?p))`. Moving the transpose inside
makes it copy the small operand instead of the broadcast result (a broadcast is a view; a
transpose is not), and a scalar's broadcast drops the transpose entirely.
"""

from __future__ import annotations

from .lang import RuleSet, parse, through_elementwise
from .typing import declare_well_typed

CHAINS = """
rule transpose_transpose: transpose(transpose(?x, perm=[1,0]), perm=[1,0]) => ?x
rule transpose3_cancel_021: transpose(transpose(?x, perm=[0,2,1]), perm=[0,2,1]) => ?x
rule transpose3_cancel_102: transpose(transpose(?x, perm=[1,0,2]), perm=[1,0,2]) => ?x
rule transpose3_rotate: transpose(transpose(?x, perm=[1,2,0]), perm=[2,0,1]) => ?x
rule transpose3_rotate_back: transpose(transpose(?x, perm=[2,0,1]), perm=[1,2,0]) => ?x
rule transpose_identity2: transpose(?x, perm=[0,1]) => ?x
rule transpose_identity3: transpose(?x, perm=[0,1,2]) => ?x
rule reshape_reshape: reshape(reshape(?x, shape=?s), shape=?t) => reshape(?x, shape=?t)
rule reshape_const: reshape(const(?a, dtype=?d), shape=?s) => const(?a, dtype=?d, shape=?s)
rule sum_transpose: sum(transpose(?x, perm=[1,0]), axes=[0,1]) => sum(?x, axes=[0,1])
"""

# A transpose commutes with a broadcast that adds no axes (each size-1 axis stretches wherever
# the permutation puts it), the written shape permuted along; a scalar's broadcast needs no
# transpose at all. The reverse direction lets a transpose leave a broadcast to meet another
# transpose (an elementwise partner, a matmul operand); the two directions are inverse
# rewrites, so together they add one e-node per match rather than chains. A broadcast that adds
# leading axes (a bias f32[n] to f32[m,n]) first reshapes its operand to the padded rank, which
# is free (same buffer) and what right-aligned broadcasting reads anyway, then moves as above.
BROADCAST = """
rule transpose_bcast: transpose(broadcast(?x, shape=?s), perm=?p) => broadcast(transpose(?x, perm=?p), shape=permute(?s, ?p)) if rank(?x) == len(?s)
rule transpose_bcast_scalar: transpose(broadcast(?x, shape=?s), perm=?p) => broadcast(?x, shape=permute(?s, ?p)) if rank(?x) == 0
rule bcast_transpose: broadcast(transpose(?x, perm=?p), shape=?s) => transpose(broadcast(?x, shape=permute(?s, inverse(?p))), perm=?p) if rank(?x) == len(?s)
rule transpose_bcast_lead: transpose(broadcast(?x, shape=?s), perm=?p) => broadcast(transpose(reshape(?x, shape=lpad(shape(?x), ?s)), perm=?p), shape=permute(?s, ?p)) if rank(?x) < len(?s), rank(?x) > 0
"""


# A transpose swapping the last two axes, per rank: what matmul_t's ta / tb flags absorb.
SWAP_LAST_TWO = {2: "[1,0]", 3: "[0,2,1]"}


def _into_matmul_t() -> str:
    lines = []
    for rank, p in SWAP_LAST_TWO.items():
        lines += [
            f"rule mm_ta{rank}: matmul(transpose(?a, perm={p}), ?b) => matmul_t(?a, ?b, ta=1, tb=0)",
            f"rule mm_tb{rank}: matmul(?a, transpose(?b, perm={p})) => matmul_t(?a, ?b, ta=0, tb=1)",
            f"rule mmt_ta{rank}: matmul_t(transpose(?a, perm={p}), ?b, ta=0, tb=?t) => matmul_t(?a, ?b, ta=1, tb=?t)",
            f"rule mmt_tb{rank}: matmul_t(?a, transpose(?b, perm={p}), ta=?t, tb=0) => matmul_t(?a, ?b, ta=?t, tb=1)",
            f"rule mmt_unta{rank}: matmul_t(transpose(?a, perm={p}), ?b, ta=1, tb=?t) => matmul_t(?a, ?b, ta=0, tb=?t)",
            f"rule mmt_untb{rank}: matmul_t(?a, transpose(?b, perm={p}), ta=?t, tb=1) => matmul_t(?a, ?b, ta=?t, tb=0)",
        ]
    lines.append("rule mmt_plain: matmul_t(?a, ?b, ta=0, tb=0) => matmul(?a, ?b)")
    return "\n".join(lines)


def _through_elementwise() -> str:
    return through_elementwise("transpose({}, perm=?p)", "{op}_transpose", "{op}_transposes")


def layout() -> RuleSet:
    """The layout rule set (transpose/reshape chains, transposes through elementwise ops and
    broadcasts, transposed matmul operands)."""
    return declare_well_typed(parse(
        "\n".join([CHAINS, BROADCAST, _through_elementwise(), _into_matmul_t()]), "layout"))
