"""Random programs with large shapes (see large_programs.py) against the interpreter, compiled
without and with optimization, gradients included.

The default run draws a few examples of each family (derandomized, so it is the same few each
time) and checks by hand-picked programs that every big-data path of the CPU backend is reached;
`pytest --run-slow` runs the long version (`test_long_*`).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import eqsat
from eqsat.backend import LoweringError, cpu, entry, matmul_kernels
from eqsat.backend import gemm as gemm_mod
from eqsat.backend import views as views_mod
from eqsat.backend.views import find_views
from eqsat.ir import DType

from backend_paths import count_paths
from large_programs import (PERMS3, Case, arguments, assert_close, attentions, chains, check_case,
                            inverse, layered, mlps, row_reductions, tolerance, trace,
                            transposed_products, with_grad)

FAMILIES = {"mlp": mlps(), "rows": row_reductions(), "attention": attentions(),
            "transposed": transposed_products(), "chain": chains(), "layered": layered()}
QUICK = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))
# EQSAT_FUZZ_EXAMPLES sets the long run's examples per family (a run in chunks).
LONG = settings(max_examples=int(os.environ.get("EQSAT_FUZZ_EXAMPLES", 400)), deadline=None,
                database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    """Compile into a fresh cache so every program is really lowered (and the user's cache is
    not filled with thousands of random programs)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("EQSAT_CACHE_DIR", str(tmp_path_factory.mktemp("eqsat-cache")))
    yield
    mp.undo()


# Paths the long run reached, by family; written to $EQSAT_FUZZ_PATHS (JSON) at the end.
REACHED: dict[str, Counter] = {}


@pytest.fixture(scope="module", autouse=True)
def report_paths():
    yield
    if os.environ.get("EQSAT_FUZZ_PATHS") and REACHED:
        with open(os.environ["EQSAT_FUZZ_PATHS"], "w") as f:
            json.dump(REACHED, f, indent=1)


def run_family(family: str, case: Case) -> None:
    note(str(case.module))
    with count_paths() as hits:
        check_case(case)
    hits["examples"] += 1
    REACHED.setdefault(family, Counter()).update(hits)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@QUICK
@given(data=st.data())
def test_quick(family: str, data) -> None:
    run_family(family, data.draw(FAMILIES[family]))


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
@LONG
@given(data=st.data())
def test_long(family: str, data) -> None:
    run_family(family, data.draw(FAMILIES[family]))


# ---------------------------------------------------------------- the paths are reached


def _lowered(case: Case, optimize: bool) -> None:
    m = eqsat.differentiate(case.module)
    cpu.lower(eqsat.optimize(m) if optimize else m)


