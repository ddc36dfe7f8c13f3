"""eqsat: an optimizing compiler for tensor programs (linear-algebra IR, adjoint AD,
equality saturation with egglog, llvmlite code generation).

This module is a thin facade: it re-exports the public names and composes the stages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import (Error, InterpretError, LocatedError, ParseError, TraceError, UnsoundRule,
                     VerifyError)
from .ir import DType, Function, GradDecl, Module, TensorType, parse, verify
from .ir.interpreter import interpret as _interpret

f32, f64, i32, i64 = DType.f32, DType.f64, DType.i32, DType.i64
bool_ = DType.bool


def interpret(module: Module, name: str, *arrays: Any) -> np.ndarray | tuple[np.ndarray, ...]:
    """Run function `name` of `module` with numpy semantics (the reference for every stage).

    One result comes back as an array, several as a tuple. Gradient declarations are expanded
    first, so `interpret(m, "loss_grad", ...)` works on a module as parsed.
    """
    return _interpret(module, name, *arrays)


__all__ = [
    "DType", "Error", "Function", "GradDecl", "InterpretError", "LocatedError", "Module",
    "ParseError", "TensorType", "TraceError", "UnsoundRule", "VerifyError", "bool_", "f32",
    "f64", "i32", "i64", "interpret", "parse", "verify",
]
