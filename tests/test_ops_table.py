"""Every op of the table round-trips and interprets like numpy, tested from the table itself.

`REFERENCE` is written here, independently of `eqsat/ir/ops.py`: for each op, the dtypes it
accepts and a numpy expression for its result. A new op without an entry fails
`test_reference_covers_every_op`; each (op, dtype) pair draws functions made only of that op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.errors import VerifyError
from eqsat.ir import OPS, DType, Function, Module, interpret
from eqsat.ir.fused import unfuse
from eqsat.ir.types import TensorType
from eqsat.testing import functions, has_generator, inputs, missing_generators

f32, f64, i32, i64, b8 = DType.f32, DType.f64, DType.i32, DType.i64, DType.bool
FLOATS = frozenset({f32, f64})
NUMERIC = FLOATS | {i32, i64}
ALL = NUMERIC | {b8}

Ref = Callable[[list[np.ndarray], dict[str, Any], TensorType], np.ndarray]


def _wrap(values: list[int], dtype: np.dtype) -> np.ndarray:
    """Python integers wrapped to `dtype` (two's complement), as C and numpy do."""
    bits = 8 * dtype.itemsize
    return np.array([(v + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1) for v in values],
                    dtype=dtype)


def _elementwise_int(fn: Callable[[int, int], int]) -> Callable[..., np.ndarray]:
    def run(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = [fn(int(a), int(b)) for a, b in zip(x.ravel(), y.ravel())]
        return _wrap(out, x.dtype).reshape(x.shape)
    return run


def _floor_div(a: int, b: int) -> int:
    return 0 if b == 0 else a // b  # numpy gives 0 for an integer division by zero


def _int_pow(a: int, b: int) -> int:
    if b >= 0:
        return pow(a, b, 2**64)  # modular: the result is wrapped to the dtype anyway
    # Truncated like C: only 1 and -1 have integer reciprocals (0 ** negative gives 0).
    return 1 if a == 1 else (-1 if b % 2 else 1) if a == -1 else 0


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _elementwise_int(_floor_div)(x, y) if x.dtype.kind == "i" else x / y


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _elementwise_int(_int_pow)(x, y) if x.dtype.kind == "i" else x**y


def _nan_first(pick_x: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    """maximum/minimum: a NaN in either operand wins; ties go to y, as numpy's do (so that
    maximum(-0.0, 0.0) is 0.0 and maximum(0.0, -0.0) is -0.0)."""
    def run(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if x.dtype.kind != "f":
            return np.where(pick_x(x, y), x, y)
        return np.where(np.isnan(x) | (pick_x(x, y) & ~np.isnan(y)), x, y)
    return run


def _u(fn: Callable[[np.ndarray], np.ndarray]) -> Ref:
    return lambda a, attrs, t: fn(a[0])


def _b(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Ref:
    return lambda a, attrs, t: fn(a[0], a[1])


def _one(x: np.ndarray) -> Any:
    return x.dtype.type(1)


def _einsum_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b by einsum over copies: on a broadcast operand (stride 0) einsum factors the
    repeated value out of the sum (inf * (0 + 1) = inf where the product's terms give
    inf * 0 + inf * 1 = nan), which no product computes."""
    return np.einsum("...ij,...jk->...ik", np.array(a), np.array(b))


REFERENCE: dict[str, tuple[frozenset[DType], Ref | None]] = {
    "neg": (NUMERIC, _u(lambda x: -x)),
    "abs": (NUMERIC, _u(lambda x: np.where(np.signbit(x), -x, x))),  # |-0.0| is 0.0
    "exp": (FLOATS, _u(np.exp)),
    "log": (FLOATS, _u(np.log)),
    "sqrt": (FLOATS, _u(np.sqrt)),
    "rsqrt": (FLOATS, _u(lambda x: _one(x) / np.sqrt(x))),
    "tanh": (FLOATS, _u(np.tanh)),
    # DESIGN's formula itself: 0.5 (1 + tanh(x/2)) loses all relative accuracy below x ~ -36,
    # where log(sigmoid(x)) then differs by whole units (or is -inf where it should be -720)
    "sigmoid": (FLOATS, _u(lambda x: _one(x) / (_one(x) + np.exp(-x)))),
    "relu": (NUMERIC, _u(lambda x: np.where(np.isnan(x) | (x > 0), x, x.dtype.type(0)))),
    "recip": (FLOATS, _u(lambda x: _one(x) / x)),
    "sin": (FLOATS, _u(np.sin)),
    "cos": (FLOATS, _u(np.cos)),
    "add": (NUMERIC, _b(lambda x, y: x + y)),
    "sub": (NUMERIC, _b(lambda x, y: x - y)),
    "mul": (NUMERIC, _b(lambda x, y: x * y)),
    "div": (NUMERIC, _b(_div)),
    "pow": (NUMERIC, _b(_pow)),
    "maximum": (NUMERIC, _b(_nan_first(lambda x, y: x > y))),
    "minimum": (NUMERIC, _b(_nan_first(lambda x, y: x < y))),
    "lt": (ALL, _b(lambda x, y: x < y)),
    "le": (ALL, _b(lambda x, y: x <= y)),
    "gt": (ALL, _b(lambda x, y: x > y)),
    "ge": (ALL, _b(lambda x, y: x >= y)),
    "eq": (ALL, _b(lambda x, y: x == y)),
    "ne": (ALL, _b(lambda x, y: x != y)),
    "select": (ALL, lambda a, attrs, t: np.where(a[0], a[1], a[2])),
    "const": (ALL, lambda a, attrs, t: np.full(t.shape, attrs["value"], t.dtype.np)),
    "broadcast": (ALL, lambda a, attrs, t: np.broadcast_to(a[0], t.shape)),
    "sum": (NUMERIC, lambda a, attrs, t: np.add.reduce(a[0], axis=attrs["axes"], dtype=t.dtype.np)),
    "max": (ALL, lambda a, attrs, t: np.amax(a[0], axis=attrs["axes"])),
    "min": (ALL, lambda a, attrs, t: np.amin(a[0], axis=attrs["axes"])),
    "matmul": (NUMERIC, lambda a, attrs, t: _einsum_product(a[0], a[1])),
    "transpose": (ALL, lambda a, attrs, t: a[0].transpose(attrs["perm"])),
    "reshape": (ALL, lambda a, attrs, t: np.reshape(a[0], t.shape)),
    "slice": (ALL, lambda a, attrs, t: a[0][tuple(slice(s, e) for s, e in
                                                   zip(attrs["start"], attrs["stop"]))]),
    "concat": (ALL, lambda a, attrs, t: np.concatenate(a, axis=attrs["axis"])),
    "cast": (ALL, lambda a, attrs, t: a[0].astype(t.dtype.np)),
    "call": (ALL, None),  # runs the callee's body with these references (see `reference_call`)
    "matmul_t": (NUMERIC, lambda a, attrs, t: _einsum_product(
        *(np.swapaxes(x, -1, -2) if flag else x for x, flag in zip(a, (attrs["ta"], attrs["tb"]))))),
    "map": (ALL, None),  # fused kernels: their expansion into core ops, run with these references
    "map_reduce": (ALL, None),
    "matmul_epi": (NUMERIC, None),
}


def _via_core_ops(op: str) -> Ref:
    """A fused op's reference: its expansion into core ops (`unfuse`), each run by REFERENCE."""
    def run(args: list[np.ndarray], attrs: dict[str, Any], t: TensorType) -> np.ndarray:
        names = tuple(f"a{i}" for i in range(len(args)))
        types = {n: TensorType(DType.of(a.dtype), a.shape) for n, a in zip(names, args)}
        env = dict(zip(names, args))
        for s in unfuse(eqsat.ir.Stmt(("r",), op, names, tuple(attrs.items()), (t,)), types):
            env[s.results[0]] = REFERENCE[s.op][1]([env[o] for o in s.operands], s.attr, s.type)
        return env["r"]
    return run


for _op in ("map", "map_reduce", "matmul_epi"):
    REFERENCE[_op] = (REFERENCE[_op][0], _via_core_ops(_op))

# Helper ops a family needs to form an instance: select's condition comes from a compare.
HELPERS = {"select": {"lt"}}
TABLE_OPS = sorted(op for op in OPS if op != "call")
CASES = [(op, d) for op in TABLE_OPS for d in sorted(REFERENCE.get(op, (ALL, None))[0],
                                                     key=list(DType).index)]
SETTINGS = settings(max_examples=12, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def reference_call(module: Module, name: str, args: list[np.ndarray]) -> list[np.ndarray]:
    """Run a function statement by statement with REFERENCE (callees included)."""
    f = module[name]
    env = {p.name: a for p, a in zip(f.params, args)}
    for s in f.body:
        ins = [env[o] for o in s.operands]
        if s.op == "call":
            outs = reference_call(module, s.attr["callee"], ins)
        else:
            outs = [REFERENCE[s.op][1](ins, s.attr, s.type)]
        env.update(zip(s.results, outs))
    return [env[r] for r in f.returns]


def expose_all(f: Function) -> Function:
    """`f` returning every value its body defines, so each statement can be compared."""
    names = [r for s in f.body for r in s.results]
    ts = f.types()
    return Function(f.name, f.params, tuple(ts[n] for n in names), f.body, tuple(names))


# Ops that add up many terms: their rounding error scales with the terms, not the result.
ACCUMULATING = {"sum", "matmul", "matmul_t", "matmul_epi", "map_reduce"}


def error_scale(op: str, ins: list[np.ndarray]) -> float:
    """The absolute size rounding errors of `op` on `ins` may reach, relative to eps."""
    if op not in ACCUMULATING:
        return 1.0
    finite = [np.abs(x[np.isfinite(x)]).max(initial=0.0) for x in ins if x.dtype.kind == "f"]
    big = max([1.0] + [float(v) for v in finite])
    scale = 8.0 * big * big * max([1] + [x.size for x in ins])
    # operands so large that their products overflow tell nothing about rounding: skip them
    assume(math.isfinite(scale))
    return scale


def assert_like(got: np.ndarray, want: np.ndarray, t: TensorType, op: str, what: str,
                scale: float = 1.0) -> None:
    want = np.asarray(want)
    assert got.dtype == t.dtype.np and got.shape == t.shape, \
        f"{what}: {got.dtype}{got.shape} vs {t}"
    assert want.shape == t.shape, f"{what}: reference shape {want.shape} vs {t}"
    if t.dtype.is_float:
        tol = 2e-6 if t.dtype is f32 else 1e-13
        if "fused" in OPS[op].traits:  # a kernel body chains ops: rounding differences add up
            tol *= 50
        # a tolerance scaled past the dtype's range is inf: the comparison, not an overflow
        with np.errstate(over="ignore"):
            np.testing.assert_allclose(got, want.astype(got.dtype), rtol=tol, atol=tol * scale,
                                       equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)


def check_module(m: Module, args: tuple[np.ndarray, ...]) -> None:
    """Round trips, then each statement of the last function against REFERENCE, op by op."""
    text = str(m)
    again = eqsat.parse(text)
    assert again == m
    assert str(again) == text
    f = m.functions[-1]
    wide = Module(*m.functions[:-1], expose_all(f), name=m.name)
    values = interpret(wide, f.name, *args)
    values = values if isinstance(values, tuple) else (values,)
    env = {p.name: a for p, a in zip(f.params, args)}
    env.update(zip(wide[f.name].returns, values))
    for s in f.body:
        ins = [env[o] for o in s.operands]  # the interpreter's operands: each op on its own
        with np.errstate(all="ignore"):  # nan and inf are results like any other here
            if s.op == "call":
                wants = reference_call(m, s.attr["callee"], ins)
            else:
                wants = [REFERENCE[s.op][1](ins, s.attr, s.type)]
        if ill_conditioned(s, ins, wants):
            continue
        for r, want, t in zip(s.results, wants, s.types):
            assert_like(env[r], want, t, s.op, f"%{r} = {s.op} in\n{text}",
                        error_scale(s.op, ins))


def ill_conditioned(s: eqsat.ir.Stmt, ins: list[np.ndarray], wants: list[np.ndarray]) -> bool:
    """Whether a kernel body over a sum of products turns its rounding into a different
    answer: the reference on operands moved by one ulp disagrees with itself (a drawn body
    abs(cos(pow($0, $0))) on a product: pow of a negative sum is NaN or not as the sum rounds,
    cos of a huge power loses every digit). No implementation can match such a statement."""
    if s.op not in ACCUMULATING or "fused" not in OPS[s.op].traits:
        return False
    moved = [np.nextafter(x, np.inf) if x.dtype.kind == "f" else x for x in ins]
    with np.errstate(all="ignore"):
        again = REFERENCE[s.op][1](moved, s.attr, s.type)
    for want, t in zip(wants, s.types):
        try:
            assert_like(np.asarray(again).astype(t.dtype.np), want, t, s.op, "",
                        error_scale(s.op, ins))
        except AssertionError:
            return True
    return False


# ---------------------------------------------------------------- the table itself


def test_reference_covers_every_op():
    missing = sorted(set(OPS) - set(REFERENCE))
    assert not missing, f"ops without a numpy reference in this test: {missing}"
    stale = sorted(set(REFERENCE) - set(OPS))
    assert not stale, f"references for ops the table does not have: {stale}"


def test_every_op_has_a_generator():
    assert not missing_generators(), "ops eqsat.testing cannot draw (register a generator)"


@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{o}-{d}" for o, d in CASES])
def test_op_round_trips_and_interprets_like_numpy(op: str, dtype: DType):
    if REFERENCE.get(op, (None, None))[1] is None:
        pytest.fail(f"no numpy reference for {op}")
    if not has_generator(op):
        pytest.fail(f"eqsat.testing has no generator for {op}")

    @SETTINGS
    @given(st.data())
    def run(data: st.DataObject) -> None:
        f = data.draw(functions(ops={op} | HELPERS.get(op, set()), dtypes=(dtype,), max_params=4))
        if op in HELPERS:  # the helper alone may have been drawn
            assume(any(s.op == op for s in f.body))
        assert any(s.op == op for s in f.body), f"no {op} statement drawn for {dtype}:\n{f}"
        assert {s.op for s in f.body} <= {op} | HELPERS.get(op, set())
        check_module(Module(f, name="m"), data.draw(inputs(f)))

    run()


@pytest.mark.parametrize("op", [op for op in TABLE_OPS if REFERENCE.get(op, (ALL,))[0] != ALL])
def test_op_refuses_other_dtypes(op: str):
    """Each dtype the reference says an op does not take is a VerifyError at the statement."""
    accepted = REFERENCE[op][0]
    src = f64 if f64 in accepted else sorted(accepted, key=list(DType).index)[0]

    @SETTINGS
    @given(functions(ops={op}, dtypes=(src,), max_stmts=2))
    def run(f: Function) -> None:
        text = str(Module(f, name="m"))
        for bad in ALL - accepted:
            with pytest.raises(VerifyError) as e:
                eqsat.parse(text.replace(f"{src}[", f"{bad}["))
            assert e.value.line == 4, f"{bad}: {e.value}"  # the first statement

    run()


@pytest.mark.parametrize("dtype", sorted(ALL, key=list(DType).index), ids=str)
def test_call(dtype: DType):
    """A call's results are its callee's, run statement by statement."""

    @SETTINGS
    @given(st.data())
    def run(data: st.DataObject) -> None:
        callee = data.draw(functions(dtypes=(dtype,), name="g"))
        ts = callee.result_types
        results = tuple(f"r{i}" for i in range(len(ts)))
        caller = Function("f", callee.params, ts, (eqsat.ir.Stmt(results, "call", tuple(
            p.name for p in callee.params), (("callee", "g"),), ts),), results)
        check_module(Module(callee, caller, name="m"), data.draw(inputs(caller)))

    run()


@pytest.mark.parametrize("src", sorted(ALL, key=list(DType).index), ids=str)
@pytest.mark.parametrize("dst", sorted(ALL, key=list(DType).index), ids=str)
def test_cast_every_pair(src: DType, dst: DType):
    text = (f"module @m\n\nfunc @f(%x: {src}[2,3]) -> {dst}[2,3] {{\n"
            f"  %y = cast %x : {dst}[2,3]\n  return %y\n}}\n")
    m = eqsat.parse(text)
    assert str(m) == text

    @settings(max_examples=10, deadline=None, database=None)
    @given(inputs(m["f"]))
    def run(args: tuple[np.ndarray, ...]) -> None:
        check_module(m, args)

    run()


# ---------------------------------------------------------------- semantics worth spelling out


def one_op(op: str, t: str, operands: int = 2, rt: str | None = None, attrs: str = "") -> Module:
    params = ", ".join(f"%a{i}: {t}" for i in range(operands))
    args = ", ".join(f"%a{i}" for i in range(operands))
    rt = rt or t
    return eqsat.parse(f"func @f({params}) -> {rt} {{\n  %r = {op} {args}{attrs} : {rt}\n"
                       f"  return %r\n}}\n")


@pytest.mark.parametrize("dtype", [i32, i64], ids=str)
def test_integer_div_floors_and_gives_zero_for_zero_divisors(dtype: DType):
    x = np.array([-7, 7, -7, 7, 0, 5, -1], dtype.np)
    y = np.array([2, 2, -2, -2, 3, 0, 3], dtype.np)
    got = interpret(one_op("div", f"{dtype}[7]"), "f", x, y)
    np.testing.assert_array_equal(got, np.array([-4, 3, 3, -4, 0, 0, -1], dtype.np))


@pytest.mark.parametrize("dtype", [i32, i64], ids=str)
def test_integer_pow_truncates_negative_exponents(dtype: DType):
    x = np.array([2, -1, -1, 1, 0, 3, -2, 5], dtype.np)
    y = np.array([-1, -1, -2, -5, -1, 2, 3, 0], dtype.np)
    got = interpret(one_op("pow", f"{dtype}[8]"), "f", x, y)
    np.testing.assert_array_equal(got, np.array([0, -1, 1, 1, 0, 9, -8, 1], dtype.np))


@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
def test_scalar_pow_of_a_half_is_pow_not_sqrt(dtype: DType):
    """numpy computes a 0-d pow(x, 0.5) as sqrt(x): NaN at -inf and -0.0 at -0.0, where pow on
    arrays (and the compiled code) gives inf and 0.0. A scalar follows the arrays."""
    m = eqsat.parse(f"func @f(%x: {dtype}[]) -> {dtype}[] {{\n  %h = const 0.5 : {dtype}[]\n"
                    f"  %r = pow %x, %h : {dtype}[]\n  return %r\n}}")
    exe = eqsat.compile(m, optimize=False)
    for x, want in ((-np.inf, np.inf), (-0.0, 0.0), (4.0, 2.0)):
        got = interpret(m, "f", dtype.np.type(x))
        assert got == want and not np.signbit(got), (x, got)
        assert exe.f(dtype.np.type(x)) == got


def test_float_div_by_zero_and_nan_propagation():
    x = np.array([1.0, -1.0, 0.0, np.nan], np.float32)
    y = np.array([0.0, 0.0, 0.0, 1.0], np.float32)
    got = interpret(one_op("div", "f32[4]"), "f", x, y)
    np.testing.assert_array_equal(got, np.array([np.inf, -np.inf, np.nan, np.nan], np.float32))
    for op in ("maximum", "minimum"):
        got = interpret(one_op(op, "f64[2]"), "f", np.array([np.nan, 1.0]), np.array([0.0, np.nan]))
        assert np.isnan(got).all(), op


def test_log_sigmoid_keeps_its_relative_accuracy_far_into_the_negatives():
    """sigmoid is 1/(1+exp(-x)): log(sigmoid(x)) is about x until exp(-x) overflows, inside a
    fused epilogue too (a hypothesis case once showed a tanh-based reference 0.044 off here)."""
    m = eqsat.parse("func @f(%a: f64[1,3], %b: f64[3,1], %c: f64[1,1]) -> f64[1,1] {\n"
                    "  %r = matmul_epi %a, %b, %c, ta=0, tb=0, body=add($1, log(sigmoid($0)))"
                    " : f64[1,1]\n  return %r\n}\n")
    for product, want in [(-36.0, 12.0 - 36.0), (-700.0, 12.0 - 700.0), (-720.0, -np.inf)]:
        got = interpret(m, "f", np.full((1, 3), product / 3), np.ones((3, 1)), np.full((1, 1), 12.0))
        np.testing.assert_allclose(got, [[want]], rtol=1e-15)


def test_matmul_with_batch_dimensions():
    m = eqsat.parse("func @f(%a: f64[2,3,4], %b: f64[2,4,5]) -> f64[2,3,5] {\n"
                    "  %c = matmul %a, %b : f64[2,3,5]\n  return %c\n}\n")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))
    want = np.stack([a[i] @ b[i] for i in range(2)])
    np.testing.assert_allclose(interpret(m, "f", a, b), want, rtol=1e-13)


def test_reductions_and_select():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    m = one_op("sum", "i64[2,3,4]", 1, "i64[3]", ", axes=[2,0]")
    np.testing.assert_array_equal(interpret(m, "f", x), x.sum(axis=(0, 2)))
    m = one_op("max", "i64[2,3,4]", 1, "i64[]", ", axes=[0,1,2]")
    assert interpret(m, "f", x) == 23
    m = eqsat.parse("func @f(%c: bool[3], %x: i32[3], %y: i32[3]) -> i32[3] {\n"
                    "  %r = select %c, %x, %y : i32[3]\n  return %r\n}\n")
    got = interpret(m, "f", np.array([True, False, True]), np.array([1, 2, 3], np.int32),
                    np.array([7, 8, 9], np.int32))
    np.testing.assert_array_equal(got, [1, 8, 3])


CONSTS = [("nan", "f32"), ("inf", "f32"), ("-inf", "f64"), ("true", "bool"), ("false", "bool"),
          ("-0.0", "f64"), ("1e-05", "f32"), ("1e+300", "f64"), ("0.1", "f64"),
          ("9223372036854775807", "i64"), ("-9223372036854775808", "i64"),
          ("-2147483648", "i32"), ("0", "i32")]


@pytest.mark.parametrize("literal,dtype", CONSTS, ids=[f"{v}-{d}" for v, d in CONSTS])
def test_const_literals_round_trip(literal: str, dtype: str):
    text = (f"module @m\n\nfunc @f() -> {dtype}[2] {{\n  %c = const {literal} : {dtype}[2]\n"
            f"  return %c\n}}\n")
    m = eqsat.parse(text)
    assert str(m) == text
    assert eqsat.parse(str(m)) == m
    got = interpret(m, "f")
    value = {"true": True, "false": False}.get(literal)
    if value is None:
        value = int(literal) if dtype.startswith("i") else float(literal)
    want = np.full(2, value, DType(dtype).np)
    np.testing.assert_array_equal(got, want)
    if literal == "-0.0":
        assert math.copysign(1.0, float(got[0])) == -1.0


@pytest.mark.parametrize("literal,dtype", [("true", "f32"), ("1.5", "i32"), ("2147483648", "i32"),
                                            ("1", "bool"), ("nan", "i64"), ("1.0", "i64")])
def test_const_literal_of_the_wrong_kind_is_refused(literal: str, dtype: str):
    with pytest.raises(VerifyError) as e:
        eqsat.parse(f"func @f() -> {dtype}[] {{\n  %c = const {literal} : {dtype}[]\n"
                    f"  return %c\n}}\n")
    assert (e.value.line, e.value.col) == (2, 14)


def test_product_reference_does_not_factor_a_broadcast_operand():
    """The case hypothesis found: [inf, inf] (a broadcast) @ [[0], [1]] is nan, as every
    product computes it, not the inf einsum gives on a stride-0 view."""
    a = np.broadcast_to(np.array(np.inf), (1, 2))
    w = np.array([[0.0], [1.0]])
    with np.errstate(all="ignore"):
        got = REFERENCE["matmul"][1]([a, w], {}, None)
    assert np.isnan(got).all()
    assert np.isnan(interpret(eqsat.parse(
        "module @m\nfunc @f(%y: f64[], %w: f64[2,1]) -> f64[1,1] {\n"
        "  %b = broadcast %y : f64[1,2]\n  %p = matmul %b, %w : f64[1,1]\n  return %p\n}"),
        "f", np.array(np.inf), w)).all()
