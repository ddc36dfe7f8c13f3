"""The layout family: transpose and reshape chains compose and cancel, transposes move through
elementwise ops and broadcasts (so extraction chooses where data is physically rearranged).

Rules that need the transposed-operand matmul of the fused op table live in `fusion.py`.
"""

from __future__ import annotations

from ..ir.ops import BINARY, UNARY
from .lang import RuleSet, parse

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


def _through_elementwise() -> str:
    lines = []
    for op in sorted(UNARY):
        lines.append(f"rule {op}_transpose: {op}(transpose(?x, perm=?p)) => "
                     f"transpose({op}(?x), perm=?p)")
    for op in sorted(BINARY):
        lines.append(f"rule {op}_transposes: {op}(transpose(?x, perm=?p), transpose(?y, perm=?p))"
                     f" => transpose({op}(?x, ?y), perm=?p)")
    return "\n".join(lines)


def layout() -> RuleSet:
    """The layout rule set (transpose/reshape chains, transposes through elementwise ops)."""
    return parse(CHAINS + _through_elementwise(), "layout")
