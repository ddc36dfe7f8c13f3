"""The rule language: patterns over IR op names, conditions on shapes, and their text syntax.

    rule NAME: LHS => RHS [if COND, COND, ...]

A pattern is `?x` (any tensor value) or `op(operands, attr=value, ...)`. Attribute values are
literals (`perm=[1,0]`, `axis=1`) or variables (`axes=?a`); an attribute left out on the left
side matches anything. Ops whose result type is written (broadcast, reshape, cast, const) take
`shape=`, `dtype=` or `like=?x` (the type of `?x`). `const(VALUE)` matches a float constant
of that value (`const(1)` an integer one); `const(?c)` binds its value, and a right-hand const
may compute one: `const(?a + ?b, like=?x)`, `const(size(?s), like=?x)`.
The kernel ops `map`, `map_reduce` and `matmul_epi` take `body=` a scalar body in the IR's
syntax: `map(?x, body=tanh($0), like=?x)`; a right-hand kernel needs its body written out (the
e-graph types it by its body), and a right-hand `map_reduce` has no written type (the e-graph
computes it from its operands, axes and body): `map_reduce(?x, body=exp($0), reduce=sum,
axes=[1])`.
A right-hand int-list attribute (`shape=`, `perm=`, ...) may be computed from int lists bound
on the left (`?s`, `?p`) or written (`[1,0]`) by the functions of `SHAPE_FNS`:
`shape=permute(?s, ?p)` (`?s` reordered by `?p`, as a transpose reorders a shape) and
`inverse(?p)` (the permutation undoing `?p`) and `lpad(?t, ?s)` (`?t` left-padded with 1s to
`len(?s)`, the shape numpy's right-aligned broadcasting sees); they nest, and an argument may
be the shape of a tensor variable: `permute(?s, inverse(?p))`, `lpad(shape(?x), ?s)`.
Conditions compare `shape(?x)`, `rank(?x)`, `dim(?x, i)` (or `shape(?x)[i]`), `size(?x)`,
`dtype(?x)`, `len(?p)`, integers, literal int lists and dtype names with `== != < <= > >=`
(lists and dtypes with `==` and `!=` only: `shape(?x) == [4, 4]`, `?p != [1, 0]`), or test
`is_float(?x)`.

In Python: `Rule("mul_one", "mul(?x, const(1.0))", "?x")`, or build patterns with
`op.mul(var("x"), op.const(1.0))` (computed attributes: `shape=shape_fn("permute", var("s"),
var("p"))`, `shape_fn("shape", var("x"))` for `shape(?x)`). `parse(text)` returns a `RuleSet`;
RuleSets add with `+`.
Everything is checked when it is built: unknown ops, wrong arity, unknown or malformed
attributes, right-side variables not bound on the left, dtype-kind errors (a bool where a
number is needed) and literals their written dtype cannot hold (`const(1e39, dtype=f32)`)
raise `ParseError` with the line and column of the offending text. A literal typed `like=?x`
applies only where ?x's dtype holds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Union

from ..errors import ParseError, UnknownOp, UnknownRule
from ..ir.ops import OPS
from ..ir.scalar_expr import App, Arg, Lit, format_body, parse_body

Pos = tuple[int, int]


@dataclass(frozen=True)
class Var:
    """A pattern variable `?name`."""

    name: str
    pos: Pos = field(default=(0, 0), compare=False)

    def __str__(self) -> str:
        return "?" + self.name


@dataclass(frozen=True)
class Num:
    """A numeric literal (float or int) inside a const value expression."""

    value: float | int
    pos: Pos = field(default=(0, 0), compare=False)

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Arith:
    """A const value computed on the right side: `op` in + - * / neg size."""

    op: str
    args: tuple[Any, ...]
    pos: Pos = field(default=(0, 0), compare=False)

    def __str__(self) -> str:
        if self.op == "neg":
            return f"-{self.args[0]}"
        if self.op == "size":
            return f"size({self.args[0]})"
        return f"({self.args[0]} {self.op} {self.args[1]})"


@dataclass(frozen=True)
class ShapeFnDef:
    """A function computing an int list (a shape, a permutation) from int lists."""

    name: str
    arity: int
    impl: Callable[..., tuple[int, ...]]  # the reference semantics (used by `check`)
    doc: str


def _in_range(i: int, n: int) -> int:
    if not 0 <= i < n:
        raise ValueError(f"index {i} out of range for length {n}")
    return i


# Reference semantics, step for step those of the egglog helpers (so that `check` tests what
# the e-graph computes): undefined, and the rule does not fire, where an index is out of range.
def _permute(s: tuple[int, ...], p: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s[_in_range(i, len(s))] for i in p)


def _inverse(p: tuple[int, ...]) -> tuple[int, ...]:
    inv = list(p)
    for i, j in enumerate(p):
        inv[_in_range(j, len(p))] = i
    return tuple(inv)


def _lpad(s: tuple[int, ...], t: tuple[int, ...]) -> tuple[int, ...]:
    if len(s) > len(t):
        raise ValueError(f"cannot pad length {len(s)} to length {len(t)}")
    return (1,) * (len(t) - len(s)) + tuple(s)


# The functions a right-hand int-list attribute may apply (each has an egglog twin in
# schema.SHAPE_FN_EGGLOG); every argument is an int list.
SHAPE_FNS: dict[str, ShapeFnDef] = {d.name: d for d in (
    ShapeFnDef("permute", 2, _permute, "permute(s, p): s reordered by p, [s[i] for i in p]"),
    ShapeFnDef("inverse", 1, _inverse, "inverse(p): the permutation q with q[p[i]] = i"),
    ShapeFnDef("lpad", 2, _lpad, "lpad(s, t): s left-padded with 1s to len(t) (len(s) <= "
               "len(t)), the shape a right-aligned broadcast to a rank-len(t) shape reads"),
)}


@dataclass(frozen=True)
class ShapeFn:
    """A computed right-hand int-list attribute, `fn(args)`; an argument is a Var bound to an
    int list, a literal tuple, `shape(?x)` (a `Fn`: the shape of a tensor variable) or another
    ShapeFn."""

    name: str
    args: tuple[Any, ...]
    pos: Pos = field(default=(0, 0), compare=False)

    def evaluate(self, env: Callable[[Any], tuple[int, ...]]) -> tuple[int, ...]:
        """Its value, reading a variable (a Var) or a tensor's shape (a `shape` Fn) through
        `env`; ValueError where it is undefined."""
        vals = [a.evaluate(env) if isinstance(a, ShapeFn) else env(a) if isinstance(
            a, (Var, Fn)) else tuple(a) for a in self.args]
        return SHAPE_FNS[self.name].impl(*vals)

    def __str__(self) -> str:
        args = ("[" + ",".join(map(str, a)) + "]" if isinstance(a, tuple) else str(a)
                for a in self.args)
        return f"{self.name}({', '.join(args)})"


def shape_fn_problem(name: str, nargs: int | None = None) -> str | None:
    """What is wrong with a call of shape function `name` with `nargs` arguments (None: not
    counted yet), or None; one wording for rule text and the Python API."""
    d = SHAPE_FNS.get(name)
    if d is None:
        return (f"unknown shape function {name!r} (known: {', '.join(SHAPE_FNS)}; shape(?x) "
                f"reads a tensor's shape)")
    if nargs is not None and nargs != d.arity:
        return f"{name}() takes {d.arity} argument(s), got {nargs}"
    return None


def shape_fn(name: str, *args: Any) -> ShapeFn | Fn:
    """A computed int-list attribute for the Python API: `shape_fn("permute", var("s"),
    var("p"))` is `permute(?s, ?p)`; lists may stand for literal arguments, and
    `shape_fn("shape", var("x"))` is the argument `shape(?x)`."""
    if name == "shape":
        if len(args) != 1 or not isinstance(args[0], Var):
            raise ParseError(f"shape() takes one tensor variable, got {args!r}", 0, 0)
        return Fn("shape", args[0])
    problem = shape_fn_problem(name, len(args))
    if problem:
        raise ParseError(problem, 0, 0)
    fixed = []
    for a in args:
        if isinstance(a, (list, tuple)) and all(isinstance(i, int) for i in a):
            a = tuple(a)
        elif not isinstance(a, (Var, ShapeFn)) and not (isinstance(a, Fn) and a.name == "shape"):
            raise ParseError(f"{name}() takes int lists (a ?variable, a list of ints or another "
                             f"shape function), not {a!r}", 0, 0)
        fixed.append(a)
    return ShapeFn(name, tuple(fixed))


@dataclass(frozen=True)
class Node:
    """`op(args, attr=value, ...)`; attribute values are ints tuples, ints, dtype names, Vars
    or (right side) ShapeFns."""

    op: str
    args: tuple[Pattern, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    pos: Pos = field(default=(0, 0), compare=False)

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def __str__(self) -> str:
        def fmt(v: Any) -> str:
            if isinstance(v, (App, Arg, Lit)):
                return format_body(v)
            return "[" + ",".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)

        parts = [str(a) for a in self.args]
        if self.op == "const":
            parts = [str(self.attr["value"])]
            parts += [f"{k}={fmt(v)}" for k, v in self.attrs if k != "value"]
        else:
            parts += [f"{k}={fmt(v)}" for k, v in self.attrs]
        return f"{self.op}({', '.join(parts)})"


Pattern = Union[Var, Node]


@dataclass(frozen=True)
class Cond:
    """`left OP right`, or a predicate `is_float(?x)` (op "is_float", right None); a side that
    is a literal int list (`shape(?x) == [4, 4]`) is kept as a tuple."""

    op: str
    left: Any
    right: Any = None
    pos: Pos = field(default=(0, 0), compare=False)

    def __post_init__(self) -> None:
        for side in ("left", "right"):
            if isinstance(getattr(self, side), list):
                object.__setattr__(self, side, tuple(getattr(self, side)))

    def __str__(self) -> str:
        if self.op == "is_float":
            return f"is_float({self.left})"
        return f"{_term_str(self.left)} {self.op} {_term_str(self.right)}"


@dataclass(frozen=True)
class Fn:
    """A condition term: `shape(?x)`, `rank(?x)`, `dim(?x, i)`, `size(?x)`, `dtype(?x)`, `len(?p)`;
    `shape(?x)` is also a shape function's argument."""

    name: str
    var: Var
    index: int = 0

    def __str__(self) -> str:
        if self.name == "dim":
            return f"dim({self.var}, {self.index})"
        return f"{self.name}({self.var})"


