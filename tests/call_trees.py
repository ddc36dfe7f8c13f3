"""Programs whose functions call the one before them: call graphs deep, or doubling at every
level (inlining them copies a callee once per call)."""

from __future__ import annotations


def call_tree(depth: int, fanout: int = 2, t: str = "f32[4]") -> str:
    """@f0 is sin(x); each @fk up to @f{depth-1} calls @f(k-1) once (fanout 1: 1 call of @f0
    in all) or twice, on x and on cos(x), adding the results (fanout 2: 2^(depth-1) calls)."""
    if fanout not in (1, 2):
        raise ValueError(f"fanout is 1 or 2, not {fanout}")
    funcs = [f"func @f0(%x: {t}) -> {t} {{\n  %y = sin %x : {t}\n  return %y\n}}"]
    for i in range(1, depth):
        if fanout == 1:
            body = f"  %a = call @f{i - 1}(%x) : {t}\n  return %a"
        else:
            body = (f"  %a = call @f{i - 1}(%x) : {t}\n  %w = cos %x : {t}\n"
                    f"  %b = call @f{i - 1}(%w) : {t}\n  %z = add %a, %b : {t}\n  return %z")
        funcs.append(f"func @f{i}(%x: {t}) -> {t} {{\n{body}\n}}")
    return "\n".join(funcs)
