"""Measure what one element of each elementwise op costs in the generated code, for the op
table's ELEMENT_COST (f32) and ELEMENT_COST_WIDE (f64): `python bench/element_costs.py`.

Each op is timed inside one fused kernel that evaluates it EVALS times per element on
independent inputs (op(x + c_k), summed), on one core, over an array that stays in the L2
cache: the throughput of the op, not of memory or of one dependency chain. The same kernel with
the op left out is subtracted. Units are one simple f32 operation (a multiply, measured the same
way); the table's values are these, rounded.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

# one core, so that kernels are not split over threads (usable_cores reads the affinity)
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eqsat  # noqa: E402
import harness  # noqa: E402
from eqsat.ir.op_costs import element_cost  # noqa: E402
from eqsat.ir.types import DType  # noqa: E402

N = 1 << 16
EVALS = 8
UNARY = ["exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "recip"]
BINARY = ["div", "pow", "mul"]


def term(op: str, k: int) -> str:
    x = f"add($0, {0.01 * (k + 1)})"
    if op == "":
        return x
    if op in BINARY:
        return f"{op}({x}, add($0, {0.7 + 0.01 * k}))"
    return f"{op}({x})"


def kernel_seconds(op: str, dtype: str) -> float:
    """Median seconds of one call evaluating `op` EVALS times per element over N elements."""
    terms = [term(op, k) for k in range(EVALS)]
    body = terms[0]
    for t in terms[1:]:
        body = f"add({body}, {t})"
    ty = f"{dtype}[{N}]"
    m = eqsat.parse(f"module @m\nfunc @f(%x: {ty}) -> {ty} {{\n"
                    f"  %y = map %x, body={body} : {ty}\n  return %y\n}}\n")
    exe = eqsat.compile(m, optimize=False)
    x = np.random.default_rng(0).uniform(0.1, 0.9, N).astype(DType(dtype).np)
    return harness.median_seconds(lambda: exe.f(x), budget=0.5, min_runs=50)


def main() -> None:
    per = {}
    for dtype in ("f32", "f64"):
        base = kernel_seconds("", dtype)
        for op in UNARY + BINARY:
            per[op, dtype] = max(0.0, kernel_seconds(op, dtype) - base) / (N * EVALS)
    unit = per["mul", "f32"]
    print(f"one simple f32 operation: {unit * 1e9:.4f} ns per element on one core\n")
    print(f"{'op':8s} {'f32 ns':>8s} {'units':>6s} {'table':>6s}   "
          f"{'f64 ns':>8s} {'units':>6s} {'table':>6s}")
    for op in UNARY + BINARY:
        cells = []
        for dtype in ("f32", "f64"):
            ns = per[op, dtype] * 1e9
            cells.append(f"{ns:8.3f} {per[op, dtype] / unit:6.1f} "
                         f"{element_cost(op, DType(dtype)):6.0f}")
        print(f"{op:8s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
