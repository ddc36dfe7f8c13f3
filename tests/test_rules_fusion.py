"""The fusion family and the transposed-operand matmul rules: sound, bounded, and finding the
kernels a reader expects (one map for an elementwise chain, map_reduce for softmax, a matmul
epilogue for bias + relu, matmul_t for a transposed operand)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
import eqsat.extract as ex
from eqsat import f32
from eqsat import interpret
from eqsat.extract import optimize, optimize_with_report
from eqsat.extract.cost import CUDA, work
from eqsat.ir import DType, Module, parse
from eqsat.ir.ops import broadcastable
from eqsat.ir.scalar_expr import App, Arg, parse_body
from eqsat.rules import Limits, algebraic, check, default, layout, saturate
from eqsat.rules.fusion import fusion
from eqsat.rules.fusion_pass import MAX_BODY_OPS, RULES, body_size, canonical
from eqsat.testing import functions
from eqsat.testing.equivalence import assert_equivalent

EXAMPLES = Path(ex.__file__).parent.parent / "examples"
FUSED = {"map", "map_reduce", "matmul_epi"}


def kernels(m: Module, name: str) -> int:
    """Kernel launches of function `name` by the cost model (views and scalars are free)."""
    f = m[name]
    env = f.types()
    return sum(work(s.op, s.attr, [env[o] for o in s.operands], s.types).kernels for s in f.body)


def ops(m: Module, name: str) -> list[str]:
    return [s.op for s in m[name].body]


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def same(m1: Module, m2: Module, name: str, *args: np.ndarray) -> None:
    np.testing.assert_allclose(interpret(m1, name, *args), interpret(m2, name, *args),
                               rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the rules themselves


def test_every_fusion_and_matmul_t_rule_passes_check():
    check(fusion(), examples=15)
    for r in layout():
        if r.name.startswith(("mm_", "mmt_")):
            check(r, examples=15)


def test_rule_names_are_unique_and_the_pass_is_named():
    names = default().names()
    assert len(names) == len(set(names))
    assert {"lift_tanh", "lift_add_l", "lift_add_r", "mm_ta2", "mm_tb3", "mmt_plain"} <= set(names)
    assert not set(RULES) & set(names)  # the pass reports under its own names


def test_canonical_merges_equal_operands_orders_by_first_use_drops_unused():
    body = parse_body("add(mul($2, $0), $2)")
    k = canonical(("a", "b", "a"), body)
    assert k.operands == ("a",) and k.body == parse_body("add(mul($0, $0), $0)")
    k = canonical(("x", "y", "z"), parse_body("sub($2, $0)"))
    assert k.operands == ("z", "x") and k.body == parse_body("sub($0, $1)")
    # a matmul_epi keeps its product first
    k = canonical(("p", "b"), parse_body("add($1, $0)"), fixed=1)
    assert k.operands == ("p", "b") and k.body == parse_body("add($1, $0)")
    assert body_size(App("neg", (Arg(0),))) == 1


# ---------------------------------------------------------------- what the optimizer finds

CHAIN = """module @m
func @f(%x: f32[64,32], %w: f32[32], %b: f32[32]) -> f32[64,32] {
  %bw = broadcast %w : f32[64,32]
  %bb = broadcast %b : f32[64,32]
  %a = mul %x, %bw : f32[64,32]
  %c = add %a, %bb : f32[64,32]
  %t = tanh %c : f32[64,32]
  %s = sigmoid %x : f32[64,32]
  %d = mul %t, %s : f32[64,32]
  return %d
}
"""


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_elementwise_chain_with_broadcasts_is_one_map(target):
    m = parse(CHAIN)
    out, report = optimize_with_report(m, target=target)
    (s,) = out["f"].body
    assert s.op == "map" and set(s.operands) == {"x", "w", "b"}  # broadcasts read through
    assert s.attr["body"] == parse_body("mul(tanh(add(mul($0, $1), $2)), sigmoid($0))")
    assert report.fired["fuse_producer"] > 0 and report.fired["fuse_broadcast"] > 0
    (kernel,) = report.fused
    assert {"lift_mul_r", "lift_add_r"} <= set(kernel.rules)  # ops reading a broadcast
    same(m, out, "f", rand(64, 32), rand(32, seed=1), rand(32, seed=2))


FOLDED = """module @m
func @f(%x: DT[64], %y: DT[64]) -> DT[64] {
  %one = const 1.0 : DT[]
  %three = const 3.0 : DT[]
  %k = div %one, %three : DT[]
  %b = broadcast %k : DT[64]
  %z = const 0.0 : DT[64]
  %c = lt %x, %y : bool[64]
  %s = select %c, %z, %b : DT[64]
  %m = mul %s, %x : DT[64]
  %n = neg %m : DT[64]
  return %n
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_an_unrounded_f32_constant_fuses_like_an_f64_one(dtype):
    # a rule's literal (as folding once did) can give an f32 constant a value f32 does not
    # hold; the fusion pass named its e-class by the rounded value, a new e-class, and the
    # fusions of the chain joined that copy instead of the program's value
    third = eqsat.rules.parse(
        "rule third: div(?o, const(3.0)) => mul(?o, const(0.3333333333333333, like=?o))")
    m = parse(FOLDED.replace("DT", dtype))
    out = optimize(m, rules=default() + third)
    assert ops(out, "f") == ["map"]
    x, y = rand(64), rand(64, seed=1)
    same(m, out, "f", x.astype(DType[dtype].np), y.astype(DType[dtype].np))


SOFTMAX = """module @m
func @f(%x: f32[64,128]) -> f32[64,128] {
  %m = max %x, axes=[1] : f32[64]
  %mr = reshape %m : f32[64,1]
  %mb = broadcast %mr : f32[64,128]
  %d = sub %x, %mb : f32[64,128]
  %e = exp %d : f32[64,128]
  %s = sum %e, axes=[1] : f32[64]
  %sr = reshape %s : f32[64,1]
  %sb = broadcast %sr : f32[64,128]
  %y = div %e, %sb : f32[64,128]
  return %y
}
"""


def test_softmax_becomes_map_reduce_and_map():
    m = parse(SOFTMAX)
    out = optimize(m, target="cuda")
    c = Counter(ops(out, "f"))
    assert c["map_reduce"] == 1 and c["map"] == 1 and not {"exp", "sub", "div", "sum"} & set(c)
    # max, map_reduce(sum), map(div) against max, two broadcasts, sub, exp, sum, div
    assert kernels(out, "f") == 3 < kernels(m, "f") == 7
    mr_kernel = next(k for k in optimize_with_report(m, target="cuda")[1].fused
                     if k.op == "map_reduce")
    assert "fuse_reduce" in mr_kernel.rules  # the pass's rules are credited in the report
    (mr,) = [s for s in out["f"].body if s.op == "map_reduce"]
    assert mr.attr["reduce"] == "sum" and mr.attr["axes"] == (1,)
    same(m, out, "f", rand(64, 128) * 3)


def test_matmul_bias_relu_becomes_matmul_epi():
    m = parse("""module @m
func @f(%x: f32[128,256], %w: f32[256,64], %b: f32[64]) -> f32[128,64] {
  %p = matmul %x, %w : f32[128,64]
  %bb = broadcast %b : f32[128,64]
  %a = add %p, %bb : f32[128,64]
  %r = relu %a : f32[128,64]
  return %r
}
""")
    out, report = optimize_with_report(m, target="cuda")
    (s,) = out["f"].body
    assert s.op == "matmul_epi" and s.operands == ("x", "w", "b")
    assert s.attr["body"] == parse_body("relu(add($0, $1))")
    assert report.fired["fuse_epilogue"] > 0
    same(m, out, "f", rand(128, 256) / 8, rand(256, 64, seed=1) / 8, rand(64, seed=2))


@pytest.mark.parametrize("perm, shape, ta", [("[1,0]", "32,48", 1), ("[0,2,1]", "4,32,48", 1),
                                             ("[1,0]", "16,48", 0)])
def test_transpose_feeding_matmul_becomes_matmul_t(perm, shape, ta):
    dims = [int(d) for d in shape.split(",")]
    t_dims = dims[:-2] + [dims[-1], dims[-2]]
    if ta:  # transpose(a) @ b: a is [.., k, m]
        b = dims[:-2] + [dims[-2], 8]
        out_t = t_dims[:-1] + [8]
        body = f"%t = transpose %a, perm={perm} : f32[{','.join(map(str, t_dims))}]\n" \
               f"  %r = matmul %t, %b : f32[{','.join(map(str, out_t))}]"
    else:  # a @ transpose(b)
        b = [8, dims[-1]]
        dims, b = b, dims
        out_t = [8, b[-2]]
        body = f"%t = transpose %b, perm={perm} : f32[{b[-1]},{b[-2]}]\n" \
               f"  %r = matmul %a, %t : f32[{','.join(map(str, out_t))}]"
    text = (f"module @m\nfunc @f(%a: f32[{','.join(map(str, dims))}], "
            f"%b: f32[{','.join(map(str, b))}]) -> f32[{','.join(map(str, out_t))}] {{\n"
            f"  {body}\n  return %r\n}}\n")
    m = parse(text)
    out = optimize(m, target="cuda")
    (s,) = out["f"].body
    assert s.op == "matmul_t" and (s.attr["ta"], s.attr["tb"]) == (ta, 1 - ta)
    same(m, out, "f", rand(*dims), rand(*b, seed=1))


def test_no_fusion_without_the_family():
    eg, report = saturate(parse(CHAIN), algebraic() + layout())
    ser = eg.serialize()
    assert not {n.op for n in ser.nodes.values()} & FUSED
    assert not set(RULES) & set(report.fired)


# ---------------------------------------------------------------- soundness of the pass

_HEALTH = list(HealthCheck)
FUSABLE = ["add", "mul", "sub", "div", "neg", "exp", "tanh", "sigmoid", "relu", "maximum",
           "broadcast", "const", "sum", "max", "matmul", "transpose", "lt", "select"]


class _FusionLoving:
    """A cost model under which every fused kernel is nearly free: extraction then takes the
    most fused forms the pass built, so their bodies are what the interpreter checks."""

    name = "fusion-loving"

    def stmt_cost(self, op, attrs, operands, results) -> float:
        base = CUDA.stmt_cost(op, attrs, operands, results)
        return base * (1e-3 if op in FUSED else 1.0)


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=_HEALTH)
@given(functions(ops=FUSABLE, dtypes=[DType.f32], max_stmts=9))
def test_most_fused_forms_equal_the_interpreter(f):
    m = Module(f, name="m")
    out = optimize(m, target=_FusionLoving(), limits=Limits(seconds=3))
    assert_equivalent(m, out, trials=4)