def _term_str(t: Any) -> str:
    return "[" + ",".join(map(str, t)) + "]" if isinstance(t, tuple) else str(t)


_RULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")  # the rule text's ident token

COND_FNS = {"shape": "tensor", "rank": "tensor", "dim": "tensor", "size": "any",
            "dtype": "tensor", "len": "ints"}
WRITTEN_ATTRS = ("shape", "dtype", "like")


# ---------------------------------------------------------------- rules and rule sets


@dataclass(frozen=True)
class Rule:
    """A named rewrite `lhs => rhs if conds`; kind "analysis" rules run to a fixpoint each round."""

    name: str
    lhs: Pattern
    rhs: Pattern
    conds: tuple[Cond, ...] = ()
    kind: str = "rewrite"
    pos: Pos = field(default=(0, 0), compare=False)

    def __init__(self, name: str, lhs: Pattern | str, rhs: Pattern | str,
                 conds: Iterable[Cond] | str = (), kind: str = "rewrite", pos: Pos = (0, 0)):
        line, col = pos
        if not isinstance(name, str) or not _RULE_NAME.match(name):
            raise ParseError(f"rule name {name!r} is not a name (letters, digits, '_' and '.', "
                             f"not starting with a digit), so the rule could not be written "
                             f"as text", line, col)
        for side, p in (("left", lhs), ("right", rhs)):
            if not isinstance(p, (str, Var, Node)):
                raise ParseError(f"rule {name}: the {side}-hand side must be a pattern (text, "
                                 f"var(...) or op....(...)), not {type(p).__name__}", line, col)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "lhs", parse_pattern(lhs) if isinstance(lhs, str) else lhs)
        object.__setattr__(self, "rhs", parse_pattern(rhs) if isinstance(rhs, str) else rhs)
        if isinstance(conds, str):
            conds = parse_conds(conds) if conds.strip() else ()
        object.__setattr__(self, "conds", tuple(conds))
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "pos", pos)
        from .typing import check_rule

        self.__dict__["sorts"] = check_rule(self)

    def __str__(self) -> str:
        head = "analysis rule" if self.kind == "analysis" else "rule"
        cond = " if " + ", ".join(map(str, self.conds)) if self.conds else ""
        return f"{head} {self.name}: {self.lhs} => {self.rhs}{cond}"


