"""Compile checked rules to egglog rules over the constructors of `schema`: each matches its
left side and unions its right side with it, as an egglog `rewrite` does.

Values a right-hand side needs but cannot name (the dtype of a new broadcast, the shape behind
`like=`, a computed constant) are bound in the rule's query, so a rule whose computation fails
(a division by zero, a missing shape) simply does not fire. A computed int list
(`shape=permute(?s, ?p)`) is read from the schema's helper function (`permuted`; an argument
`shape(?x)` is ?x's entry in the `shape` table), which the
analysis fills only on demand: each one also gets a companion analysis rule that matches the
same left side and asks for the value, so it is ready before the rewrite runs.
A rule not declared well-typed (`typing.declare_well_typed`: the built-in families) adds its
right side to `typed-union` instead of unioning it (see schema), and the bodies of the kernels
it makes are typed by analysis rules of its own (`body-types`). In a set that holds one,
every rule matches only a typed left side.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..ir.fused import body_signatures
from ..ir.ops import INTS, OPS
from ..ir.scalar_expr import format_body
from ..ir.types import DTYPES
from . import schema
from .bridge import _float, _vec
from .lang import Cond, Fn, Node, Num, Pattern, Rule, RuleSet, ShapeFn, Var
from .typing import is_well_typed


def _v(name: str) -> str:
    return "v_" + name


class _Compiler:
    def __init__(self, rule: Rule):
        self.rule = rule
        self.facts: list[str] = []
        self.n = 0
        # (facts the value needs, action asking the analysis for it), one per ShapeFn
        self.demands: list[tuple[list[str], str]] = []
        self.memo: dict[str, str] = {}

    def fresh(self, prefix: str = "w") -> str:
        self.n += 1
        return f"_{prefix}{self.n}"

    def bound(self, expr: str) -> str:
        """A query variable equal to `expr` (functions cannot be looked up in actions); one per
        expression, so that a rule reading `(shape v_x)` thrice joins on it once."""
        if expr not in self.memo:
            self.memo[expr] = self.fresh("b")
            self.facts.append(f"(= {self.memo[expr]} {expr})")
        return self.memo[expr]

    def attr(self, v: Any, kind: str) -> str:
        if isinstance(v, Var):
            return _v(v.name)
        if isinstance(v, ShapeFn):
            return self.shape_fn(v)
        if isinstance(v, Fn):  # shape(?x), a shape function's argument
            return self.bound(f"(shape {_v(v.var.name)})")
        if kind in schema.ATTR_CODECS:  # e.g. a fused kernel's body, stored as its text
            return json.dumps(schema.ATTR_CODECS[kind][0](v))
        if kind == INTS:
            return _vec(v)
        if isinstance(v, str):
            return f'"{v}"'
        return str(int(v))

    # ------------------------------------------------------------------ left-hand side

    def lhs(self, p: Pattern) -> str:
        if isinstance(p, Var):
            return _v(p.name)
        attrs = p.attr
        if p.op == "const":
            value = attrs["value"]
            is_int = isinstance(value, Num) and isinstance(value.value, int)
            lit = (str(value.value) if is_int else _float(value.value)) if isinstance(
                value, Num) else _v(value.name)
            dt = self.attr(attrs["dtype"], "") if "dtype" in attrs else self.fresh()
            sh = self.attr(attrs["shape"], INTS) if "shape" in attrs else self.fresh()
            return f"({'ConstI' if is_int else 'ConstF'} {lit} {dt} {sh})"
        enc = schema.encodings()[p.op]
        args = [self.lhs(a) for a in p.args]
        if enc.variadic:
            args = [_cons(args)]
        for name, kind in enc.attrs:
            args.append(self.attr(attrs[name], kind) if name in attrs else self.fresh())
        if enc.written:
            args.append(self.attr(attrs["dtype"], "") if "dtype" in attrs else self.fresh())
            args.append(self.attr(attrs["shape"], INTS) if "shape" in attrs else self.fresh())
        return f"({schema.ctor(p.op)} {' '.join(args)})"

    # ------------------------------------------------------------------ right-hand side

    def dtype_of(self, p: Pattern) -> str:
        """An egglog expression (bound in the facts) for the dtype of a right-hand pattern."""
        if isinstance(p, Var):
            return self.bound(f"(dtype {_v(p.name)})")
        attrs = p.attr
        if "dtype" in attrs:
            return self.attr(attrs["dtype"], "")
        if "like" in attrs:
            return self.bound(f"(dtype {_v(attrs['like'].name)})")
        if OPS[p.op].family == "compare":
            return '"bool"'
        return self.dtype_of(p.args[1] if p.op == "select" else p.args[0])

    def shape_of_written(self, p: Node) -> str:
        attrs = p.attr
        if "shape" in attrs:
            return self.attr(attrs["shape"], INTS)
        if "like" in attrs:
            return self.bound(f"(shape {_v(attrs['like'].name)})")
        return self.bound(f"(shape {_v(p.args[0].name)})")  # cast of a variable (typing checks)

    def value(self, v: Any) -> str:
        if isinstance(v, Num):
            return _float(float(v.value))
        if isinstance(v, Var):
            return _v(v.name)
        if v.op == "size":
            name = _v(v.args[0].name)
            sort = self.rule.__dict__["sorts"][v.args[0].name]
            shape = self.bound(f"(shape {name})") if sort == "tensor" else name
            return self.bound(f"(to-f64 (numel {shape}))")
        if v.op == "neg":
            return self.bound(f"(neg {self.value(v.args[0])})")
        return self.bound(f"({v.op} {self.value(v.args[0])} {self.value(v.args[1])})")

    def rhs(self, p: Pattern) -> str:
        if isinstance(p, Var):
            return _v(p.name)
        attrs = p.attr
        if p.op == "const":
            value = attrs["value"]
            is_int = isinstance(value, Num) and isinstance(value.value, int)
            dt = self.dtype_of_const(p)
            sh = self.shape_of_written(p)
            # a float constant only for float dtypes, an integer one only for the others
            self.facts.append(f"({'int' if is_int else 'float'}-dtype {dt})")
            lit = str(value.value) if is_int else self.value(value)
            if isinstance(value, Num):
                self.literal_in(value.value, dt)
            if not is_int and not isinstance(value, Num):
                # a computed float never folds to a zero: egglog's f64 equality does not tell
                # -0.0 from 0.0, so a zero result could join the class of the other zero
                self.facts.append(f"(!= {lit} 0.0)")
                self.exact_in(lit, dt)
            return f"({'ConstI' if is_int else 'ConstF'} {lit} {dt} {sh})"
        enc = schema.encodings()[p.op]
        args = [self.rhs(a) for a in p.args]
        if enc.variadic:
            args = [_cons(args)]
        args += [self.attr(attrs[name], kind) for name, kind in enc.attrs]
        if enc.written:
            dt = self.attr(attrs["dtype"], "") if "dtype" in attrs else (
                self.bound(f"(dtype {_v(attrs['like'].name)})") if "like" in attrs
                else self.dtype_of(p.args[0]))
            args += [dt, self.shape_of_written(p)]
        return f"({schema.ctor(p.op)} {' '.join(args)})"

    def literal_in(self, value: float, dtype: str) -> None:
        """Facts that a literal of the rule is a value of `dtype`: `const(1e39, like=?x)` is
        no f32 constant (the IR refuses one), so the rule applies only where it fits."""
        if isinstance(value, int):
            self.facts.append(f"(>= {value} (min-int {dtype}))")
            self.facts.append(f"(<= {value} (max-int {dtype}))")
        elif math.isfinite(value) and value != 0:
            self.facts.append(f"(<= {_float(abs(value))} (max-finite {dtype}))")

    def exact_in(self, value: str, dtype: str) -> None:
        """Facts that a value computed in f64 is exactly a finite, normal value of `dtype`.

        Folding computes in egglog's f64: an f32 result that needs rounding would be used
        unrounded by the next fold ((1 + 2^-30) - 1 folds to 2^-30 where f32 gives 0), so it
        does not fold. Veltkamp's split by 2^29 + 1 rounds to 24 significant bits, f32's
        significand; a value it keeps is one. A single f32 operation's f64 result that fits
        is also its correctly rounded f32 result (53 >= 2 * 24 + 2 bits: no double rounding).
        """
        c = self.bound(f"(* {value} (split-factor {dtype}))")
        self.facts.append(f"(= {value} (- {c} (- {c} {value})))")
        magnitude = self.bound(f"(abs {value})")
        self.facts.append(f"(<= {magnitude} (max-finite {dtype}))")
        self.facts.append(f"(>= {magnitude} (min-normal {dtype}))")

    def dtype_of_const(self, p: Node) -> str:
        attrs = p.attr
        if "dtype" in attrs:
            return self.attr(attrs["dtype"], "")
        return self.bound(f"(dtype {_v(attrs['like'].name)})")

    def shape_fn(self, f: ShapeFn) -> str:
        """A query variable holding `f`'s value; inner calls are bound (and demanded) first."""
        args = [self.attr(a, INTS) for a in f.args]
        function, demand = schema.SHAPE_FN_EGGLOG[f.name]
        self.demands.append((list(self.facts), demand.format(*args)))
        return self.bound(f"({function} {' '.join(args)})")

    # ------------------------------------------------------------------ conditions

    def term(self, t: Any) -> str:
        if isinstance(t, Fn):
            x = _v(t.var.name)
            sort = self.rule.__dict__["sorts"][t.var.name]
            if t.name == "len":
                return self.bound(f"(vec-length {x})")
            if t.name == "dtype":
                return self.bound(f"(dtype {x})")
            shape = self.bound(f"(shape {x})") if sort == "tensor" else x
            if t.name == "shape":
                return shape
            if t.name == "rank":
                return self.bound(f"(vec-length {shape})")
            if t.name == "size":
                return self.bound(f"(numel {shape})")
            index = str(t.index) if t.index >= 0 else self.bound(
                f"(- (vec-length {shape}) {-t.index})")
            return self.bound(f"(vec-get {shape} {index})")
        if isinstance(t, Var):
            return _v(t.name)
        if isinstance(t, str) and t in DTYPES:
            return f'"{t}"'
        if isinstance(t, tuple):  # a literal int list, `shape(?x) == [4, 4]`
            return _vec(t)
        return str(int(t))

    def cond(self, c: Cond) -> None:
        if c.op == "is_float":
            self.facts.append(f"(float-dtype {self.bound(f'(dtype {_v(c.left.name)})')})")
            return
        left, right = self.term(c.left), self.term(c.right)
        egg = {"==": "=", "!=": "!="}.get(c.op, c.op)
        self.facts.append(f"({egg} {left} {right})")