UNARY = ["neg", "exp", "tanh", "sigmoid", "relu", "abs"]
BINARY = ["add", "mul", "sub", "maximum", "minimum"]


@st.composite
def fusable_programs(draw: st.DrawFn) -> str:
    """A matmul (or not), then an elementwise chain reading earlier values, broadcast vectors
    and constants, then a reduction (or not): every fusion rule has something to do."""
    lines, values = [], []
    if draw(st.booleans()):
        tb = draw(st.booleans())
        w = "f32[6,5]" if tb else "f32[5,6]"
        lines.append("%w.t = transpose %w, perm=[1,0] : f32[5,6]" if tb else "")
        lines.append(f"%v0 = matmul %x, {'%w.t' if tb else '%w'} : f32[8,6]")
        values.append("%v0")
    else:
        w = "f32[5,6]"
    values.append("%y")
    lines += ["%bb = broadcast %b : f32[8,6]", "%c = const 0.5 : f32[8,6]"]
    for i in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(UNARY + BINARY))
        a = draw(st.sampled_from(values))
        if op in UNARY:
            lines.append(f"%e{i} = {op} {a} : f32[8,6]")
        else:
            other = draw(st.sampled_from(values + ["%bb", "%c"]))
            lines.append(f"%e{i} = {op} {a}, {other} : f32[8,6]")
        values.append(f"%e{i}")
    result, rtype = values[-1], "f32[8,6]"
    red = draw(st.sampled_from(["", "sum", "max"]))
    if red:
        axes = draw(st.sampled_from([[0], [1], [0, 1]]))
        rtype = {(0,): "f32[6]", (1,): "f32[8]", (0, 1): "f32[]"}[tuple(axes)]
        lines.append(f"%r = {red} {result}, axes=[{','.join(map(str, axes))}] : {rtype}")
        result = "%r"
    body = "\n".join(f"  {ln}" for ln in lines if ln)
    return (f"module @m\nfunc @f(%x: f32[8,5], %w: {w}, %y: f32[8,6], %b: f32[6]) -> {rtype} "
            f"{{\n{body}\n  return {result}\n}}\n")


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=_HEALTH)
@given(fusable_programs())
def test_most_fused_kernels_of_chains_equal_the_interpreter(text):
    m = parse(text)
    out = optimize(m, target=_FusionLoving(), limits=Limits(seconds=3))
    assert_equivalent(m, out, trials=3)


