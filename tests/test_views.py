"""Slices, broadcasts and transposes read in place (backend/views.py): their consumers read
them through strides and an offset, and the results must equal `interpret`'s."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.backend import compile_module
from eqsat.backend.entry import plan_function
from eqsat.backend.views import in_order
from eqsat.ir import parse

LSTM = """module @m
func @f(%x: f32[{n},{k}], %w: f32[{k},{d4}], %c: f32[{n},{d}]) -> (f32[{n},{d}], f32[{n},{d}]) {{
  %z = matmul %x, %w : f32[{n},{d4}]
  %zi = slice %z, start=[0,0], stop=[{n},{d}] : f32[{n},{d}]
  %zf = slice %z, start=[0,{d}], stop=[{n},{d2}] : f32[{n},{d}]
  %zo = slice %z, start=[0,{d2}], stop=[{n},{d3}] : f32[{n},{d}]
  %zg = slice %z, start=[0,{d3}], stop=[{n},{d4}] : f32[{n},{d}]
  %ig = map %zi, %zg, body=mul(sigmoid($0), tanh($1)) : f32[{n},{d}]
  %c1 = map %zf, %c, %ig, body=add(mul(sigmoid($0), $1), $2) : f32[{n},{d}]
  %h1 = map %zo, %c1, body=mul(sigmoid($0), tanh($1)) : f32[{n},{d}]
  return %h1, %c1
}}
"""


def lstm(n: int, k: int, d: int) -> str:
    return LSTM.format(n=n, k=k, d=d, d2=2 * d, d3=3 * d, d4=4 * d)


def _inputs(module: eqsat.Module, name: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.type.shape).astype(p.type.dtype.np)
            for p in module[name].params]


def _check(text: str, fresh, threads: int = 2, rtol: float = 2e-6) -> None:
    module = parse(text)
    args = _inputs(module, "f")
    fresh(threads, 0)
    got = compile_module(module, cache_dir=None).f(*args)
    want = eqsat.interpret(module, "f", *args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("threads", [1, 2])
def test_lstm_gate_slices_of_a_product_are_read_in_place(fresh, threads):
    """The four gate slices of one product are never copied: the maps read the product's
    buffer through its row stride, each from its own column offset (and two of them in one
    row-chunked group, as they only read it)."""
    text = lstm(64, 48, 40)
    plan = plan_function(parse(text)["f"], {})
    assert set(plan.views) == {"zi", "zf", "zo", "zg"}
    assert plan.offsets == {"zf": 40, "zo": 80, "zg": 120}
    assert all(plan.views[v] == [160, 1] for v in plan.views)
    assert ".slice" not in eqsat.emit(parse(text), target="llvm")
    _check(text, fresh, threads)


def test_broadcasts_feeding_elementwise_ops_are_read_in_place(fresh):
    """An unfused softmax's broadcast maxima and sums are read with stride 0, not copied."""
    text = """module @m
func @f(%x: f32[33,70]) -> f32[33,70] {
  %m = max %x, axes=[1] : f32[33]
  %mr = reshape %m : f32[33,1]
  %mb = broadcast %mr : f32[33,70]
  %z = sub %x, %mb : f32[33,70]
  %e = exp %z : f32[33,70]
  %s = sum %e, axes=[1] : f32[33]
  %sr = reshape %s : f32[33,1]
  %sb = broadcast %sr : f32[33,70]
  %y = div %e, %sb : f32[33,70]
  return %y
}
"""
    plan = plan_function(parse(text)["f"], {})
    assert plan.views == {"mb": [1, 0], "sb": [1, 0]}
    _check(text, fresh)


def test_slices_feeding_a_blas_product_are_read_in_place(fresh):
    """A slice of a fused QKV projection goes to the BLAS as a leading dimension; a transposed
    slice (K^T) too, as gemm's transpose flag."""
    text = """module @m
func @f(%qkv: f32[128,384], %w: f32[128,96]) -> (f32[128,96], f32[128,128]) {
  %q = slice %qkv, start=[0,0], stop=[128,128] : f32[128,128]
  %k = slice %qkv, start=[0,128], stop=[128,256] : f32[128,128]
  %kt = transpose %k, perm=[1,0] : f32[128,128]
  %a = matmul %q, %w : f32[128,96]
  %s = matmul %q, %kt : f32[128,128]
  return %a, %s
}
"""
    plan = plan_function(parse(text)["f"], {})
    assert plan.views == {"q": [384, 1], "k": [384, 1], "kt": [1, 384]}
    assert plan.offsets == {"k": 128, "kt": 128}
    _check(text, fresh, rtol=1e-4)


