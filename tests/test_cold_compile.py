"""The cold compile path: duplicate kernels compiled once, HiGHS without scipy.optimize, what a cold
`eqsat.compile` imports."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import llvmlite.binding as llvm
import numpy as np
import pytest

import eqsat
from eqsat.backend import cpu, jit
from eqsat.backend.llvm_kernels import KernelBuilder
from eqsat.extract import EGraph, dag_cost, extract_ilp
from eqsat.extract import ilp as ilp_mod

TWO_USERS = """
module @twice
func @a(%x: f32[64,32], %w: f32[32,16]) -> f32[64,16] {
  %m = matmul %x, %w : f32[64,16]
  %r = relu %m : f32[64,16]
  return %r
}
func @b(%x: f32[64,32], %w: f32[32,16], %y: f32[64,16]) -> f32[64,16] {
  %m = matmul %x, %w : f32[64,16]
  %r = relu %m : f32[64,16]
  %s = add %r, %y : f32[64,16]
  return %s
}
"""


def test_identical_statements_share_one_kernel():
    """@b's matmul and relu are @a's on the same types: the lowering builds each kernel once."""
    text, _ = cpu.lower(eqsat.parse(TWO_USERS))
    names = [m.group(1) for m in re.finditer(r"^define internal [^@]*@\"?([\w.]+)", text, re.M)]
    assert sum("matmul" in n for n in names) == 1 and sum("relu" in n for n in names) == 1


class _Forgetful(dict):
    """A kernel memo that never remembers: every statement builds its own kernel."""

    def get(self, key, default=None):
        return default


def test_identical_kernels_are_compiled_once(monkeypatch):
    """Kernels built twice (the memo off) are merged: one body of each is left, both entry
    points remain, and the module still verifies."""
    init = KernelBuilder.__init__

    def forgetful_init(self, module):
        init(self, module)
        self.built = _Forgetful()

    monkeypatch.setattr(KernelBuilder, "__init__", forgetful_init)
    text, _ = cpu.lower(eqsat.parse(TWO_USERS))
    jit._init()
    mod = llvm.parse_assembly(jit.with_function_attributes(text))
    names = lambda: {f.name for f in mod.functions if not f.is_declaration}  # noqa: E731
    before = names()
    assert sum("matmul" in n for n in before) == 2 and sum("relu" in n for n in before) == 2
    tm = jit.target_machine()
    jit.merge_functions(mod, llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options()))
    after = names()
    assert sum("matmul" in n for n in after) == 1 and sum("relu" in n for n in after) == 1
    assert {"eqsat.fn.a", "eqsat.fn.b"} <= after
    mod.verify()


def test_module_with_merged_kernels_computes_what_interpret_does(tmp_path):
    m = eqsat.parse(TWO_USERS)
    exe = eqsat.backend.compile_module(m, cache_dir=tmp_path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((64, 16)).astype(np.float32)
    np.testing.assert_allclose(exe("a", x, w), eqsat.interpret(m, "a", x, w), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(exe("b", x, w, y), eqsat.interpret(m, "b", x, w, y), rtol=1e-4,
                               atol=1e-4)


def _reach(k: int, edges: list[tuple[int, int]]) -> list[set[int]]:
    succ = [set() for _ in range(k)]
    for a, b in edges:
        succ[a].add(b)
    out = []
    for s in range(k):
        seen, stack = {s}, [s]
        while stack:
            for d in succ[stack.pop()]:
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        out.append(seen)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_strong_components_match_mutual_reachability(seed):
    rng = random.Random(seed)
    k = rng.randint(1, 30)
    edges = [(rng.randrange(k), rng.randrange(k)) for _ in range(rng.randint(0, 3 * k))]
    comp = ilp_mod._strong_components(k, [a for a, _ in edges], [b for _, b in edges])
    reach = _reach(k, edges)
    for u in range(k):
        for v in range(k):
            assert (comp[u] == comp[v]) == (v in reach[u] and u in reach[v])


def _synthetic(n_classes: int, seed: int) -> tuple[EGraph, np.ndarray]:
    # alternatives over recent classes, self-loops and back edges (cycles), three roots
    rng = random.Random(seed)
    rows = []
    for c in range(n_classes):
        if c < 5:
            rows.append((c, "param", [], 0.0))
            continue
        for a in range(rng.randint(1, 3)):
            kids = [rng.randint(max(0, c - 20), c - 1) for _ in range(rng.randint(1, 3))]
            rows.append((c, f"op{a}", kids, rng.uniform(1, 10)))
        if rng.random() < 0.1:
            rows.append((c, "mul", [c, 0], 0.0))
        if rng.random() < 0.1 and c + 3 < n_classes:
            rows.append((c, "neg", [c + rng.randint(1, 3)], 0.5))
    g = EGraph([(c, op, {}, kids) for c, op, kids, _ in rows],
               roots=[n_classes - 1 - i for i in range(3)])
    return g, np.array([cost for *_, cost in rows], dtype=float)


@pytest.mark.parametrize("seed", range(8))
def test_highs_core_finds_what_milp_finds(seed, monkeypatch):
    g, costs = _synthetic(60, seed)
    direct = extract_ilp(g, costs, time_limit=10.0)
    assert ilp_mod._highs() is not None  # scipy's HiGHS module loads by itself here
    monkeypatch.setattr(ilp_mod, "_highs", lambda: None)
    public = extract_ilp(g, costs, time_limit=10.0)
    assert direct.optimal and public.optimal
    assert direct.cost == pytest.approx(public.cost, rel=1e-9)
    assert direct.cost == pytest.approx(dag_cost(g, costs, direct.choice))


def test_cold_compile_skips_the_heavy_imports(tmp_path):
    # hypothesis (rule checking), egglog's Python API and scipy.optimize (~0.6 s together)
    # are not needed to optimize and compile a program
    script = (
        "import sys, eqsat\n"
        "from importlib import resources\n"
        "m = eqsat.parse(resources.files('eqsat.examples').joinpath('mlp.eqir').read_text())\n"
        "eqsat.compile(m)\n"
        "print(*(name in sys.modules for name in\n"
        "        ('egglog.bindings', 'egglog', 'hypothesis', 'scipy.optimize')))\n")
    env = {**os.environ, "EQSAT_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", "False", "False", "False"]
