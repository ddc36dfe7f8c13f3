"""Scalar LLVM code for one element of every elementwise op: the bodies of all loop kernels.

Each op family has a small table from op name to an emitter `(builder, args, dtype) -> value`;
`emit_scalar` is the one dispatcher. Values follow numpy's semantics exactly as
`eqsat.ir.ops` defines them (floor division with 0 for division by zero, C-truncated integer
pow, NaN-propagating maximum/minimum). Bools live in registers as i8 0/1, as in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from ..errors import Error
from ..ir.types import DType

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)

LLVM_TYPES: dict[DType, ir.Type] = {
    DType.f32: ir.FloatType(),
    DType.f64: ir.DoubleType(),
    DType.i32: I32,
    DType.i64: I64,
    DType.bool: I8,
}

# Names the math library provides as vectorizable code; the fallbacks below are LLVM intrinsics.
MATH_NAMES = ("exp", "log", "tanh", "sigmoid", "sin", "cos", "sqrt", "rsqrt", "pow")


class LoweringError(Error):
    """An op or dtype the CPU backend cannot lower; names the op."""


def llvm_type(dtype: DType) -> ir.Type:
    """The LLVM type an element of `dtype` has in memory and in registers."""
    return LLVM_TYPES[dtype]


def const(ty: ir.Type, value: float | int) -> ir.Constant:
    """A constant of an LLVM scalar type."""
    return ir.Constant(ty, value)


def declare(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type],
            var_arg: bool = False) -> ir.Function:
    """An external or intrinsic function, declared once per module."""
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, list(args), var_arg=var_arg), name)
    return fn


def internal_function(module: ir.Module, name: str, fnty: ir.FunctionType,
                      attrs: Sequence[str] = ()) -> tuple[ir.Function, bool]:
    """The module's internal function `name` and whether it was created now, with `attrs`
    (then the caller emits its body): a helper that many kernels call is defined once."""
    fn = module.globals.get(name)
    if fn is not None:
        return fn, False
    fn = ir.Function(module, fnty, name)
    fn.linkage = "internal"
    for attr in attrs:
        fn.attributes.add(attr)
    return fn, True


def _suffix(ty: ir.Type) -> str:
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    return f"i{ty.width}"


def intrinsic(b: ir.IRBuilder, name: str, *args: ir.Value,
              flags: tuple[str, ...] = ()) -> ir.Value:
    """Call `llvm.<name>.<type>` on scalars of one type, with fast-math `flags`."""
    ty = args[0].type
    fn = declare(b.module, f"llvm.{name}.{_suffix(ty)}", ty, [a.type for a in args])
    return b.call(fn, list(args), fastmath=flags)


# False makes every math function an LLVM intrinsic (scalar libm calls): a reference point.
USE_MATHLIB = True


def _mathlib():
    if not USE_MATHLIB:
        return None
    try:
        from . import mathlib
    except ImportError:
        return None
    return mathlib if hasattr(mathlib, "define") else None


def math_call(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """A math function: the vectorizable mathlib version when it exists, else an intrinsic."""
    lib = _mathlib()
    ty = args[0].type
    if lib is not None:
        # inside a kernel's fast pass (loops.with_trig_fallback): sin/cos's cheap variant
        fast = lib.active_fast_trig()
        value = fast.call(b, name, args[0]) if fast is not None else None
        return value if value is not None else b.call(lib.define(b.module, name, ty), list(args))
    one = const(ty, 1.0)
    if name == "sigmoid":
        e = intrinsic(b, "exp", b.fneg(args[0]))
        return b.fdiv(one, b.fadd(one, e))
    if name == "rsqrt":
        return b.fdiv(one, intrinsic(b, "sqrt", args[0]))
    return intrinsic(b, name, *args)


# ---------------------------------------------------------------- unary


def _float_max(b: ir.IRBuilder, x: ir.Value, y: ir.Value, cmp: str = ">") -> ir.Value:
    """numpy's maximum (with `cmp` "<": minimum): x where x is NaN, else x if x > y else y, so
    ties (-0, +0) give y, as numpy does; a vmaxps and a NaN blend where LLVM's
    llvm.maximum orders the zeros and costs seven instructions."""
    pick = b.select(b.fcmp_ordered(cmp, x, y), x, y)
    return b.select(b.fcmp_unordered("uno", x, x), x, pick)


def _float_relu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _float_max(b, x, const(x.type, 0.0))


FLOAT_UNARY: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {
    "neg": lambda b, x: b.fneg(x),
    "abs": lambda b, x: intrinsic(b, "fabs", x),
    "relu": _float_relu,
    "recip": lambda b, x: b.fdiv(const(x.type, 1.0), x),
    **{name: (lambda n: lambda b, x: math_call(b, n, x))(name)
       for name in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos")},
}

INT_UNARY: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {
    "neg": lambda b, x: b.sub(const(x.type, 0), x),
    # abs(INT_MIN) wraps to INT_MIN as in numpy: the intrinsic's poison flag stays off.
    "abs": lambda b, x: b.call(declare(b.module, f"llvm.abs.{_suffix(x.type)}", x.type,
                                       [x.type, I1]), [x, const(I1, 0)]),
    "relu": lambda b, x: intrinsic(b, "smax", x, const(x.type, 0)),
}


# ---------------------------------------------------------------- binary


def _floor_div(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """numpy's integer floor_divide: 0 for y == 0, -x (wrapping) for y == -1, no traps."""
    ty = x.type
    zero, one, minus1 = const(ty, 0), const(ty, 1), const(ty, -1)
    y_zero = b.icmp_signed("==", y, zero)
    y_m1 = b.icmp_signed("==", y, minus1)
    safe = b.select(b.or_(y_zero, y_m1), one, y)
    q = b.sdiv(x, safe)
    r = b.srem(x, safe)
    # Truncation rounds toward zero; floor needs one less when the remainder's sign differs.
    adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
    q = b.sub(q, b.zext(adjust, ty))
    q = b.select(y_m1, b.sub(zero, x), q)
    return b.select(y_zero, zero, q)


