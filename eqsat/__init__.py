"""eqsat: an optimizing compiler for tensor programs (linear-algebra IR, adjoint AD,
equality saturation with egglog, llvmlite code generation).

This module is a thin facade: it re-exports the public names and composes the stages
(parse -> differentiate -> optimize -> lower). The heavier layers (egglog, llvmlite, scipy)
are imported on first use, so `import eqsat` and the CLI stay quick.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import (Error, InterpretError, LocatedError, ParseError, TraceError,
                     UnknownFunction, UnsoundRule, VerifyError)
from .ir import DType, Function, GradDecl, Module, TensorType, parse, verify
from .ir.dsl import (TracedFunction, abs, broadcast_to, cast, concatenate, cos, exp, function,
                     gelu, layer_norm, log, logsumexp, matmul, max, maximum, mean, min,
                     minimum, reciprocal, relu, reshape, rsqrt, sigmoid, sin, softmax, sqrt, sum,
                     tanh, transpose, where)
from .ir.dsl_function import function_name
from .ir.interpreter import interpret as _interpret
from .ad import grad, value_and_grad, vjp

f32, f64, i32, i64 = DType.f32, DType.f64, DType.i32, DType.i64
bool_ = DType.bool

_LAZY_SUBMODULES = ("rules", "testing", "extract", "backend", "ad")


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name == "Limits":
        from .rules import Limits

        return Limits
    raise AttributeError(f"module 'eqsat' has no attribute {name!r}")


@functools.lru_cache(maxsize=64)
def _differentiated(module: Module) -> Module:
    from .ad import differentiate as _differentiate

    return _differentiate(module)


def _as_module(module: Any, what: str) -> Module:
    """`module` itself, or the module of one traced function (`eqsat.Module(f)`)."""
    if isinstance(module, Module):
        return module
    if isinstance(module, TracedFunction):
        return Module(module)
    raise Error(f"{what} takes an eqsat.Module (or an @eqsat.function), not "
                f"{type(module).__name__}" + ("; parse text with eqsat.parse first"
                                               if isinstance(module, (str, bytes)) else ""))


def differentiate(module: Module) -> Module:
    """Expand every gradient declaration (grad, value_and_grad, vjp) into a plain function."""
    module = _as_module(module, "differentiate")
    return _differentiated(module) if module.grad_decls else verify(module)


def interpret(module: Module, name: str, /, *arrays: Any, **named: Any
              ) -> np.ndarray | tuple[np.ndarray, ...]:
    """Run function `name` of `module` with numpy semantics (the reference for every stage).

    One result comes back as an array, several as a tuple. Gradient declarations are expanded
    first, so `interpret(m, "loss_grad", ...)` works on a module as parsed. `name` may be the
    traced function itself. Arguments may also be passed by parameter name.
    """
    module = _as_module(module, "interpret")
    return _interpret(differentiate(module), function_name(name, module), *arrays, **named)


def optimize(module: Module, rules: Any = None, target: str = "cpu", limits: Any = None,
             **options: Any) -> Module:
    """The cheapest equivalent program the rules find for `target` (never costlier than the input).

    Gradient declarations are expanded first; `limits` (an `eqsat.Limits`) bounds saturation.
    `eqsat.extract.optimize_with_report` also returns what happened.
    """
    from .extract import optimize as _optimize

    module = _as_module(module, "optimize")
    return _optimize(module, rules=rules, target=target, limits=limits, **options)


def cost(module: Module, target: str = "cpu") -> float:
    """The cost model's estimate, in seconds, of running every function of `module` once."""
    from .extract import module_cost

    return module_cost(differentiate(_as_module(module, "cost")), target)


def compile(module: Module, target: str = "cpu", optimize: bool = True, rules: Any = None,
            limits: Any = None) -> Any:
    """Differentiate, optimize (unless `optimize=False`) and lower `module` for `target`.

    Returns an Executable: `exe("f", *arrays)` or `exe.f(*arrays)` run the compiled code.
    """
    backend = _backend(target)
    if target == "cuda":  # before optimizing, which takes a second on a transformer block
        from .backend.cuda_runtime import require_gpu

        require_gpu()
    if limits is not None:  # checked whether or not it optimizes: never silently ignored
        from .rules.runner import checked_limits

        checked_limits(limits)
    source = _as_module(module, "compile")
    m = differentiate(source)
    if optimize:
        # where the optimizer runs, the CPU's compile workers start meanwhile: a program not
        # optimized before is not compiled before either
        m = _optimize_cached(m, rules, target, limits,
                             getattr(backend, "start_compile_workers", None))
    return backend.compile_module(m, source=source)


def _optimize_cached(module: Module, rules: Any, target: str, limits: Any,
                     on_miss: Callable[[], None] | None = None) -> Module:
    """`optimize` with the built-in rules, its result kept on disk so a second run of the same
    program skips saturation (custom rules are not cached: their text is not a stable key);
    `on_miss` is called first where it optimizes."""
    if rules is not None:
        if on_miss is not None:
            on_miss()
        return optimize(module, rules=rules, target=target, limits=limits)
    import hashlib

    from . import cache

    key = hashlib.sha256("\0".join([
        str(module), target, repr(limits), cache.machine_key(),
        cache.source_fingerprint("ir", "ad", "rules", "extract")]).encode()).hexdigest()[:40]
    directory = cache.cache_dir() / "optimized"
    text = cache.load_checked(directory, f"{key}.eqir")
    if text is not None:
        try:
            return parse(text)
        except Error:
            pass  # a damaged entry: optimize again and overwrite it
    if on_miss is not None:
        on_miss()
    out = optimize(module, target=target, limits=limits)
    cache.store_checked(directory, f"{key}.eqir", str(out).encode())
    return out


def emit(module: Module, target: str = "llvm") -> str:
    """The LLVM IR (`target="llvm"`) or PTX (`target="ptx"`) text of `module` as given."""
    module = _as_module(module, "emit")
    if target == "llvm":
        from .backend import emit_llvm

        return emit_llvm(differentiate(module))
    if target == "ptx":
        from .backend.cuda import emit_ptx

        return emit_ptx(differentiate(module))
    raise Error(f"unknown emit target {target!r}; valid targets: llvm, ptx")


def _backend(target: str) -> Any:
    if target == "cpu":
        from . import backend

        return backend
    if target == "cuda":
        from .backend import cuda

        return cuda
    raise Error(f"unknown target {target!r}; valid targets: cpu, cuda")


def _eager_runner(module: Module, name: str, *arrays: Any) -> Any:
    return interpret(module, name, *arrays)


TracedFunction.runner = staticmethod(_eager_runner)

__all__ = [
    "DType", "Error", "Function", "GradDecl", "InterpretError", "Limits", "LocatedError", "Module",
    "ParseError", "TensorType", "TraceError", "TracedFunction", "UnknownFunction", "UnsoundRule",
    "VerifyError", "abs", "bool_", "broadcast_to", "cast", "compile", "concatenate", "cos", "cost",
    "differentiate", "emit", "exp", "f32", "f64", "function", "gelu", "grad", "i32", "i64",
    "interpret", "layer_norm", "log", "logsumexp", "matmul", "max", "maximum", "mean", "min",
    "minimum", "optimize", "parse", "reciprocal", "relu", "reshape", "rsqrt", "sigmoid", "sin",
    "softmax", "sqrt", "sum", "tanh", "transpose", "value_and_grad", "verify", "vjp", "where",
]