def test_paths_are_reached() -> None:
    """Models of each family, lowered under the path counters: every big-data path runs."""
    cases = [
        # packed GEMM with epilogues, threads, arena reuse (MLP forward and gradient)
        mlp_case(DType.f32, 130, 257, 300, "tanh"),
        # BLAS (narrow product, 10 columns) and its in-place transposed views
        tmm_case(DType.f64, 1, 300, 257, 10, (0, 2, 1)),
        # softmax rows: chunked groups, the shared exp, a streamed output (see STREAM_MIN)
        softmax_case(DType.f32, (-(-entry.STREAM_MIN // (257 * 300 * 4)), 257, 300)),
    ]
    with count_paths() as hits:
        for case in cases:
            for opt in (False, True):
                _lowered(case, opt)
    for path in ("packed_gemm", "blas", "in_place_view", "chunked_group", "shared_reduction",
                 "streamed", "threaded", "arena_reuse"):
        assert hits[path] > 0, f"{path} never ran: {dict(hits)}"


def mlp_case(dtype: DType, m: int, k: int, h: int, act: str) -> Case:
    """loss = mean((act(x @ w + b) - y)^2) and its gradient wrt w, b."""
    scales: dict[str, float] = {}

    def body(p):
        from eqsat.ir import dsl
        x = p.param(dtype, (m, k))
        y = getattr(dsl, act)(x @ p.param(dtype, (k, h), 1 / math.sqrt(k)) + p.param(dtype, (h,)))
        d = y - p.param(dtype, (m, h))
        return [dsl.mean(d * d)]

    f = trace("loss", body, scales)
    return Case(with_grad(f, ["p1", "p2"], "grad"), ["loss", "loss_grad"], scales)


def tmm_case(dtype: DType, b: int, m: int, k: int, n: int, perm) -> Case:
    """transpose(a, perm) @ w for a rank-3 parameter a, and its vjp."""
    scales: dict[str, float] = {}

    def body(p):
        from eqsat.ir import dsl
        logical = (b, m, k)
        a = dsl.transpose(p.param(dtype, tuple(logical[i] for i in inverse(perm))), perm)
        return [a @ p.param(dtype, (b, k, n), 1 / math.sqrt(k))]

    f = trace("tmm", body, scales)
    return Case(with_grad(f, ["p0", "p1"]), ["tmm", "tmm_vjp"], scales)


def softmax_case(dtype: DType, shape) -> Case:
    """softmax over the last axis (returned: a big result the entry may stream)."""
    scales: dict[str, float] = {}

    def body(p):
        from eqsat.ir import dsl
        return [dsl.softmax(p.param(dtype, shape, 3.0))]

    f = trace("sm", body, scales)
    return Case(with_grad(f, ["p0"]), ["sm", "sm_vjp"], scales)


# ---------------------------------------------------------------- transposed operands read in place

# (batch, m, k, n): products the views apply to, degenerate axes included (a length-1 axis
# makes more layouts readable in place).
VIEW_SHAPES = [(3, 300, 257, 128), (3, 65, 300, 257), (1, 1, 300, 257),
               (7, 130, 1, 300), (2, 257, 100, 1)]


def _compile_fresh(m, monkeypatch):
    """Compile `m` unoptimized, bypassing every cache (lowering must really run)."""
    monkeypatch.setattr(cpu, "_memory", {})
    return cpu.compile_module(eqsat.differentiate(m), cache_dir=None)


@pytest.mark.parametrize("route", ["gemm", "blas"])
@pytest.mark.parametrize("perm", PERMS3, ids=str)
def test_rank3_transposed_operand_every_perm(perm, route, monkeypatch) -> None:
    """transpose(a, perm) @ w (and its vjp, whose products read transposes too) for every
    perm of a rank-3 parameter, on the generated GEMM and on the host BLAS: right, and read
    in place wherever the layout allows it."""
    if route == "blas":
        monkeypatch.setattr(gemm_mod, "ENABLED", False)
    for b, m, k, n in VIEW_SHAPES:
        for dtype in (DType.f32, DType.f64):
            case = tmm_case(dtype, b, m, k, n, perm)
            with count_paths() as hits:
                exe = _compile_fresh(case.module, monkeypatch)
            if route == "blas" and m * n * k >= matmul_kernels.BLAS_MIN_FLOPS:
                assert hits["packed_gemm"] == 0 and hits["blas"] > 0
            for name in case.names:
                args = arguments(case, name)
                assert_close(exe(name, *args), eqsat.interpret(case.module, name, *args),
                             tolerance(case.module, name), f"{name} {perm} {(b, m, k, n)}")


@pytest.mark.parametrize("perm", [(2, 1, 0), (2, 0, 1), (1, 2, 0)], ids=str)
def test_views_outside_gemm_layout_ok_are_never_read_wrong(perm, monkeypatch) -> None:
    """If the planner ever offered the BLAS a layout with no contiguous matrix axis
    (gemm_layout_ok said yes wrongly), lowering refuses instead of reading it as a plain
    transpose (wrong results, seen for perm (2, 1, 0)); the generated GEMM reads any
    strides, so there the forced view is right."""
    monkeypatch.setattr(views_mod, "gemm_layout_ok", lambda view, shape: True)
    b, m, k, n = 3, 300, 257, 128
    for route in ("gemm", "blas"):
        monkeypatch.setattr(gemm_mod, "ENABLED", route == "gemm")
        case = tmm_case(DType.f64, b, m, k, n, perm)
        try:
            with count_paths() as hits:
                exe = _compile_fresh(case.module, monkeypatch)
        except LoweringError as e:
            assert route == "blas" and "gemm_layout_ok" in str(e)
            continue
        assert hits["in_place_view"] > 0
        args = arguments(case, "tmm")
        assert_close(exe.tmm(*args), eqsat.interpret(case.module, "tmm", *args), 1e-9,
                     f"forced view {perm} on {route}")
        assert route == "gemm" or perm == (1, 2, 0)  # (1, 2, 0) has a unit stride


def test_gemm_layout_ok_refuses_layouts_without_a_contiguous_matrix_axis() -> None:
    """The contract the BLAS path relies on: perm (2, 1, 0) or (2, 0, 1) of a parameter with
    no length-1 axis has neither matrix axis contiguous, so it is refused; the perms that
    keep the last source axis in the matrix are accepted."""
    shape = (3, 300, 257)
    strides = [300 * 257, 257, 1]
    for perm in PERMS3:
        view = [strides[p] for p in perm]
        out = tuple(shape[p] for p in perm)
        assert matmul_kernels.gemm_layout_ok(view, out) == (2 in perm[1:]), perm


# ---------------------------------------------------------------- as an outside checker would


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_compiled_gradient_matches_finite_differences(kind: str) -> None:
    """f64, compiled and optimized: the gradient's directional derivative along a random
    direction agrees with central differences of the compiled function itself."""
    if kind == "mlp":
        case = mlp_case(DType.f64, 130, 257, 65, "tanh")
        f, g = "loss", "loss_grad"
        wrt = (1, 2)
    else:
        scales: dict[str, float] = {}

        def body(p):
            from eqsat.ir import dsl
            q = dsl.transpose(p.param(DType.f64, (65, 4, 100)), (1, 0, 2))  # stored (s, b, d)
            k = dsl.transpose(p.param(DType.f64, (100, 65, 4)), (2, 0, 1))  # stored (d, s, b)
            v = p.param(DType.f64, (4, 65, 100))
            o = dsl.softmax((q @ k) * 0.1) @ v
            return [dsl.sum(o * o)]

        fn = trace("att", body, scales)
        case = Case(with_grad(fn, ["p0", "p1"], "grad"), ["att", "att_grad"], scales)
        f, g = "att", "att_grad"
        wrt = (0, 1)
    exe = eqsat.compile(case.module)
    args = arguments(case, f)
    grads = exe(g, *args)
    rng = np.random.default_rng(7)
    dirs = {i: rng.standard_normal(args[i].shape) for i in wrt}
    h = 1e-5

    def at(step: float) -> float:
        xs = [a + step * dirs[i] if i in dirs else a for i, a in enumerate(args)]
        return float(exe(f, *xs))

    numeric = (at(h) - at(-h)) / (2 * h)
    analytic = sum(float(np.sum(gr * dirs[i])) for gr, i in zip(grads, wrt))
    assert abs(numeric - analytic) <= 1e-6 * (1 + abs(analytic)), (numeric, analytic)


@pytest.mark.parametrize("perm", [(2, 1, 0), (2, 0, 1)], ids=str)
def test_generated_gemm_reads_layouts_the_blas_cannot(perm, monkeypatch) -> None:
    """A transpose with no contiguous matrix axis feeding a product on the generated GEMM is
    read in place (no copy); on the host BLAS it is materialized first."""
    for route in ("gemm", "blas"):
        monkeypatch.setattr(gemm_mod, "ENABLED", route == "gemm")
        case = tmm_case(DType.f32, 3, 300, 257, 128, perm)
        fn = case.module[case.names[0]]
        views, _ = find_views(fn, range(len(fn.body)))
        assert bool(views) == (route == "gemm"), (route, views)
        exe = _compile_fresh(case.module, monkeypatch)
        args = arguments(case, "tmm")
        assert_close(exe.tmm(*args), eqsat.interpret(case.module, "tmm", *args),
                     tolerance(case.module, "tmm"), f"{perm} on {route}")
