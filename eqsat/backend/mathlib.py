"""Vectorizable math functions of our own, as LLVM IR functions the CPU backend calls.

`define(module, "exp", ir.FloatType())` adds (once per module) an internal, alwaysinline,
branch-free function `eqsat.exp.f32`: only arithmetic, selects, bit casts and the intrinsics
fma/fabs/floor/rint/copysign/sqrt, so that after inlining LLVM's loop vectorizer widens a loop
that calls it (to <16 x float> with AVX-512). Results follow numpy's semantics (the reference
interpreter's formulas) including inf, NaN, -0.0, subnormals and the overflow / underflow
thresholds, within a few ulp (see tests/test_mathlib.py for the measured bounds).

Kernels live in mathlib_explog.py (exp, log, tanh, sigmoid, pow) and mathlib_trig.py
(sin, cos); their polynomial coefficients are fitted in mathlib_fit.py. sin and cos also
have small-argument variants (`SMALL_VARIANTS`) that kernels use in a first pass, with a
second, full pass where some argument needs it (`FastTrig`, loops.with_trig_fallback).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from llvmlite import ir

from eqsat.backend import mathlib_explog as explog
from eqsat.backend import mathlib_trig as trig
from eqsat.backend.mathlib_emit import Emit, Value
from eqsat.backend.scalar import internal_function
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
# function -> its small-argument variant (see FastTrig); variants are not in NAMES
SMALL_VARIANTS = {"sin": "sin_small", "cos": "cos_small"}
NAMES = tuple(KERNELS)
KERNELS.update({"sin_small": (1, trig.sin_small), "cos_small": (1, trig.cos_small)})


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
    if name not in KERNELS:  # the small variants are accepted too
        raise Error(f"no math function {name!r}; the math library has {', '.join(NAMES)}")
    arity, kernel = KERNELS[name]
    fn, new = internal_function(module, function_name(name, ty),
                                ir.FunctionType(ty, [ty] * arity), ("alwaysinline", "nounwind"))
    if not new:
        return fn
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(kernel(Emit(builder, ty), *fn.args))
    return fn


class FastTrig:
    """While one kernel's fast pass is emitted (`fast_trig`), `call` stands in for sin and cos:
    it emits their small-argument variant and ORs into an i8 flag, zeroed in the kernel's
    entry, whether the element needs the full function (|x| >= SMALL_LIMIT, finite). LLVM
    promotes the flag to an `or` reduction, so the loop still vectorizes."""

    def __init__(self, fn: ir.Function):
        self.fn = fn
        self.flag: ir.AllocaInstr | None = None  # created on the first sin or cos

    def call(self, b: ir.IRBuilder, name: str, x: Value) -> Value | None:
        """The variant's value for `x`, or None where `name` has no variant (or `b` builds
        another function)."""
        if name not in SMALL_VARIANTS or b.function is not self.fn:
            return None
        i8 = ir.IntType(8)
        if self.flag is None:
            with b.goto_entry_block():
                self.flag = b.alloca(i8, name="trig.full")
                b.store(ir.Constant(i8, 0), self.flag)
        e = Emit(b, x.type)
        ax, limit = e.fabs(x), e.c(trig.SMALL_LIMIT[e.bits])
        # NaN and +-inf are left out: both versions return the same NaN constant for them
        need = b.and_(b.fcmp_ordered(">=", ax, limit),
                      b.fcmp_ordered("!=", ax, ir.Constant(x.type, float("inf"))))
        b.store(b.or_(b.load(self.flag), b.zext(need, i8)), self.flag)
        return b.call(define(b.module, SMALL_VARIANTS[name], x.type), [x])


_ACTIVE: contextvars.ContextVar[FastTrig | None] = contextvars.ContextVar("fast_trig", default=None)


@contextmanager
def fast_trig(fn: ir.Function) -> Iterator[FastTrig]:
    """Within the block, sin and cos emitted into `fn` by scalar.math_call use the small
    variants and record in the yielded FastTrig's flag whether that was wrong somewhere."""
    token = _ACTIVE.set(FastTrig(fn))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)


def active_fast_trig() -> FastTrig | None:
    """The FastTrig of the enclosing `fast_trig` block, if any."""
    return _ACTIVE.get()