@settings(max_examples=20, deadline=None, database=None, suppress_health_check=_HEALTH)
@given(functions(ops=FUSABLE, dtypes=[DType.f32, DType.f64], max_stmts=8))
def test_optimized_programs_equal_the_interpreter(f):
    m = Module(f, name="m")
    out = optimize(m, target="cuda", limits=Limits(seconds=3))
    assert_equivalent(m, out, trials=4)


def test_bodies_stay_within_the_bound():
    lines = [f"  %v{i + 1} = {'tanh' if i % 2 else 'exp'} %v{i} : f32[16]" for i in range(40)]
    m = parse("module @m\nfunc @f(%v0: f32[16]) -> f32[16] {\n" + "\n".join(lines) +
              "\n  return %v40\n}\n")
    eg, report = saturate(m, default(), Limits(seconds=20))
    bodies = [dict(n.attrs)["body"] for n in eg.serialize().nodes.values() if n.op == "map"]
    assert bodies and max(body_size(b) for b in bodies) <= MAX_BODY_OPS
    assert report.stop_reason == "saturated"


# ---------------------------------------------------------------- limits and the examples


@pytest.mark.parametrize("limits, reason", [(Limits(nodes=400), "node limit"),
                                            (Limits(iterations=2), "iteration limit")])
def test_limits_hold_with_fusion_on(limits, reason):
    m = parse((EXAMPLES / "transformer.eqir").read_text())
    out, report = optimize_with_report(m, target="cuda", limits=limits)
    assert report.stop_reason == reason
    if reason == "node limit":  # one round and one pass may overshoot, by a bounded amount
        assert report.enodes_final < 4 * limits.nodes
    assert report.cost_after <= report.cost_before
    args = [rand(*p.type.shape, seed=i) / 8 for i, p in enumerate(m["encoder_block"].params)]
    np.testing.assert_allclose(interpret(out, "encoder_block", *args),
                               interpret(m, "encoder_block", *args), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("example", ["mlp.eqir", "transformer.eqir"])
def test_examples_fuse_in_seconds(example):
    m = parse((EXAMPLES / example).read_text())
    t0 = time.perf_counter()
    out, report = optimize_with_report(m, target="cuda")
    assert time.perf_counter() - t0 < 10
    assert report.stop_reason == "saturated"
    from eqsat.ad import differentiate

    before = differentiate(m)
    for f in before.functions:
        assert kernels(out, f.name) <= kernels(before, f.name)
    assert sum(kernels(out, f.name) for f in before.functions) < sum(
        kernels(before, f.name) for f in before.functions)
    assert any(s.op in FUSED for f in out.functions for s in f.body)


# ---------------------------------------------------------------- time limits hold


def _attention() -> Module:
    """Multi-head attention + layer norm + gelu loss with its gradient: the fusion pass's
    heaviest workload (thousands of candidate kernels per round without a limit)."""
    @eqsat.function
    def attn(x: f32[2, 16, 32], wq: f32[32, 32], wk: f32[32, 32], wv: f32[32, 32]):
        q = (x @ wq).reshape(2, 16, 4, 8).transpose((0, 2, 1, 3))
        k = (x @ wk).reshape(2, 16, 4, 8).transpose((0, 2, 3, 1))
        v = (x @ wv).reshape(2, 16, 4, 8).transpose((0, 2, 1, 3))
        a = eqsat.softmax(q @ k / np.sqrt(np.float32(8.0)), axis=-1)  # f32, as in numpy
        o = (a @ v).transpose((0, 2, 1, 3)).reshape(2, 16, 32)
        return eqsat.layer_norm(o + x)

    @eqsat.function
    def loss(x: f32[2, 16, 32], wq: f32[32, 32], wk: f32[32, 32], wv: f32[32, 32]):
        return eqsat.sum(eqsat.gelu(attn(x, wq, wk, wv)) ** 2)

    return eqsat.differentiate(eqsat.Module(attn, loss, eqsat.grad(loss, wrt=("wq", "wk", "wv"))))


@pytest.mark.parametrize("seconds", [0.3, 1.0])
def test_saturation_keeps_its_time_limit_on_attention(seconds):
    m = _attention()
    t0 = time.perf_counter()
    _, report = saturate(m, default(), Limits(seconds=seconds))
    wall = time.perf_counter() - t0
    # the margin is a rule run already under way at the deadline (0.3 s measured 0.61 once in a
    # full suite run); unlimited, saturation takes ~2.6 s, which either bound still catches
    assert wall <= seconds + 0.6, (wall, str(report))
    assert report.stop_reason in ("time limit", "saturated")


def test_optimize_under_a_small_time_limit_is_valid_and_not_costlier():
    m = _attention()
    out, report = optimize_with_report(m, limits=Limits(seconds=0.5))
    # Unlimited, saturation takes ~2.6 s here; the margin is for a rule run already under
    # way at the deadline, which a loaded machine (CI beside other jobs) stretches.
    assert report.seconds["saturate"] <= 0.5 + 1.0
    assert ex.module_cost(out) <= ex.module_cost(m)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) * 0.3
            for s in [(2, 16, 32), (32, 32), (32, 32), (32, 32)]]
    for name in ("attn", "loss_grad"):
        want, got = interpret(m, name, *args), interpret(out, name, *args)
        for w, g in zip(want if isinstance(want, tuple) else (want,),
                        got if isinstance(got, tuple) else (got,)):
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def _rows_of(n: int, rows: int) -> Module:
    """sum(concat(tanh(x[i:i+rows] * w) for each block of rows, reversed) * x), with its
    gradient: hundreds of f32[rows,8] classes beside `w`'s f32[8] one."""
    def f(x, w):
        blocks = [eqsat.tanh(x[i:i + rows, :] * w) for i in range(0, n, rows)]
        return eqsat.sum(eqsat.concatenate(blocks[::-1], axis=0) * x)
    f.__annotations__ = {"x": f32[n, 8], "w": f32[8]}
    fn = eqsat.function(f)
    return eqsat.differentiate(Module(fn, eqsat.grad(fn)))


