"""A small arithmetic vocabulary over llvmlite's IRBuilder for writing branch-free math kernels.

Kernels read like the formulas they implement (`e.fma(n, c, x)`, `e.sel(e.lt(x, 0), a, b)`).
Only operations that LLVM's loop vectorizer widens are offered: IEEE arithmetic without
fast-math flags (so that LLVM keeps our rounding), selects, integer ops on the bit pattern, and
the intrinsics fma, fabs, floor, rint, copysign, sqrt, lrint and ldexp.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import llvmlite.binding as llvm
from llvmlite import ir

from .scalar import declare

Value = ir.Value


@functools.cache
def native_ldexp(triple: str) -> bool:
    """Whether kernels for `triple` may use `lrint` and `ldexp` as single instructions: on the
    host with AVX-512 (vcvtps2dq, vscalefps). NVPTX has no lrint lowering and only a long
    generic expansion of ldexp; x86 without AVX-512 expands ldexp too."""
    if triple.startswith("nvptx"):
        return False
    return "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")


class Emit:
    """Emits scalar code of one float type (f32 or f64) at a builder's insertion point."""

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type):
        self.b = builder
        self.ty = ty
        self.bits = 64 if isinstance(ty, ir.DoubleType) else 32
        self.ity = ir.IntType(self.bits)
        self.mant = 52 if self.bits == 64 else 23  # explicit mantissa bits
        self.bias = 1023 if self.bits == 64 else 127
        self.native_ldexp = native_ldexp(str(builder.module.triple))

    def at(self, ty: ir.Type) -> Emit:
        """The same builder, emitting another float type (f32 kernels that work in f64)."""
        return Emit(self.b, ty)

    # constants
    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, float(v))

    def ci(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, v)

    def _v(self, x: Value | float) -> Value:
        return x if isinstance(x, ir.Value) else self.c(x)

    # IEEE arithmetic (no fast-math flags: every rounding is the one written)
    def add(self, a: Value | float, b: Value | float) -> Value:
        return self.b.fadd(self._v(a), self._v(b))

    def sub(self, a: Value | float, b: Value | float) -> Value:
        return self.b.fsub(self._v(a), self._v(b))

    def mul(self, a: Value | float, b: Value | float) -> Value:
        return self.b.fmul(self._v(a), self._v(b))

    def div(self, a: Value | float, b: Value | float) -> Value:
        return self.b.fdiv(self._v(a), self._v(b))

    def neg(self, a: Value) -> Value:
        return self.b.fneg(a)

    # intrinsics that have vector forms on every target
    def _intr(self, name: str, *args: Value) -> Value:
        module = self.b.module
        suffix = "f64" if self.bits == 64 else "f32"
        fn = declare(module, f"llvm.{name}.{suffix}", self.ty, [self.ty] * len(args))
        return self.b.call(fn, list(args))

    def fma(self, a: Value | float, b: Value | float, c: Value | float) -> Value:
        return self._intr("fma", self._v(a), self._v(b), self._v(c))

    def fabs(self, a: Value) -> Value:
        return self._intr("fabs", a)

    def floor(self, a: Value) -> Value:
        return self._intr("floor", a)

    def rint(self, a: Value) -> Value:
        return self._intr("rint", a)

    def sqrt(self, a: Value) -> Value:
        return self._intr("sqrt", a)

    def copysign(self, mag: Value, sign: Value) -> Value:
        return self._intr("copysign", mag, sign)

    def horner(self, x: Value, coeffs: Sequence[float]) -> Value:
        """sum coeffs[k] * x^k, lowest degree first, by fused multiply-adds."""
        acc: Value = self.c(coeffs[-1])
        for a in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, a)
        return acc

    # comparisons: ordered ones are false on NaN, so a select keeps the NaN branch
    def _cmp(self, op: str, a: Value | float, b: Value | float) -> Value:
        return self.b.fcmp_ordered(op, self._v(a), self._v(b))

    def lt(self, a: Value | float, b: Value | float) -> Value:
        return self._cmp("<", a, b)

    def le(self, a: Value | float, b: Value | float) -> Value:
        return self._cmp("<=", a, b)

    def gt(self, a: Value | float, b: Value | float) -> Value:
        return self._cmp(">", a, b)

    def ge(self, a: Value | float, b: Value | float) -> Value:
        return self._cmp(">=", a, b)

    def eq(self, a: Value | float, b: Value | float) -> Value:
        return self._cmp("==", a, b)

    def ugt(self, a: Value | float, b: Value | float) -> Value:
        """a > b, or either is NaN."""
        return self.b.fcmp_unordered(">", self._v(a), self._v(b))

    def ne_or_nan(self, a: Value | float, b: Value | float) -> Value:
        return self.b.fcmp_unordered("!=", self._v(a), self._v(b))

    def isnan(self, a: Value) -> Value:
        return self.b.fcmp_unordered("uno", a, a)

    def and_(self, a: Value, b: Value) -> Value:
        return self.b.and_(a, b)

    def or_(self, a: Value, b: Value) -> Value:
        return self.b.or_(a, b)

    def not_(self, a: Value) -> Value:
        return self.b.not_(a)

    def sel(self, cond: Value, a: Value | float, b: Value | float) -> Value:
        return self.b.select(cond, self._v(a), self._v(b))

    # the bit pattern, for exponent manipulation
    def to_bits(self, x: Value) -> Value:
        return self.b.bitcast(x, self.ity)

    def from_bits(self, i: Value) -> Value:
        return self.b.bitcast(i, self.ty)

    def to_int(self, x: Value) -> Value:
        """fptosi; callers guarantee x is finite and in range."""
        return self.b.fptosi(x, self.ity)

    def to_float(self, i: Value) -> Value:
        return self.b.sitofp(i, self.ty)

    def pow2i(self, k: Value) -> Value:
        """2^k for an integer k in the normal exponent range, built from its bits."""
        return self.from_bits(self.b.shl(self.b.add(k, self.ci(self.bias)), self.ci(self.mant)))

    def _decl(self, full: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return declare(self.b.module, full, ret, args)

    def lrint(self, x: Value) -> Value:
        """x rounded to the nearest integer (ties to even), as i32 (one vcvtps2dq; rint and a
        conversion where lrint has no lowering); callers guarantee x is finite and well
        inside the i32 range."""
        i32 = ir.IntType(32)
        if not self.native_ldexp:
            return self.b.fptosi(self.rint(x), i32)
        suffix = "f64" if self.bits == 64 else "f32"
        return self.b.call(self._decl(f"llvm.lrint.i32.{suffix}", i32, [self.ty]), [x])

    def ldexp(self, x: Value, n: Value) -> Value:
        """x * 2^n for an i32 n, rounded once (subnormal results included, overflow to inf):
        `llvm.ldexp`, one vscalefps on AVX-512."""
        suffix = "f64" if self.bits == 64 else "f32"
        fn = self._decl(f"llvm.ldexp.{suffix}.i32", self.ty, [self.ty, ir.IntType(32)])
        return self.b.call(fn, [x, n])

    def widen(self, x: Value, ty: ir.Type) -> Value:
        return self.b.fpext(x, ty)

    def narrow(self, x: Value, ty: ir.Type) -> Value:
        return self.b.fptrunc(x, ty)

    # double-double helpers (error-free transformations)
    def two_prod(self, a: Value, b: Value) -> tuple[Value, Value]:
        p = self.mul(a, b)
        return p, self.fma(a, b, self.neg(p))

    def two_sum(self, a: Value, b: Value) -> tuple[Value, Value]:
        s = self.add(a, b)
        bb = self.sub(s, a)
        return s, self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))

    def fast_two_sum(self, a: Value, b: Value) -> tuple[Value, Value]:
        """Exact a + b = s + e, valid when |a| >= |b| (or a == 0)."""
        s = self.add(a, b)
        return s, self.sub(b, self.sub(s, a))
