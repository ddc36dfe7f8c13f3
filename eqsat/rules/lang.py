"""The rule language: patterns over IR op names, conditions on shapes, and their text syntax.

    rule NAME: LHS => RHS [if COND, COND, ...]

A pattern is `?x` (any tensor value) or `op(operands, attr=value, ...)`. Attribute values are
literals (`perm=[1,0]`, `axis=1`) or variables (`axes=?a`); an attribute left out on the left
side matches anything. Ops whose result type is written (broadcast, reshape, cast, const) take
`shape=`, `dtype=` or `like=?x` (the type of `?x`). `const(VALUE)` matches a float constant
of that value (`const(1)` an integer one); `const(?c)` binds its value, and a right-hand const
may compute one: `const(?a + ?b, like=?x)`, `const(size(?s), like=?x)`.
Conditions compare `shape(?x)`, `rank(?x)`, `dim(?x, i)`, `size(?x)`, `dtype(?x)`, `len(?p)`,
integers and dtype names with `== != < <= > >=`, or test `is_float(?x)`.

In Python: `Rule("mul_one", "mul(?x, const(1.0))", "?x")`, or build patterns with
`op.mul(var("x"), op.const(1.0))`. `parse(text)` returns a `RuleSet`; RuleSets add with `+`.
Everything is checked when it is built: unknown ops, wrong arity, unknown or malformed
attributes, right-side variables not bound on the left, and dtype-kind errors (a bool where a
number is needed) raise `ParseError` with the line and column of the offending text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Union

from ..errors import ParseError
from ..ir.ops import OPS
from ..ir.types import DTYPES

Pos = tuple[int, int]


@dataclass(frozen=True)
class Var:
    """A pattern variable `?name`."""

    name: str
    pos: Pos = field(default=(0, 0), compare=False)

    def __str__(self) -> str:
        return "?" + self.name


@dataclass(frozen=True)
class Num:
    """A numeric literal (float or int) inside a const value expression."""

    value: float | int
    pos: Pos = field(default=(0, 0), compare=False)

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Arith:
    """A const value computed on the right side: `op` in + - * / neg size."""

    op: str
    args: tuple[Any, ...]
    pos: Pos = field(default=(0, 0), compare=False)

    def __str__(self) -> str:
        if self.op == "neg":
            return f"-{self.args[0]}"
        if self.op == "size":
            return f"size({self.args[0]})"
        return f"({self.args[0]} {self.op} {self.args[1]})"


@dataclass(frozen=True)
class Node:
    """`op(args, attr=value, ...)`; attribute values are ints tuples, ints, dtype names or Vars."""

    op: str
    args: tuple[Pattern, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    pos: Pos = field(default=(0, 0), compare=False)

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def __str__(self) -> str:
        def fmt(v: Any) -> str:
            return "[" + ",".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)

        parts = [str(a) for a in self.args]
        if self.op == "const":
            parts = [str(self.attr["value"])]
            parts += [f"{k}={fmt(v)}" for k, v in self.attrs if k != "value"]
        else:
            parts += [f"{k}={fmt(v)}" for k, v in self.attrs]
        return f"{self.op}({', '.join(parts)})"


Pattern = Union[Var, Node]


@dataclass(frozen=True)
class Cond:
    """`left OP right`, or a predicate `is_float(?x)` (op "is_float", right None)."""

    op: str
    left: Any
    right: Any = None
    pos: Pos = field(default=(0, 0), compare=False)

    def __str__(self) -> str:
        if self.op == "is_float":
            return f"is_float({self.left})"
        return f"{_term_str(self.left)} {self.op} {_term_str(self.right)}"


@dataclass(frozen=True)
class Fn:
    """A condition term: `shape(?x)`, `rank(?x)`, `dim(?x, i)`, `size(?x)`, `dtype(?x)`, `len(?p)`."""

    name: str
    var: Var
    index: int = 0

    def __str__(self) -> str:
        return f"dim({self.var}, {self.index})" if self.name == "dim" else f"{self.name}({self.var})"


def _term_str(t: Any) -> str:
    return str(t)


COND_FNS = {"shape": "tensor", "rank": "tensor", "dim": "tensor", "size": "any",
            "dtype": "tensor", "len": "ints"}
WRITTEN_ATTRS = ("shape", "dtype", "like")


# ---------------------------------------------------------------- tokens and parser

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\f\v]+) | (?P<nl>\n) | (?P<comment>\#[^\n]*)
  | (?P<var>\?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|inf\b|nan\b)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<op>=>|==|!=|<=|>=|[()\[\],:=<>+\-*/])
""", re.VERBOSE)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    line: int
    col: int


