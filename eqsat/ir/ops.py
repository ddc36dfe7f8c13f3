"""The op table: one `OpDef` per op drives the printer, parser, verifier and interpreter.

Each entry knows its operand count, its attributes, how to infer its result type (raising
`OpTypeError` with the operand or attribute at fault) and its numpy implementation. Later
passes (AD, rules, backends) iterate over the derived sets at the bottom instead of naming ops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .types import DType, TensorType

Attrs = Mapping[str, Any]
Infer = Callable[[Sequence[TensorType], Attrs, "TensorType | None"], TensorType]
Impl = Callable[[list[np.ndarray], Attrs, TensorType], np.ndarray]

# Attribute kinds: how a value is written and checked.
INTS = "ints"  # [0,1]
INT = "int"  # 3
LITERAL = "literal"  # const's value, written where an operand would be
CALLEE = "callee"  # call's @f


class OpTypeError(Exception):
    """Raised by type inference; the verifier turns it into a located `VerifyError`."""

    def __init__(self, message: str, operand: int | None = None, attr: str | None = None):
        super().__init__(message)
        self.message = message
        self.operand = operand
        self.attr = attr


@dataclass(frozen=True)
class OpDef:
    """Everything eqsat knows about one op."""

    name: str
    family: str
    arity: int | None  # None: one or more operands
    infer: Infer
    impl: Impl | None
    attrs: tuple[tuple[str, str], ...] = ()
    traits: frozenset[str] = field(default_factory=frozenset)
    doc: str = ""

    @property
    def written_type(self) -> bool:
        """True when the result type comes from the text (broadcast, reshape, cast, const)."""
        return "written_type" in self.traits


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add an op to the table (later layers' fused and layout ops register here too)."""
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is already defined")
    OPS[op.name] = op
    return op


# ---------------------------------------------------------------- type-inference helpers


def _need_numeric(t: TensorType, op: str, i: int) -> None:
    if not t.dtype.is_numeric:
        raise OpTypeError(f"{op} needs a numeric operand, got {t} (cast it to i32 or f32 "
                          f"first, e.g. to count trues)", operand=i)


def _need_float(t: TensorType, op: str, i: int) -> None:
    if not t.dtype.is_float:
        raise OpTypeError(f"{op} needs a float operand (f32 or f64), got {t}", operand=i)


def _same_type(ins: Sequence[TensorType], op: str, first: int = 0) -> TensorType:
    t = ins[first]
    for i in range(first + 1, len(ins)):
        if ins[i] != t:
            raise OpTypeError(
                f"{op} needs operands of one type, got {t} and {ins[i]}"
                " (insert a broadcast or cast to make them agree)",
                operand=i,
            )
    return t


def _axes(attrs: Attrs, name: str, rank: int, op: str) -> tuple[int, ...]:
    axes = tuple(attrs[name])
    for a in axes:
        if not 0 <= a < rank:
            raise OpTypeError(f"{op}: axis {a} is out of range for rank {rank}", attr=name)
    if len(set(axes)) != len(axes):
        raise OpTypeError(f"{op}: repeated axis in {list(axes)}", attr=name)
    return axes


def _written(written: TensorType | None, op: str) -> TensorType:
    if written is None:
        raise OpTypeError(f"{op} needs its result type written")
    return written


# ---------------------------------------------------------------- elementwise


