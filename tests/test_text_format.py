"""The .eqir text format: golden text, round trips, comments, multiple results."""

from __future__ import annotations

import copy
import pickle
from importlib import resources

import numpy as np
import pytest

import eqsat
from eqsat.ir import Function, Module, Param, Stmt

MULTI = """\
module @multi

func @split(%x: f64[2,4]) -> (f64[2,2], f64[2,2]) {
  %a = slice %x, start=[0,0], stop=[2,2] : f64[2,2]
  %b = slice %x, start=[0,2], stop=[2,4] : f64[2,2]
  return %a, %b
}

func @swap(%x: f64[2,4]) -> f64[2,4] {
  %l, %r = call @split(%x) : f64[2,2], f64[2,2]
  %y = concat %r, %l, axis=1 : f64[2,4]
  return %y
}

func @consts() -> (f32[], bool[2], i64[3], f64[]) {
  %n = const nan : f32[]
  %t = const true : bool[2]
  %i = const -7 : i64[3]
  %e = const 1e-05 : f64[]
  return %n, %t, %i, %e
}
"""


def test_golden_text_is_canonical():
    m = eqsat.parse(MULTI)
    assert str(m) == MULTI
    assert eqsat.parse(str(m)) == m


def test_bundled_example_round_trips():
    text = resources.files("eqsat.examples").joinpath("mlp.eqir").read_text()
    m = eqsat.parse(text)
    assert eqsat.parse(str(m)) == m
    assert str(eqsat.parse(str(m))) == str(m)
    assert [it.name for it in m] == ["predict", "loss", "loss_grad"]


def test_comments_and_free_layout():
    text = """# header
    module @c   # trailing comment
    func @f(%x: f32[3]) -> f32[3] { %y = neg %x : f32[3]   # why not
      return %y }"""
    m = eqsat.parse(text)
    assert str(m) == "module @c\n\nfunc @f(%x: f32[3]) -> f32[3] {\n  %y = neg %x : f32[3]\n  return %y\n}\n"


def test_module_header_is_optional():
    m = eqsat.parse("func @f(%x: f32[]) -> f32[] {\n  return %x\n}\n")
    assert m.name == "main"


def test_multiple_results_interpret():
    m = eqsat.parse(MULTI)
    x = np.arange(8, dtype=np.float64).reshape(2, 4)
    a, b = eqsat.interpret(m, "split", x)
    np.testing.assert_array_equal(a, x[:, :2])
    np.testing.assert_array_equal(eqsat.interpret(m, "swap", x), np.concatenate([x[:, 2:], x[:, :2]], 1))
    n, t, i, e = eqsat.interpret(m, "consts")
    assert np.isnan(n) and n.dtype == np.float32 and t.tolist() == [True, True]
    assert i.tolist() == [-7, -7, -7] and i.dtype == np.int64 and e == 1e-05


def test_structural_equality_ignores_locations():
    built = Module(Function("f", (Param("x", eqsat.f32[3]),), (eqsat.f32[3],),
                            (Stmt(("y",), "neg", ("x",), (), (eqsat.f32[3],)),), ("y",)), name="c")
    parsed = eqsat.parse("module @c\nfunc @f(%x: f32[3]) -> f32[3] {\n%y = neg %x : f32[3]\nreturn %y\n}")
    assert built == parsed and hash(built) == hash(parsed)
    assert built != parsed.replace(name="d")


def test_modules_pickle_and_copy():
    """A module goes to a worker process (multiprocessing pickles it) or through
    copy.deepcopy; the immutable __setattr__ refused pickle's default slot by slot."""
    m = eqsat.parse(resources.files("eqsat.examples").joinpath("mlp.eqir").read_text())
    for copied in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m), copy.copy(m)):
        assert copied == m and str(copied) == str(m) and copied["loss_grad"] == m["loss_grad"]


def test_a_copied_negative_zero_equals_the_original():
    """`-0.0 == -0.0` between two attribute values that are not the one object (a pickled or
    deep-copied statement) compared the second with +0.0 and said no."""
    m = eqsat.parse("func @f() -> f32[2] {\n  %c = const -0.0 : f32[2]\n  return %c\n}")
    stmt = m["f"].body[0]
    assert copy.deepcopy(stmt) == stmt and pickle.loads(pickle.dumps(stmt)) == stmt
    assert stmt != Stmt(("c",), "const", (), (("value", 0.0),), (eqsat.f32[2],))


