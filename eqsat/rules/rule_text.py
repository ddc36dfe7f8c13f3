"""The text syntax of rules: a tokenizer and a recursive-descent parser producing the terms of
`lang` (see its docstring for the syntax). Every error is a ParseError with line and column."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ParseError
from ..ir.fused import REDUCER
from ..ir.ops import OPS, float_overflow
from ..ir.scalar_expr import Expr, parse_body
from ..ir.types import DTYPES, DType
from .lang import (COND_FNS, Arith, Cond, Fn, Node, Num, Pattern, Pos, Rule, ShapeFn, Var,
                   shape_fn_problem)

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\f\v]+) | (?P<nl>\r\n?|\n) | (?P<comment>\#[^\r\n]*)
  | (?P<var>\?[A-Za-z_][A-Za-z0-9_]*) | (?P<arg>\$\d+)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|inf\b|nan\b)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<op>=>|==|!=|<=|>=|[()\[\],:=<>+\-*/])
""", re.VERBOSE)
_MAX_NUMBER_LEN = 400  # int() refuses 4300 digits; no rule needs a number a tenth that long


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    line: int
    col: int
    at: int  # offset in the text: a body attribute is handed on as the text it spans


def _tokenize(text: str) -> list[Tok]:
    toks: list[Tok] = []
    pos, line, start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}", line, pos - start + 1)
        if m.lastgroup == "nl":
            toks.append(Tok("nl", "\n", line, pos - start + 1, pos))
            line, start = line + 1, m.end()
        elif m.lastgroup not in ("ws", "comment"):
            if m.lastgroup in ("number", "arg") and len(m.group()) > _MAX_NUMBER_LEN:
                raise ParseError(f"number with {len(m.group())} characters is too long", line,
                                 pos - start + 1)
            toks.append(Tok(m.lastgroup, m.group(), line, pos - start + 1, pos))
        pos = m.end()
    toks.append(Tok("eof", "", line, pos - start + 1, pos))
    return toks


class RuleParser:
    """Parses rule text; `line0`/`col0` offset positions when the text is part of a larger one."""

    def __init__(self, text: str, line0: int = 0, col0: int = 0):
        self.text = text
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
                body = key.text == "body" and self.tok.kind != "var"
                kind = dict(OPS[t.text].attrs).get(key.text, key.text)
                attrs.append((key.text, self.body() if body else self.attr_value(kind)))
            else:
                if attrs:
                    raise self.error("operands come before attributes")
                args.append(self.pattern())
        return Node(t.text, tuple(args), tuple(attrs), self.pos(t))

    def attr_value(self, kind: str | None = None) -> Any:
        """An attribute's value; `kind` is the op's kind for the attribute (its name for the
        written-type ones): a reduction is named (`reduce=sum`), as in the IR."""
        t = self.tok
        if t.kind == "var":
            self.next()
            return Var(t.text[1:], self.pos(t))
        if t.text == "[":
            return self.int_list()
        if t.kind == "ident" and (t.text in DTYPES or kind == REDUCER):
            self.next()
            return t.text
        if t.kind == "ident" and self.toks[self.i + 1].text == "(":
            if t.text == "shape":
                raise self.error("shape(?x) is an argument of a shape function (e.g. "
                                 "lpad(shape(?x), ?s)); for ?x's own type write like=?x", t)
            return self.shape_fn()
        if kind == "dtype":
            raise self.error(f"dtype= takes one of {', '.join(DTYPES)} or a ?variable, got "
                             f"{t.text or 'end of line'!r}")
        return self.integer()

    def body(self) -> Expr:
        """A kernel body, `tanh(add($0, 0.5))`, read by the IR's own body parser from the text
        up to the next ',' or ')' outside parentheses."""
        start, depth = self.tok, 0
        while self.tok.kind not in ("nl", "eof"):
            if self.tok.text == "(":
                depth += 1
            elif self.tok.text == ")" and depth == 0 or self.tok.text == "," and depth == 0:
                break
            elif self.tok.text == ")":
                depth -= 1
            self.next()
        if self.tok is start:
            raise self.error("expected a body ($i, a constant or op(...))")
        try:
            return parse_body(self.text[start.at:self.tok.at])
        except ParseError as e:
            line, col = self.pos(start)
            raise ParseError(e.message, line + e.line - 1,
                             col + e.col - 1 if e.line == 1 else e.col) from None

    def int_list(self) -> tuple[int, ...]:
        self.expect("[")
        vals: list[int] = []
        while not self.accept("]"):
            if vals:
                self.expect(",", "',' or ']'")
            vals.append(self.integer())
        return tuple(vals)

    # computed int lists: permute(?s, ?p), inverse([1,2,0]), permute(?s, inverse(?p)),
    # lpad(shape(?x), ?s)
    def shape_fn(self) -> ShapeFn:
        t = self.next()
        problem = shape_fn_problem(t.text)
        if problem:
            raise self.error(problem, t)
        self.expect("(")
        args: list[Any] = []
        while not self.accept(")"):
            if args:
                self.expect(",", "',' or ')'")
            a = self.tok
            if a.kind == "var":
                self.next()
                args.append(Var(a.text[1:], self.pos(a)))
            elif a.text == "[":
                args.append(self.int_list())
            elif a.text == "shape" and self.toks[self.i + 1].text == "(":
                self.next()
                self.next()
                args.append(Fn("shape", self.cond_var()))
                self.expect(")")
            elif a.kind == "ident" and self.toks[self.i + 1].text == "(":
                args.append(self.shape_fn())
            else:
                got = "end of line" if a.kind in ("nl", "eof") else repr(a.text)
                raise self.error(f"{t.text}() takes int lists (?s, [1,0], shape(?x) or a "
                                 f"shape function), got {got}", a)
        problem = shape_fn_problem(t.text, len(args))
        if problem:
            raise self.error(problem, t)
        return ShapeFn(t.text, tuple(args), self.pos(t))

    def integer(self) -> int:
        neg = self.accept("-")
        t = self.next()
        if t.kind != "number" or not t.text.isdigit():
            got = "end of line" if t.kind in ("nl", "eof") else repr(t.text)
            raise self.error(f"expected an integer, got {got}", t)
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
            if t.text.isdigit():
                return Num(int(t.text), self.pos(t))
            if math.isinf(float(t.text)) and t.text != "inf":
                raise self.error(float_overflow(t.text, DType.f64), t)
            return Num(float(t.text), self.pos(t))
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
            if t.text == "shape" and self.accept("["):  # shape(?x)[i] is dim(?x, i)
                index = self.integer()
                self.expect("]", "']' (shape(?x)[i] takes one integer index)")
                return Fn("dim", v, index)
            return Fn(t.text, v, index)
        if t.kind == "ident" and t.text in DTYPES:
            self.next()
            return t.text
        if t.kind == "var":
            self.next()
            return Var(t.text[1:], self.pos(t))
        if t.kind == "number" or t.text == "-":
            return self.integer()
        if t.text == "[":
            return self.int_list()
        got = "end of line" if t.kind in ("nl", "eof") else repr(t.text)
        raise self.error(f"expected a condition term (shape(?x), rank(?x), dim(?x, i), size(?x), "
                         f"dtype(?x), len(?p), an integer, a list like [4,4] or a dtype), "
                         f"got {got}")