def _cons(items: list[str]) -> str:
    out = "(TNil)"
    for item in reversed(items):
        out = f"(TCons {item} {out})"
    return out


# Kernel ops whose dtype is their body's, and what types a constant nothing else fixes in it
# (`fused.body_signatures`): the written dtype of a map, the product's of a matmul_epi.
_KERNELS = {"map": "result", "map_reduce": None, "matmul_epi": "first"}


def _kernels(p: Pattern) -> list[Node]:
    """The kernel nodes of a right-hand side: their dtype is their body's."""
    if not isinstance(p, Node):
        return []
    own = [p] if p.op in _KERNELS else []
    return own + [k for a in p.args for k in _kernels(a)]


def _body_types(rule: Rule) -> list[str]:
    """Analysis rules typing the bodies of the kernels that `rule` makes, one per signature of
    each body (`fused.body_signatures`): egglog cannot type a body, so each body's type rule
    is spelled out as the operand dtypes it types on and the dtype it computes there, in
    `body-types` (operands, body, the dtype it is expected to compute or "", that dtype)."""
    out: list[str] = []
    seen: set[tuple] = set()
    for k in _kernels(rule.rhs):
        body, n, expect = k.attr["body"], len(k.args), _KERNELS[k.op]
        if (k.op, body, n) in seen:
            continue
        seen.add((k.op, body, n))
        xs = [f"x{i}" for i in range(n)]
        ins = [xs[0]] + xs[2:] if k.op == "matmul_epi" else xs
        text = json.dumps(format_body(body))
        enc = schema.encodings()[k.op]
        slots = [text if name == "body" else f"_a{i}" for i, (name, _) in enumerate(enc.attrs)]
        node = f"({schema.ctor(k.op)} l {' '.join(slots)}{' _wd _ws' if enc.written else ''})"
        for sig, result in body_signatures(body, len(ins), expect):
            facts = " ".join(f'(= (dtype {x}) "{d}")' for x, d in zip(ins, sig) if d is not None)
            want = f'"{result}"' if expect == "result" else '""'
            out.append(f"(rule ((= _t {node}) (= l {_cons(xs)}) {facts}) "
                       f'((body-types l {text} {want} "{result}")) '
                       f':ruleset {schema.ANALYSIS} :name "{rule.name}/body{len(out)}")')
    return out


