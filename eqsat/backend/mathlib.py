"""Vectorizable math functions of our own, as LLVM IR functions the CPU backend calls.

`define(module, "exp", ir.FloatType())` adds (once per module) an internal, alwaysinline,
branch-free function `eqsat.exp.f32`: only arithmetic, selects, bit casts and the intrinsics
fma/fabs/floor/rint/copysign/sqrt, so that after inlining LLVM's loop vectorizer widens a loop
that calls it (to <16 x float> with AVX-512). Results follow numpy's semantics (the reference
interpreter's formulas) including inf, NaN, -0.0, subnormals and the overflow / underflow
thresholds, within a few ulp (see tests/test_mathlib.py for the measured bounds).

Kernels live in mathlib_explog.py (exp, log, tanh, sigmoid, pow) and mathlib_trig.py
(sin, cos); their polynomial coefficients are fitted in mathlib_fit.py.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from eqsat.backend import mathlib_explog as explog
from eqsat.backend import mathlib_trig as trig
from eqsat.backend.mathlib_emit import Emit, Value
from eqsat.errors import Error


def _sqrt(e: Emit, x: Value) -> Value:
    return e.sqrt(x)


def _rsqrt(e: Emit, x: Value) -> Value:
    # two roundings, exactly as numpy's 1/np.sqrt(x) (no fast reciprocal estimate)
    return e.div(1.0, e.sqrt(x))


def _recip(e: Emit, x: Value) -> Value:
    return e.div(1.0, x)


# name -> (number of operands, kernel); the kernel emits the body for one float type.
KERNELS: dict[str, tuple[int, Callable[..., Value]]] = {
    "exp": (1, explog.exp_),
    "log": (1, explog.log),
    "tanh": (1, explog.tanh),
    "sigmoid": (1, explog.sigmoid),
    "sin": (1, trig.sin),
    "cos": (1, trig.cos),
    "sqrt": (1, _sqrt),
    "rsqrt": (1, _rsqrt),
    "recip": (1, _recip),
    "pow": (2, explog.pow_),
}
NAMES = tuple(KERNELS)


def function_name(name: str, ty: ir.Type) -> str:
    """The symbol `define` gives a function, e.g. `eqsat.exp.f32`."""
    return f"eqsat.{name}.{_suffix(ty)}"


def _suffix(ty: ir.Type) -> str:
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    raise Error(f"the math library has f32 and f64 versions only, not {ty}")


def define(module: ir.Module, name: str, ty: ir.Type) -> ir.Function:
    """The function computing `name` (one of NAMES) on `ty` (ir.FloatType() or
    ir.DoubleType()) in `module`, created on first use and reused after."""
    if name not in KERNELS:
        raise Error(f"no math function {name!r}; the math library has {', '.join(NAMES)}")
    symbol = function_name(name, ty)
    existing = module.globals.get(symbol)
    if existing is not None:
        return existing
    arity, kernel = KERNELS[name]
    fn = ir.Function(module, ir.FunctionType(ty, [ty] * arity), symbol)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(kernel(Emit(builder, ty), *fn.args))
    return fn