def _int_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer pow truncated like C: negative exponents give 0 except for bases 1 and -1."""
    neg = y < 0
    out = np.power(x, np.where(neg, 0, y))
    odd = (y % 2) != 0
    trunc = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0)).astype(x.dtype)
    return np.where(neg, trunc, out)


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":
        return np.floor_divide(x, y)
    return np.divide(x, y)


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """np.power element by element. Given a scalar exponent 0.5 (a 0-d array, a constant in a
    fused body) numpy computes sqrt instead, whose values differ at -inf (NaN, not inf) and
    -0.0 (-0.0, not 0.0): both operands go in as full arrays of at least one element."""
    if x.dtype.kind in "iu":
        return _int_pow(x, y)
    shape = np.broadcast_shapes(x.shape, y.shape)
    full = [np.ascontiguousarray(np.broadcast_to(a, shape)).reshape(-1) for a in (x, y)]
    return np.power(*full).reshape(shape)


def _float_const(x: np.ndarray, v: float) -> Any:
    return x.dtype.type(v)


UNARY_IMPLS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool, str]] = {
    # name: (numpy implementation, float only, doc)
    "neg": (np.negative, False, "-x"),
    "abs": (np.abs, False, "|x|"),
    "exp": (np.exp, True, "e^x"),
    "log": (np.log, True, "natural logarithm"),
    "sqrt": (np.sqrt, True, "square root"),
    "rsqrt": (lambda x: _float_const(x, 1.0) / np.sqrt(x), True, "1/sqrt(x)"),
    "tanh": (np.tanh, True, "hyperbolic tangent"),
    "sigmoid": (
        lambda x: _float_const(x, 1.0) / (_float_const(x, 1.0) + np.exp(-x)),
        True,
        "1/(1+exp(-x))",
    ),
    "relu": (lambda x: np.maximum(x, x.dtype.type(0)), False, "max(x, 0)"),
    "recip": (lambda x: _float_const(x, 1.0) / x, True, "1/x"),
    "sin": (np.sin, True, "sine"),
    "cos": (np.cos, True, "cosine"),
}

BINARY_IMPLS: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], bool, str]] = {
    # name: (numpy implementation, commutative, doc)
    "add": (np.add, True, "x + y"),
    "sub": (np.subtract, False, "x - y"),
    "mul": (np.multiply, True, "x * y"),
    "div": (_div, False, "x / y (floor division for integers)"),
    "pow": (_pow, False, "x ** y"),
    "maximum": (np.maximum, True, "elementwise max (NaN propagates)"),
    "minimum": (np.minimum, True, "elementwise min (NaN propagates)"),
}

COMPARE_IMPLS: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], bool]] = {
    "lt": (np.less, False),
    "le": (np.less_equal, False),
    "gt": (np.greater, False),
    "ge": (np.greater_equal, False),
    "eq": (np.equal, True),
    "ne": (np.not_equal, True),
}


def _unary_op(name: str, fn: Callable, float_only: bool, doc: str) -> OpDef:
    def infer(ins: Sequence[TensorType], attrs: Attrs, written: TensorType | None) -> TensorType:
        (_need_float if float_only else _need_numeric)(ins[0], name, 0)
        return ins[0]

    traits = frozenset({"elementwise", "unary", "differentiable"})
    return OpDef(name, "unary", 1, infer, lambda a, _, t: fn(a[0]), traits=traits, doc=doc)


def _binary_op(name: str, fn: Callable, commutative: bool, doc: str) -> OpDef:
    def infer(ins: Sequence[TensorType], attrs: Attrs, written: TensorType | None) -> TensorType:
        t = _same_type(ins, name)
        _need_numeric(t, name, 0)
        return t

    commutes = {"commutative"} if commutative else set()
    traits = {"elementwise", "binary", "differentiable"} | commutes
    return OpDef(name, "binary", 2, infer, lambda a, _, t: fn(a[0], a[1]),
                 traits=frozenset(traits), doc=doc)


def _compare_op(name: str, fn: Callable, commutative: bool) -> OpDef:
    def infer(ins: Sequence[TensorType], attrs: Attrs, written: TensorType | None) -> TensorType:
        return _same_type(ins, name).with_dtype(DType.bool)

    traits = {"elementwise", "compare"} | ({"commutative"} if commutative else set())
    return OpDef(name, "compare", 2, infer, lambda a, _, t: fn(a[0], a[1]),
                 traits=frozenset(traits), doc=f"numpy's {fn.__name__}, a bool result")


for _name, (_fn, _float_only, _doc) in UNARY_IMPLS.items():
    register(_unary_op(_name, _fn, _float_only, _doc))
for _name, (_fn, _comm, _doc) in BINARY_IMPLS.items():
    register(_binary_op(_name, _fn, _comm, _doc))
for _name, (_fn, _comm) in COMPARE_IMPLS.items():
    register(_compare_op(_name, _fn, _comm))


def _infer_select(ins: Sequence[TensorType], attrs: Attrs,
                  written: TensorType | None) -> TensorType:
    c = ins[0]
    if c.dtype is not DType.bool:
        raise OpTypeError(f"select's condition must be bool, got {c}", operand=0)
    t = _same_type(ins, "select", first=1)
    if c.shape != t.shape:
        raise OpTypeError(f"select's condition {c} must have the shape of its branches {t}",
                          operand=0)
    return t


register(OpDef("select", "select", 3, _infer_select, lambda a, _, t: np.where(a[0], a[1], a[2]),
               traits=frozenset({"elementwise", "differentiable"}), doc="np.where(c, x, y)"))


# ---------------------------------------------------------------- constants and layout


def literal_fits(value: Any, dtype: DType) -> str | None:
    """Why `value` cannot be a constant of `dtype`, or None if it can."""
    a = "an" if dtype.is_int else "a"
    if dtype is DType.bool:
        return None if isinstance(value, bool) else "a bool constant is written true or false"
    if isinstance(value, bool):
        return f"{a} {dtype} constant cannot be {str(value).lower()}"
    if dtype.is_int:
        if not isinstance(value, int):
            return f"an {dtype} constant needs an integer literal, got {value!r}"
        info = np.iinfo(dtype.np)
        if not info.min <= value <= info.max:
            return f"{value} does not fit in {dtype}"
        return None
    if not isinstance(value, float):
        return f"a {dtype} constant needs a float literal, got {value!r}"
    with np.errstate(over="ignore"):
        overflows = np.isfinite(value) and not np.isfinite(dtype.np.type(value))
    return float_overflow(repr(value), dtype) if overflows else None


def float_overflow(shown: str, dtype: DType,
                   then: str = "; write inf or -inf for an infinity") -> str:
    """The message for a finite number that `dtype` would round to infinity: a user who means
    infinity writes it, so a literal that only becomes one is a mistake, not a value."""
    largest = str(np.finfo(dtype.np).max)
    return f"{shown} overflows {dtype} (the largest finite {dtype} is {largest}){then}"


def _infer_const(ins: Sequence[TensorType], attrs: Attrs,
                 written: TensorType | None) -> TensorType:
    t = _written(written, "const")
    problem = literal_fits(attrs["value"], t.dtype)
    if problem:
        raise OpTypeError(problem, attr="value")
    return t


def _impl_const(a: list[np.ndarray], attrs: Attrs, t: TensorType) -> np.ndarray:
    return np.full(t.shape, attrs["value"], dtype=t.dtype.np)


register(OpDef("const", "const", 0, _infer_const, _impl_const, attrs=(("value", LITERAL),),
               traits=frozenset({"written_type"}), doc="every element the written value"))


def broadcastable(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """numpy's right-aligned rule: can `src` broadcast to exactly `dst`?"""
    if len(src) > len(dst):
        return False
    return all(s == d or s == 1 for s, d in zip(reversed(src), reversed(dst)))