class RuleSet:
    """An ordered, named collection of rules; `a + b` concatenates (names must stay unique)."""

    def __init__(self, rules: Iterable[Rule] = (), name: str = "rules"):
        self.name = name
        self.rules: tuple[Rule, ...] = tuple(rules)
        for r in self.rules:
            if not isinstance(r, Rule):
                raise ParseError(f"a RuleSet holds Rules (eqsat.rules.parse(text) or "
                                 f"Rule(name, lhs, rhs)), not {type(r).__name__}", 0, 0)
        seen: dict[str, Rule] = {}
        for r in self.rules:
            if r.name in seen:
                line, col = r.pos
                raise ParseError(f"rule {r.name!r} is defined twice", line, col)
            seen[r.name] = r

    def __add__(self, other: RuleSet) -> RuleSet:
        if not isinstance(other, RuleSet):
            return NotImplemented
        return RuleSet(self.rules + other.rules, f"{self.name}+{other.name}")

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise UnknownRule(f"{self.name} has no rule named {name!r}")

    def names(self) -> list[str]:
        """The rule names in order."""
        return [r.name for r in self.rules]

    def without(self, *names: str) -> RuleSet:
        """This set less the rules `names` (say, the approximate ones); a name it does not
        hold is an `eqsat.Error`, so a typo cannot leave a rule in silently."""
        unknown = [n for n in names if n not in self.names()]
        if unknown:
            raise UnknownRule(f"{self.name} has no rule named {', '.join(map(repr, unknown))}")
        return RuleSet((r for r in self.rules if r.name not in names), self.name)

    def __str__(self) -> str:
        return "\n".join(map(str, self.rules)) + "\n"

    def __repr__(self) -> str:
        return f"<RuleSet {self.name}: {len(self.rules)} rules>"