def _tokenize(text: str) -> list[Tok]:
    toks: list[Tok] = []
    pos, line, start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}", line, pos - start + 1)
        if m.lastgroup == "nl":
            toks.append(Tok("nl", "\n", line, pos - start + 1))
            line, start = line + 1, m.end()
        elif m.lastgroup not in ("ws", "comment"):
            toks.append(Tok(m.lastgroup, m.group(), line, pos - start + 1))
        pos = m.end()
    toks.append(Tok("eof", "", line, pos - start + 1))
    return toks


class _Parser:
    def __init__(self, text: str, line0: int = 0, col0: int = 0):
        self.toks = _tokenize(text)
        self.i = 0
        self.line0, self.col0 = line0, col0

    def pos(self, t: Tok) -> Pos:
        return (t.line + self.line0, t.col + (self.col0 if t.line == 1 else 0))

    @property
    def tok(self) -> Tok:
        return self.toks[self.i]

    def error(self, msg: str, t: Tok | None = None) -> ParseError:
        t = t or self.tok
        line, col = self.pos(t)
        return ParseError(msg, line, col)

    def next(self) -> Tok:
        t = self.tok
        self.i += 1
        return t

    def accept(self, text: str) -> Tok | None:
        if self.tok.text == text and self.tok.kind in ("op", "ident"):
            return self.next()
        return None

    def expect(self, text: str, what: str | None = None) -> Tok:
        t = self.accept(text)
        if t is None:
            got = "end of line" if self.tok.kind in ("nl", "eof") else repr(self.tok.text)
            raise self.error(f"expected {what or repr(text)}, got {got}")
        return t

    def skip_nl(self) -> None:
        while self.tok.kind == "nl":
            self.next()

    # -------------------------------------------------------------- rules

    def rules(self) -> list[Rule]:
        out = []
        self.skip_nl()
        while self.tok.kind != "eof":
            out.append(self.rule())
            if self.tok.kind not in ("nl", "eof"):
                raise self.error(f"unexpected {self.tok.text!r} after the rule")
            self.skip_nl()
        return out

    def rule(self) -> Rule:
        kind = "rewrite"
        head = self.tok
        if self.accept("analysis"):
            kind = "analysis"
            self.expect("rule")
        elif not self.accept("rule"):
            raise self.error(f"expected 'rule NAME: LHS => RHS', got {head.text!r}")
        name = self.next()
        if name.kind != "ident":
            raise self.error("expected the rule's name", name)
        self.expect(":")
        lhs = self.pattern()
        self.expect("=>", "'=>'")
        rhs = self.pattern()
        conds: list[Cond] = []
        if self.accept("if"):
            conds.append(self.cond())
            while self.accept(",") or self.accept("and"):
                conds.append(self.cond())
        return Rule(name.text, lhs, rhs, tuple(conds), kind, pos=self.pos(head))

    def pattern(self) -> Pattern:
        t = self.tok
        if t.kind == "var":
            self.next()
            return Var(t.text[1:], self.pos(t))
        if t.kind != "ident":
            raise self.error(f"expected a pattern (?x or op(...)), got {t.text or 'end of line'!r}")
        self.next()
        if t.text not in OPS:
            raise self.error(f"unknown op {t.text!r}", t)
        self.expect("(")
        args: list[Pattern] = []
        attrs: list[tuple[str, Any]] = []
        first = True
        while not self.accept(")"):
            if not first:
                self.expect(",", "',' or ')'")
            first = False
            if t.text == "const" and not args and not attrs and self.tok.text != ")":
                attrs.append(("value", self.value()))
                continue
            if self.tok.kind == "ident" and self.toks[self.i + 1].text == "=":
                key = self.next()
                self.next()
                attrs.append((key.text, self.attr_value()))
            else:
                if attrs:
                    raise self.error("operands come before attributes")
                args.append(self.pattern())
        return Node(t.text, tuple(args), tuple(attrs), self.pos(t))

    def attr_value(self) -> Any:
        t = self.tok
        if t.kind == "var":
            self.next()
            return Var(t.text[1:], self.pos(t))
        if self.accept("["):
            vals: list[int] = []
            while not self.accept("]"):
                if vals:
                    self.expect(",", "',' or ']'")
                vals.append(self.integer())
            return tuple(vals)
        if t.kind == "ident" and t.text in DTYPES:
            self.next()
            return t.text
        return self.integer()

    def integer(self) -> int:
        neg = self.accept("-")
        t = self.next()
        if t.kind != "number" or not t.text.isdigit():
            raise self.error(f"expected an integer, got {t.text!r}", t)
        return -int(t.text) if neg else int(t.text)

    # const values: + - * / over literals, ?vars and size(?s)
    def value(self) -> Any:
        left = self.product()
        while self.tok.text in ("+", "-"):
            op = self.next()
            left = Arith(op.text, (left, self.product()), self.pos(op))
        return left

    def product(self) -> Any:
        left = self.atom()
        while self.tok.text in ("*", "/"):
            op = self.next()
            left = Arith(op.text, (left, self.atom()), self.pos(op))
        return left

    def atom(self) -> Any:
        t = self.tok
        if self.accept("-"):
            inner = self.atom()
            if isinstance(inner, Num):
                return Num(-inner.value, self.pos(t))
            return Arith("neg", (inner,), self.pos(t))
        if self.accept("("):
            v = self.value()
            self.expect(")")
            return v
        if t.kind == "var":
            self.next()
            return Var(t.text[1:], self.pos(t))
        if t.kind == "number":
            self.next()
            is_int = t.text.isdigit()
            return Num(int(t.text) if is_int else float(t.text), self.pos(t))
        if t.text in ("true", "false"):
            self.next()
            return Num(int(t.text == "true"), self.pos(t))
        if self.accept("size"):
            self.expect("(")
            v = self.tok
            if v.kind != "var":
                raise self.error("size() takes a variable", v)
            self.next()
            self.expect(")")
            return Arith("size", (Var(v.text[1:], self.pos(v)),), self.pos(t))
        raise self.error(f"expected a constant value, got {t.text or 'end of line'!r}")

    # -------------------------------------------------------------- conditions

    def cond(self) -> Cond:
        t = self.tok
        if self.accept("is_float"):
            self.expect("(")
            v = self.cond_var()
            self.expect(")")
            return Cond("is_float", v, None, self.pos(t))
        left = self.term()
        op = self.tok
        if op.text not in ("==", "!=", "<", "<=", ">", ">="):
            raise self.error(f"expected a comparison (== != < <= > >=), got {op.text!r}")
        self.next()
        return Cond(op.text, left, self.term(), self.pos(t))

    def cond_var(self) -> Var:
        t = self.next()
        if t.kind != "var":
            raise self.error(f"expected a variable, got {t.text!r}", t)
        return Var(t.text[1:], self.pos(t))

    def term(self) -> Any:
        t = self.tok
        if t.kind == "ident" and t.text in COND_FNS:
            self.next()
            self.expect("(")
            v = self.cond_var()
            index = 0
            if t.text == "dim":
                self.expect(",")
                index = self.integer()
            self.expect(")")
            return Fn(t.text, v, index)
        if t.kind == "ident" and t.text in DTYPES:
            self.next()
            return t.text
        if t.kind == "var":
            self.next()
            return Var(t.text[1:], self.pos(t))
        if t.kind == "number" or t.text == "-":
            return self.integer()
        raise self.error(f"expected a condition term (shape(?x), rank(?x), dim(?x, i), size(?x), "
                         f"dtype(?x), len(?p), an integer or a dtype), got {t.text!r}")