def _infer_broadcast(ins: Sequence[TensorType], attrs: Attrs,
                     written: TensorType | None) -> TensorType:
    t = _written(written, "broadcast")
    x = ins[0]
    if x.dtype != t.dtype:
        raise OpTypeError(f"broadcast cannot change the dtype ({x} to {t}); use cast", operand=0)
    if not broadcastable(x.shape, t.shape):
        raise OpTypeError(f"cannot broadcast {x} to {t} (numpy's right-aligned rule)", operand=0)
    return t


register(OpDef("broadcast", "broadcast", 1, _infer_broadcast,
               lambda a, _, t: np.broadcast_to(a[0], t.shape).copy(),
               traits=frozenset({"written_type", "differentiable"}), doc="np.broadcast_to"))


def _reduce_op(name: str, fn: Callable) -> OpDef:
    def infer(ins: Sequence[TensorType], attrs: Attrs, written: TensorType | None) -> TensorType:
        x = ins[0]
        if name == "sum":
            _need_numeric(x, name, 0)
        axes = _axes(attrs, "axes", x.rank, name)
        if name != "sum":
            for a in axes:
                if x.shape[a] == 0:
                    raise OpTypeError(f"{name} over axis {a} of length 0 has no identity",
                                      attr="axes")
        return x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in axes))

    def impl(a: list[np.ndarray], attrs: Attrs, t: TensorType) -> np.ndarray:
        axes = tuple(attrs["axes"])
        if name == "sum":
            return np.sum(a[0], axis=axes, dtype=a[0].dtype)
        return fn(a[0], axis=axes)

    return OpDef(name, "reduce", 1, infer, impl, attrs=(("axes", INTS),),
                 traits=frozenset({"reduction", "differentiable"}),
                 doc=f"np.{fn.__name__} over axes")