def compile_rule(rule: Rule, typed: bool | None = None, typed_roots: bool = True) -> str:
    """The egglog commands for one rule (in the analysis or the rewrite ruleset): the rewrite,
    preceded by the analysis rules that compute its shape functions' values and type the
    bodies of the kernels it makes. A typed rule (by default, one not declared well-typed:
    `typing.declare_well_typed`) adds its right side to `typed-union`, which unions it with
    the left side only where both are typed alike (see schema), so an instance that would
    not type is skipped; the others union it at once. `typed_roots`: match only a typed left
    side (a typed rule always does)."""
    typed = not is_well_typed(rule) if typed is None else typed
    c = _Compiler(rule)
    lhs = c.lhs(rule.lhs)
    for cond in rule.conds:
        c.cond(cond)
    rhs = c.rhs(rule.rhs)
    ruleset = schema.ANALYSIS if rule.kind == "analysis" else schema.REWRITE
    needs = [f"(rule ((= _root {lhs}) {' '.join(facts)}) ({action}) :ruleset {schema.ANALYSIS} "
             f':name "{rule.name}/need{i}")' for i, (facts, action) in enumerate(c.demands)]
    if not (typed or typed_roots):  # an egglog rewrite is the rule below without the guard
        when = f" :when ({' '.join(c.facts)})" if c.facts else ""
        return "\n".join(needs + [
            f'(rewrite {lhs} {rhs}{when} :ruleset {ruleset} :name "{rule.name}")'])
    # The guard: an untyped term is the right side of an instance the typed step skipped (the
    # union could never follow, and where it matched the rule again it made one such term a
    # round), and a rule is sound only on terms that type, so a well-typed rule could union
    # one that does not into a typed e-class.
    query = f"(= _root {lhs}) (= _rs (shape _root)) {' '.join(c.facts)}"
    union = f"(typed-union _root {rhs})" if typed else f"(union _root {rhs})"
    return "\n".join(needs + (_body_types(rule) if typed else []) + [
        f'(rule ({query}) ({union}) :ruleset {ruleset} :name "{rule.name}")'])