def test_views_some_consumer_cannot_read_are_materialized(fresh):
    """A slice that is returned, reshaped or read transposed by a loop kernel is copied (and a
    transpose feeding only such a slice too); the rest of the chain still reads in place."""
    text = """module @m
func @f(%x: f32[6,8,10]) -> (f32[6,8,4], f32[48,4], f32[8,6], f32[8,6,4]) {
  %a = slice %x, start=[0,0,2], stop=[6,8,6] : f32[6,8,4]
  %b = slice %x, start=[0,0,5], stop=[6,8,9] : f32[6,8,4]
  %br = reshape %b : f32[48,4]
  %t = transpose %x, perm=[1,0,2] : f32[8,6,10]
  %ts = slice %t, start=[0,0,0], stop=[8,6,1] : f32[8,6,1]
  %tr = reshape %ts : f32[8,6]
  %e = exp %tr : f32[8,6]
  %c = slice %x, start=[1,0,0], stop=[5,8,10] : f32[4,8,10]
  %ct = transpose %c, perm=[1,0,2] : f32[8,4,10]
  %cs = sum %ct, axes=[2] : f32[8,4]
  %u = transpose %cs, perm=[1,0] : f32[4,8]
  %g = slice %x, start=[0,0,0], stop=[6,8,4] : f32[6,8,4]
  %gt = transpose %g, perm=[1,0,2] : f32[8,6,4]
  %h = tanh %gt : f32[8,6,4]
  return %a, %br, %e, %h
}
"""
    plan = plan_function(parse(text)["f"], {})
    assert not {"a", "b", "t", "ts", "c", "ct", "g", "gt"} & set(plan.views)
    _check(text, fresh)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_view_of_a_result_waits_for_all_its_rows(fresh, threads):
    """A slice of a returned value read by the next kernel: the two must not run row-chunked
    together (the slice's rows are other rows of the result; chunked, they were read before
    they were written)."""
    text = """module @m
func @f(%x: f32[64,256]) -> (f32[64,256], f32[32,256]) {
  %a = map %x, body=mul($0, 2.0) : f32[64,256]
  %v = slice %a, start=[32,0], stop=[64,256] : f32[32,256]
  %y = map %v, body=add($0, 1.0) : f32[32,256]
  return %a, %y
}
"""
    assert plan_function(parse(text)["f"], {}).views == {"v": [256, 1]}
    _check(text, fresh, threads, rtol=0)


def test_a_reduction_keeping_its_elements_waits_for_the_buffer_it_reuses(fresh):
    """A softmax's reduction stores its exps into the map's buffer, which the arena may place
    over one a kernel before it still reads (B, dead after the sum): the two must not run
    row-chunked together (y's rows are wider than B's: chunked, the sum read B's later rows
    after the reduction had written exps over them)."""
    text = """module @m
func @f(%x: f32[64,2048], %z: f32[64,4096]) -> (f32[64], f32[64], f32[64]) {
  %b = transpose %x, perm=[1,0] : f32[2048,64]
  %br = reshape %b : f32[64,2048]
  %r = sum %br, axes=[1] : f32[64]
  %s = map_reduce %z, body=exp($0), reduce=sum, axes=[1] : f32[64]
  %sr = reshape %s : f32[64,1]
  %sb = broadcast %sr : f32[64,4096]
  %y = map %z, %sb, body=div(exp($0), $1) : f32[64,4096]
  %o = max %y, axes=[1] : f32[64]
  return %r, %o, %s
}
"""
    plan = plan_function(parse(text)["f"], {})
    assert plan.where["y"] == plan.where["b"] == ("arena", 0)
    _check(text, fresh, 1, rtol=1e-5)


