"""Negative tests: each bad input gets the exact error class, line and column."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat
from eqsat import ParseError, VerifyError


def fn(body: str, sig: str = "(%x: f32[4], %y: f32[4]) -> f32[4]") -> str:
    """A one-function module whose body starts on line 3."""
    return f"module @m\nfunc @f{sig} {{\n{body}\n}}\n"


CASES = [
    # (id, text, error, line, col, message fragment)
    ("bad-char", "module @m\nfunc @f() -> f32[] { $ }", ParseError, 2, 22, "unexpected character '$'"),
    ("name-char", fn("  %\u00e9 = neg %x : f32[4]\n  return %x"), ParseError, 3, 4,
     "'\u00e9' cannot be part of a %name"),
    ("bare-sigil", fn("  % = neg %x : f32[4]\n  return %x"), ParseError, 3, 3,
     "'%' must be followed by a name"),
    ("no-func", "module @m\nfoo", ParseError, 2, 1, "expected 'func'"),
    ("unknown-op", fn("  %a = addd %x, %y : f32[4]\n  return %a"), ParseError, 3, 8,
     "unknown op 'addd'; did you mean 'add'"),
    ("unknown-attr", fn("  %a = add %x, %y, axes=[0] : f32[4]\n  return %a"), ParseError, 3, 20,
     "add has no attribute 'axes'"),
    ("dup-attr", fn("  %a = sum %x, axes=[0], axes=[0] : f32[]\n  return %a", "(%x: f32[4]) -> f32[]"),
     ParseError, 3, 26, "given twice"),
    ("missing-type", fn("  %a = add %x, %y\n  return %a"), ParseError, 4, 3, "expected ':'"),
    ("bad-dtype", fn("  %a = add %x, %y : f16[4]\n  return %a"), ParseError, 3, 21, "expected a type"),
    ("no-return", fn("  %a = add %x, %y : f32[4]"), ParseError, 4, 1, "ends without a 'return'"),
    ("bad-grad-kind", "module @m\nfunc @g = hessian @f wrt %x\n", ParseError, 2, 11,
     "unknown gradient kind 'hessian'"),
    ("eof", "module @m\nfunc @f(%x: f32[4]", ParseError, 2, 19, "end of input"),
    ("hex-literal", fn("  %a = const 0x10 : f32[4]\n  return %a"), ParseError, 3, 14,
     "malformed number '0x10': numbers are decimal"),
    ("suffixed-literal", fn("  %a = const 1.0f : f32[4]\n  return %a"), ParseError, 3, 14,
     "malformed number '1.0f'"),
    ("float-dim", "module @m\nfunc @f(%x: f32[1.5]) -> f32[] {\n", ParseError, 2, 17,
     "dimension must be an integer"),
    ("negative-dim", "module @m\nfunc @f(%x: f32[-1]) -> f32[-1] {\n  return %x\n}\n", VerifyError,
     2, 13, "dimension -1 is negative"),
    ("absurd-dim", "module @m\nfunc @f(%x: f32[99999999999,99999999999]) -> f32[] {\n", VerifyError,
     2, 13, "more than 2^48 elements"),
    ("type-mismatch", fn("  %a = add %x, %y : f32[4]\n  return %a", "(%x: f32[4], %y: f32[5]) -> f32[4]"),
     VerifyError, 3, 16, "add needs operands of one type, got f32[4] and f32[5]"),
    ("wrong-written-type", fn("  %a = add %x, %y : f32[5]\n  return %a"), VerifyError, 3, 21,
     "has type f32[4], but f32[5] is written"),
    ("undefined", fn("  %a = add %x, %z : f32[4]\n  return %a"), VerifyError, 3, 16, "%z is not defined"),
    ("use-before-def", fn("  %a = add %x, %b : f32[4]\n  %b = neg %x : f32[4]\n  return %a"), VerifyError,
     3, 16, "%b is used before it is defined"),
    ("redefined", fn("  %x = neg %y : f32[4]\n  return %x"), VerifyError, 3, 3, "%x is defined twice"),
    ("dup-param", fn("  return %x", "(%x: f32[4], %x: f32[4]) -> f32[4]"), VerifyError, 2, 21,
     "declared twice"),
    ("arity", fn("  %a = neg %x, %y : f32[4]\n  return %a"), VerifyError, 3, 3, "neg takes 1 operand(s), got 2"),
    ("missing-attr", fn("  %a = sum %x : f32[]\n  return %a", "(%x: f32[4]) -> f32[]"), VerifyError, 3, 3,
     "sum needs the attribute 'axes'"),
    ("axis-range", fn("  %a = sum %x, axes=[1] : f32[]\n  return %a", "(%x: f32[4]) -> f32[]"), VerifyError,
     3, 16, "axis 1 is out of range for rank 1"),
    ("perm", fn("  %a = transpose %x, perm=[0,0] : f32[2,3]\n  return %a", "(%x: f32[2,3]) -> f32[2,3]"),
     VerifyError, 3, 22, "not a permutation"),
    ("float-only", fn("  %a = exp %x : i32[4]\n  return %a", "(%x: i32[4]) -> i32[4]"), VerifyError,
     3, 12, "exp needs a float operand"),
    ("matmul-inner", fn("  %a = matmul %x, %y : f32[2,2]\n  return %a", "(%x: f32[2,3], %y: f32[4,2]) -> f32[2,2]"),
     VerifyError, 3, 19, "inner dimensions differ"),
    ("broadcast", fn("  %a = broadcast %x : f32[3,5]\n  return %a", "(%x: f32[4]) -> f32[3,5]"), VerifyError,
     3, 18, "cannot broadcast f32[4] to f32[3,5]"),
    ("reshape-count", fn("  %a = reshape %x : f32[5]\n  return %a", "(%x: f32[4]) -> f32[5]"), VerifyError,
     3, 16, "must keep the element count"),
    ("slice-bounds", fn("  %a = slice %x, start=[1], stop=[9] : f32[8]\n  return %a", "(%x: f32[4]) -> f32[8]"),
     VerifyError, 3, 29, "0 <= start <= stop <= 4"),
    ("select-cond", fn("  %a = select %x, %x, %y : f32[4]\n  return %a"), VerifyError, 3, 15,
     "condition must be bool"),
    ("const-literal", fn("  %a = const 0.5 : i32[4]\n  return %a", "() -> i32[4]"), VerifyError, 3, 14,
     "needs an integer literal"),
    ("const-range", fn("  %a = const 3000000000 : i32[]\n  return %a", "() -> i32[]"), VerifyError, 3, 14,
     "does not fit in i32"),
    ("return-type", fn("  %a = neg %x : f32[4]\n  return %a", "(%x: f32[4]) -> f64[4]"), VerifyError, 4, 10,
     "returns %a of type f32[4] where its signature says f64[4]"),
    ("return-count", fn("  return %x, %x", "(%x: f32[4]) -> f32[4]"), VerifyError, 3, 3,
     "declares 1 result(s) but returns 2"),
    ("call-unknown", fn("  %a = call @g(%x) : f32[4]\n  return %a", "(%x: f32[4]) -> f32[4]"), VerifyError,
     3, 13, "@f calls @g, which is not defined"),
    ("call-args", "module @m\nfunc @g(%x: f32[4]) -> f32[4] {\n  return %x\n}\n"
     "func @f(%x: f32[3]) -> f32[4] {\n  %a = call @g(%x) : f32[4]\n  return %a\n}\n", VerifyError, 6, 16,
     "argument 1 of @g (%x) must be f32[4], got f32[3]"),
    ("call-results", "module @m\nfunc @g(%x: f32[4]) -> f32[4] {\n  return %x\n}\n"
     "func @f(%x: f32[4]) -> f32[4] {\n  %a, %b = call @g(%x) : f32[4], f32[4]\n  return %a\n}\n",
     VerifyError, 6, 3, "call gives 1 result(s) but 2 name(s) are written"),
    ("recursion", "module @m\nfunc @f(%x: f32[4]) -> f32[4] {\n  %a = call @g(%x) : f32[4]\n  return %a\n}\n"
     "func @g(%x: f32[4]) -> f32[4] {\n  %a = call @f(%x) : f32[4]\n  return %a\n}\n", VerifyError, 7, 13,
     "recursion is not supported: @f -> @g -> @f"),
    ("dup-function", "module @m\nfunc @f(%x: f32[4]) -> f32[4] {\n  return %x\n}\n"
     "func @f(%x: f32[4]) -> f32[4] {\n  return %x\n}\n", VerifyError, 5, 1, "@f is defined twice"),
    ("grad-unknown-fn", "module @m\nfunc @g = grad @nope wrt %x\n", VerifyError, 2, 16,
     "@g differentiates @nope, which is not defined"),
    ("grad-unknown-param", fn("  %a = sum %x, axes=[0] : f32[]\n  return %a", "(%x: f32[4]) -> f32[]")
     + "func @g = grad @f wrt %w\n", VerifyError, 6, 23, "@f has no parameter %w"),
    ("grad-nonscalar", fn("  return %x", "(%x: f32[4]) -> f32[4]") + "func @g = grad @f wrt %x\n",
     VerifyError, 5, 16, "grad needs @f to return one float scalar"),
    ("grad-int-wrt", fn("  %a = cast %x : f32[]\n  return %a", "(%x: i32[]) -> f32[]")
     + "func @g = grad @f wrt %x\n", VerifyError, 6, 23, "not a float type"),
    ("grad-dup-wrt", fn("  %a = sum %x, axes=[0] : f32[]\n  return %a", "(%x: f32[4]) -> f32[]")
     + "func @g = value_and_grad @f wrt %x, %x\n", VerifyError, 6, 37, "listed twice"),
    ("grad-recursion", "module @m\nfunc @g = grad @h wrt %x\nfunc @h = grad @g wrt %x\n", VerifyError, 3, 16,
     "recursion is not supported"),
    # a written-type op with two types written said its type was not written
    ("written-type-twice", fn("  %a = reshape %x : f32[2,2], f32[4]\n  return %x"), VerifyError, 3, 21,
     "reshape gives 1 result(s) but 2 type(s) are written"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_error_class_line_col(case):
    _, text, error, line, col, fragment = case
    with pytest.raises(error) as info:
        eqsat.parse(text)
    e = info.value
    assert (e.line, e.col) == (line, col), str(e)
    assert fragment in e.message, str(e)
    assert str(e).startswith(f"line {line}, col {col}: ")
    assert isinstance(e, eqsat.Error) and isinstance(e, ValueError)


def test_programmatic_module_errors_are_located_in_printed_text():
    m = eqsat.parse(fn("  %a = add %x, %y : f32[4]\n  return %a"))
    f = m["f"]
    bad = f.body[0].__class__(("a",), "add", ("x", "y"), (), (eqsat.f32[5],))
    broken = m.replace([f.__class__(f.name, f.params, f.result_types, (bad,), f.returns)])
    with pytest.raises(VerifyError) as info:
        eqsat.verify(broken)
    assert info.value.line == 4 and "<printed module>" in str(info.value)


def test_interpret_input_errors():
    m = eqsat.parse(fn("  %a = add %x, %y : f32[4]\n  return %a"))
    import numpy as np

    x = np.zeros(4, np.float32)
    with pytest.raises(eqsat.InterpretError, match=r"takes 2 argument\(s\)"):
        eqsat.interpret(m, "f", x)
    with pytest.raises(eqsat.InterpretError, match=r"must have shape \[4\]"):
        eqsat.interpret(m, "f", x, np.zeros(5, np.float32))
    with pytest.raises(eqsat.InterpretError, match="got an array of dtype float64"):
        eqsat.interpret(m, "f", x, np.zeros(4))
    with pytest.raises(eqsat.Error, match="has no function @g"):
        eqsat.interpret(m, "g", x, x)


def test_a_name_that_is_not_a_string_is_an_unknown_function():
    # the name forgotten, an array first: not a TypeError from a dict lookup
    m = eqsat.parse(fn("  %a = add %x, %y : f32[4]\n  return %a"))
    import numpy as np

    x = np.zeros(4, np.float32)
    exe = eqsat.compile(m, optimize=False)
    for call in (lambda: eqsat.interpret(m, x, x), lambda: exe(x, x), lambda: exe([1], x)):
        with pytest.raises(eqsat.UnknownFunction, match="the name comes first"):
            call()
    with pytest.raises(eqsat.UnknownFunction, match="has no function"):
        m[x]


def test_arguments_by_parameter_name():
    # as a traced function's own call does, interpret and compiled functions bind keyword
    # arguments by parameter name; a wrong name is an eqsat error, not Python's TypeError
    import numpy as np

    m = eqsat.parse(fn("  %a = sub %x, %y : f32[4]\n  return %a"))
    x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    exe = eqsat.compile(m, optimize=False)
    for call in (lambda **kw: eqsat.interpret(m, "f", **kw), lambda **kw: exe("f", **kw),
                 lambda **kw: exe.f(**kw)):
        np.testing.assert_array_equal(call(y=y, x=x), x - y)
        with pytest.raises(eqsat.InterpretError, match="has no parameter 'z'"):
            call(x=x, z=y)
        with pytest.raises(eqsat.InterpretError, match="missing argument"):
            call(x=x)
    np.testing.assert_array_equal(exe.f(x, y=y), x - y)
    with pytest.raises(eqsat.InterpretError, match="two values for parameter 'x'"):
        exe.f(x, x=x)


def test_python_built_module_names_must_be_printable():
    # a module built in Python verifies only with names its text can hold, so that
    # eqsat.parse(str(m)) == m; a bad kind, name or type is a VerifyError, never a TypeError
    from eqsat import f32
    from eqsat.ir import Function, GradDecl, Module, Param, Stmt

    @eqsat.function
    def scaled(x: eqsat.f32[3]):
        return x * 2.0

    scalar = Function("s", (Param("x", f32[()]),), (f32[()],), (), ("x",))
    bad = [
        eqsat.Module(scaled, name="my model"),
        eqsat.Module(scaled, name=3),
        Module(Function("a b", (Param("x", f32[3]),), (f32[3],), (), ("x",))),
        Module(scalar, GradDecl("g", "hess", "s", ("x",))),
        Module(Function("h", (Param("x", f32[3]),), (f32[3],),
                        (Stmt((1,), "neg", ("x",), (), (f32[3],)),), (1,))),
        Module(Function("k", (Param("x", eqsat.TensorType("f32", (3,))),),
                        (eqsat.TensorType("f32", (3,)),), (), ("x",))),
        # parts of the wrong class were AttributeErrors ('str' object has no attribute 'name')
        Module(Function("p", ("x",), (f32[3],), (), ("x",))),
        Module(Function("q", (Param("x", f32[3]),), (f32[3],), ("%y = neg %x",), ("x",))),
    ]
    for m in bad:
        with pytest.raises(eqsat.VerifyError):
            eqsat.verify(m)
    good = eqsat.verify(eqsat.Module(scaled, name="my_model.v2"))
    assert eqsat.parse(str(good)) == good


def test_python_built_malformed_attributes_print_and_are_named():
    # str(m) of a module built in Python with a non-list int-list attribute (or an unknown key
    # holding a scalar, printed as an int list) or a name that is not a str raised TypeError:
    # printing must not fail on what the verifier exists to name
    from eqsat import f32
    from eqsat.ir import Function, GradDecl, Module, Param, Stmt

    for op, attrs, named in [("sum", (("axes", 3),), "malformed value 3"),
                             ("exp", (("foo", 3),), "no attribute 'foo'"),
                             ("transpose", (("perm", None),), "malformed value None")]:
        m = Module(Function("f", (Param("x", f32[3]),), (f32[3],),
                            (Stmt(("y",), op, ("x",), attrs, (f32[3],)),), ("y",)))
        assert f"%y = {op} %x, " in str(m)
        with pytest.raises(eqsat.VerifyError, match=named):
            eqsat.verify(m)
    # an int name printed as %1 and a wrt of 0 as %0: the text reads back as another module,
    # whose first error (no parameter %0) is not this one's
    m = Module(Function("h", (Param("x", f32[3]),), (f32[3],),
                        (Stmt((1,), "neg", ("x",), (), (f32[3],)),), (1,)),
               GradDecl("g", "vjp", "h", (0,)))
    assert "%1 = neg %x" in str(m) and "wrt %0" in str(m)
    with pytest.raises(eqsat.VerifyError, match="the value 1 is not a valid name"):
        eqsat.verify(m)


@pytest.mark.parametrize("text, at", [
    ("func @f(%x: f32[4]) -> f32[4] {\n  %a = add %x,\n        %q : f32[4]\n  return %a\n}", (3, 9)),
    ("func @f(%x: f32[4]) -> f32[] {\n  %a = sum %x,\n     axes=[3] : f32[]\n  return %a\n}", (3, 6)),
    ("func @f(%x: f32[4]) -> f32[4] {\n  %a = neg %x : f32[4]\n  return\n    %q\n}", (4, 5)),
    ("func @f(%x: f32[4]) -> f32[4] {\n  %a = add %x, %x :f32[5]\n  return %a\n}", (2, 20)),
    ("func @f(%x: f32[4]) -> f32[4] {\n  %a = add %x, %x :\n     f32[5]\n  return %a\n}", (3, 6)),
    ("func @f(%x: f32[4]) -> f32[4] {\n  return %x\n}\nfunc @h = grad @f wrt\n  %y\n", (5, 3)),
])
def test_verify_errors_point_at_parts_on_other_lines(text, at):
    # the format is free-form: a statement's parts may sit on later lines or after any spacing
    with pytest.raises(VerifyError) as e:
        eqsat.parse(text)
    assert (e.value.line, e.value.col) == at


@pytest.mark.parametrize("args, problem", [
    (([1.5, 2.5], [True, False], [1.0, 2.0]), "integer parameter takes integers"),
    (([1, 2], [1, 0], [1.0, 2.0]), "True and False only"),
    (([2**40, 2], [True, False], [1.0, 2.0]), "out of i32's range"),
    (([1, 2], [True, False], [1e39, 2.0]), "overflows f32"),
    (([1, 2], [True, False], ["a", "b"]), "not as numbers"),
])
def test_python_inputs_that_would_change_value_are_refused(args, problem):
    # numpy's conversion truncated 1.5 to 1, read 1/0 as bools, made 1e39 inf, 'a' True
    m = eqsat.parse("func @f(%i: i32[2], %b: bool[2], %x: f32[2]) -> f32[2] {\n"
                    "  %c = cast %i : f32[2]\n  %y = add %c, %x : f32[2]\n  return %y\n}")
    exe = eqsat.compile(m, optimize=False)
    for run in (lambda: eqsat.interpret(m, "f", *args), lambda: exe.f(*args)):
        with pytest.raises(eqsat.Error, match=problem):
            run()
    ok = ([1, 2], [True, False], [0.5, 2])  # exact conversions stay accepted
    np.testing.assert_array_equal(exe.f(*ok), eqsat.interpret(m, "f", *ok))


def test_arrays_of_the_other_byte_order_are_read_as_their_values():
    """A big-endian f32 array holds f32 values: converting it changes none, so it is accepted
    (an f64 array for an f32 parameter still is not)."""
    m = eqsat.parse("func @f(%i: i64[3], %x: f32[3]) -> f32[3] {\n"
                    "  %c = cast %i : f32[3]\n  %y = mul %c, %x : f32[3]\n  return %y\n}")
    i, x = np.array([1, -2, 3], dtype=">i8"), np.array([0.5, 1e-30, -7.25], dtype=">f4")
    want = i.astype(np.float32) * x.astype(np.float32)
    exe = eqsat.compile(m, optimize=False)
    np.testing.assert_array_equal(exe.f(i, x), want)
    np.testing.assert_array_equal(eqsat.interpret(m, "f", i, x), want)
    with pytest.raises(eqsat.Error, match=r"must be f32\[3\], got an array of dtype >f8"):
        exe.f(i, x.astype(">f8"))


def test_a_sum_of_bools_says_to_cast_first():
    with pytest.raises(eqsat.Error, match=r"got bool\[3\] \(cast it to i32 or f32 first"):
        eqsat.parse("func @f(%x: bool[3]) -> bool[] {\n  %s = sum %x, axes=[0] : bool[]\n"
                    "  return %s\n}")
