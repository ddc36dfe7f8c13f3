"""The VJP rules: one entry per differentiable op, each emitting a few statements.

A rule takes the builder, the primal statement and the name of its result's adjoint `g`, and
returns one adjoint contribution per operand (None where an operand gets no gradient: a select's
condition, a value that does not influence the result). Primal values (operands and the result)
are used by name, never recomputed. Conventions follow JAX: relu'(0) = abs'(0) = 0, ties in
`maximum`/`minimum`/`max`/`min` share the gradient equally, d(x^y)/dy = log(x) * x^y.

`call` and the fused kernels (`map`, `matmul_t`, ...) have no rule here: the reverse pass
first inlines callees and expands fused kernels into core ops (`inline.py`), so the adjoint of
a call is the adjoint of the callee's body, with its primal values reused.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Stmt
from .builder import Builder

Contribs = tuple[str | None, ...]
Rule = Callable[[Builder, Stmt, str], Contribs]
UnaryRule = Callable[[Builder, str, str, str], str]  # (b, x, y, g) -> x's contribution
BinaryRule = Callable[[Builder, str, str, str, str], tuple[str, str]]  # (b, x, y, out, g)


# ---------------------------------------------------------------- elementwise, unary: y = f(x)

def _abs(b: Builder, x: str, y: str, g: str) -> str:
    zero = b.const(0.0, x)
    neg_part = b.where(b.emit("lt", x, zero), b.neg(g))
    return b.select(b.emit("gt", x, zero), g, neg_part)


def _rsqrt(b: Builder, x: str, y: str, g: str) -> str:  # d x^(-1/2) = -1/2 * y / x
    return b.mul(g, b.mul(b.div(y, x), b.const(-0.5, x)))


UNARY: dict[str, UnaryRule] = {
    "neg": lambda b, x, y, g: b.neg(g),
    "abs": _abs,
    "exp": lambda b, x, y, g: b.mul(g, y),
    "log": lambda b, x, y, g: b.div(g, x),
    "sqrt": lambda b, x, y, g: b.div(g, b.add(y, y)),
    "rsqrt": _rsqrt,
    "tanh": lambda b, x, y, g: b.mul(g, b.sub(b.const(1.0, y), b.mul(y, y))),
    "sigmoid": lambda b, x, y, g: b.mul(g, b.mul(y, b.sub(b.const(1.0, y), y))),
    "relu": lambda b, x, y, g: b.where(b.emit("gt", x, b.const(0.0, x)), g),
    "recip": lambda b, x, y, g: b.neg(b.mul(g, b.mul(y, y))),
    "sin": lambda b, x, y, g: b.mul(g, b.emit("cos", x)),
    "cos": lambda b, x, y, g: b.neg(b.mul(g, b.emit("sin", x))),
}


# ---------------------------------------------------------------- elementwise, binary: out = x op y

def _div(b: Builder, x: str, y: str, out: str, g: str) -> tuple[str, str]:
    gx = b.div(g, y)  # d(x/y)/dy = -(x/y)/y: reuse g/y for both
    return gx, b.neg(b.mul(gx, out))


def _pow(b: Builder, x: str, y: str, out: str, g: str) -> tuple[str, str]:
    # d/dx = y * x^(y-1), defined as 0 where y == 0 (JAX), so 0^0 does not give 0 * inf.
    zero = b.const(0.0, y)
    slope = b.mul(y, b.emit("pow", x, b.sub(y, b.const(1.0, y))))
    gx = b.mul(g, b.select(b.emit("eq", y, zero), zero, slope))
    # d/dy = log(x) * x^y, with log(0) read as log(1) so that 0^y contributes 0, not NaN (JAX)
    safe_x = b.select(b.emit("eq", x, zero), b.const(1.0, x), x)
    return gx, b.mul(g, b.mul(b.emit("log", safe_x), out))


def _maximum(b: Builder, x: str, y: str, out: str, g: str) -> tuple[str, str]:
    return _extremum(b, b.emit("ge", x, y), b.emit("le", x, y), g)


def _minimum(b: Builder, x: str, y: str, out: str, g: str) -> tuple[str, str]:
    return _extremum(b, b.emit("le", x, y), b.emit("ge", x, y), g)


def _extremum(b: Builder, x_won: str, y_won: str, g: str) -> tuple[str, str]:
    # JAX's balanced rule: the operand equal to the result takes g, a tie gives each half.
    # Who won is decided by comparing the operands with each other, not with the result: the
    # optimizer may recompute an operand inside a backward kernel by a different (equal up to
    # rounding) formula than the one the result was computed from, and eq(x, out) would then
    # drop the gradient altogether. x >= y or x <= y always holds (but for NaN, where both
    # rules give no gradient), so some operand always takes g.
    half = b.mul(g, b.const(0.5, g))
    gx = b.where(x_won, b.select(y_won, half, g))
    gy = b.where(y_won, b.select(x_won, half, g))
    return gx, gy


BINARY: dict[str, BinaryRule] = {
    "add": lambda b, x, y, out, g: (g, g),
    "sub": lambda b, x, y, out, g: (g, b.neg(g)),
    "mul": lambda b, x, y, out, g: (b.mul(g, y), b.mul(g, x)),
    "div": _div,
    "pow": _pow,
    "maximum": _maximum,
    "minimum": _minimum,
}


# ---------------------------------------------------------------- everything else: (b, s, g)

def _select(b: Builder, s: Stmt, g: str) -> Contribs:
    c = s.operands[0]
    return None, b.where(c, g), b.select(c, b.const(0.0, g), g)


def _reduce_extremum(b: Builder, s: Stmt, g: str) -> Contribs:
    # The elements at the max (min) share g equally. "At" allows a few ulp: the optimizer may
    # recompute `x` here by a formula that rounds differently from the one `out` came from
    # (div_bcast_recip turns x / s into x * (1/s) in one kernel and not in another), and an
    # exact test then finds no element at all, so the row would lose its gradient. Elements
    # within those ulp of each other are ties in every other sense too (below any finite
    # difference's resolution).
    (x,), out, axes = s.operands, s.results[0], s.attr["axes"]
    t = b.types[x]
    bound = out
    if t.dtype.is_float:
        ulps = 4.0 * 2.0 ** -(23 if t.dtype.itemsize == 4 else 52)
        slack = b.mul(b.emit("abs", out), b.const(ulps, out))
        bound = b.sub(out, slack) if s.op == "max" else b.add(out, slack)
        bound = b.select(b.emit("ne", bound, bound), out, bound)  # inf - inf: the bound is inf
    hit = b.mask(b.emit("ge" if s.op == "max" else "le", x, b.expand(bound, axes, t)), x)
    # Divided by max(count, 1): a row with no element at its max (NaN) gets no gradient
    # rather than g / 0 = inf, NaN everywhere after.
    count = b.emit("sum", hit, axes=axes)
    share = b.div(g, b.emit("maximum", count, b.const(1.0, count)))
    return (b.mul(b.expand(share, axes, t), hit),)


def _matmul(b: Builder, s: Stmt, g: str) -> Contribs:
    x, y = s.operands
    rank = b.types[x].rank
    swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    return (b.emit("matmul", g, b.transpose(y, swap)),
            b.emit("matmul", b.transpose(x, swap), g))


def _transpose(b: Builder, s: Stmt, g: str) -> Contribs:
    perm = s.attr["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (b.transpose(g, inverse),)


def _slice(b: Builder, s: Stmt, g: str) -> Contribs:
    # Pad with zeros, one axis at a time.
    x = s.operands[0]
    shape = b.types[x].shape
    for axis, (start, stop) in enumerate(zip(s.attr["start"], s.attr["stop"])):
        t = b.types[g]
        zeros = [b.const(0.0, t.with_shape(t.shape[:axis] + (n,) + t.shape[axis + 1:])) if n
                 else None for n in (start, shape[axis] - stop)]
        if zeros != [None, None]:
            parts = [zeros[0], g, zeros[1]]
            g = b.emit("concat", *[p for p in parts if p is not None], axis=axis)
    return (g,)


def _concat(b: Builder, s: Stmt, g: str) -> Contribs:
    axis, shape = s.attr["axis"], b.types[g].shape
    out, offset = [], 0
    for x in s.operands:
        width = b.types[x].shape[axis]
        start = tuple(offset if i == axis else 0 for i in range(len(shape)))
        stop = tuple(offset + width if i == axis else d for i, d in enumerate(shape))
        out.append(b.emit("slice", g, start=start, stop=stop))
        offset += width
    return tuple(out)


def _unary(rule: UnaryRule) -> Rule:
    return lambda b, s, g: (rule(b, s.operands[0], s.results[0], g),)


def _binary(rule: BinaryRule) -> Rule:
    return lambda b, s, g: rule(b, s.operands[0], s.operands[1], s.results[0], g)


VJP_RULES: dict[str, Rule] = {
    **{op: _unary(rule) for op, rule in UNARY.items()},
    **{op: _binary(rule) for op, rule in BINARY.items()},
    "select": _select,
    "broadcast": lambda b, s, g: (b.unbroadcast(g, b.types[s.operands[0]]),),
    "sum": lambda b, s, g: (b.expand(g, s.attr["axes"], b.types[s.operands[0]]),),
    "max": _reduce_extremum,
    "min": _reduce_extremum,
    "matmul": _matmul,
    "transpose": _transpose,
    "reshape": lambda b, s, g: (b.emit("reshape", g, type=b.types[s.operands[0]]),),
    "slice": _slice,
    "concat": _concat,
    # float -> float only: an integer or bool operand gets no adjoint (nor a cast to its type).
    "cast": lambda b, s, g: (b.emit("cast", g, type=b.types[s.operands[0]])
                             if b.types[s.operands[0]].dtype.is_float else None,),
}
