"""The canonical `.eqir` text of a module: `parse(print_module(m)) == m`."""

from __future__ import annotations

import math
from typing import Any

from .module import Function, GradDecl, Module, Stmt
from .ops import INT, INTS, LITERAL, OPS
from .types import TensorType


def format_literal(value: Any) -> str:
    """A constant as written in text: `true`, `3`, `0.5`, `1e-05`, `inf`, `nan`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value)
    return str(value)


def format_attr(kind: str, value: Any) -> str:
    if kind == INTS:
        if not isinstance(value, (tuple, list)):
            return repr(value)  # malformed, built in Python: printed for the verifier to name
        return "[" + ",".join(str(v) for v in value) + "]"
    if kind in (INT, LITERAL):
        return format_literal(value)
    formatter = ATTR_FORMATTERS.get(kind)
    if formatter is None:
        raise ValueError(f"no printer for attribute kind {kind!r}")
    return formatter(value)


# Later layers register printers for their own attribute kinds (e.g. fused-kernel bodies).
ATTR_FORMATTERS: dict[str, Any] = {}


def format_types(types: tuple[TensorType, ...]) -> str:
    return ", ".join(map(str, types))


def format_stmt(s: Stmt) -> str:
    lhs = ", ".join(f"%{r}" for r in s.results)
    op = OPS.get(s.op)
    kinds = dict(op.attrs) if op else {}
    attrs = dict(s.attrs)
    operands = [f"%{o}" for o in s.operands]
    if s.op == "call":
        rhs = f"call @{attrs.get('callee', '?')}({', '.join(operands)})"
    elif s.op == "const":
        rhs = f"const {format_literal(attrs.get('value'))}"
    else:
        parts = operands + [f"{k}={format_attr(kinds.get(k, INTS), v)}" for k, v in s.attrs]
        rhs = f"{s.op}" + (" " + ", ".join(parts) if parts else "")
    return f"{lhs} = {rhs} : {format_types(s.types)}"


def format_signature(f: Function) -> str:
    params = ", ".join(f"%{p.name}: {p.type}" for p in f.params)
    results = (str(f.result_types[0]) if len(f.result_types) == 1
               else "(" + format_types(f.result_types) + ")")
    return f"func @{f.name}({params}) -> {results}"


def format_function(f: Function) -> list[str]:
    lines = [format_signature(f) + " {"]
    lines += ["  " + format_stmt(s) for s in f.body]
    lines.append("  return " + ", ".join(f"%{r}" for r in f.returns))
    lines.append("}")
    return lines


def format_grad_decl(g: GradDecl) -> str:
    return f"func @{g.name} = {g.kind} @{g.of} wrt " + ", ".join(f"%{w}" for w in g.wrt)


def module_lines(m: Module) -> list[str]:
    """The lines of `print_module(m)`: every line but the blank ones ("", one before each
    function and gradient declaration) is one item of the text, in order: the module line, a
    function's header, each statement, its return and its closing brace, a declaration (the
    formatter places comments by this)."""
    lines = [f"module @{m.name}"]
    for item in m.items:
        lines.append("")
        if isinstance(item, Function):
            lines += format_function(item)
        else:
            lines.append(format_grad_decl(item))
    return lines


def print_module(m: Module) -> str:
    """The canonical text of a module, one statement per line."""
    return "\n".join(module_lines(m)) + "\n"