# ---------------------------------------------------------------- rules and rule sets


@dataclass(frozen=True)
class Rule:
    """A named rewrite `lhs => rhs if conds`; kind "analysis" rules run to a fixpoint each round."""

    name: str
    lhs: Pattern
    rhs: Pattern
    conds: tuple[Cond, ...] = ()
    kind: str = "rewrite"
    pos: Pos = field(default=(0, 0), compare=False)

    def __init__(self, name: str, lhs: Pattern | str, rhs: Pattern | str,
                 conds: Iterable[Cond] | str = (), kind: str = "rewrite", pos: Pos = (0, 0)):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "lhs", parse_pattern(lhs) if isinstance(lhs, str) else lhs)
        object.__setattr__(self, "rhs", parse_pattern(rhs) if isinstance(rhs, str) else rhs)
        if isinstance(conds, str):
            conds = parse_conds(conds) if conds.strip() else ()
        object.__setattr__(self, "conds", tuple(conds))
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "pos", pos)
        from .typing import check_rule

        self.__dict__["sorts"] = check_rule(self)

    def __str__(self) -> str:
        head = "analysis rule" if self.kind == "analysis" else "rule"
        cond = " if " + ", ".join(map(str, self.conds)) if self.conds else ""
        return f"{head} {self.name}: {self.lhs} => {self.rhs}{cond}"


