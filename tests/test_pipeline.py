"""The whole pipeline as a user runs it: eqsat.compile (differentiate + optimize + llvmlite)
against the reference interpreter, on random programs and on the bundled models."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.ir import DType
from eqsat.testing import inputs, modules

from cpu_helpers import assert_matches


def example(name: str) -> eqsat.Module:
    return eqsat.parse(resources.files("eqsat.examples").joinpath(name).read_text(), source=name)


def rand_args(f, seed: int = 0, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(p.type.shape) * scale).astype(p.type.dtype.np) for p in f.params]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_compiled_and_optimized_equals_interpreter(data):
    m = data.draw(modules(max_functions=2, dtypes=data.draw(st.sampled_from(
        [[DType.f32], [DType.f64], [DType.f64, DType.i32, DType.bool]]))))
    exe = eqsat.compile(m)
    for f in m.functions:
        args = data.draw(inputs(f))
        assert_matches(exe(f.name, *args), eqsat.interpret(m, f.name, *args),
                       ulps=16, rtol=1e-4, atol=1e-4)


def test_mlp_with_gradient_compiled_matches_interpreter():
    m = example("mlp.eqir")
    exe = eqsat.compile(m)
    args = rand_args(m["loss"], scale=0.1)
    for name in ("predict", "loss", "loss_grad"):
        mine = args[: len(m.functions[0].params)] if name == "predict" else args
        assert_matches(exe(name, *mine), eqsat.interpret(m, name, *mine),
                       ulps=64, rtol=1e-4, atol=1e-6)


def test_mlp_gradient_matches_finite_differences_through_compiled_code():
    text = resources.files("eqsat.examples").joinpath("mlp.eqir").read_text()
    m = eqsat.parse(text.replace("f32", "f64"))
    exe = eqsat.compile(m)
    x, w, b, y = rand_args(m["loss"], seed=1, scale=0.1)
    gw, gb = exe.loss_grad(x, w, b, y)
    rng = np.random.default_rng(2)
    for _ in range(5):
        i, j = rng.integers(0, 784), rng.integers(0, 10)
        e = np.zeros_like(w)
        e[i, j] = 1e-6
        fd = (exe.loss(x, w + e, b, y) - exe.loss(x, w - e, b, y)) / 2e-6
        assert abs(fd - gw[i, j]) <= 1e-6 + 1e-5 * abs(fd)
    e = np.zeros_like(b)
    e[3] = 1e-6
    fd = (exe.loss(x, w, b + e, y) - exe.loss(x, w, b - e, y)) / 2e-6
    assert abs(fd - gb[3]) <= 1e-6 + 1e-5 * abs(fd)


def test_transformer_block_compiled_matches_interpreter():
    m = example("transformer.eqir")
    exe = eqsat.compile(m)
    f = m.functions[-1]
    args = rand_args(f, scale=0.05)
    got, want = exe(f.name, *args), eqsat.interpret(m, f.name, *args)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("target", ["llvm", "ptx"])
def test_emit_text(target):
    m = example("mlp.eqir")
    text = eqsat.emit(m, target=target)
    assert ("define" in text) if target == "llvm" else (".entry" in text or ".visible" in text)
    with pytest.raises(eqsat.Error, match="valid targets"):
        eqsat.emit(m, target="wasm")


def test_second_compile_of_a_program_skips_the_optimizer(tmp_path):
    # a fresh process that finds the optimized program and its object code in the cache
    # neither saturates (egglog's native module is never loaded) nor generates code again
    import subprocess
    import sys

    script = (
        "import sys, time, eqsat\n"
        "from importlib import resources\n"
        "m = eqsat.parse(resources.files('eqsat.examples').joinpath('mlp.eqir').read_text())\n"
        "t = time.perf_counter()\n"
        "eqsat.compile(m)\n"
        "print(time.perf_counter() - t, 'egglog.bindings' in sys.modules)\n")
    env = {**__import__("os").environ, "EQSAT_CACHE_DIR": str(tmp_path)}
    cold = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True).stdout.split()
    warm = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True).stdout.split()
    assert cold[1] == "True" and warm[1] == "False"
    assert list((tmp_path / "optimized").glob("*.eqir")) and list((tmp_path / "objects").glob("*.o"))
    assert float(warm[0]) < float(cold[0])


def test_facade_takes_a_traced_function_and_refuses_other_things():
    """compile, interpret, optimize, cost and emit take an @eqsat.function as its module;
    anything else that is not a Module is an eqsat.Error naming the call."""
    @eqsat.function
    def g(x: eqsat.f32[3]):
        return eqsat.relu(x) * 2.0

    x = np.array([-1.0, 0.5, 2.0], np.float32)  # g may be g_2: another test traced a g
    assert eqsat.interpret(g, g, x).tolist() == [0.0, 1.0, 4.0]
    assert eqsat.interpret(g, g.name, x).tolist() == [0.0, 1.0, 4.0]
    assert eqsat.compile(g)(g, x).tolist() == [0.0, 1.0, 4.0]
    assert eqsat.optimize(g).functions[0].name == g.name
    assert eqsat.cost(g) > 0 and "define" in eqsat.emit(g)
    for call, use in [("compile", lambda m: eqsat.compile(m)),
                      ("interpret", lambda m: eqsat.interpret(m, "f")),
                      ("optimize", lambda m: eqsat.optimize(m)), ("cost", eqsat.cost),
                      ("emit", eqsat.emit)]:
        with pytest.raises(eqsat.Error, match=f"{call} takes an eqsat.Module.*eqsat.parse"):
            use("module @m")
