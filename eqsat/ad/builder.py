"""The statement builder the VJP rules write through: typed emission, reuse, tiny simplifications.

Rules ask for `b.mul(g, y)` and get back the name of a value. The builder
- infers the result type from the op table (so a rule cannot emit an ill-typed statement),
- reuses an identical statement, primal or generated, instead of emitting it twice (this is how
  the adjoint reuses primal values rather than recomputing them),
- skips the no-ops that make generated code hard to read (adding zero, multiplying by one, a
  broadcast or reshape to the same type) and folds layout ops of uniform constants,
- names nothing for good: generated values get placeholder names, and the reverse pass gives
  them readable ones (`%x.adj`, `%y.bwd`) once dead code is gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..ir import OPS, Stmt, TensorType

# Placeholder names contain '#', which no `.eqir` name can, so they never clash with the primal.
_PLACEHOLDER = "#"

# Readable names for the constants rules need.
_CONST_NAMES = {0.0: "zero", 1.0: "one", 0.5: "half", -0.5: "neg_half", 2.0: "two", -1.0: "neg_one"}


def _stored(value: float, t: TensorType) -> float:
    """`value` as a constant of type `t` holds it (a cast of the constant must see the f32
    rounding: 1e300 is inf in f32, and stays inf cast back to f64; a constant of f32 is
    written as that f32, or it would claim a value the program never holds)."""
    with np.errstate(over="ignore"):
        return float(t.dtype.np.type(value))


def is_placeholder(name: str) -> bool:
    """True for a generated value that has not been given its readable name yet."""
    return name.startswith(_PLACEHOLDER)


class Builder:
    """Emits typed statements after a primal body; see the module docstring."""

    def __init__(self, types: dict[str, TensorType], primal: Sequence[Stmt]):
        self.types: dict[str, TensorType] = dict(types)
        self.stmts: list[Stmt] = []
        self.preferred: dict[str, str] = {}  # placeholder -> the name it would like
        self._adjoint_named: set[str] = set()  # placeholders already named as an adjoint
        self.context = "v"  # the primal value whose rule is running; names intermediates
        self._reuse: dict[tuple, str] = {}
        self._known: dict[str, float] = {}  # values whose every element is this constant
        self._defs: dict[str, Stmt] = {}
        self._count = 0
        for s in primal:
            if len(s.results) == 1:
                self._defs[s.results[0]] = s
                self._reuse.setdefault(self._key(s.op, s.operands, s.attrs, s.types[0]),
                                       s.results[0])
                if s.op == "const" and isinstance(s.attr["value"], float):
                    self._known[s.results[0]] = s.attr["value"]

    # ---------------------------------------------------------------- core

    @staticmethod
    def _key(op: str, operands: Iterable[str], attrs: Iterable[tuple[str, Any]],
             t: TensorType) -> tuple:
        return (op, tuple(operands), tuple(attrs), t)

    def emit(self, op: str, *operands: str, type: TensorType | None = None,
             name: str | None = None, **attrs: Any) -> str:
        """The name of `op(operands)`: an existing equal value, a simplification, or a new one.

        `type` is needed only for ops whose result type is written (broadcast, reshape, cast,
        const); `name` is the readable name a new value would like to have.
        """
        opdef = OPS[op]
        ordered = tuple((k, tuple(attrs[k]) if isinstance(attrs[k], list) else attrs[k])
                        for k, _ in opdef.attrs)
        ins = [self.types[o] for o in operands]
        t = opdef.infer(ins, dict(ordered), type)
        simpler = self._simplify(op, operands, dict(ordered), t)
        if simpler is not None:
            return simpler
        key = self._key(op, operands, ordered, t)
        if key in self._reuse:
            return self._reuse[key]
        self._count += 1
        result = f"{_PLACEHOLDER}{self._count}"
        self.stmts.append(Stmt((result,), op, tuple(operands), ordered, (t,)))
        self._defs[result] = self.stmts[-1]
        self.types[result] = t
        self._reuse[key] = result
        if name is not None:
            self.preferred[result] = name
            self._adjoint_named.add(result)
        elif op == "const":
            self.preferred[result] = _CONST_NAMES.get(ordered[0][1], "c")
        else:
            self.preferred[result] = f"{self.context}.bwd"
        if op == "const":
            self._known[result] = ordered[0][1]
        return result

    def _simplify(self, op: str, xs: Sequence[str], attrs: dict, t: TensorType) -> str | None:
        """An existing value equal to `op(xs)`, or a folded constant; None when there is none."""
        known = [self._known.get(x) for x in xs]
        if op in ("broadcast", "reshape", "cast") and self.types[xs[0]] == t:
            return xs[0]
        if op in ("broadcast", "reshape", "transpose", "slice") and known[0] is not None:
            return self.const(known[0], t)
        if op == "cast" and known[0] is not None and t.dtype.is_float:
            return self.const(_stored(_stored(known[0], self.types[xs[0]]), t), t)
        if op == "transpose" and tuple(attrs["perm"]) == tuple(range(t.rank)):
            return xs[0]
        inner = self._defs.get(xs[0]) if xs else None
        if op == "transpose" and inner is not None and inner.op == "transpose":
            perm = tuple(inner.attr["perm"][p] for p in attrs["perm"])
            return self.transpose(inner.operands[0], perm)
        if op == "reshape" and inner is not None and inner.op == "reshape":
            return self.emit("reshape", inner.operands[0], type=t)
        if op == "neg" and inner is not None and inner.op == "neg":
            return inner.operands[0]
        if op == "sum" and not attrs["axes"]:
            return xs[0]
        if op == "add" and known[0] == 0.0:
            return xs[1]
        if op in ("add", "sub") and known[1] == 0.0:
            return xs[0]
        if op == "mul" and known[0] == 1.0:
            return xs[1]
        if op in ("mul", "div") and known[1] == 1.0:
            return xs[0]
        if op == "neg" and known[0] is not None:
            return self.const(-known[0], t)
        return None

    def defining(self, value: str) -> Stmt | None:
        """The statement (primal or generated) that defines `value`, if it has one result."""
        return self._defs.get(value)

    def known(self, value: str) -> float | None:
        """The constant every element of `value` holds, if the builder knows one."""
        return self._known.get(value)

    def claim(self, value: str, name: str) -> None:
        """Name a generated value as an adjoint, unless it is already one (or not generated)."""
        if is_placeholder(value) and value not in self._adjoint_named:
            self.preferred[value] = name
            self._adjoint_named.add(value)

    # ---------------------------------------------------------------- helpers for rules

    def const(self, value: float, like: str | TensorType, name: str | None = None) -> str:
        """A constant of the type of `like` (a value's name or a type)."""
        t = like if isinstance(like, TensorType) else self.types[like]
        return self.emit("const", type=t, name=name, value=float(value))

    def add(self, x: str, y: str) -> str:
        """`x + y` (without the no-ops: adding zero, multiplying or dividing by one)."""
        return self.emit("add", x, y)

    def sub(self, x: str, y: str) -> str:
        """`x - y` (without the no-ops: adding zero, multiplying or dividing by one)."""
        return self.emit("sub", x, y)

    def mul(self, x: str, y: str) -> str:
        """`x * y` (without the no-ops: adding zero, multiplying or dividing by one)."""
        return self.emit("mul", x, y)

    def div(self, x: str, y: str) -> str:
        """`x / y` (without the no-ops: adding zero, multiplying or dividing by one)."""
        return self.emit("div", x, y)

    def neg(self, x: str) -> str:
        """`-x` (`--x` is `x`)."""
        return self.emit("neg", x)

    def select(self, c: str, x: str, y: str) -> str:
        """`x` where `c` holds, else `y`."""
        return self.emit("select", c, x, y)

    def where(self, c: str, g: str) -> str:
        """`g` where `c` holds, zero elsewhere."""
        return self.select(c, g, self.const(0.0, g))

    def mask(self, c: str, like: str) -> str:
        """A bool value as 1.0 / 0.0 of the float type of `like`."""
        return self.emit("cast", c, type=self.types[like])

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        """`x` transposed by `perm` (a transpose of a transpose composes into one)."""
        return self.emit("transpose", x, perm=tuple(perm))

    def unbroadcast(self, g: str, to: TensorType) -> str:
        """The adjoint of `broadcast x : type(g)` for x of type `to`: sum the broadcast axes.

        This is the only place where gradients are un-broadcast (binary ops in the IR need
        operands of one type, so broadcasting is always an explicit `broadcast`).
        """
        out = self.types[g].shape
        lead = len(out) - len(to.shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(to.shape) if d == 1 and out[lead + i] != 1)
        summed = self.emit("sum", g, axes=axes)
        return self.emit("reshape", summed, type=to)

    def expand(self, g: str, axes: Sequence[int], to: TensorType) -> str:
        """The adjoint of a reduction over `axes` of a value of type `to`: broadcast `g` back."""
        if tuple(sorted(axes)) != tuple(range(len(axes))):
            # numpy broadcasting aligns on the right: put the reduced axes back as ones first.
            kept = to.with_shape(tuple(1 if i in axes else d for i, d in enumerate(to.shape)))
            g = self.emit("reshape", g, type=kept.with_dtype(self.types[g].dtype))
        return self.emit("broadcast", g, type=to.with_dtype(self.types[g].dtype))
