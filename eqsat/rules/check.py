"""Property-based soundness check: instantiate each rule on random shapes and values, compare.

For each rule, hypothesis draws a seed; from it the checker draws types for the left side's
variables (small dims, and around the sizes and ranks its conditions name; shapes shared
between variables often, so that guards and matmul chains are satisfiable), attributes left
open, and values in [-4, 4] mixed with 0, -0, 1, -1 and tiny/negative numbers. Instances whose
left side does not verify or whose condition is false are redrawn. Both sides become IR
functions, run by the reference interpreter, and are compared (float tolerance scaled to the
magnitudes involved; NaN must match NaN). A right side that does not verify, or a difference,
raises `UnsoundRule` with the rule name and the counterexample. A right side's computed int
lists (`shape=permute(?s, ?p)`, `lpad(shape(?x), ?s)`) are evaluated by the reference semantics
of `lang.SHAPE_FNS`; where one is undefined the rule would not fire, so the instance is
redrawn. The check is of real-number identities over a bounded range: floating-point overflow
far out (log(exp(x)) for x > 88) is outside it."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from ..errors import Error, LocatedError, UnsoundRule
from ..ir.fused import REDUCER
from ..ir.interpreter import interpret_function
from ..ir.module import Function, Module, Param, Stmt
from ..ir.ops import INT, INTS, OPS, ops_in
from ..ir.printer import format_stmt
from ..ir.types import DTYPES, DType, TensorType
from ..ir.verifier import verify
from .lang import Cond, Fn, Node, Num, Pattern, Rule, RuleSet, ShapeFn, Var

_ATTEMPTS = 300
_MAX_DIM, _MAX_RANK, _MAX_ELEMENTS = 4096, 6, 1 << 15
_SPECIAL = (0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-3, -1e-3)
# check(..., ieee=True) also draws these, per dtype: infinities, NaN, values whose products
# overflow, and subnormals
_IEEE = {np.dtype(np.float32): (np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-40, -1e-40),
         np.dtype(np.float64): (np.inf, -np.inf, np.nan, 1.7e308, -1.7e308, 5e-324, -5e-324)}


class CheckError(Error):
    """A rule whose left side and condition could not be instantiated at all."""


class _Reject(Exception):
    pass


class _Undrawable(Exception):
    """An attribute the rule leaves open whose values check cannot draw (a kernel body)."""


class _IllTyped(Exception):
    def __init__(self, message: str, module: Module, arrays: list[np.ndarray],
                 inst: _Instance | None = None):
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
    int lists imply (`perm=[0,1,2,3,4]`)."""
    dims: list[int] = []
    ranks: list[int] = []
    for c in rule.conds:
        for fn, i in ((c.left, c.right), (c.right, c.left)):
            if isinstance(fn, Fn) and isinstance(i, int) and not isinstance(i, bool):
                (ranks if fn.name in ("rank", "len") else dims).append(i)
    lists: list[tuple[int, ...]] = []
    stack: list[Any] = [rule.lhs, rule.rhs]
    while stack:
        p = stack.pop()
        if isinstance(p, Node):
            stack.extend(p.args)
            lists += [v for _, v in p.attrs if isinstance(v, tuple)]
    ranks += [len(t) for t in lists] + [max(t) + 1 for t in lists if t]
    big = {d for i in dims if 3 < i <= _MAX_DIM for d in (i, i + 1)}
    return tuple(sorted(big)), tuple(sorted({r for r in ranks if 4 < r <= _MAX_RANK}))


class _Instance:
    """One attempt at instantiating a rule: variable types, attributes, values."""

    def __init__(self, rule: Rule, rng: random.Random):
        self.rule, self.rng = rule, rng
        self.sorts: dict[str, str] = rule.__dict__["sorts"]
        self.big, ranks = _sizes(rule)
        self.rank = rng.choice((0, 1, 2, 2, 3, 4) + ranks)
        self.types: dict[str, TensorType] = {}
        self.attrs: dict[str, Any] = {}
        self.values: dict[str, float] = {}
        self.shapes: list[tuple[int, ...]] = []
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
            self.types[v.name] = TensorType(dt, self.shape())
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
                self.attrs[v.name] = make()
            return self.attrs[v.name]
        if isinstance(v, ShapeFn):
            # undefined where egglog's helper finds no value: there the rule does not fire
            try:
                return v.evaluate(lambda x: self.types[x.var.name].shape if isinstance(
                    x, Fn) else tuple(self.attrs[x.name]))
            except ValueError:
                raise _Reject from None
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
            raise _Reject
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
                    raise _Reject
                kinds = {"bool", "int", "float"}
                t = self.var_type(p, kinds if sibling is None else {
                    "bool" if sibling.dtype is DType.bool else
                    ("float" if sibling.dtype.is_float else "int")})
                if sibling is not None and self.rng.random() < 0.8:
                    t = self.types[p.name] = sibling
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
                raise _Reject
            value = self.value(v)
            value = bool(value) if t.dtype is DType.bool else (
                float(value) if t.dtype.is_float else value)
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
                    raise _Reject from None
                why = str(e) if str(e).startswith(p.op) else f"{p.op}: {e}"
                raise _IllTyped(why, Module(), []) from None
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
                raise _Reject
            return tuple(d if self.rng.random() < 0.5 else self.rng.randint(min(b + 1, d), d)
                         for b, d in zip(start, x.shape))
        if kind == REDUCER:
            return self.rng.choice(sorted(ops_in("reduce")))
        if kind == INT:
            return self.rng.randrange(max(rank, 1))
        if kind == INTS:
            return _random_shape(self.rng, rank, self.big)
        raise _Undrawable(f"{key}= of {op}")

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

    def bound(self) -> list[str]:
        """`?p = [1,0]`, `?c = 0.5`: the attributes and constant values drawn for the left
        side's variables, which a counterexample needs besides its tensors."""
        out = [f"?{k} = {_fmt_attr(v)}" for k, v in self.attrs.items()]
        return out + [f"?{k} = {v!r}" for k, v in self.values.items()]

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
                    raise _Reject
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


