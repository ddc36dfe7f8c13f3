"""The `.eqir` parser: text to an (unverified) Module, with line and column on every error."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ParseError, VerifyError
from .module import GRAD_KINDS, Function, GradDecl, Loc, Module, Param, Stmt
from .ops import CALLEE, INT, INTS, LITERAL, OPS, float_overflow
from .types import DTYPES, DType, TensorType, shape_problem

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\f\v]+)
  | (?P<nl>\r\n?|\n)
  | (?P<comment>\#[^\r\n]*)
  | (?P<pname>%[A-Za-z0-9_.]+)
  | (?P<fname>@[A-Za-z0-9_.]+)
  | (?P<arrow>->)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<ident>[-+]?[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<arg>\$[0-9]+)
  | (?P<punct>[()\[\]{},:=])
    """,
    re.VERBOSE,
)

_MAX_NUMBER_LEN = 400
NAME_CHARS = "names are letters, digits, '_' and '.'"


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # pname fname arrow number ident arg punct eof, and comment when asked for
    text: str
    line: int
    col: int

    def describe(self) -> str:
        return "end of input" if self.kind == "eof" else repr(self.text)


def _at(tok: Token) -> tuple[int, int]:
    """Where a part of a statement is: (line, col); a statement may span lines, so the
    verifier locates its parts by both (see verifier._Checker.fail)."""
    return (tok.line, tok.col)


def _shown(ch: str) -> str:
    return repr(ch) if ch.isprintable() else f"{ch!r} (U+{ord(ch):04X})"


def tokenize(text: str, source: str | None = None, comments: bool = False) -> list[Token]:
    """Split text into tokens; any character outside the format is a ParseError. Comments
    are left out unless `comments` (the formatter keeps them)."""
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    n = len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            col, ch = pos - line_start + 1, text[pos]
            if ch in "%@":  # a sigil without a valid name after it
                after = text[pos + 1:pos + 2]
                if after and not after.isspace():
                    raise ParseError(f"{_shown(after)} cannot be part of a {ch}name ({NAME_CHARS})",
                                     line, col + 1, source)
                raise ParseError(f"'{ch}' must be followed by a name ({NAME_CHARS})", line, col,
                                 source)
            raise ParseError(f"unexpected character {_shown(ch)}", line, col, source)
        kind = m.lastgroup
        if kind == "nl":
            line += 1
            line_start = m.end()
        elif kind != "ws" and (comments or kind != "comment"):
            if kind == "arg" and len(m.group()) > _MAX_NUMBER_LEN:  # int() refuses 4300 digits
                raise ParseError(f"{m.group()[:20]}... with {len(m.group())} characters is too "
                                 f"long", line, pos - line_start + 1, source)
            tokens.append(Token(kind, m.group(), line, pos - line_start + 1))
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