def test_fusion_pass_cut_short_puts_each_new_kernel_in_its_own_class():
    # A pass stopped after 148 fusions (by its budget here, by its deadline under load) once
    # had egglog give the map fused for one block the e-class of `w`: the e-graph held
    # `w = map(x[70:72], w)`, an optimized program read `w` for a row of `x`.
    from eqsat.rules import bridge, runner
    from eqsat.rules.compile import compile_ruleset
    from eqsat.rules.fusion import _PASS

    eg = bridge.load(_rows_of(130, 2))
    eg.run(compile_ruleset(default()))
    eg.analyze()
    eg.run(runner._REWRITE)
    assert sum(_PASS.run(eg, 460).values()) == 148
    eg.analyze()  # an f32[2,8] map in the f32[8] class: "Illegal merge" here
    ser = eg.serialize()
    for n in ser.nodes.values():
        if n.op == "map":
            out = ser.types[n.eclass].shape
            assert all(broadcastable(ser.types[c].shape, out) for c in n.children), n


def test_fusion_graph_finds_a_class_kernels_once():
    from eqsat.rules import load
    from eqsat.rules.fusion_graph import FusionGraph

    m = parse("module @k\nfunc @f(%x: f32[3]) -> f32[3] {\n  %a = exp %x : f32[3]\n"
              "  %b = neg %a : f32[3]\n  %c = mul %a, %b : f32[3]\n  return %c\n}\n")
    g = FusionGraph(load(m).serialize())
    (a,) = [c for c in g.ser.classes if any(n.op == "exp" for n in g.nodes(c))]
    # every kernel reading `a` asks for its kernels again: the answer is kept, not rebuilt
    first = g.kernels(a)
    assert [k.body for k in first] == [parse_body("exp($0)")]
    assert g.kernels(a) is first