def _instantiate(rule: Rule, rng: random.Random, ieee: bool = False
                 ) -> tuple[Module, list[np.ndarray], _Instance]:
    inst = _Instance(rule, rng)
    params: list[Param] = []
    root = inst.build(rule.lhs, params, None, lhs=True)
    lhs_body = list(inst.body)
    t = inst.type_of(root, params)
    lhs = Function("lhs", tuple(params), (t,), tuple(lhs_body), (root,))
    try:
        verify(Module(lhs))
    except Error:
        raise _Reject from None
    if not all(inst.holds(c) for c in rule.conds):
        raise _Reject
    inst.body = []
    if any(p.type.size > _MAX_ELEMENTS for p in params):
        raise _Reject
    arrays = [_array(rng, p.type, ieee) for p in params]
    try:
        rhs_root = inst.build(rule.rhs, params, t if isinstance(rule.rhs, Node) and OPS[
            rule.rhs.op].family in ("unary", "binary", "select") else None, lhs=False)
    except _IllTyped as e:
        raise _IllTyped(str(e), Module(lhs), arrays, inst) from None
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


def _close(a: np.ndarray, b: np.ndarray, scale: float) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    rtol = 1e-3 if a.dtype == np.float32 else 1e-9
    with np.errstate(all="ignore"):
        finite = np.isfinite(a)
        if not np.array_equal(finite, np.isfinite(b)):
            return False
        # inf, -inf and NaN must be the same on both sides, finite values close
        if not np.array_equal(a[~finite], b[~finite], equal_nan=True):
            return False
        return bool(np.allclose(a[finite].astype(np.float64), b[finite].astype(np.float64),
                                rtol=rtol, atol=rtol * scale))


# Further seeds tried once a rule fails, for a counterexample with fewer input elements.
SMALLER_DRAWS = 30


def _try_seed(rule: Rule, seed: int, ieee: bool) -> tuple[bool, UnsoundRule | None]:
    """Instantiate `rule` from `seed` and compare its sides: whether an instance was found,
    and the error (with `.elements`, its inputs' total size, and `.ill_typed`) where they
    differ."""
    rng = random.Random(seed)
    for _ in range(_ATTEMPTS):
        try:
            module, arrays, inst = _instantiate(rule, rng, ieee)
            break
        except _Reject:
            continue
        except _IllTyped as e:
            return False, _ill_typed(rule, str(e), e.module["lhs"], e.arrays, e.inst)
    else:
        return False, None
    try:
        verify(module)
    except Error as e:
        why = e.message if isinstance(e, LocatedError) else str(e)  # in no text of theirs
        return True, _ill_typed(rule, why, module["lhs"], arrays, inst)
    (left,) = interpret_function(module, "lhs", *arrays)
    (right,) = interpret_function(module, "rhs", *arrays)
    with np.errstate(all="ignore"):
        mags = [np.max(np.abs(x)) for x in [left, right, *arrays]
                if x.size and x.dtype.kind in "fi"]
        finite = [float(m) for m in mags if np.isfinite(m)]
    largest = max([1.0] + finite)
    scale = largest ** 2 if largest < 1e150 else 1e300
    if not _close(left, right, scale):
        return True, _unsound(f"rule {rule.name} is unsound: {rule}\n  counterexample: "
                              f"{_describe(module['lhs'], arrays, inst)}\n  left side gives "
                              f"{_fmt(left)}\n  right side gives {_fmt(right)}", arrays, False)
    return True, None