class _Parser:
    def __init__(self, text: str, source: str | None):
        self.source = source
        self.toks = tokenize(text, source)
        self.i = 0

    # ---------------------------------------------------------------- token helpers

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def error(self, message: str, tok: Token | None = None) -> ParseError:
        tok = tok or self.tok
        return ParseError(message, tok.line, tok.col, self.source)

    def next(self) -> Token:
        tok = self.toks[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.tok
        return tok.kind == kind and (text is None or tok.text == text)

    def accept(self, kind: str, text: str | None = None) -> Token | None:
        if self.at(kind, text):
            return self.next()
        return None

    def expect(self, kind: str, text: str | None = None, what: str | None = None) -> Token:
        if self.at(kind, text):
            return self.next()
        wanted = what or (repr(text) if text else {"pname": "a %name", "fname": "an @name",
                                                  "ident": "a word", "number": "a number"}[kind])
        raise self.error(f"expected {wanted}, found {self.tok.describe()}")

    def punct(self, ch: str, what: str | None = None) -> Token:
        return self.expect("punct", ch, what)

    # ---------------------------------------------------------------- grammar

    def module(self) -> Module:
        name = "main"
        if self.accept("ident", "module"):
            name = self.expect("fname", what="the module's @name").text[1:]
        items: list[Any] = []
        while not self.at("eof"):
            if not self.at("ident", "func"):
                raise self.error(
                    f"expected 'func' to start a function, found {self.tok.describe()}")
            items.append(self.item())
        return Module.of(name, items)

    def item(self) -> Function | GradDecl:
        start = self.next()
        name_tok = self.expect("fname", what="the function's @name after 'func'")
        name = name_tok.text[1:]
        loc = Loc(start.line, start.col)
        if self.accept("punct", "="):
            return self.grad_decl(name, loc)
        self.punct("(", "'(' and the parameters, or '=' and a gradient declaration")
        params: list[Param] = []
        if not self.at("punct", ")"):
            while True:
                p = self.expect("pname", what="a parameter %name")
                self.punct(":", f"':' and the type of parameter {p.text}")
                t = self.type()
                params.append(Param(p.text[1:], t, Loc(p.line, p.col, type_col=0)))
                if not self.accept("punct", ","):
                    break
        self.punct(")", "')' or ',' after a parameter")
        self.expect("arrow", "->", "'->' and the result type")
        results = self.result_types()
        self.punct("{", "'{' to open the function body")
        body: list[Stmt] = []
        while not self.at("ident", "return"):
            if self.at("pname"):
                body.append(self.stmt())
            elif self.at("punct", "}"):
                raise self.error(f"function @{name} ends without a 'return'")
            else:
                raise self.error(f"expected a statement '%name = op ...' or 'return', found "
                                 f"{self.tok.describe()}")
        ret = self.next()
        returns = self.pnames("a returned %name")
        self.punct("}", "'}' to close the function body after 'return'")
        return Function(name, tuple(params), results, tuple(body),
                        tuple(t.text[1:] for t in returns), loc,
                        Loc(ret.line, ret.col, tuple(_at(t) for t in returns)))

    def grad_decl(self, name: str, loc: Loc) -> GradDecl:
        kind = self.expect("ident", what=f"a gradient kind ({', '.join(GRAD_KINDS)})")
        if kind.text not in GRAD_KINDS:
            raise self.error(f"unknown gradient kind {kind.text!r}; expected one of "
                             f"{', '.join(GRAD_KINDS)}", kind)
        of = self.expect("fname", what="the @function to differentiate")
        self.expect("ident", "wrt", f"'wrt' and the parameters to differentiate @{of.text[1:]} by")
        wrt = self.pnames("a parameter %name after 'wrt'")
        return GradDecl(name, kind.text, of.text[1:], tuple(t.text[1:] for t in wrt), loc,
                        tuple(_at(t) for t in wrt), _at(of))

    def pnames(self, what: str) -> list[Token]:
        toks = [self.expect("pname", what=what)]
        while self.accept("punct", ","):
            toks.append(self.expect("pname", what=what))
        return toks

    def result_types(self) -> tuple[TensorType, ...]:
        if self.accept("punct", "("):
            types = [self.type()]
            while self.accept("punct", ","):
                types.append(self.type())
            self.punct(")", "')' after the result types")
            return tuple(types)
        return (self.type(),)

    def type(self) -> TensorType:
        tok = self.tok
        if tok.kind != "ident" or tok.text not in DTYPES:
            raise self.error(f"expected a type like f32[2,3] (dtypes: {', '.join(DTYPES)}), "
                             f"found {tok.describe()}")
        self.next()
        self.punct("[", f"'[' and the shape after {tok.text} (a scalar is {tok.text}[])")
        dims: list[int] = []
        if not self.at("punct", "]"):
            while True:
                d = self.tok
                if d.kind != "number":
                    raise self.error(f"expected a dimension (a non-negative integer), found "
                                     f"{d.describe()}")
                value = self.number()
                if not isinstance(value, int):
                    raise self.error(f"a dimension must be an integer, got {d.text}", d)
                dims.append(value)
                if not self.accept("punct", ","):
                    break
        self.punct("]", "']' or ',' in the shape")
        problem = shape_problem(tuple(dims))
        if problem:
            raise VerifyError(problem, tok.line, tok.col, self.source)
        return TensorType(DTYPES[tok.text], tuple(dims))

    def number(self) -> int | float:
        tok = self.next()
        if len(tok.text) > _MAX_NUMBER_LEN:
            raise self.error(f"number with {len(tok.text)} characters is too long", tok)
        after = self.tok
        if after.kind == "ident" and (after.line, after.col) == (tok.line,
                                                                 tok.col + len(tok.text)):
            raise self.error(f"malformed number {tok.text + after.text!r}: numbers are "
                             f"decimal (16, 0.5, 1e-3), with no suffix", tok)
        if re.fullmatch(r"[-+]?\d+", tok.text):
            return int(tok.text)
        value = float(tok.text)
        if math.isinf(value):
            raise self.error(float_overflow(tok.text, DType.f64), tok)
        return value

    def literal(self) -> tuple[Any, Token]:
        tok = self.tok
        if tok.kind == "number":
            return self.number(), tok
        # signed like numbers: +inf as +5, and a NaN's sign carries no meaning here
        words = {"true": True, "false": False, "inf": float("inf"), "+inf": float("inf"),
                 "-inf": float("-inf"), "nan": float("nan"), "+nan": float("nan"),
                 "-nan": float("nan")}
        if tok.kind == "ident" and tok.text in words:
            self.next()
            return words[tok.text], tok
        raise self.error(f"expected a constant (a number, inf, nan, true or false), found "
                         f"{tok.describe()}")

    def stmt(self) -> Stmt:
        first = self.tok
        results = self.pnames("a result %name")
        self.punct("=", "'=' after the result names")
        op_tok = self.expect("ident", what="an op name")
        opdef = OPS.get(op_tok.text)
        if opdef is None:
            close = difflib.get_close_matches(op_tok.text, OPS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise self.error(f"unknown op {op_tok.text!r}{hint}", op_tok)
        operands: list[Token] = []
        attrs: dict[str, Any] = {}
        attr_cols: dict[str, tuple[int, int]] = {}
        if opdef.name == "call":
            callee = self.expect("fname", what="the called @function")
            attrs["callee"], attr_cols["callee"] = callee.text[1:], _at(callee)
            self.punct("(", "'(' and the call's arguments")
            if not self.at("punct", ")"):
                operands = self.pnames("an argument %name")
            self.punct(")", "')' or ',' in the call's arguments")
        elif opdef.name == "const":
            value, lit_tok = self.literal()
            attrs["value"], attr_cols["value"] = value, _at(lit_tok)
        elif not self.at("punct", ":"):
            kinds = dict(opdef.attrs)
            while True:
                if self.at("pname"):
                    if attrs:
                        raise self.error("operands come before attributes")
                    operands.append(self.next())
                elif self.at("ident"):
                    key = self.next()
                    if key.text not in kinds:
                        takes = ", ".join(kinds) or "no attributes"
                        raise self.error(f"{opdef.name} has no attribute {key.text!r} (it takes "
                                         f"{takes})", key)
                    if key.text in attrs:
                        raise self.error(f"attribute {key.text!r} is given twice", key)
                    self.punct("=", f"'=' after attribute {key.text!r}")
                    attr_cols[key.text] = _at(key)
                    attrs[key.text] = self.attr_value(kinds[key.text], key.text)
                else:
                    raise self.error(f"expected an operand %name or an attribute, found "
                                     f"{self.tok.describe()}")
                if not self.accept("punct", ","):
                    break
        self.punct(":", "':' and the result type (it is always written)")
        type_at = _at(self.tok)
        types = [self.type()]
        while self.accept("punct", ","):
            types.append(self.type())
        value = attrs.get("value")
        if opdef.name == "const" and type(value) is int and types[0].dtype.is_float:
            try:
                attrs["value"] = float(value)  # `const 3 : f32[]` means 3.0, as np.full would
            except OverflowError:
                raise self.error(f"the integer {value} is too large for {types[0].dtype}",
                                 lit_tok) from None
        loc = Loc(first.line, first.col, tuple(_at(t) for t in operands),
                  tuple(attr_cols.items()), type_at)
        return Stmt(tuple(t.text[1:] for t in results), opdef.name,
                    tuple(t.text[1:] for t in operands), tuple(attrs.items()), tuple(types), loc)

    def attr_value(self, kind: str, name: str) -> Any:
        if kind == INTS:
            self.punct("[", f"'[' and a list of integers for {name!r}")
            values: list[int] = []
            if not self.at("punct", "]"):
                while True:
                    values.append(self.integer(name))
                    if not self.accept("punct", ","):
                        break
            self.punct("]", f"']' or ',' in the list {name!r}")
            return tuple(values)
        if kind == INT:
            return self.integer(name)
        if kind == LITERAL:
            return self.literal()[0]
        parser = ATTR_PARSERS.get(kind)
        if parser is None or kind == CALLEE:
            raise self.error(f"attribute {name!r} cannot be written here")
        return parser(self, name)

    def integer(self, name: str) -> int:
        tok = self.tok
        if tok.kind != "number":
            raise self.error(f"expected an integer in {name!r}, found {tok.describe()}")
        value = self.number()
        if not isinstance(value, int):
            raise self.error(f"expected an integer in {name!r}, found {tok.text}", tok)
        return value


# Later layers register parsers for their own attribute kinds: fn(parser, attr_name) -> value.
ATTR_PARSERS: dict[str, Any] = {}


def parse_module(text: str | bytes, source: str | None = None) -> Module:
    """Parse `.eqir` text into a Module without verifying it."""
    return _Parser(source_text(text, source), source).module()


def source_text(text: str | bytes, source: str | None = None) -> str:
    """The text the parser reads: bytes decoded as UTF-8, a leading byte order mark dropped
    (so that line and column of every token are the same wherever the text is tokenized)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ParseError(f"the text is not UTF-8 (byte {e.start})", 1, 1, source) from None
    if not isinstance(text, str):
        raise ParseError(f"expected text, got {type(text).__name__}", 0, 0, source)
    # Editors on Windows start UTF-8 files with a byte order mark; it is not part of the text.
    return text.removeprefix("\ufeff")