for _name, _fn in (("sum", np.sum), ("max", np.max), ("min", np.min)):
    register(_reduce_op(_name, _fn))


def _infer_matmul(ins: Sequence[TensorType], attrs: Attrs,
                  written: TensorType | None) -> TensorType:
    a, b = ins
    for i, t in enumerate(ins):
        _need_numeric(t, "matmul", i)
        if t.rank < 2:
            raise OpTypeError(f"matmul needs operands of rank >= 2, got {t}", operand=i)
    if a.dtype != b.dtype:
        raise OpTypeError(f"matmul needs operands of one dtype, got {a} and {b}", operand=1)
    if a.rank != b.rank or a.shape[:-2] != b.shape[:-2]:
        raise OpTypeError(f"matmul needs equal batch dimensions, got {a} and {b}", operand=1)
    if a.shape[-1] != b.shape[-2]:
        raise OpTypeError(f"matmul: inner dimensions differ ({a} @ {b}: "
                          f"{a.shape[-1]} != {b.shape[-2]})", operand=1)
    return a.with_shape(a.shape[:-1] + (b.shape[-1],))


register(OpDef("matmul", "matmul", 2, _infer_matmul, lambda a, _, t: np.matmul(a[0], a[1]),
               traits=frozenset({"differentiable"}), doc="np.matmul with equal batch dimensions"))


def _infer_transpose(ins: Sequence[TensorType], attrs: Attrs,
                     written: TensorType | None) -> TensorType:
    x = ins[0]
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise OpTypeError(f"transpose: perm {list(perm)} is not a permutation of 0..{x.rank - 1}",
                          attr="perm")
    return x.with_shape(tuple(x.shape[p] for p in perm))


register(OpDef("transpose", "transpose", 1, _infer_transpose,
               lambda a, attrs, t: np.transpose(a[0], attrs["perm"]).copy(),  # C order, 0-d kept
               attrs=(("perm", INTS),), traits=frozenset({"differentiable", "layout"}),
               doc="np.transpose(x, perm)"))


def _infer_reshape(ins: Sequence[TensorType], attrs: Attrs,
                   written: TensorType | None) -> TensorType:
    t = _written(written, "reshape")
    x = ins[0]
    if x.dtype != t.dtype:
        raise OpTypeError(f"reshape cannot change the dtype ({x} to {t}); use cast", operand=0)
    if x.size != t.size:
        raise OpTypeError(f"reshape must keep the element count: {x} has {x.size}, {t} has "
                          f"{t.size}", operand=0)
    return t


register(OpDef("reshape", "reshape", 1, _infer_reshape,
               lambda a, _, t: a[0].reshape(t.shape).copy(),
               traits=frozenset({"written_type", "differentiable", "layout"}),
               doc="row-major reshape"))