def _ill_typed(rule: Rule, why: str, lhs: Function, arrays: list[np.ndarray],
               inst: _Instance | None) -> UnsoundRule:
    return _unsound(f"rule {rule.name}: the right-hand side is ill-typed: {why}\n"
                    f"  counterexample: {_describe(lhs, arrays, inst)}", arrays, True)


def _unsound(message: str, arrays: list[np.ndarray], ill_typed: bool) -> UnsoundRule:
    err = UnsoundRule(message)
    err.elements, err.ill_typed = sum(a.size for a in arrays), ill_typed
    return err


def _smaller(rule: Rule, first: UnsoundRule, ieee: bool) -> UnsoundRule:
    """`first`, or the failure with the fewest input elements among SMALLER_DRAWS further
    seeds (drawn from the failing one, so a derandomized check stays deterministic) that fail
    the same way: a 2-element counterexample reads better than a 27-element one."""
    best = first
    rng = random.Random(getattr(first, "seed", 0))
    for _ in range(SMALLER_DRAWS):
        if best.elements <= 1:
            break
        _, err = _try_seed(rule, rng.getrandbits(32), ieee)
        if err is not None and err.ill_typed == first.ill_typed \
                and err.elements < best.elements:
            best = err
    return best


def check_rule(rule: Rule, examples: int = 40, derandomize: bool = True,
               ieee: bool = False) -> None:
    """Check one rule on `examples` random instances; raises UnsoundRule on a difference.
    `ieee=True` also draws infinities, NaN, overflowing and subnormal floats (fast-math-like
    rules such as distributivity then fail)."""
    if not isinstance(rule, Rule):
        raise Error(f"check_rule takes a Rule, not {type(rule).__name__}")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise Error(f"check: examples must be a whole number >= 1, got {examples!r}")
    # here, not at module level: hypothesis costs ~0.1 s to import, and `import eqsat.rules`
    # (every optimize) must not pay it
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    found = [0]

    # generation only: shrinking or explaining a seed finds no simpler counterexample, only
    # another seed, and each try may cost hundreds of draws (seconds on a failing rule); a
    # smaller counterexample is looked for among further seeds instead (`_smaller`)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=[Phase.explicit, Phase.generate])
    @given(st.integers(0, 2**32 - 1))
    def run(seed: int) -> None:
        hit, err = _try_seed(rule, seed, ieee)
        found[0] += hit
        if err is not None:
            err.seed = seed
            raise err

    try:
        try:
            run()
        except UnsoundRule as first:
            raise _smaller(rule, first, ieee) from None
    except _Undrawable as e:
        raise CheckError(f"rule {rule.name}: check cannot draw the open attribute {e} (it draws "
                         f"tensors, shapes, axes, perms and reductions, not kernel bodies); "
                         f"check instances of the rule with the attribute written out") from None
    if not found[0]:
        raise CheckError(f"rule {rule.name}: no instance satisfies its left side and condition "
                         f"(tried {examples} x {_ATTEMPTS} draws)")


def _fmt(a: np.ndarray) -> str:
    # continuation lines indented under the message's own, so a matrix reads as one block
    first, *rest = np.array2string(a, precision=6, threshold=20).split("\n")
    return "\n".join([f"{a.dtype}{list(a.shape)} {first}"]
                     + [f"      {line}" if line.strip() else "" for line in rest])


def _fmt_attr(v: Any) -> str:
    return "[" + ",".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)


def _describe(f: Function, arrays: list[np.ndarray], inst: _Instance | None = None) -> str:
    """The counterexample: every tensor variable's value, the attributes and constants drawn
    for the other variables, and, where the rule leaves an attribute open, the left side's
    instance as IR (which shows the attribute drawn)."""
    parts = [f"?{p.name} = {_fmt(a)}" for p, a in zip(f.params, arrays)]
    text = ", ".join(parts + (inst.bound() if inst else [])) or "no inputs"
    if inst is not None and inst.open:
        text += "\n  left side as IR:" + "".join(f"\n    {format_stmt(s)}" for s in f.body)
    return text


def check(ruleset: RuleSet | Rule, examples: int = 40, derandomize: bool = True,
          ieee: bool = False) -> None:
    """Check every rule of a rule set; raises `eqsat.UnsoundRule` naming the first wrong one.
    With `ieee=True` floats are also drawn infinite, NaN, huge and subnormal: rules that hold
    for real numbers but not at those values (`mul(?x, const(0.0)) => const(0.0, like=?x)`,
    distributivity) fail."""
    rules = [ruleset] if isinstance(ruleset, Rule) else (
        list(ruleset) if isinstance(ruleset, (RuleSet, list, tuple)) else None)
    if rules is None or not all(isinstance(r, Rule) for r in rules):
        raise Error(f"check takes a RuleSet, a Rule or a list of Rules (eqsat.rules.parse(text) "
                    f"makes a RuleSet), not {type(ruleset).__name__}")
    for rule in rules:
        check_rule(rule, examples, derandomize, ieee)