def _int_pow(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """Square-and-multiply without branches (vectorizable); C truncation for y < 0."""
    ty = x.type
    zero, one = const(ty, 0), const(ty, 1)
    negative = b.icmp_signed("<", y, zero)
    e = b.select(negative, zero, y)
    result, base = one, x
    for k in range(ty.width - 1):
        bit = b.icmp_signed("!=", b.and_(b.lshr(e, const(ty, k)), one), zero)
        result = b.select(bit, b.mul(result, base), result)
        if k < ty.width - 2:
            base = b.mul(base, base)
    odd = b.icmp_signed("!=", b.and_(y, one), zero)
    minus = b.select(odd, const(ty, -1), one)
    trunc = b.select(b.icmp_signed("==", x, one), one,
                     b.select(b.icmp_signed("==", x, const(ty, -1)), minus, zero))
    return b.select(negative, trunc, result)


FLOAT_BINARY: dict[str, Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]] = {
    "add": lambda b, x, y: b.fadd(x, y),
    "sub": lambda b, x, y: b.fsub(x, y),
    "mul": lambda b, x, y: b.fmul(x, y),
    "div": lambda b, x, y: b.fdiv(x, y),
    "pow": lambda b, x, y: math_call(b, "pow", x, y),
    "maximum": _float_max,
    "minimum": lambda b, x, y: _float_max(b, x, y, "<"),
}

INT_BINARY: dict[str, Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]] = {
    "add": lambda b, x, y: b.add(x, y),
    "sub": lambda b, x, y: b.sub(x, y),
    "mul": lambda b, x, y: b.mul(x, y),
    "div": _floor_div,
    "pow": _int_pow,
    "maximum": lambda b, x, y: intrinsic(b, "smax", x, y),
    "minimum": lambda b, x, y: intrinsic(b, "smin", x, y),
}

COMPARE_SYMBOLS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _compare(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: DType) -> ir.Value:
    sym = COMPARE_SYMBOLS[op]
    if dtype.is_float:
        # numpy: every comparison with NaN is False except !=, which is True.
        bit = b.fcmp_unordered(sym, x, y) if op == "ne" else b.fcmp_ordered(sym, x, y)
    elif dtype is DType.bool:
        bit = b.icmp_unsigned(sym, x, y)
    else:
        bit = b.icmp_signed(sym, x, y)
    return b.zext(bit, I8)


# ---------------------------------------------------------------- cast


def _float_to_int(b: ir.IRBuilder, x: ir.Value, ty: ir.IntType) -> ir.Value:
    """fptosi where defined; numpy on x86 gives INT_MIN for NaN and out-of-range values."""
    lo = const(x.type, -(2.0 ** (ty.width - 1)))
    hi = const(x.type, 2.0 ** (ty.width - 1))
    ok = b.and_(b.fcmp_ordered(">=", x, lo), b.fcmp_ordered("<", x, hi))
    # Clamp first so the conversion itself never sees an out-of-range value (poison).
    safe = b.select(ok, x, const(x.type, 0.0))
    return b.select(ok, b.fptosi(safe, ty), const(ty, -(2 ** (ty.width - 1))))


def cast(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """numpy's `astype` for one element."""
    if src is dst:
        return x
    ty = llvm_type(dst)
    if dst is DType.bool:
        bit = (b.fcmp_unordered("!=", x, const(x.type, 0.0)) if src.is_float
               else b.icmp_signed("!=", x, const(x.type, 0)))
        return b.zext(bit, I8)
    if src is DType.bool:
        return b.uitofp(x, ty) if dst.is_float else b.zext(x, ty)
    if src.is_float and dst.is_float:
        return b.fpext(x, ty) if dst.itemsize > src.itemsize else b.fptrunc(x, ty)
    if src.is_int and dst.is_int:
        return b.sext(x, ty) if dst.itemsize > src.itemsize else b.trunc(x, ty)
    if src.is_int:
        return b.sitofp(x, ty)
    return _float_to_int(b, x, ty)


# ---------------------------------------------------------------- the dispatcher


def emit_scalar(b: ir.IRBuilder, op: str, args: Sequence[ir.Value], dtype: DType,
                out: DType | None = None) -> ir.Value:
    """One element of elementwise op `op`; `dtype` is the operands' dtype (the branches' for
    select), `out` the result dtype (needed by cast)."""
    if op in FLOAT_UNARY and len(args) == 1 and dtype.is_float:
        return FLOAT_UNARY[op](b, args[0])
    if op in INT_UNARY and len(args) == 1 and dtype.is_int:
        return INT_UNARY[op](b, args[0])
    if op in FLOAT_BINARY and len(args) == 2 and dtype.is_float:
        return FLOAT_BINARY[op](b, args[0], args[1])
    if op in INT_BINARY and len(args) == 2 and dtype.is_int:
        return INT_BINARY[op](b, args[0], args[1])
    if op in COMPARE_SYMBOLS:
        return _compare(b, op, args[0], args[1], dtype)
    if op == "select":
        return b.select(b.icmp_unsigned("!=", args[0], const(I8, 0)), args[1], args[2])
    if op == "cast":
        if out is None:
            raise LoweringError("cast needs its result dtype")
        return cast(b, args[0], dtype, out)
    raise LoweringError(f"the CPU backend cannot lower elementwise op {op!r} on {dtype}")