def _infer_slice(ins: Sequence[TensorType], attrs: Attrs,
                 written: TensorType | None) -> TensorType:
    x = ins[0]
    start, stop = tuple(attrs["start"]), tuple(attrs["stop"])
    for name, v in (("start", start), ("stop", stop)):
        if len(v) != x.rank:
            raise OpTypeError(f"slice: {name} has {len(v)} entries, operand {x} has rank {x.rank}",
                              attr=name)
    for i, (s, e, d) in enumerate(zip(start, stop, x.shape)):
        if not 0 <= s <= e <= d:
            raise OpTypeError(f"slice: axis {i} needs 0 <= start <= stop <= {d}, got {s}:{e}",
                              attr="start" if not 0 <= s <= d else "stop")
    return x.with_shape(tuple(e - s for s, e in zip(start, stop)))


register(OpDef("slice", "slice", 1, _infer_slice,
               lambda a, attrs, t: a[0][tuple(
                   slice(s, e) for s, e in zip(attrs["start"], attrs["stop"]))].copy(),
               attrs=(("start", INTS), ("stop", INTS)), traits=frozenset({"differentiable"}),
               doc="x[start:stop] per axis"))


def _infer_concat(ins: Sequence[TensorType], attrs: Attrs,
                  written: TensorType | None) -> TensorType:
    first = ins[0]
    axis = attrs["axis"]
    if not 0 <= axis < first.rank:
        raise OpTypeError(f"concat: axis {axis} is out of range for rank {first.rank}", attr="axis")
    total = 0
    for i, t in enumerate(ins):
        if t.dtype != first.dtype or t.rank != first.rank or any(
            d != e for j, (d, e) in enumerate(zip(t.shape, first.shape)) if j != axis
        ):
            raise OpTypeError(f"concat along axis {axis}: {t} does not fit {first}", operand=i)
        total += t.shape[axis]
    return first.with_shape(first.shape[:axis] + (total,) + first.shape[axis + 1 :])


register(OpDef("concat", "concat", None, _infer_concat,
               lambda a, attrs, t: np.concatenate(a, axis=attrs["axis"]),
               attrs=(("axis", INT),), traits=frozenset({"differentiable"}), doc="np.concatenate"))


def _infer_cast(ins: Sequence[TensorType], attrs: Attrs,
                written: TensorType | None) -> TensorType:
    t = _written(written, "cast")
    if ins[0].shape != t.shape:
        raise OpTypeError(f"cast keeps the shape: {ins[0]} cannot become {t}", operand=0)
    return t


register(OpDef("cast", "cast", 1, _infer_cast, lambda a, _, t: a[0].astype(t.dtype.np),
               traits=frozenset({"written_type", "elementwise", "differentiable"}),
               doc="x.astype(dtype)"))


def _infer_call(ins: Sequence[TensorType], attrs: Attrs,
                written: TensorType | None) -> TensorType:
    raise OpTypeError("call is typed by the verifier from its callee's signature")


register(OpDef("call", "call", None, _infer_call, None, attrs=(("callee", CALLEE),),
               traits=frozenset({"differentiable"}), doc="call @f(args)"))


# ---------------------------------------------------------------- derived sets


def lookup(table: Mapping[str, Any], op_name: str) -> Any:
    """The entry of a per-op table (a backend's kernels, ...) for `op_name`: by name first, then
    by the op's family, or None."""
    op = OPS.get(op_name)
    return table.get(op_name) or (table.get(op.family) if op is not None else None)


def ops_with(trait: str) -> frozenset[str]:
    """Names of the ops carrying `trait` (read at call time, so later registrations count)."""
    return frozenset(name for name, op in OPS.items() if trait in op.traits)


def ops_in(family: str) -> frozenset[str]:
    """Names of the ops of one family ("unary", "binary", "compare", "reduce", ...)."""
    return frozenset(name for name, op in OPS.items() if op.family == family)


UNARY = ops_in("unary")
BINARY = ops_in("binary")
COMPARE = ops_in("compare")
REDUCTIONS = ops_in("reduce")
ELEMENTWISE = ops_with("elementwise")
COMMUTATIVE = ops_with("commutative")
CORE_OPS = frozenset(OPS)
