"""The Python face of AD: `grad`, `value_and_grad` and `vjp` of traced functions.

Each returns a new traced function whose IR is the generated adjoint (a plain function, so
`print(eqsat.grad(loss))` shows the code, calling it on arrays runs it, and `Module(...)` or
another traced function can use it like any other).

`wrt` names the parameters to differentiate with respect to, by name or by position; by default
every float parameter, in order (integer and bool parameters carry no gradient).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ..errors import Error, VerifyError
from ..ir import Function, GradDecl, Module
from ..ir.dsl import TracedFunction
from .expand import differentiate

Wrt = str | int | Sequence[str | int] | None


def grad(f: TracedFunction, wrt: Wrt = None, name: str | None = None) -> TracedFunction:
    """The gradient of `f` (which returns one float scalar): same parameters, one gradient per
    `wrt` parameter, in order."""
    return _derive("grad", f, wrt, name)


def value_and_grad(f: TracedFunction, wrt: Wrt = None, name: str | None = None
                   ) -> TracedFunction:
    """Like `grad`, but the new function returns `f`'s value first, then the gradients."""
    return _derive("value_and_grad", f, wrt, name)


def vjp(f: TracedFunction, wrt: Wrt = None, name: str | None = None) -> TracedFunction:
    """The vector-Jacobian product of `f`: it takes `f`'s parameters, then one seed (cotangent)
    per result of `f`, and returns the cotangents of the `wrt` parameters."""
    return _derive("vjp", f, wrt, name)


def _derive(kind: str, f: Any, wrt: Wrt, name: str | None) -> TracedFunction:
    if not isinstance(f, TracedFunction):
        raise Error(f"eqsat.{kind} takes a function traced with @eqsat.function, not "
                    f"{type(f).__name__}")
    module = differentiate(f.module)  # f may itself be a declaration: expand it first
    of = module[f.name]
    assert isinstance(of, Function)
    names = _wrt_names(kind, of, wrt)
    if kind != "vjp":
        r = of.result_types
        if len(r) != 1 or r[0].shape != () or not r[0].dtype.is_float:
            raise VerifyError(f"eqsat.{kind} needs @{of.name} to return one float scalar "
                              f"(f32[] or f64[]), but it returns {', '.join(map(str, r))}; "
                              f"use eqsat.vjp for other results")
    decl = GradDecl(_free_name(module, name or f"{f.name}_{kind}"), kind, f.name, names)
    expanded = differentiate(module.replace(module.items + (decl,)))
    return TracedFunction.from_ir(expanded[decl.name])


def _free_name(module: Module, base: str) -> str:
    """`base`, or the first of `base_2`, `base_3`, ... that no item of `module` holds (the
    declaration joins `module` to be expanded)."""
    name, k = base, 1
    while name in module:
        k += 1
        name = f"{base}_{k}"
    return name


def _wrt_names(kind: str, f: Function, wrt: Wrt) -> tuple[str, ...]:
    """Parameter names from names or positions; every float parameter when `wrt` is None."""
    params = f.params
    if wrt is None:
        names = tuple(p.name for p in params if p.type.dtype.is_float)
        if not names:
            raise VerifyError(f"eqsat.{kind}: @{f.name} has no float parameter to "
                              f"differentiate with respect to")
        return names
    items = list(wrt) if isinstance(wrt, (list, tuple)) else [wrt]
    if not items:
        raise VerifyError(f"eqsat.{kind}: wrt is empty; name at least one parameter")
    by_name = {p.name: p for p in params}
    out = []
    for w in items:
        if not isinstance(w, (str, bool, int)) and hasattr(type(w), "__index__"):
            try:
                w = operator.index(w)  # a numpy integer is a position too
            except TypeError:
                pass
        if isinstance(w, bool) or not isinstance(w, (str, int)):
            raise VerifyError(f"eqsat.{kind}: wrt takes parameter names or positions, "
                              f"not {w!r}")
        if isinstance(w, int):
            if not -len(params) <= w < len(params):
                shown = w if w.bit_length() <= 64 else f"of {w.bit_length()} bits"
                raise VerifyError(f"eqsat.{kind}: @{f.name} has {len(params)} parameter(s); "
                                  f"position {shown} is out of range")
            w = params[w].name
        if w not in by_name:
            raise VerifyError(f"eqsat.{kind}: @{f.name} has no parameter {w!r} (its parameters: "
                              f"{', '.join(by_name) or 'none'})")
        if not by_name[w].type.dtype.is_float:
            raise VerifyError(f"eqsat.{kind}: cannot differentiate with respect to {w!r}: its "
                              f"type {by_name[w].type} is not a float type")
        if w in out:
            raise VerifyError(f"eqsat.{kind}: {w!r} is listed twice in wrt")
        out.append(w)
    return tuple(out)
