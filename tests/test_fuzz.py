"""Long fuzzing runs across the whole pipeline; opt-in with `pytest --run-slow`.

Each test draws thousands of random programs and checks one stage against the reference
interpreter: the text round trip, the compiled CPU code, the optimizer, and the gradients.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.ir import DType, Module
from eqsat.ir.ops import ops_with
from eqsat.testing import default_ops, functions, inputs, modules
from eqsat.testing.equivalence import assert_equivalent

from ad_helpers import check_inner_product
from cpu_helpers import assert_matches, run_both

pytestmark = pytest.mark.slow
FUZZ = settings(max_examples=1500, deadline=None,
                suppress_health_check=list(HealthCheck))


@FUZZ
@given(modules(max_functions=3))
def test_text_round_trip(m):
    assert eqsat.parse(str(m)) == m
    assert str(eqsat.parse(str(m))) == str(m)


@FUZZ
@given(st.data())
def test_compiled_equals_interpreter(data):
    m = data.draw(modules(max_functions=3, dtypes=data.draw(st.sampled_from(
        [[DType.f32], [DType.f64], [DType.i32, DType.bool], [DType.i64, DType.f64]]))))
    f = m.functions[-1]
    got, want = run_both(m, f.name, *data.draw(inputs(f)))
    assert_matches(got, want, ulps=8, rtol=1e-5, atol=1e-5)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(modules(max_functions=2, dtypes=[DType.f64]))
def test_optimized_equals_interpreter(m):
    out = eqsat.optimize(m)
    assert eqsat.cost(out) <= eqsat.cost(m) * (1 + 1e-12)
    assert_equivalent(m, out, trials=3)


@FUZZ
@given(st.data())
def test_gradients_inner_product(data):
    ops = sorted((ops_with("differentiable") & default_ops()) | {"gt"})
    f = data.draw(functions(ops=ops, dtypes=[DType.f64], max_stmts=12))
    check_inner_product(data, Module(f), f.name)