def test_in_order_layouts():
    assert in_order([40, 1], [3, 4])
    assert in_order([0, 7, 1], [5, 3, 7])
    assert in_order([1, 40], [1, 4])  # a length-1 axis is never walked
    assert not in_order([1, 40], [3, 4])


# ---------------------------------------------------------------- drawn chains of views

# consumer: (reads a second parameter %p, its statement, result "full" or "kept" axes)
_CONSUMERS = {
    "exp": (False, "%y = exp %{v} : {t}", "full"),
    "add": (True, "%y = add %{v}, %p : {t}", "full"),
    "reduce": (False, "%y = sum %{v}, {ax} : {t}", "kept"),
    "map": (True, "%y = map %{v}, %p, body=mul(tanh($0), $1) : {t}", "full"),
    "map_reduce": (False, "%y = map_reduce %{v}, body=exp($0), reduce=max, {ax} : {t}", "kept"),
}


@st.composite
def view_chains(draw) -> str:
    """A function reading a chain of one to three view ops of its input through one consumer
    (or two), in f32 or f64."""
    dtype = draw(st.sampled_from(["f32", "f64"]))
    shape = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    lines, cur, n = [], "x", 0

    def ty(s: list[int]) -> str:
        return f"{dtype}[{','.join(map(str, s))}]"

    params = [f"%x: {ty(shape)}"]
    source = ty(shape)
    if draw(st.booleans()):  # the chain reads a computed value, itself returned too
        lines.append(f"%a = exp %x : {source}")
        cur = "a"
    for _ in range(draw(st.integers(1, 3))):
        n += 1
        kind = draw(st.sampled_from(["slice", "transpose", "broadcast"]))
        if kind == "slice":
            start = [draw(st.integers(0, d - 1)) for d in shape]
            stop = [draw(st.integers(a + 1, d)) for a, d in zip(start, shape)]
            shape = [b - a for a, b in zip(start, stop)]
            lines.append(f"%v{n} = slice %{cur}, start=[{','.join(map(str, start))}], "
                         f"stop=[{','.join(map(str, stop))}] : {ty(shape)}")
        elif kind == "transpose":
            perm = draw(st.permutations(range(len(shape))))
            shape = [shape[p] for p in perm]
            lines.append(f"%v{n} = transpose %{cur}, perm=[{','.join(map(str, perm))}] "
                         f": {ty(shape)}")
        else:
            lead = draw(st.lists(st.integers(1, 4), max_size=4 - len(shape)))
            shape = lead + [draw(st.integers(1, 4)) if d == 1 else d for d in shape]
            lines.append(f"%v{n} = broadcast %{cur} : {ty(shape)}")
        cur = f"v{n}"
    consumer = draw(st.sampled_from([*_CONSUMERS, "two"]))
    axes = sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    kept = ty([d for i, d in enumerate(shape) if i not in axes])
    ax = f"axes=[{','.join(map(str, axes))}]"
    if consumer in _CONSUMERS:
        needs_p, line, result = _CONSUMERS[consumer]
        if needs_p:
            params.append(f"%p: {ty(shape)}")
        ret = ty(shape) if result == "full" else kept
        lines.append(line.format(v=cur, ax=ax, t=ret))
    else:  # a loop kernel and a reduction both reading the view, results joined
        size, rest = int(np.prod(shape)), int(np.prod([d for i, d in enumerate(shape)
                                                        if i not in axes]))
        lines += [f"%e = sin %{cur} : {ty(shape)}",
                  f"%s = sum %{cur}, {ax} : {kept}",
                  f"%er = reshape %e : {ty([size])}",
                  f"%sr = reshape %s : {ty([rest])}",
                  f"%y = concat %er, %sr, axis=0 : {ty([size + rest])}"]
        ret = ty([size + rest])
    body = "\n  ".join(lines)
    rets, names = (f"({ret}, {source})", "%y, %a") if lines[0].startswith("%a") else (ret, "%y")
    return (f"module @m\nfunc @f({', '.join(params)}) -> {rets} {{\n  {body}\n"
            f"  return {names}\n}}\n")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=view_chains(), threads=st.sampled_from([1, 2]))
def test_drawn_view_chains_equal_interpret(fresh, text, threads):
    _check(text, fresh, threads, rtol=1e-5)
