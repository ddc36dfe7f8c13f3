"""Drawing random instances of a rule for `check`: types, attributes, values and input arrays.

An `Instance` builds a rule's left side as an IR function from shapes, dtypes, attributes and
constants drawn at random (around the sizes its conditions name), and its right side over the
same parameters; `instantiate` rejects draws whose left side does not verify or whose condition
is false. Kept apart from check.py, which compares the two sides, shrinks and reports.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from ..errors import Error
from ..ir.fused import REDUCER
from ..ir.module import Function, Module, Param, Stmt
from ..ir.ops import INT, INTS, OPS, literal_fits, ops_in
from ..ir.types import DTYPES, DType, TensorType
from ..ir.verifier import verify
from .lang import Cond, Fn, Node, Num, Pattern, Rule, ShapeFn, Var

_MAX_DIM, _MAX_RANK, _MAX_ELEMENTS = 4096, 6, 1 << 15
_SPECIAL = (0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-3, -1e-3)
# check(..., ieee=True) also draws these, per dtype: infinities, NaN, values whose products
# overflow, and subnormals
_IEEE = {np.dtype(np.float32): (np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-40, -1e-40),
         np.dtype(np.float64): (np.inf, -np.inf, np.nan, 1.7e308, -1.7e308, 5e-324, -5e-324)}


class Reject(Exception):
    """A draw that is no instance of the rule (its left side does not verify, its condition is
    false, a computed attribute is undefined): `check` draws again."""


class Undrawable(Exception):
    """An attribute the rule leaves open whose values check cannot draw (a kernel body)."""


class IllTyped(Exception):
    """The rule's right side does not type on an instance whose left side does: the rule is
    wrong, and `module`, `arrays` and `inst` make the counterexample."""

    def __init__(self, message: str, module: Module, arrays: list[np.ndarray],
                 inst: Instance | None = None):
        super().__init__(message)
        self.module, self.arrays, self.inst = module, arrays, inst


def _random_shape(rng: random.Random, rank: int, big: tuple[int, ...] = ()
                  ) -> tuple[int, ...]:
    """Dims of 1 to 3, and now and then one of `big` (the sizes a rule's condition names)."""
    return tuple(rng.choice(big) if big and rng.random() < 0.25 else rng.choice((1, 2, 3))
                 for _ in range(rank))


def _sizes(rule: Rule) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Dims and ranks beyond the usual draws that `rule` asks for: around the integers its
    conditions compare with (`dim(?a, 0) >= 64`, `rank(?x) == 5`), and the ranks its literal
    int lists imply (`perm=[0,1,2,3,4]`), and the dims and ranks of the int lists they compare
    with (`shape(?x) == [64, 64]`, `?p == [0,1,2,3,4]`)."""
    dims: list[int] = []
    ranks: list[int] = []
    lists: list[tuple[int, ...]] = []
    for c in rule.conds:
        for fn, i in ((c.left, c.right), (c.right, c.left)):
            if isinstance(fn, Fn) and isinstance(i, int) and not isinstance(i, bool):
                (ranks if fn.name in ("rank", "len") else dims).append(i)
            if isinstance(i, tuple) and isinstance(fn, Fn) and fn.name == "shape":
                dims += i
                ranks.append(len(i))
            elif isinstance(i, tuple) and isinstance(fn, Var):  # `?p == [0,1,2,3,4]`
                lists.append(i)
    stack: list[Any] = [rule.lhs, rule.rhs]
    while stack:
        p = stack.pop()
        if isinstance(p, Node):
            stack.extend(p.args)
            lists += [v for _, v in p.attrs if isinstance(v, tuple)]
    ranks += [len(t) for t in lists] + [max(t) + 1 for t in lists if t]
    big = {d for i in dims if 3 < i <= _MAX_DIM for d in (i, i + 1)}
    return tuple(sorted(big)), tuple(sorted({r for r in ranks if 4 < r <= _MAX_RANK}))


def pinned(rule: Rule) -> dict[str, tuple[int, ...]]:
    """The int lists that `rule`'s conditions fix: `shape(?x) == [4, 4]` fixes ?x's shape,
    `?p == [1, 0]` the attribute ?p (by variable name; a random draw would rarely meet them)."""
    out: dict[str, tuple[int, ...]] = {}
    for c in rule.conds:
        if c.op != "==":
            continue
        for term, lit in ((c.left, c.right), (c.right, c.left)):
            if isinstance(lit, tuple) and isinstance(term, Var):
                out[term.name] = lit
            elif isinstance(lit, tuple) and isinstance(term, Fn) and term.name == "shape":
                out[term.var.name] = lit
    return out


def too_large(rule: Rule) -> str | None:
    """Why `check` cannot draw an instance of `rule` whose condition fixes a tensor's shape
    (more elements than it draws), or None."""
    for name, shape in pinned(rule).items():
        if rule.__dict__["sorts"].get(name) == "tensor" and math.prod(shape) > _MAX_ELEMENTS:
            return (f"its condition fixes ?{name}'s shape to [{','.join(map(str, shape))}] "
                    f"({math.prod(shape)} elements), and check draws tensors of at most "
                    f"{_MAX_ELEMENTS}")
    return None


class Instance:
    """One attempt at instantiating a rule: variable types, attributes, values."""

    def __init__(self, rule: Rule, rng: random.Random):
        self.rule, self.rng = rule, rng
        self.sorts: dict[str, str] = rule.__dict__["sorts"]
        self.big, ranks = _sizes(rule)
        self.rank = rng.choice((0, 1, 2, 2, 3, 4) + ranks)
        self.types: dict[str, TensorType] = {}
        self.attrs: dict[str, Any] = {}
        self.values: dict[str, float] = {}
        self.pins = pinned(rule)
        # the fixed shapes are drawn for other variables often too (`add(?x, ?y) if shape(?y)
        # == [4, 4]` needs an ?x that broadcasts with it)
        self.shapes: list[tuple[int, ...]] = [s for n, s in self.pins.items()
                                              if self.sorts.get(n) == "tensor"]
        self.dtype = rng.choice((DType.f32, DType.f32, DType.f64))
        self.int_dtype = rng.choice((DType.i32, DType.i64))
        self.body: list[Stmt] = []
        self.env: dict[str, str] = {}
        self.open = False  # whether an attribute the rule leaves open was drawn

    def shape(self) -> tuple[int, ...]:
        if self.shapes and self.rng.random() < 0.6:
            return self.rng.choice(self.shapes)
        s = _random_shape(self.rng, self.rank if self.rng.random() < 0.7 else
                          self.rng.choice((0, 1, 2, 3)), self.big)
        self.shapes.append(s)
        return s

    def var_type(self, v: Var, kinds: set[str]) -> TensorType:
        if v.name not in self.types:
            if kinds == {"bool"} or "bool" in kinds and self.rng.random() < 0.1:
                dt = DType.bool
            elif "float" in kinds:
                dt = (self.dtype if self.rng.random() < 0.8 or "int" not in kinds
                      else self.int_dtype)
            else:
                dt = self.int_dtype
            self.types[v.name] = TensorType(dt, self.pins[v.name] if v.name in self.pins
                                         else self.shape())
        return self.types[v.name]

    def emit(self, op: str, args: list[str], attrs: dict, t: TensorType) -> str:
        name = f"t{len(self.body)}"
        self.body.append(Stmt((name,), op, tuple(args), tuple(attrs.items()), (t,)))
        return name

    def type_of(self, name: str, params: list[Param]) -> TensorType:
        for p in params:
            if p.name == name:
                return p.type
        for s in self.body:
            if s.results[0] == name:
                return s.types[0]
        raise KeyError(name)

    def attr(self, v: Any, make: Any) -> Any:
        if isinstance(v, Var):
            if v.name not in self.attrs:
                self.attrs[v.name] = self.pins[v.name] if v.name in self.pins else make()
            return self.attrs[v.name]
        if isinstance(v, ShapeFn):
            # undefined where egglog's helper finds no value: there the rule does not fire
            try:
                return v.evaluate(lambda x: self.types[x.var.name].shape if isinstance(
                    x, Fn) else tuple(self.attrs[x.name]))
            except ValueError:
                raise Reject from None
        if v is None:
            self.open = True
            return make()
        return v

    def value(self, v: Any) -> float:
        if isinstance(v, Num):
            return v.value
        if isinstance(v, Var):
            if v.name not in self.values:
                self.values[v.name] = _draw_value(self.rng)
            return self.values[v.name]
        if v.op == "size":
            x = v.args[0].name
            shape = self.types[x].shape if x in self.types else self.attrs[x]
            return float(math.prod(shape))
        a = [self.value(x) for x in v.args]
        if v.op == "neg":
            return -a[0]
        if v.op == "/" and a[1] == 0:
            raise Reject
        if v.op == "+":
            return a[0] + a[1]
        if v.op == "-":
            return a[0] - a[1]
        return a[0] * a[1] if v.op == "*" else a[0] / a[1]

    def build(self, p: Pattern, params: list[Param], sibling: TensorType | None,
              lhs: bool) -> str:
        if isinstance(p, Var):
            if p.name not in self.env:
                if not lhs:
                    raise Reject
                kinds = {"bool", "int", "float"}
                t = self.var_type(p, kinds if sibling is None else {
                    "bool" if sibling.dtype is DType.bool else
                    ("float" if sibling.dtype.is_float else "int")})
                if sibling is not None and self.rng.random() < 0.8:
                    t = self.types[p.name] = sibling.with_shape(self.pins.get(
                        p.name, sibling.shape))
                params.append(Param(p.name, t))
                self.env[p.name] = p.name
            return self.env[p.name]
        op = OPS[p.op]
        a = p.attr
        if p.op == "const":
            t = self.written_type(p, None, sibling)
            v = a["value"]
            # as the e-graph encodes constants: an integer literal is an int or bool constant,
            # anything else (2.0, ?c, a computed value) a float one; the rule meets no other
            if (isinstance(v, Num) and isinstance(v.value, int)) == t.dtype.is_float:
                raise Reject
            value = self.value(v)
            value = bool(value) if t.dtype is DType.bool else (
                float(value) if t.dtype.is_float else value)
            # nor a literal the dtype cannot hold (1e39 as f32, 2 as bool): its facts keep the
            # rule from applying there
            if isinstance(v, Num) and (literal_fits(value, t.dtype) or (
                    t.dtype is DType.bool and v.value not in (0, 1))):
                raise Reject
            return self.emit("const", [], {"value": value}, t)
        args: list[str] = []
        # operands share the result's type, except a comparison's (its result is bool)
        sib = sibling if op.family in ("unary", "binary", "select") else None
        for k, arg in enumerate(p.args):
            hint = sib
            if p.op == "select" and k == 0:  # the condition: bool, of the select's shape
                hint = TensorType(DType.bool, sib.shape if sib is not None else self.shape())
            name = self.build(arg, params, hint, lhs)
            args.append(name)
            t = self.type_of(name, params)
            if op.family in ("binary", "compare") or p.op == "select" and len(args) > 1:
                sib = t
        attrs = {}
        x = self.type_of(args[0], params) if args else None
        for key, kind in op.attrs:
            attrs[key] = self.attr(a.get(key), lambda: self.random_attr(p.op, key, kind, x,
                                                                        attrs))
        t = self.written_type(p, x, sibling) if op.written_type else None
        if t is None:
            ins = [self.type_of(n, params) for n in args]
            try:
                t = op.infer(ins, attrs, None)
            except Exception as e:
                if lhs:
                    raise Reject from None
                why = str(e) if str(e).startswith(p.op) else f"{p.op}: {e}"
                raise IllTyped(why, Module(), []) from None
        return self.emit(p.op, args, attrs, t)

    def random_attr(self, op: str, key: str, kind: str, x: TensorType | None,
                    drawn: dict[str, Any]) -> Any:
        """A value for an attribute the rule leaves open; `drawn` holds the node's earlier
        ones (a slice's stop follows its start)."""
        rank = x.rank if x is not None else self.rank
        if key == "perm":
            perm = list(range(rank))
            self.rng.shuffle(perm)
            return tuple(perm)
        if key == "axes":
            return tuple(i for i in range(rank) if self.rng.random() < 0.5)
        if key == "start" and x is not None:  # a full slice half the time, else a part
            return tuple(0 if self.rng.random() < 0.5 else self.rng.randrange(d)
                         for d in x.shape)
        if key == "stop" and x is not None:
            start = drawn.get("start") or (0,) * x.rank
            if len(start) != x.rank:
                raise Reject
            return tuple(d if self.rng.random() < 0.5 else self.rng.randint(min(b + 1, d), d)
                         for b, d in zip(start, x.shape))
        if kind == REDUCER:
            return self.rng.choice(sorted(ops_in("reduce")))
        if kind == INT:
            return self.rng.randrange(max(rank, 1))
        if kind == INTS:
            return _random_shape(self.rng, rank, self.big)
        raise Undrawable(f"{key}= of {op}")

    def written_type(self, p: Node, x: TensorType | None, sibling: TensorType | None
                     ) -> TensorType:
        a = p.attr
        if "like" in a:
            return self.types[a["like"].name]
        dt = a.get("dtype")
        dtype = DTYPES[self.attr(dt, lambda: self.dtype.value)] if dt is not None else None
        shape = a.get("shape")
        if shape is not None:
            shape = self.attr(shape, lambda: self.target_shape(p.op, x))
        if sibling is not None:
            dtype, shape = dtype or sibling.dtype, shape if shape is not None else sibling.shape
        if dtype is None:
            if p.op == "const":
                v = a["value"]
                literal_int = isinstance(v, Num) and isinstance(v.value, int)
                dtype = self.int_dtype if literal_int else self.dtype
            else:
                dtype = x.dtype if p.op != "cast" else self.dtype
        if shape is None:
            shape = self.target_shape(p.op, x)
        return TensorType(dtype, tuple(shape))

    def target_shape(self, op: str, x: TensorType | None) -> tuple[int, ...]:
        if x is None:
            return self.shape()
        if op == "broadcast":
            # a scalar may broadcast to any rank (rules over scalar broadcasts need rank >= 2),
            # a tensor gains up to two leading axes (rules that pad its shape)
            lead = _random_shape(self.rng, self.rng.choice((0, 1, 2) if x.rank else (0, 1, 2, 3)))
            return lead + tuple(d if d != 1 else self.rng.choice((1, 2, 3)) for d in x.shape)
        if op == "reshape":
            return self.rng.choice(((x.size,), tuple(reversed(x.shape)), (1,) + x.shape))
        return x.shape

    def holds(self, c: Cond) -> bool:
        if c.op == "is_float":
            return self.types[c.left.name].dtype.is_float
        left, right = self.term(c.left), self.term(c.right)
        return {"==": left == right, "!=": left != right, "<": left < right,
                "<=": left <= right, ">": left > right, ">=": left >= right}[c.op]

    def term(self, t: Any) -> Any:
        if isinstance(t, Fn):
            name = t.var.name
            if self.sorts[name] == "tensor":
                ty = self.types[name]
                shape, dtype = ty.shape, ty.dtype.value
            else:
                shape, dtype = tuple(self.attrs[name]), None
            if t.name == "dim":
                if not -len(shape) <= t.index < len(shape):
                    raise Reject
                return shape[t.index]
            return {"shape": shape, "rank": len(shape), "size": math.prod(shape),
                    "dtype": dtype, "len": len(shape)}[t.name]
        if isinstance(t, Var):
            return self.attrs.get(t.name, self.types.get(t.name))
        return t


def _draw_value(rng: random.Random, dtype: np.dtype | None = None, ieee: bool = False) -> float:
    """A float to draw: small multiples of 1/8, special values, and with `ieee` now and then
    one of `dtype`'s infinities, NaN, huge or subnormal values."""
    if ieee and dtype is not None and rng.random() < 0.15:
        return rng.choice(_IEEE[dtype])
    if rng.random() < 0.3:
        return rng.choice(_SPECIAL)
    return rng.randint(-32, 32) / 8.0


def instantiate(rule: Rule, rng: random.Random, ieee: bool = False
                 ) -> tuple[Module, list[np.ndarray], Instance]:
    """One instance of `rule`: a module of its sides as functions `lhs` and `rhs` over the same
    parameters, input arrays for them, and the draws. Raises `Reject` where the draw is no
    instance, `IllTyped` where the right side does not type."""
    inst = Instance(rule, rng)
    params: list[Param] = []
    root = inst.build(rule.lhs, params, None, lhs=True)
    lhs_body = list(inst.body)
    t = inst.type_of(root, params)
    lhs = Function("lhs", tuple(params), (t,), tuple(lhs_body), (root,))
    try:
        verify(Module(lhs))
    except Error:
        raise Reject from None
    if not all(inst.holds(c) for c in rule.conds):
        raise Reject
    inst.body = []
    if any(p.type.size > _MAX_ELEMENTS for p in params):
        raise Reject
    arrays = [_array(rng, p.type, ieee) for p in params]
    try:
        rhs_root = inst.build(rule.rhs, params, t if isinstance(rule.rhs, Node) and OPS[
            rule.rhs.op].family in ("unary", "binary", "select") else None, lhs=False)
    except IllTyped as e:
        raise IllTyped(str(e), Module(lhs), arrays, inst) from None
    rhs_type = inst.type_of(rhs_root, params)
    rhs = Function("rhs", tuple(params), (rhs_type,), tuple(inst.body), (rhs_root,))
    return Module(lhs, rhs), arrays, inst


def _array(rng: random.Random, t: TensorType, ieee: bool = False) -> np.ndarray:
    n = t.size
    if t.dtype is DType.bool:
        data = [rng.random() < 0.5 for _ in range(n)]
    elif t.dtype.is_int:
        # small values, or now and then any of the dtype's, its extremes often (integer
        # arithmetic wraps around: `div(mul(?x, 2), 2) => ?x` is unsound where x * 2
        # overflows, `lt(neg(?x), neg(?y)) => gt(?x, ?y)` at the minimum, which -x keeps)
        lo, hi = int(np.iinfo(t.dtype.np).min), int(np.iinfo(t.dtype.np).max)
        wide = rng.random() < 0.3
        data = [(rng.choice((lo, lo + 1, hi)) if rng.random() < 0.3 else rng.randint(lo, hi))
                if wide else rng.randint(-5, 5) for _ in range(n)]
    else:
        data = [_draw_value(rng, np.dtype(t.dtype.np), ieee) for _ in range(n)]
    return np.array(data, dtype=t.dtype.np).reshape(t.shape)
