"""egglog actions from their text, built as egglog's command objects without its parser.

egglog's parser gives every node of a program a span holding the program's whole text, and
each object crossing between Rust and Python copies it: a program costs time quadratic in its
length, twice (parsing it, then running what was parsed), and a fusion pass rule of ~130
actions is one command. `actions` reads the actions eqsat writes (terms, `let`, `union`)
into the same objects with a span that holds no text, so declaring a rule is linear in its
length: a warm `optimize` of examples/transformer.eqir took 0.64 s of CPU with its rules
parsed, 0.50 with them built here.

The objects are built inside `native_call`, like a call into egglog: their constructors
release and re-take the GIL (an argument of egglog's enum types, such as an expression that
is not a literal, is tried against each variant in turn, and each failed try makes and
normalizes a Python exception, which pyo3 does with the GIL released). A daemon thread that
re-took the GIL there while the interpreter was finalizing was ended inside Rust frames: a
segfault, or an abort, at exit.

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
from .in_flight import native_call

_TOKEN = re.compile(r'\s*(?:(\()|(\))|"((?:[^"\\]|\\.)*)"|([^\s()"]+))', re.S)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SPECIAL = {"NaN": math.nan, "inf": math.inf, "-inf": -math.inf}
_I64 = (-(1 << 63), 1 << 63)


class EgglogTextError(Error):
    """Text that is not an egglog action in the subset `actions` reads."""


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return re.sub(r"\\(.)", lambda m: _escaped(m.group(1)), text, flags=re.S)


def _escaped(c: str) -> str:
    if c not in _ESCAPES:
        raise EgglogTextError(f"unrecognized escape character {c!r} in an egglog string")
    return _ESCAPES[c]


def _atom(text: str, span: Any) -> Any:
    if text in ("true", "false"):
        return bindings.Lit(span, bindings.Bool(text == "true"))
    if _INT.fullmatch(text) and _I64[0] <= int(text) < _I64[1]:
        return bindings.Lit(span, bindings.Int(int(text)))
    if text in _SPECIAL:
        return bindings.Lit(span, bindings.Float(_SPECIAL[text]))
    if _FLOAT.fullmatch(text) and math.isfinite(float(text)):
        return bindings.Lit(span, bindings.Float(float(text)))
    return bindings.Var(span, text)


def _read(text: str, span: Any, memo: dict[str, Any]) -> list[Any]:
    """The top-level s-expressions of `text`: atoms as egglog expressions, lists as Python
    lists of their items, nested lists as egglog calls. `memo` holds the objects made so far
    by their text: a repeated term (an operand list, a shape) is built once."""
    stack: list[list[Any]] = [[]]
    starts: list[int] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise EgglogTextError(f"cannot read egglog text at {text[pos:pos + 40]!r}")
            break
        opened, closed, string, atom = m.groups()
        if opened:
            stack.append([])
            starts.append(m.start(1))
        elif closed:
            if len(stack) == 1:
                raise EgglogTextError("unbalanced ')' in egglog text")
            items = stack.pop()
            key = text[starts.pop():m.end()]
            if len(stack) == 1:
                stack[-1].append(items)  # an action, made by _action
            elif key in memo:
                stack[-1].append(memo[key])
            else:
                stack[-1].append(memo.setdefault(key, _call(items, span)))
        else:
            key = atom if string is None else f'"{string}"'
            if key not in memo:
                memo[key] = (_atom(atom, span) if string is None
                             else bindings.Lit(span, bindings.String(_unescape(string))))
            stack[-1].append(memo[key])
        pos = m.end()
    if len(stack) != 1:
        raise EgglogTextError("unbalanced '(' in egglog text")
    return stack[0]


def _call(items: list[Any], span: Any) -> Any:
    if not items or not isinstance(items[0], bindings.Var):
        raise EgglogTextError("an egglog call starts with a name")
    return bindings.Call(span, items[0].name, items[1:])


def _action(sexp: Any, span: Any) -> Any:
    if not isinstance(sexp, list):
        return bindings.Expr_(span, sexp)
    head = sexp[0].name if sexp and isinstance(sexp[0], bindings.Var) else None
    if head == "let" and len(sexp) == 3 and isinstance(sexp[1], bindings.Var):
        return bindings.Let(span, sexp[1].name, sexp[2])
    if head == "union" and len(sexp) == 3:
        return bindings.Union(span, sexp[1], sexp[2])
    return bindings.Expr_(span, _call(sexp, span))


def _actions(text: str, span: Any, memo: dict[str, Any]) -> list[Any]:
    return [_action(s, span) for s in _read(text, span, memo)]


def actions(text: str) -> list[Any]:
    """egglog's action objects for the actions written in `text`, one after another."""
    with native_call():
        return _actions(text, bindings.PanicSpan(), {})


def run_once(ruleset: str, action_text: list[str]) -> list[Any]:
    """The commands `(ruleset R) (rule () (<actions>) :ruleset R) (run R 1)`: a new ruleset
    `ruleset` of one rule with no query, whose actions `action_text` run once."""
    with native_call():
        span, memo = bindings.PanicSpan(), {}
        head = [a for text in action_text for a in _actions(text, span, memo)]
        return [bindings.AddRuleset(span, ruleset),
                bindings.RuleCommand(bindings.Rule(span, head, [], ruleset, ruleset)),
                bindings.RunSchedule(bindings.Repeat(
                    span, 1, bindings.Run(span, bindings.RunConfig(ruleset, None))))]