def parse(text: str, name: str = "rules") -> RuleSet:
    """Parse rule text (one `rule NAME: LHS => RHS [if ...]` per line) into a checked RuleSet."""
    from .rule_text import RuleParser

    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise ParseError(f"expected rule text, got {type(text).__name__}", 0, 0)
    try:
        return RuleSet(RuleParser(text.removeprefix("\ufeff")).rules(), name)  # a BOM is no rule
    except RecursionError:
        raise ParseError("a pattern nests too deeply to parse (hundreds of levels); split the "
                         "rule into smaller ones", 1, 1) from None


def parse_pattern(text: str) -> Pattern:
    """Parse one pattern, e.g. `mul(?x, const(1.0))`."""
    from .rule_text import RuleParser

    p = RuleParser(text)
    pat = p.pattern()
    if p.tok.kind not in ("eof", "nl"):
        raise p.error(f"unexpected {p.tok.text!r} after the pattern")
    return pat


def parse_conds(text: str) -> tuple[Cond, ...]:
    """Parse a condition list, e.g. `shape(?x) == shape(?y), rank(?a) == 2`."""
    from .rule_text import RuleParser

    p = RuleParser(text)
    conds = [p.cond()]
    while p.accept(",") or p.accept("and"):
        conds.append(p.cond())
    if p.tok.kind not in ("eof", "nl"):
        raise p.error(f"unexpected {p.tok.text!r} after the condition")
    return tuple(conds)


def through_elementwise(wrapper: str, unary_name: str, binary_name: str,
                        binary_cond: str = "") -> str:
    """Rule text moving every unary and binary op of the table through `wrapper` (written with
    `{}` where the wrapped value goes, e.g. `transpose({}, perm=?p)`): `op(W(?x)) => W(op(?x))`
    and `op(W(?x), W(?y)) => W(op(?x, ?y))`, named `unary_name` / `binary_name` with `{op}`."""
    from ..ir.ops import BINARY, UNARY

    w = wrapper.format
    cond = f" if {binary_cond}" if binary_cond else ""
    lines = [f"rule {unary_name.format(op=op)}: {op}({w('?x')}) => {w(f'{op}(?x)')}"
             for op in sorted(UNARY)]
    lines += [f"rule {binary_name.format(op=op)}: {op}({w('?x')}, {w('?y')}) => "
              f"{w(f'{op}(?x, ?y)')}{cond}" for op in sorted(BINARY)]
    return "\n".join(lines)


def var(name: str) -> Var:
    """A pattern variable for the Python API (`var("x")` is `?x`)."""
    return Var(name)


class _OpBuilder:
    """`op.mul(a, b)`, `op.transpose(x, perm=(1, 0))`, `op.const(1.0, like=var("x"))`."""

    def __getattr__(self, name: str) -> Any:
        if name not in OPS:
            if name.startswith("__"):  # copy, inspect and doctest probe for these
                raise AttributeError(name)
            raise UnknownOp(f"unknown op {name!r} (known: {', '.join(sorted(OPS))})")

        def build(*args: Any, **attrs: Any) -> Node:
            if name == "const":
                value = args[0] if len(args) == 1 else None
                if isinstance(value, bool):
                    value = int(value)
                if not isinstance(value, (Var, Arith, Num, int, float)):
                    raise ParseError(f"op.const takes one value (a number or a var), got "
                                     f"{args!r}", 0, 0)
                value = value if isinstance(value, (Var, Arith, Num)) else Num(value)
                return Node("const", (), (("value", value),) + tuple(attrs.items()))
            fixed = tuple((k, tuple(v) if isinstance(v, list) else parse_body(v) if
                           k == "body" and isinstance(v, str) else v) for k, v in attrs.items())
            return Node(name, tuple(args), fixed)

        return build


op = _OpBuilder()
