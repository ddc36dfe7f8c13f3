"""egglog actions from their text, built as egglog's command objects without its parser.

egglog's parser gives every node of a program a span that holds the program's whole text, and
each object crossing between Rust and Python copies it: a program costs time quadratic in its
length, twice (parsing it, then running what was parsed): the fusion pass's rules of ~130
actions each were declared ~7 times faster built as below than parsed. `actions` reads the actions eqsat writes (terms, `let`, `union`) into the
same objects with a span that holds no text, so declaring a rule is linear in its length.

The reader follows egglog's own for what eqsat writes: lists, strings with the escapes
`\\" \\\\ \\n \\t`, `true`/`false`, integers (i64), floats (`NaN`, `inf`, `-inf` and finite
numbers), and names.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import Error
from .egglog_native import bindings

_TOKEN = re.compile(r'\s*(?:(\()|(\))|"((?:[^"\\]|\\.)*)"|([^\s()"]+))', re.S)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SPECIAL = {"NaN": math.nan, "inf": math.inf, "-inf": -math.inf}
_SPAN = bindings.PanicSpan()


class EgglogTextError(Error):
    """Text that is not an egglog action in the subset `actions` reads."""


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return re.sub(r"\\(.)", lambda m: _escape(m.group(1)), text, flags=re.S)


def _escape(c: str) -> str:
    if c not in _ESCAPES:
        raise EgglogTextError(f"unrecognized escape character {c!r} in an egglog string")
    return _ESCAPES[c]


def _atom(text: str) -> Any:
    if text == "true" or text == "false":
        return bindings.Lit(_SPAN, bindings.Bool(text == "true"))
    if _INT.fullmatch(text) and -(1 << 63) <= int(text) < (1 << 63):
        return bindings.Lit(_SPAN, bindings.Int(int(text)))
    if text in _SPECIAL:
        return bindings.Lit(_SPAN, bindings.Float(_SPECIAL[text]))
    if _FLOAT.fullmatch(text) and math.isfinite(float(text)):
        return bindings.Lit(_SPAN, bindings.Float(float(text)))
    return bindings.Var(_SPAN, text)


def _read(text: str) -> list[Any]:
    """The s-expressions of `text`: lists as Python lists, atoms as egglog expressions."""
    stack: list[list[Any]] = [[]]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise EgglogTextError(f"cannot read egglog text at {text[pos:pos + 40]!r}")
            break
        pos = m.end()
        opened, closed, string, atom = m.groups()
        if opened:
            stack.append([])
        elif closed:
            if len(stack) == 1:
                raise EgglogTextError("unbalanced ')' in egglog text")
            done = stack.pop()
            stack[-1].append(done)
        elif string is not None:
            stack[-1].append(bindings.Lit(_SPAN, bindings.String(_unescape(string))))
        else:
            stack[-1].append(_atom(atom))
    if len(stack) != 1:
        raise EgglogTextError("unbalanced '(' in egglog text")
    return stack[0]


def _expr(sexp: Any) -> Any:
    if not isinstance(sexp, list):
        return sexp
    if not sexp or not isinstance(sexp[0], bindings.Var):
        raise EgglogTextError("an egglog call starts with a name")
    return bindings.Call(_SPAN, sexp[0].name, [_expr(a) for a in sexp[1:]])


def _action(sexp: Any) -> Any:
    head = sexp[0].name if isinstance(sexp, list) and sexp and isinstance(
        sexp[0], bindings.Var) else None
    if head == "let" and len(sexp) == 3 and isinstance(sexp[1], bindings.Var):
        return bindings.Let(_SPAN, sexp[1].name, _expr(sexp[2]))
    if head == "union" and len(sexp) == 3:
        return bindings.Union(_SPAN, _expr(sexp[1]), _expr(sexp[2]))
    return bindings.Expr_(_SPAN, _expr(sexp))


def actions(text: str) -> list[Any]:
    """egglog's action objects for the actions written in `text`, one after another."""
    return [_action(s) for s in _read(text)]


def run_once(ruleset: str, action_text: list[str]) -> list[Any]:
    """The commands `(ruleset R) (rule () (<actions>) :ruleset R) (run R 1)`: a new ruleset
    `ruleset` of one rule with no query, whose actions `action_text` run once."""
    head = [a for text in action_text for a in actions(text)]
    return [bindings.AddRuleset(_SPAN, ruleset),
            bindings.RuleCommand(bindings.Rule(_SPAN, head, [], ruleset, ruleset)),
            bindings.RunSchedule(bindings.Repeat(
                _SPAN, 1, bindings.Run(_SPAN, bindings.RunConfig(ruleset, None))))]
