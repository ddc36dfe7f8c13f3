"""Hypothesis-generated modules: they verify, round-trip through text and interpret as typed."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import eqsat
from eqsat.ir import DType, Module, interpret, ops, verify
from eqsat.testing import default_ops, functions, inputs, modules

SETTINGS = settings(max_examples=250, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def as_tuple(results) -> tuple[np.ndarray, ...]:
    return results if isinstance(results, tuple) else (results,)


@SETTINGS
@given(st.data())
def test_generated_modules_verify_round_trip_and_interpret(data: st.DataObject):
    m = data.draw(modules())
    assert verify(m) is m
    text = str(m)
    again = eqsat.parse(text)
    assert again == m
    assert str(again) == text
    for f in m.functions:
        args = data.draw(inputs(f))
        got = as_tuple(interpret(m, f.name, *args))
        assert len(got) == len(f.result_types)
        for r, t in zip(got, f.result_types):
            assert r.dtype == t.dtype.np and r.shape == t.shape, (r.dtype, r.shape, t)
        # The module read back from its text computes the very same bits.
        for r, s in zip(got, as_tuple(interpret(again, f.name, *args))):
            assert r.tobytes() == s.tobytes()


@settings(max_examples=80, deadline=None, database=None)
@given(st.data())
def test_float_only_op_sets_still_give_valid_programs(data: st.DataObject):
    """The AD tests' use: differentiable ops over f64 only; every value stays f64."""
    allowed = sorted(ops.ops_with("differentiable") - {"call"})
    f = data.draw(functions(ops=allowed, dtypes=(DType.f64,)))
    verify(Module(f))
    assert {s.op for s in f.body} <= set(allowed)
    assert all(t.dtype is DType.f64 for t in f.types().values())
    got = as_tuple(interpret(Module(f), f.name, *data.draw(inputs(f))))
    assert all(r.dtype == np.float64 for r in got)


@settings(max_examples=60, deadline=None, database=None)
@given(functions(ops={"map_reduce", "sum"}, dtypes=(DType.f32,)))
def test_kernel_bodies_make_no_bool_values_that_were_not_asked_for(f):
    """A map_reduce's body could end in a compare, so a function over f32 alone held bool
    values although neither bool nor a compare op was asked for."""
    assert all(t.dtype is DType.f32 for t in f.types().values()), f


@settings(max_examples=60, deadline=None, database=None)
@given(functions(ops={"add", "mul"}, dtypes=(DType.i32,), max_stmts=6, max_params=2))
def test_restricted_ops_and_params_are_respected(f):
    assert {s.op for s in f.body} <= {"add", "mul"}
    assert len(f.params) <= 2 and 1 <= len(f.returns) <= 2
    assert f.returns[0] == (f.body[-1].results[0] if f.body else f.returns[0])


def test_every_op_is_drawn_in_a_few_hundred_modules():
    """Generation reaches every op of the table (and multi-result calls) with fair odds."""
    seen: Counter[str] = Counter()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(modules())
    def collect(m: Module) -> None:
        for f in m.functions:
            for s in f.body:
                seen[s.op] += 1
                if s.op == "call" and len(s.results) > 1:
                    seen["call with several results"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    missing = sorted(default_ops(include_call=True) - set(seen))
    assert not missing, f"never drawn: {missing}; counts {dict(seen)}"
    assert seen["call with several results"] > 0


def test_inputs_take_a_traced_function_and_name_a_wrong_argument():
    @eqsat.function
    def f(x: eqsat.f32[4], n: eqsat.i32[2]):
        return eqsat.exp(x)

    @settings(max_examples=3, deadline=None)
    @given(inputs(f))
    def run(args: tuple[np.ndarray, ...]) -> None:
        assert args[0].dtype == np.float32 and args[1].shape == (2,)

    run()
    with pytest.raises(InvalidArgument, match="takes a Function"):
        inputs(eqsat.Module(f))