class RuleSet:
    """An ordered, named collection of rules; `a + b` concatenates (names must stay unique)."""

    def __init__(self, rules: Iterable[Rule] = (), name: str = "rules"):
        self.name = name
        self.rules: tuple[Rule, ...] = tuple(rules)
        seen: dict[str, Rule] = {}
        for r in self.rules:
            if r.name in seen:
                line, col = r.pos
                raise ParseError(f"rule {r.name!r} is defined twice", line, col)
            seen[r.name] = r

    def __add__(self, other: RuleSet) -> RuleSet:
        return RuleSet(self.rules + other.rules, f"{self.name}+{other.name}")

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def names(self) -> list[str]:
        """The rule names in order."""
        return [r.name for r in self.rules]

    def __str__(self) -> str:
        return "\n".join(map(str, self.rules)) + "\n"

    def __repr__(self) -> str:
        return f"<RuleSet {self.name}: {len(self.rules)} rules>"


def parse(text: str, name: str = "rules") -> RuleSet:
    """Parse rule text (one `rule NAME: LHS => RHS [if ...]` per line) into a checked RuleSet."""
    return RuleSet(_Parser(text).rules(), name)


def parse_pattern(text: str) -> Pattern:
    """Parse one pattern, e.g. `mul(?x, const(1.0))`."""
    p = _Parser(text)
    pat = p.pattern()
    if p.tok.kind not in ("eof", "nl"):
        raise p.error(f"unexpected {p.tok.text!r} after the pattern")
    return pat


def parse_conds(text: str) -> tuple[Cond, ...]:
    """Parse a condition list, e.g. `shape(?x) == shape(?y), rank(?a) == 2`."""
    p = _Parser(text)
    conds = [p.cond()]
    while p.accept(",") or p.accept("and"):
        conds.append(p.cond())
    if p.tok.kind not in ("eof", "nl"):
        raise p.error(f"unexpected {p.tok.text!r} after the condition")
    return tuple(conds)


def var(name: str) -> Var:
    """A pattern variable for the Python API (`var("x")` is `?x`)."""
    return Var(name)


class _OpBuilder:
    """`op.mul(a, b)`, `op.transpose(x, perm=(1, 0))`, `op.const(1.0, like=var("x"))`."""

    def __getattr__(self, name: str) -> Any:
        if name not in OPS:
            raise AttributeError(f"unknown op {name!r}")

        def build(*args: Any, **attrs: Any) -> Node:
            if name == "const":
                value = args[0]
                value = value if isinstance(value, (Var, Arith, Num)) else Num(value)
                return Node("const", (), (("value", value),) + tuple(attrs.items()))
            fixed = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items())
            return Node(name, tuple(args), fixed)

        return build


op = _OpBuilder()