def test_epilogue_renumbers_a_body_only_for_a_product_operand(monkeypatch):
    from eqsat.rules import fusion_pass, load
    from eqsat.rules.fusion_graph import FusionGraph

    m = parse("module @k\nfunc @f(%x: f32[3,3], %w: f32[3,3]) -> (f32[3,3], f32[3,3]) {\n"
              "  %a = exp %x : f32[3,3]\n  %c = mul %a, %a : f32[3,3]\n  %p = matmul %w, %x"
              " : f32[3,3]\n  %d = add %p, %x : f32[3,3]\n  return %c, %d\n}\n")
    g = FusionGraph(load(m).serialize())
    ops = {c: {n.op for n in g.nodes(c)} for c in g.ser.classes}
    mul, add = (next(c for c, o in ops.items() if op in o) for op in ("mul", "add"))
    calls = []
    real = fusion_pass.substitute
    monkeypatch.setattr(fusion_pass, "substitute", lambda *a: calls.append(1) or real(*a))
    p = fusion_pass.FusionPass(frozenset())
    (k,) = g.kernels(mul)
    assert list(p._epilogue(g, mul, g.types[mul], k, 0)) == []
    assert calls == []  # `exp %x` is no matmul: nothing to renumber
    (k,) = g.kernels(add)
    (epi,) = p._epilogue(g, add, g.types[add], k, 0)
    assert epi.op == "matmul_epi" and calls == [1]


def test_fusion_graphs_weigh_a_kernel_once(monkeypatch):
    from eqsat.ir import fused
    from eqsat.rules import fusion_graph, load

    m = parse("module @k\nfunc @f(%x: f32[3]) -> f32[3] {\n  %a = exp %x : f32[3]\n"
              "  %c = mul %a, %a : f32[3]\n  return %c\n}\n")
    ser = load(m).serialize()
    fused._flops_cached.cache_clear()
    calls = []
    real = fused._flops
    monkeypatch.setattr(fused, "_flops", lambda *a: calls.append(1) or real(*a))
    # each run of the pass builds a new graph of mostly the same classes: weighed once
    for _ in range(2):
        g = fusion_graph.FusionGraph(ser)
        (c,) = [c for c in ser.classes if any(n.op == "mul" for n in g.nodes(c))]
        (k,) = g.kernels(c)
        assert g.dominated(c, k)
    assert calls == [1]
