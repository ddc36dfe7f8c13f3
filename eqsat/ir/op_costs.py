"""What one element of each elementwise op costs in the generated code, per dtype: the cost
model's arithmetic, the fusion pass's weights and the CPU backend's compute-bound test."""

from __future__ import annotations

from .types import DType

# The cost of one element of an elementwise op in f32, in simple operations: one vector
# instruction per lane, as an add, a multiply or a compare takes. Measured on the generated
# code on AVX-512 (`python bench/element_costs.py`: many independent evaluations in one
# kernel, one core, cache-resident inputs), so sin, whose argument reduction is long, costs over
# four exps. Ops not listed cost 1.
ELEMENT_COST: dict[str, float] = {
    "div": 4, "recip": 4, "sqrt": 8, "rsqrt": 14, "exp": 9, "log": 22, "sin": 41, "cos": 42,
    "tanh": 15, "sigmoid": 12, "pow": 84,
}
# The same for 8-byte elements (f64, i64): half the lanes per instruction, and longer
# polynomials for f64's precision. Ops not listed cost 2.
ELEMENT_COST_WIDE: dict[str, float] = {
    "div": 15, "recip": 15, "sqrt": 29, "rsqrt": 47, "exp": 30, "log": 59, "sin": 93,
    "cos": 99, "tanh": 85, "sigmoid": 38, "pow": 208,
}


def element_costs(dtype: DType | None = None) -> tuple[dict[str, float], float]:
    """The table of element costs for ops computing in `dtype` (f32 when not given), and the
    cost of an op it does not list: for a walk over many ops of one dtype."""
    if dtype is not None and dtype.itemsize == 8:
        return ELEMENT_COST_WIDE, 2.0
    return ELEMENT_COST, 1.0


def element_cost(op: str, dtype: DType | None = None) -> float:
    """The cost of one element of an elementwise op computing in `dtype` (f32 when not
    given), in simple f32 operations (see ELEMENT_COST)."""
    table, other = element_costs(dtype)
    return table.get(op, other)