# id(rule tuple) -> (that tuple, its typed flags, its program), least recently used first.
# Rules are frozen and a tuple immutable, so the tuple itself (held here, so its id is not
# reused) and the flags (`declare_well_typed` may come later) fix the program: compiling the
# built-in set took ~5 ms of every optimize, and `default()` hands out the same tuple.
_PROGRAMS: dict[int, tuple[tuple[Rule, ...], tuple[bool, ...], str]] = {}
KEEP_PROGRAMS = 8


def compile_ruleset(rules: RuleSet) -> str:
    """The egglog program for a whole rule set: the typed step for every rule not declared
    well-typed (`typing.declare_well_typed`) and, where there is one, every rule matching
    only a typed left side. A set of well-typed rules makes no untyped term: its rules are
    plain rewrites (the guard made egglog's push and pop of a kept e-graph, a third of a small
    program's saturation, 0.6 ms slower)."""
    held = rules.rules
    typed = tuple(not is_well_typed(r) for r in held)
    kept = _PROGRAMS.pop(id(held), None)
    if kept is not None and kept[0] is held and kept[1] == typed:
        _PROGRAMS[id(held)] = kept  # the most recent, evicted last
        return kept[2]
    program = "\n".join(compile_rule(r, t, any(typed)) for r, t in zip(held, typed))
    while len(_PROGRAMS) >= KEEP_PROGRAMS:
        _PROGRAMS.pop(next(iter(_PROGRAMS), None), None)
    _PROGRAMS[id(held)] = (held, typed, program)
    return program


def checks_types(rules: RuleSet) -> bool:
    """Whether the e-graph's type analysis must check the op type rules for `rules`: where a
    rule takes the typed step. A set of well-typed rules makes only terms that type, and the
    analysis may just compute their types (`schema.prelude(checks=False)`)."""
    return not all(is_well_typed(r) for r in rules)
