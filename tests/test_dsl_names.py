"""Names of traced functions: a function keeps its Python name; names are unique per module
(where different functions of one name meet, the later is `name_2`, its callers follow), and a
function passed where a name is asked for is found under the name it has in that module."""

import pickle

import numpy as np
import pytest

import eqsat
from eqsat.errors import UnknownFunction
from eqsat.ir import Module, parse, verify
from eqsat.ir.dsl import TracedFunction, function

from dsl_helpers import close, rand

f32 = eqsat.f32


def make_layer(k: float) -> TracedFunction:
    @function
    def layer(x: f32[4]):
        return x * k

    return layer


def make_model(k: float) -> TracedFunction:
    layer = make_layer(k)

    @function
    def model(x: f32[4]):
        return layer(x) + 1.0

    return model


def test_a_loop_over_models_each_defining_loss_compiles_each_loss_grad():
    """The second model's `loss` was `loss_2` (names were unique per process), so the
    README's `exe.loss_grad` of it was an UnknownFunction."""
    for n, k in ((4, 3), (5, 2)):
        @function
        def loss(x: f32[n, k], w: f32[k]):
            return eqsat.sum((x @ w) ** 2)

        assert loss.name == "loss"
        m = eqsat.Module(loss, eqsat.grad(loss, wrt="w"))
        assert [it.name for it in m] == ["loss", "loss_grad"]
        x, w = rand((n, k)), rand((k,))
        exe = eqsat.compile(m)
        close(exe.loss_grad(x, w), eqsat.interpret(m, "loss_grad", x, w), rtol=1e-4)
        close(exe(loss, x, w), loss(x, w), rtol=1e-4)


def test_different_callees_of_one_name_are_renamed_in_their_caller():
    one, two, one_again = make_layer(1.0), make_layer(2.0), make_layer(1.0)
    assert one.name == two.name == "layer"

    @function
    def model(x: f32[4]):
        return one(x) + two(x) * 10.0 + one_again(x) * 100.0

    m = Module(model)
    assert [it.name for it in m] == ["layer", "layer_2", "model"]  # identical IR: one item
    verify(m)
    assert parse(str(m)) == m
    x = rand((4,))
    close(model(x), x * 1.0 + x * 2.0 * 10.0 + x * 100.0)
    close(eqsat.compile(m)(model, x), model(x), rtol=1e-5)


def test_a_function_keeps_its_name_over_a_callee_of_that_name():
    inner = make_model(3.0)

    def model(x: f32[4]):
        return inner(x) * 2.0

    outer = function(model)
    assert outer.name == "model"
    assert [it.name for it in outer.module] == ["layer", "model_2", "model"]
    close(outer(np.ones(4, np.float32)), np.full(4, 8.0, np.float32))


def test_a_module_of_an_old_and_a_new_function_of_one_name_runs_each():
    old, new = make_model(2.0), make_model(5.0)  # each `model` calling its own `layer`
    m = eqsat.Module(old, new)
    assert [it.name for it in m] == ["layer", "model", "layer_2", "model_2"]
    x = rand((4,))
    exe = eqsat.compile(m)
    for f, k in ((old, 2.0), (new, 5.0)):
        close(eqsat.interpret(m, f, x), x * k + 1.0)
        close(exe(f, x), x * k + 1.0)
    close(pickle.loads(pickle.dumps(exe))(new, x), x * 5.0 + 1.0)
    assert eqsat.Module(old, new, old) == m
    with pytest.raises(UnknownFunction, match="model.*not in module"):
        exe(make_model(7.0), x)


def test_gradients_of_functions_of_one_name_are_renamed_alike():
    def make_loss(k: float) -> TracedFunction:
        @function
        def loss(w: f32[3]):
            return eqsat.sum(w * w) * k

        return loss

    a, b = make_loss(1.0), make_loss(3.0)
    ga, gb = eqsat.grad(a), eqsat.grad(b)
    assert ga.name == gb.name == "loss_grad"
    m = eqsat.Module(a, ga, b, gb)
    assert [it.name for it in m] == ["loss", "loss_grad", "loss_2", "loss_grad_2"]
    w = rand((3,))
    exe = eqsat.compile(m)
    close(exe(ga, w), 2 * w, rtol=1e-5)
    close(exe(gb, w), 6 * w, rtol=1e-5)
    close(exe.loss_grad_2(w), 6 * w, rtol=1e-5)


def test_an_unpickled_function_meets_a_different_one_of_its_callees_name():
    f = function(make_layer(2.0))

    @function
    def caller(x: f32[4]):
        return f(x) + 1.0

    back = pickle.loads(pickle.dumps(caller))
    assert back.module == caller.module and back.name == "caller"
    other = make_layer(5.0)

    @function
    def both(x: f32[4]):
        return back(x) + other(x)

    assert [it.name for it in both.module] == ["layer", "caller", "layer_2", "both"]
    x = rand((4,))
    close(both(x), x * 2.0 + 1.0 + x * 5.0)


def test_a_copy_is_found_under_any_suffix_of_its_name():
    """name_in walked the suffixes as Module renames (layer, layer_2, ...) and stopped at the
    first one free, so a copy past a gap (layer and layer_3, no layer_2: a module edited or
    written so) was not found; nor was a caller whose callee's copy was past a gap."""
    layers = [make_layer(k) for k in (1.0, 2.0, 3.0)]
    m = eqsat.Module(*layers)
    assert [it.name for it in m] == ["layer", "layer_2", "layer_3"]
    assert [f.name_in(m) for f in layers] == ["layer", "layer_2", "layer_3"]
    gap = eqsat.Module(*(it for it in m if it.name != "layer_2"))
    assert [it.name for it in gap] == ["layer", "layer_3"]
    assert layers[2].name_in(gap) == "layer_3"
    x = rand((4,))
    close(eqsat.compile(gap)(layers[2], x), x * 3.0)
    with pytest.raises(UnknownFunction, match="its @layer is a different function"):
        layers[1].name_in(gap)

    models = [make_model(k) for k in (1.0, 2.0, 3.0)]
    m = eqsat.Module(*models)
    assert [it.name for it in m][-2:] == ["layer_3", "model_3"]
    gap = parse(str(m).replace("@model_2", "@model_9").replace("@layer_2", "@layer_8"))
    assert models[2].name_in(gap) == "model_3"
    assert models[1].name_in(gap) == "model_9"
    close(eqsat.interpret(gap, models[1], x), x * 2.0 + 1.0)
    other = parse(str(m).replace("mul", "add"))  # every copy's body differs
    with pytest.raises(UnknownFunction, match="not in module"):
        models[2].name_in(other)
