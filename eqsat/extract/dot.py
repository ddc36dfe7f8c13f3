"""Graphviz text of programs: one box per statement, an edge from each operand to its user.

`to_dot(module)` draws a module (a cluster per function); `compare_dot(before, after)` draws
two modules side by side in clusters "before" and "after" (what `eqsat opt --dot` writes).
Render with `dot -Tsvg file.dot -o file.svg`.
"""

from __future__ import annotations

from ..ir.module import Function, Module
from ..ir.printer import ATTR_FORMATTERS
from ..ir.ops import OPS
from .report import FUSED_OPS, LAYOUT_OPS

# Fill colours: fused kernels and layout ops stand out, as do the function's inputs.
_FILL = {"param": "#e8f0fe", "fused": "#fde2c8", "layout": "#e6f4ea", "call": "#f3e8fd"}


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attr_text(op: str, name: str, value: object) -> str:
    kinds = dict(OPS[op].attrs) if op in OPS else {}
    fmt = ATTR_FORMATTERS.get(kinds.get(name, ""))
    if fmt is not None:
        try:
            return f"{name}={fmt(value)}"
        except (TypeError, ValueError):
            pass
    if isinstance(value, tuple):
        return f"{name}=[{','.join(map(str, value))}]"
    return f"{name}={value}"


def _label(op: str, attrs: tuple, types: tuple) -> str:
    parts = [op]
    for k, v in attrs:
        if op == "const" and k == "value":
            parts[0] = f"const {v}"
        elif k != "callee":
            parts.append(_attr_text(op, k, v))
        else:
            parts[0] = f"call @{v}"
    text = "\n".join(parts)
    return text + "\n" + ", ".join(map(str, types))


def _fill(op: str) -> str | None:
    if op in FUSED_OPS:
        return _FILL["fused"]
    if op in LAYOUT_OPS:
        return _FILL["layout"]
    return _FILL.get(op)


def function_lines(f: Function, prefix: str, indent: str = "  ") -> list[str]:
    """The lines of one function's cluster; node ids start with `prefix`."""
    def node_id(key: str) -> str:
        return _quote(f"{prefix}{f.name}/{key}")

    lines = [f"{indent}subgraph {_quote('cluster_' + prefix + f.name)} {{",
             f"{indent}  label={_quote('@' + f.name)};"]
    where: dict[str, str] = {}  # value name -> id of the node that defines it
    for p in f.params:
        where[p.name] = node_id(p.name)
        lines.append(f"{indent}  {where[p.name]} [label={_quote(f'%{p.name}: {p.type}')}, "
                     f'shape=ellipse, style=filled, fillcolor="{_FILL["param"]}"];')

    def edge(value: str, target: str, k: int, n: int) -> str:
        return f"{indent}  {where[value]} -> {target}" + (f" [label={k}];" if n > 1 else ";")

    for i, s in enumerate(f.body):
        sid = node_id(f"#{i}")
        style = f', style=filled, fillcolor="{_fill(s.op)}"' if _fill(s.op) else ""
        results = ", ".join("%" + r for r in s.results)
        label = f"{results} = {_label(s.op, s.attrs, s.types)}"
        lines.append(f"{indent}  {sid} [label={_quote(label)}, shape=box{style}];")
        lines += [edge(o, sid, k, len(s.operands)) for k, o in enumerate(s.operands)]
        for r in s.results:
            where[r] = sid
    ret = node_id("#return")
    lines.append(f"{indent}  {ret} [label=\"return\", shape=plaintext];")
    lines += [edge(r, ret, k, len(f.returns)) for k, r in enumerate(f.returns)]
    lines.append(f"{indent}}}")
    return lines


def to_dot(module: Module, title: str | None = None) -> str:
    """Graphviz text of every function of `module` (gradient declarations are not drawn)."""
    lines = [f"digraph {_quote(title or module.name)} {{", "  rankdir=TB;",
             '  node [fontname="monospace", fontsize=10];']
    for f in module.functions:
        lines += function_lines(f, "m/")
    lines.append("}")
    return "\n".join(lines) + "\n"


def compare_dot(before: Module, after: Module) -> str:
    """Graphviz text with the program before optimization and after, in two clusters."""
    lines = [f"digraph {_quote(after.name)} {{", "  rankdir=TB;", "  compound=true;",
             '  node [fontname="monospace", fontsize=10];']
    for tag, m in (("before", before), ("after", after)):
        lines += [f"  subgraph {_quote('cluster_' + tag)} {{", f"    label={_quote(tag)};",
                  "    style=dashed;"]
        for f in m.functions:
            lines += function_lines(f, tag + "/", "    ")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
