"""Programs long in statements or in data: code generation stays linear in a chain's length
(one kernel per repeated statement, kernels called out of line, entries run in parts), and
float sums along millions of elements stay accurate."""

from __future__ import annotations

import re

import numpy as np
import pytest

import eqsat
from call_trees import call_tree
from large_programs import long_chain


def test_a_long_chain_builds_each_kernel_once_and_calls_it_out_of_line():
    """A chain of 300 small ops and its gradient: a statement repeated on the same types is
    one kernel, and an entry calling that many kernels keeps them out of line (inlined, LLVM's
    pipeline took 36 s for 500 ops, and a 5,000-op chain did not finish in 10 minutes) and
    runs them in parts (in one function, 5,000 ops took 23 s to compile; in parts 7 s)."""
    m = eqsat.parse(long_chain(300))
    text = eqsat.emit(m, target="llvm")
    kernels = re.findall(r"^define internal .*@(k\d+\.\w+)", text, re.M)
    assert len(kernels) <= 12, kernels
    # and runs its statements in parts (LLVM may merge or drop some after optimization)
    assert len(set(re.findall(r"^define .*@eqsat\.fn\.g\.part(\d+)\(", text, re.M))) >= 2
    assert len(re.findall(r"call fastcc void @k\d+\.", text)) >= 600
    exe = eqsat.compile(m, optimize=False)
    x = np.array([0.3, -0.2, 0.1, 0.05], np.float32)
    np.testing.assert_allclose(exe.g(x), eqsat.interpret(m, "g", x), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_long_float_sums_keep_their_accuracy(fused):
    """A sum along 4e6 equal f32 values: accumulated in blocks, within ~1e-6 of the exact sum
    (one running accumulator per lane was 6e-4 off; numpy's pairwise sum is within 1e-7)."""
    n = 4_000_000
    op = ("map_reduce %x, body=mul($0, 1.0), reduce=sum, axes=[0]" if fused
          else "sum %x, axes=[0]")
    m = eqsat.parse(f"func @f(%x: f32[{n}]) -> f32[] {{\n  %s = {op} : f32[]\n  return %s\n}}\n")
    x = np.full(n, 0.1, np.float32)
    exact = float(np.float32(0.1)) * n
    assert abs(float(eqsat.compile(m, optimize=False)("f", x)) / exact - 1) < 4e-6
    y = np.random.default_rng(0).standard_normal(n).astype(np.float32) + 1
    got = float(eqsat.compile(m, optimize=False)("f", y))
    assert abs(got / y.astype(np.float64).sum() - 1) < 1e-6


def test_functions_come_callees_first_however_deep_the_calls():
    """Module.callees_first orders every function after the ones it calls, iteratively (the
    backend, the cost model, AD and optimize's result check all walk calls this way)."""
    m = eqsat.parse(call_tree(3000, fanout=1))
    assert [f.name for f in m.callees_first()] == [f"f{k}" for k in range(3000)]
    m = eqsat.parse(call_tree(26))
    m = m.replace(list(reversed(m.items)))
    order = {f.name: i for i, f in enumerate(m.callees_first())}
    assert len(order) == 26 and all(order[f"f{k - 1}"] < order[f"f{k}"] for k in range(1, 26))
    assert eqsat.cost(m) > 2 ** 24 * eqsat.cost(eqsat.parse(call_tree(1)))