def test_integer_literal_for_a_float_constant():
    m = eqsat.parse("func @f() -> (f32[2], f64[]) {\n  %a = const 3 : f32[2]\n"
                    "  %b = const -2 : f64[]\n  return %a, %b\n}")
    assert "const 3.0 : f32[2]" in str(m) and "const -2.0 : f64[]" in str(m)
    assert eqsat.parse(str(m)) == m
    a, b = eqsat.interpret(m, "f")
    assert a.dtype == np.float32 and a.tolist() == [3.0, 3.0] and b == -2.0


def test_signed_special_literals_read_like_signed_numbers():
    """+5 was accepted and +inf was not; -nan is nan (its sign means nothing to eqsat)."""
    m = eqsat.parse("func @f(%x: f32[2]) -> (f32[2], f32[2]) {\n  %a = const +inf : f32[2]\n"
                    "  %b = const -nan : f32[2]\n  %y = map %x, body=add($0, +inf) : f32[2]\n"
                    "  return %y, %b\n}")
    assert "const inf : f32[2]" in str(m) and "const nan : f32[2]" in str(m)
    assert "body=add($0, inf)" in str(m) and eqsat.parse(str(m)) == m
    y, b = eqsat.interpret(m, "f", np.ones(2, np.float32))
    assert np.isposinf(y).all() and np.isnan(b).all()


def test_zero_sign_makes_modules_differ():
    """const 0.0 and const -0.0 are different programs (1 / x tells them apart): equality and
    hashing must see it, or caches keyed by the module mix them up (a module with grad
    declarations used to get the other one's expansion, and its results)."""
    def module(value: str) -> eqsat.Module:
        return eqsat.parse(f"module @m\nfunc @f(%x: f64[]) -> f64[] {{\n  %c = const {value} : "
                           "f64[]\n  %r = recip %c : f64[]\n  %y = add %r, %x : f64[]\n"
                           "  return %y\n}\nfunc @g = grad @f wrt %x\n")
    pos, neg = module("0.0"), module("-0.0")
    assert pos != neg and hash(pos) != hash(neg)
    assert eqsat.parse(str(neg)) == neg and module("-0.0") == neg
    for m, want in ((pos, np.inf), (neg, -np.inf), (pos, np.inf)):
        assert eqsat.interpret(m, "f", 1.0) == want
        assert eqsat.compile(m)("f", 1.0) == want


def test_interpret_returns_fresh_arrays():
    m = eqsat.parse("func @id(%x: f32[2]) -> f32[2] {\n  return %x\n}\n")
    x = np.ones(2, np.float32)
    y = eqsat.interpret(m, "id", x)
    y[0] = 5
    assert x[0] == 1


def test_non_contiguous_inputs_accepted():
    m = eqsat.parse("func @f(%x: f32[3,2]) -> f32[3,2] {\n  %y = exp %x : f32[3,2]\n  return %y\n}\n")
    x = np.arange(6, dtype=np.float32).reshape(2, 3).T
    np.testing.assert_allclose(eqsat.interpret(m, "f", x), np.exp(x), rtol=1e-6)


def test_integer_literal_too_large_for_a_float_is_a_parse_error():
    text = "func @f() -> f32[] {\n  %c = const " + "9" * 309 + " : f32[]\n  return %c\n}\n"
    try:
        eqsat.parse(text)
    except eqsat.ParseError as e:
        assert (e.line, e.col) == (2, 14) and "too large" in str(e)
    else:
        raise AssertionError("no error")


