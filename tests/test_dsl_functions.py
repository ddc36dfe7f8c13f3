"""Traced functions as functions: calls between them and the modules they bring, pickling,
eager calls through the interpreter, functions wrapped from IR and gradient declarations,
string annotations (names: test_dsl_names.py)."""

import numpy as np
import pytest

from eqsat.errors import Error, InterpretError
from eqsat.ir import Function, GradDecl, Module, parse, verify
from eqsat.ir import dsl
from eqsat.ir.dsl import TracedFunction, function
from eqsat.ir.types import DType

from dsl_helpers import close, rand, run

f32 = DType.f32


# ---------------------------------------------------------------- functions, calls, modules


@function
def affine(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
    return x @ w + b


@function
def stats(y: f32[8, 3]):
    return y.sum(axis=0), y.max()


@function
def model(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
    h = dsl.relu(affine(x, w, b))
    total, peak = stats(h)
    again = affine(x, w, b=b)
    return dsl.sum(total) + peak, again


def test_calls_emit_call_statements_and_modules_bring_callees():
    # Names are unique per process (another test file may trace an `affine` too): use .name.
    assert [s.attr.get("callee") for s in model.ir.body if s.op == "call"] == \
        [affine.name, stats.name, affine.name]
    call = next(s for s in model.ir.body if s.op == "call" and s.attr["callee"] == stats.name)
    assert len(call.results) == 2
    m = Module(model)
    assert [it.name for it in m] == [affine.name, stats.name, model.name]
    assert model.__eqsat_items__() == list(m.items)
    assert Module(affine, model) == m  # shared callees appear once
    verify(m)
    assert parse(str(m)) == m and str(parse(str(m))) == str(m)
    assert parse(str(model)).items == m.items  # str(f) is parseable text of f and its callees
    x, w, b = rand((8, 4)), rand((4, 3)), rand((3,))
    h = np.maximum(x @ w + b, 0)
    got_loss, got_again = run(model, x, w, b)
    close(got_loss, np.float32(h.sum(0).sum() + h.max()), rtol=1e-5)
    close(got_again, x @ w + b)


def test_statement_and_parameter_names():
    assert [p.name for p in affine.ir.params] == ["x", "w", "b"]
    assert [s.results[0] for s in affine.ir.body] == ["0", "1", "2"]
    assert affine.name == affine.ir.name and affine.__name__ == "affine"
    assert f"func @{affine.name}(%x: f32[8,4], %w: f32[4,3], %b: f32[3])" in repr(affine)


def test_eager_call_runs_the_interpreter():
    x, w, b = rand((8, 4)), rand((4, 3)), rand((3,))
    close(affine(x, w, b), x @ w + b)
    close(affine(x, w=w, b=b), x @ w + b)
    total, peak = stats(np.ones((8, 3), np.float32))
    close(total, np.full(3, 8, np.float32)), close(peak, np.float32(1))
    with pytest.raises(InterpretError, match="shape"):
        affine(x[:4], w, b)
    with pytest.raises(InterpretError, match="missing"):
        affine(x, w)


def test_call_with_a_scalar_argument():
    @function
    def scale(x: f32[3], s: f32[()]):
        return x * s

    @function
    def user(x: f32[3]):
        return scale(x, 2)

    assert "const 2.0 : f32[]" in str(user)
    close(run(user, np.ones(3, np.float32)), np.full(3, 2, np.float32))


def test_call_with_only_scalar_arguments_inside_a_trace_is_a_call():
    @function
    def square(s: f32[()]):
        return s * s

    @function
    def user(x: f32[3]):
        return x * square(3.0)  # no traced argument: still a call, not an eager run

    assert f"call @{square.name}(%" in str(user)
    close(run(user, np.ones(3, np.float32)), np.full(3, 9, np.float32))

    @function
    def zero_d(x: f32[3]):  # a 0-d array is an argument as the numpy scalar it holds is
        return x * square(np.full((), 3.0, np.float32)), x * square(np.float32(3.0))

    assert str(zero_d).count(f"call @{square.name}(%") == 2
    assert str(zero_d).count("const 3.0 : f32[]") == 1  # both arguments are one constant
    with pytest.raises(Error, match="numpy array of shape \\(1,\\)"):
        @function
        def eager_inside(x: f32[3]):
            return x * square(np.ones((1,), np.float32))


def test_from_ir_wraps_generated_functions_and_declarations():
    fn = Function("twice_gen", affine.ir.params, affine.ir.result_types,
                  affine.ir.body, affine.ir.returns)
    wrapped = TracedFunction.from_ir(fn, [])
    x, w, b = rand((8, 4)), rand((4, 3)), rand((3,))
    close(wrapped(x, w, b), x @ w + b)

    @function
    def scalar_loss(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
        return dsl.sum(affine(x, w, b))

    decl = TracedFunction.from_ir(GradDecl("scalar_loss_grad", "grad", scalar_loss.name,
                                           ("w",)), [scalar_loss])
    assert [it.name for it in Module(decl)] == [affine.name, scalar_loss.name, decl.name]
    assert decl.signature.results == (f32[4, 3],)

    @function
    def uses(x: f32[8, 4], w: f32[4, 3], b: f32[3]):
        return decl(x, w, b) * 2.0, wrapped(x, w, b)

    m = Module(uses)
    assert f"call @{decl.name}(%x, %w, %b) : f32[4,3]" in str(m)
    assert parse(str(m)) == m
    with pytest.raises(Error):
        TracedFunction.from_ir("not ir")


def test_from_ir_renames_a_dependency_whose_name_a_traced_function_holds():
    """A plain Function passed as a dependency kept its name although a different traced
    function held it, and a function calling both failed with 'two different functions'."""
    @function
    def from_ir_dep(x: f32[3]):
        return x * 2.0

    m = parse("func @from_ir_dep(%x: f32[3]) -> f32[3] {\n  %0 = const 5.0 : f32[3]\n"
              "  %1 = mul %x, %0 : f32[3]\n  return %1\n}\n"
              "func @from_ir_user(%x: f32[3]) -> f32[3] {\n"
              "  %0 = call @from_ir_dep(%x) : f32[3]\n  return %0\n}\n")
    user = TracedFunction.from_ir(m["from_ir_user"], [m["from_ir_dep"]])

    @function
    def both(x: f32[3]):
        return user(x) + from_ir_dep(x)

    assert len({it.name for it in Module(both)}) == 4
    close(both(np.ones(3, np.float32)), np.full(3, 7.0, np.float32))


def test_eager_calls_go_through_the_runner_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(TracedFunction, "runner",
                        lambda module, name, *args: seen.append((module, name, len(args))))
    affine(1, 2, 3)
    assert seen == [(Module(affine, name=affine.name), affine.name, 3)]


def test_traced_functions_verify_and_accept_string_annotations():
    @function
    def g(x: "f32[2, 2]", s: "f32[()]") -> "f32[2, 2]":
        return x * s

    assert g.ir.params[1].type == f32[()] and verify(Module(g))
    close(g(np.eye(2, dtype=np.float32), np.float32(3)), 3 * np.eye(2, dtype=np.float32))


def test_string_annotations_read_the_decorating_scope_and_the_closure():
    """A model factory under `from __future__ import annotations`: its `dt` and `n` were 'not
    defined' when string annotations were evaluated in the module's globals alone. They are
    read from the scope that decorates the function, or from its closure where it is
    decorated elsewhere."""
    def factory(dt, n):
        @function
        def layer(x: "dt[n, 2]", w: "dt[2, 3]"):
            return x @ w

        return layer

    def undecorated(dt, n):
        def layer(x: "dt[n, 2]", w: "dt[2, 3]"):
            return (x @ w).astype(dt)[:n]

        return layer

    for dt, np_dt in ((f32, np.float32), (DType.f64, np.float64)):
        x, w = np.ones((4, 2), np_dt), np.ones((2, 3), np_dt)
        for layer in (factory(dt, 4), function(undecorated(dt, 4))):
            assert [p.type for p in layer.ir.params] == [dt[4, 2], dt[2, 3]]
            close(layer(x, w), x @ w)


def test_traced_functions_pickle_as_their_ir():
    """The module-level name of a decorated function is the TracedFunction, so pickle could
    not store the Python function by name; it pickles as its IR and the functions it calls."""
    import pickle

    @function
    def inner(x: DType.f32[3]):
        return dsl.exp(x) * 2.0

    @function
    def outer(x: DType.f32[3], y: DType.f32[3]):
        """A docstring kept across pickling."""
        return inner(x) + y

    back = pickle.loads(pickle.dumps(outer))
    assert isinstance(back, TracedFunction) and back.module == outer.module
    assert (back.__name__, back.__doc__) == ("outer", "A docstring kept across pickling.")
    x, y = np.float32([0.5, -1.0, 2.0]), np.float32([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(back(x, y), outer(x, y))