@pytest.mark.parametrize("value, dtype, error", [
    ("1e39", "f32", eqsat.VerifyError), ("-3.5e38", "f32", eqsat.VerifyError),
    ("1" + "0" * 39, "f32", eqsat.VerifyError), ("1e309", "f64", eqsat.ParseError),
    ("-1e309", "f32", eqsat.ParseError),
])
def test_a_float_literal_that_overflows_its_dtype_is_an_error(value, dtype, error):
    """`const 1e39 : f32[4]` was read as inf: a literal that only rounds to infinity is a
    mistake (whoever means infinity writes inf), named at its line and column with the
    dtype's largest finite value. Also in a kernel body, where the literal has that dtype."""
    largest = {"f32": "3.4028235e+38", "f64": "1.7976931348623157e+308"}
    for line in (f"  %c = const {value} : {dtype}[4]\n",
                 f"  %c = map %x, body=add($0, {value}) : {dtype}[4]\n"):
        text = f"module @m\nfunc @f(%x: {dtype}[4]) -> {dtype}[4] {{\n{line}  return %c\n}}\n"
        with pytest.raises(error) as e:
            eqsat.parse(text)
        at = line.index("body") if "map" in line and error is eqsat.VerifyError else (
            line.index(value))  # a body's type errors point at its attribute
        assert (e.value.line, e.value.col) == (3, at + 1)
        wanted = "f64" if error is eqsat.ParseError else dtype
        assert f"overflows {wanted} (the largest finite {wanted} is {largest[wanted]})" in str(
            e.value)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "3.4028235e38", "-3.4028235e38",
                                   "3.4028235677973362e38", "1e-50"])
def test_float_literals_that_f32_holds_stay_accepted(value):
    """Infinities and NaN written as such, the largest finite f32 (and a value that rounds down
    to it), and an underflow to zero, as numpy's f32 gives them."""
    m = eqsat.parse(f"func @f() -> f32[2] {{\n  %c = const {value} : f32[2]\n"
                    f"  return %c\n}}\n")
    assert eqsat.parse(str(m)) == m
    np.testing.assert_array_equal(eqsat.interpret(m, "f"), np.full(2, float(value), np.float32))


def test_a_leading_byte_order_mark_is_skipped():
    text = "module @m\nfunc @f(%x: f32[3]) -> f32[3] {\n  %a = neg %x : f32[3]\n  return %a\n}\n"
    assert eqsat.parse("\ufeff" + text) == eqsat.parse(text)
    assert eqsat.parse(("\ufeff" + text).encode()) == eqsat.parse(text)
    with pytest.raises(eqsat.ParseError, match="line 1, col 11:"):  # columns as editors count
        eqsat.parse("\ufeffmodule @m funk")
    rules = eqsat.rules.parse("\ufeffrule swap: add(?x, ?y) => add(?y, ?x)")
    assert [r.name for r in rules.rules] == ["swap"]


@pytest.mark.parametrize("newline", ["\r", "\r\n"])
def test_old_mac_and_windows_line_ends_are_line_ends(newline):
    """A comment ends at a lone CR too (it swallowed the whole program, which parsed as an empty
    module), and errors count lines by it."""
    text = "# my model\nmodule @m\nfunc @f(%x: f32[3]) -> f32[3] {\n  %a = neg %x : f32[3]\n"
    good = text + "  return %a\n}\n"
    assert eqsat.parse(good.replace("\n", newline)) == eqsat.parse(good)
    bad = text.replace("f32[3]\n", "f32[4]\n", 1) + "  return %a\n}\n"
    with pytest.raises(eqsat.VerifyError, match="line 4, col 17:"):
        eqsat.parse(bad.replace("\n", newline).encode())


def test_python_built_attributes_read_back_as_printed():
    """Attributes given out of the table's order, or as numpy scalars, are stored as the parser
    stores them: a verified module equals its printed text (a np.float64 constant printed as
    `np.float64(0.5)`, slice's stop before start printed stop first and read back start first)."""
    t4, t2, scalar = eqsat.f32[4], eqsat.f32[2], eqsat.f32[()]
    body = (
        Stmt(("c",), "const", (), (("value", np.float64(0.5)),), (t4,)),
        Stmt(("y",), "add", ("x", "c"), (), (t4,)),
        Stmt(("s",), "slice", ("y",), {"stop": [3], "start": [np.int64(1)]}, (t2,)),
        Stmt(("r",), "sum", ("s",), (("axes", (np.int32(0),)),), (scalar,)),
    )
    m = eqsat.verify(Module(Function("f", (Param("x", t4),), (scalar,), body, ("r",))))
    assert eqsat.parse(str(m)) == m and str(eqsat.parse(str(m))) == str(m)
    assert m["f"].body[2].attrs == (("start", (1,)), ("stop", (3,)))
