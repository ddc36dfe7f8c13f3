"""Static checks of a rule when it is built: ops, arity, attributes, variables and dtype kinds.

Every error is a `ParseError` at the line and column of the offending part of the rule text
(rules built in Python have no text; their errors are at line 0).
"""

from __future__ import annotations

from typing import Any

from ..errors import ParseError
from ..ir.fused import BODY, MAX_SIGNATURE_GROUPS, REDUCER, body_signatures
from ..ir.ops import CALLEE, INT, INTS, OPS, literal_fits, ops_in
from ..ir.scalar_expr import App, Arg, Lit, body_args, body_op_names, format_body
from ..ir.types import DTYPES, DType
from . import schema
from .lang import (WRITTEN_ATTRS, Arith, Cond, Fn, Node, Num, Pattern, Rule, RuleSet, ShapeFn,
                   Var)

ANY = frozenset({"bool", "int", "float"})
NUM = frozenset({"int", "float"})
FLOAT = frozenset({"float"})
BOOL = frozenset({"bool"})


def _err(msg: str, where: Any, rule: Rule) -> ParseError:
    line, col = getattr(where, "pos", None) or rule.pos
    return ParseError(f"rule {rule.name}: {msg}", line, col)


def _operand_kinds(node: Node) -> list[frozenset[str]]:
    op = OPS[node.op]
    n = len(node.args)
    if op.family == "unary":
        from ..ir.ops import UNARY_IMPLS

        return [FLOAT if UNARY_IMPLS.get(node.op, (None, False))[1] else NUM] * n
    if op.family in ("binary", "matmul") or node.op == "sum":
        return [NUM] * n
    if node.op == "select":
        return [BOOL, ANY, ANY]
    return [ANY] * n


_I64 = 2**63  # egglog's integers are i64: a literal beyond them fails to load the rule


def _ints(v: Any) -> list[int]:
    """The integer literals in an attribute, const value or condition term."""
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, Num):
        return _ints(v.value)
    if isinstance(v, (Arith, ShapeFn)):
        return [i for a in v.args for i in _ints(a)]
    if isinstance(v, tuple):
        return [i for a in v for i in _ints(a)]
    return []


def _literal_problem(v: Any, dtype: Any) -> str | None:
    """Why a literal cannot be a constant of the dtype written next to it (1e39 as f32), or
    None; a literal of the other kind (2 as f32) is the kinds' check's to report."""
    if not isinstance(v, Num) or dtype not in DTYPES or DTYPES[dtype] is DType.bool:
        return None
    if isinstance(v.value, float) != DTYPES[dtype].is_float:
        return None
    return literal_fits(v.value, DTYPES[dtype])


def _int_list(v: Any) -> bool:
    """Whether `v` is a literal int list attribute, `(1, 0)`."""
    return isinstance(v, tuple) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in v)


def _body_inputs(node: Node) -> int:
    """How many $i a kernel body of `node` reads: matmul_epi's $0 is the product."""
    return len(node.args) - 1 if node.op == "matmul_epi" else len(node.args)


def _body_problem(e: Any, n: int) -> str | None:
    """What makes `e` no body over `n` inputs (ops, arities, $i in range), or None; dtypes
    wait for the values a rule meets."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Arg):
            if x.index >= n:
                return f"${x.index} is out of range with {n} input(s)"
        elif isinstance(x, App):
            if x.op not in body_op_names():
                return f"{x.op!r} is not an op a body may apply"
            if len(x.args) != OPS[x.op].arity:
                return f"{x.op} takes {OPS[x.op].arity} operand(s), got {len(x.args)} in " \
                       f"{format_body(x)}"
            stack.extend(x.args)
        elif not isinstance(x, Lit):
            return f"a body expression like tanh($0) is needed, not {x!r}"
    return None


class _Checker:
    def __init__(self, rule: Rule):
        self.rule = rule
        self.sorts: dict[str, str] = {}
        self.kinds: dict[str, frozenset[str]] = {}
        self.encodable = set(schema.encodings()) | {"const"}

    def fail(self, msg: str, where: Any) -> ParseError:
        return _err(msg, where, self.rule)

    def bind(self, v: Var, sort: str, lhs: bool) -> None:
        have = self.sorts.get(v.name)
        if have is None:
            if not lhs:
                raise self.fail(f"variable ?{v.name} is not bound on the left-hand side", v)
            self.sorts[v.name] = sort
        elif have != sort:
            raise self.fail(f"variable ?{v.name} is used as {sort} here but as {have} before", v)

    def constrain(self, v: Var, kinds: frozenset[str]) -> None:
        have = self.kinds.get(v.name, ANY) & kinds
        if not have:
            raise self.fail(f"type error: ?{v.name} would need to be both "
                            f"{'/'.join(sorted(self.kinds.get(v.name, ANY)))} and "
                            f"{'/'.join(sorted(kinds))}", v)
        self.kinds[v.name] = have

    def pattern(self, p: Pattern, lhs: bool, want: frozenset[str] = ANY) -> frozenset[str]:
        if not isinstance(p, (Var, Node)):
            raise self.fail(f"an operand must be a pattern (var(...) or op....(...)), not "
                            f"{p!r}", self.rule)
        if isinstance(p, Var):
            self.bind(p, "tensor", lhs)
            self.constrain(p, want)
            return self.kinds[p.name]
        op = OPS.get(p.op)
        if op is None:
            raise self.fail(f"unknown op {p.op!r}", p)
        if p.op not in self.encodable:
            raise self.fail(f"op {p.op!r} cannot appear in rules", p)
        if not lhs and p.op in schema.LOAD_ONLY:
            raise self.fail(f"op {p.op!r} cannot be created by rules yet (no type analysis)", p)
        n = len(p.args)
        if op.arity is None and n == 0:
            raise self.fail(f"{p.op} needs at least one operand", p)
        if op.arity is not None and n != op.arity:
            raise self.fail(f"{p.op} takes {op.arity} operand(s), got {n}", p)
        self.attrs(p, lhs)
        for key, v in p.attrs:
            if any(abs(i) >= _I64 for i in _ints(v)):
                what = "its value" if key == "value" else f"{key}="
                raise self.fail(f"{p.op}: {what} holds an integer beyond the 64-bit range", p)
        kinds = [self.pattern(a, lhs, k) for a, k in zip(p.args, _operand_kinds(p))]
        result = self.result_kind(p, kinds, lhs)
        if not result & want:
            raise self.fail(f"type error: {p.op} gives {'/'.join(sorted(result))} where "
                            f"{'/'.join(sorted(want))} is needed", p)
        return result & want

    def result_kind(self, p: Node, kinds: list[frozenset[str]], lhs: bool) -> frozenset[str]:
        op = OPS[p.op]
        if p.op == "const":
            v = p.attr.get("value")
            return NUM - FLOAT | BOOL if isinstance(v, Num) and isinstance(v.value, int) else FLOAT
        if op.family == "compare":
            return BOOL
        dt = p.attr.get("dtype")
        if isinstance(dt, str):
            return FLOAT if DTYPES[dt].is_float else (BOOL if dt == "bool" else NUM - FLOAT)
        if p.op == "select":
            return kinds[1] & kinds[2]
        if p.op == "cast":  # the dtype of like=?y (or of a dtype variable), not the operand's
            like = p.attr.get("like")
            return self.kinds.get(like.name, ANY) if isinstance(like, Var) else ANY
        if p.op == "map_reduce":
            return self.kernel_kind(p, kinds, lhs)
        return kinds[0] if kinds else ANY

    def kernel_kind(self, p: Node, kinds: list[frozenset[str]], lhs: bool) -> frozenset[str]:
        """The dtype kinds a map_reduce computes: its body's, on the operand kinds the rule
        allows (a kernel made on the right side needs its body written: egglog types it by
        the body's signatures)."""
        body, reduce = p.attr.get("body"), p.attr.get("reduce")
        if not isinstance(body, (App, Arg, Lit)):
            if not lhs:
                raise self.fail("map_reduce on the right-hand side needs its body written out "
                                "(body=exp($0)): the e-graph types a kernel it makes by its body",
                                p)
            return ANY
        out = set()
        for ins, result in body_signatures(body, len(p.args)):
            if (all(d is None or _kind(d) in k for d, k in zip(ins, kinds))
                    and (reduce != "sum" or result.is_numeric)):
                out.add(_kind(result))
        if not out and lhs:
            return ANY  # matches nothing; harmless
        if not out:
            why = (f" (a kernel made by a rule reads at most {MAX_SIGNATURE_GROUPS} inputs of "
                   f"independent dtypes)" if len(body_args(body)) > MAX_SIGNATURE_GROUPS else
                   " (a sum of bools is none)" if reduce == "sum" else "")
            raise self.fail(f"map_reduce: the body {format_body(body)} types on none of the "
                            f"operand dtypes the rule allows{why}", p)
        return frozenset(out)

    def attrs(self, p: Node, lhs: bool) -> None:
        op = OPS[p.op]
        specs = dict(op.attrs)
        written = op.written_type or p.op == "const"
        keys = [k for k, _ in p.attrs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise self.fail(f"{p.op} is given {', '.join(twice)} more than once", p)
        for key, v in p.attrs:
            if key == "value" and p.op == "const":
                self.value(v, lhs, p)
                problem = _literal_problem(v, p.attr.get("dtype"))
                if problem:
                    raise self.fail(f"const: {problem}", v)
            elif key in specs:
                kind = specs[key]
                if kind == CALLEE:
                    raise self.fail(f"{p.op} cannot appear in rules", p)
                if isinstance(v, Var):
                    self.bind(v, {INTS: "ints", INT: "int"}.get(kind, kind), lhs)
                elif kind == INTS and isinstance(v, ShapeFn):
                    self.shape_fn(v, lhs)
                elif kind == INTS and not _int_list(v):
                    raise self.fail(f"attribute {key} of {p.op} takes a list like [0,1]", p)
                elif kind == INT and (not isinstance(v, int) or isinstance(v, bool)):
                    raise self.fail(f"attribute {key} of {p.op} takes an integer", p)
                elif kind == REDUCER and v not in ops_in("reduce"):
                    raise self.fail(f"attribute {key} of {p.op} takes a reduction "
                                    f"({', '.join(sorted(ops_in('reduce')))}), not {v!r}", p)
                elif kind == BODY:
                    problem = _body_problem(v, _body_inputs(p))
                    if problem:
                        raise self.fail(f"{key} of {p.op}: {problem}", p)
            elif written and key in WRITTEN_ATTRS:
                self.written_attr(p, key, v, lhs)
            else:
                takes = ", ".join(list(specs) + (list(WRITTEN_ATTRS) if written else []))
                raise self.fail(f"{p.op} has no attribute {key!r} (it takes: {takes or 'none'})",
                                p)
        if lhs:
            return
        given = p.attr
        missing = [k for k in specs if k not in given and k != "value"]
        if missing:
            raise self.fail(f"{p.op} on the right-hand side needs {', '.join(missing)}", p)
        if p.op in ("map", "matmul_epi") and not isinstance(given.get("body"), (App, Arg, Lit)):
            raise self.fail(f"{p.op} on the right-hand side needs its body written out "
                            f"(body=exp($0)): the e-graph types a kernel it makes by its body",
                            p)
        if p.op in ("broadcast", "reshape") and not ({"shape", "like"} & set(given)):
            raise self.fail(f"{p.op} on the right-hand side needs shape= or like=", p)
        if p.op == "cast" and not ({"dtype", "like"} & set(given)):
            raise self.fail("cast on the right-hand side needs dtype= or like=", p)
        if p.op == "cast" and "like" not in given and "shape" not in given and not isinstance(
                p.args[0], Var):
            raise self.fail("cast of a compound operand needs shape= or like=", p)
        if p.op == "const" and "like" not in given and not {"shape", "dtype"} <= set(given):
            raise self.fail("const on the right-hand side needs like=?x or shape= and dtype=", p)

    def written_attr(self, p: Node, key: str, v: Any, lhs: bool) -> None:
        if key == "like":
            if lhs:
                raise self.fail("like= is for the right-hand side", p)
            if not isinstance(v, Var):
                raise self.fail("like= takes a tensor variable", p)
            self.bind(v, "tensor", lhs)
        elif key == "shape":
            if isinstance(v, Var):
                self.bind(v, "ints", lhs)
            elif isinstance(v, ShapeFn):
                self.shape_fn(v, lhs)
            elif not _int_list(v):
                raise self.fail("shape= takes a list like [2,3] or a variable", p)
        elif isinstance(v, Var):
            self.bind(v, "dtype", lhs)
        elif v not in DTYPES:
            raise self.fail(f"dtype= takes one of {', '.join(DTYPES)}", p)

    def shape_fn(self, f: ShapeFn, lhs: bool) -> None:
        if lhs:
            raise self.fail(f"{f.name}() computes an attribute: it belongs on the right-hand "
                            f"side (bind the attribute to a ?variable on the left)", f)
        for a in f.args:
            if isinstance(a, ShapeFn):
                self.shape_fn(a, lhs)
            elif isinstance(a, Fn):  # shape(?x): the shape of a tensor bound on the left
                sort = self.sorts.get(a.var.name)
                if sort not in (None, "tensor"):
                    raise self.fail(f"shape() takes a tensor variable, but ?{a.var.name} is "
                                    f"bound as {sort}", a.var)
                self.bind(a.var, "tensor", lhs)
            elif isinstance(a, Var):
                sort = self.sorts.get(a.name)
                if sort not in (None, "ints"):
                    raise self.fail(f"{f.name}() takes int lists (shapes, permutations), but "
                                    f"?{a.name} is bound as {sort}", a)
                self.bind(a, "ints", lhs)

    def value(self, v: Any, lhs: bool, where: Node) -> None:
        if isinstance(v, Num):
            if isinstance(v.value, bool) or not isinstance(v.value, (int, float)):
                raise self.fail(f"a const's value is a number, not {v.value!r}", where)
            return
        if isinstance(v, Var):
            self.bind(v, "value", lhs)
            return
        if lhs or not isinstance(v, Arith):
            raise self.fail("a const on the left-hand side takes a literal or a variable", where)
        if v.op == "size":
            (x,) = v.args
            if self.sorts.get(x.name) not in ("tensor", "ints"):
                raise self.fail(f"size() needs a tensor or shape variable, got ?{x.name}", x)
            return
        for a in v.args:
            self.value(a, lhs, where)

    def cond(self, c: Cond) -> None:
        for side in (c.left, c.right):
            if any(abs(i) >= _I64 for i in _ints(side.index if isinstance(side, Fn) else side)):
                raise self.fail(f"{c} holds an integer beyond the 64-bit range", c)
            if isinstance(side, Fn):
                sort = self.sorts.get(side.var.name)
                if sort is None:
                    raise self.fail(f"variable ?{side.var.name} in the condition is not bound "
                                    f"on the left-hand side", side.var)
                need = schema_sort(side.name)
                if need != "any" and sort != need or need == "any" and sort not in (
                        "tensor", "ints"):
                    raise self.fail(f"{side.name}() cannot take ?{side.var.name} ({sort})",
                                    side.var)
            elif isinstance(side, Var):
                if side.name not in self.sorts:
                    raise self.fail(f"variable ?{side.name} in the condition is not bound on "
                                    f"the left-hand side", side)
        if c.op == "is_float":
            if self.sorts.get(c.left.name) != "tensor":
                raise self.fail(f"is_float() needs a tensor variable, got ?{c.left.name}",
                                c.left)
            return
        left, right = self.cond_sort(c.left), self.cond_sort(c.right)
        for fn, lit in ((c.left, c.right), (c.right, c.left)):
            if isinstance(fn, Fn) and fn.name == "shape" and _int_list(lit) and min(
                    lit, default=0) < 0:
                raise self.fail(f"{c} can never hold: a shape's dims are >= 0", c)
        if c.op in ("==", "!=") and left != right:
            raise self.fail(f"type error: {c} compares {_A_SORT[left]} with "
                            f"{_A_SORT[right]}", c)
        if c.op not in ("==", "!=") and (left, right) != ("int", "int"):
            raise self.fail(f"type error: {c} orders {_A_SORT[left]} and {_A_SORT[right]}; "
                            f"{c.op} compares integers only", c)

    def cond_sort(self, t: Any) -> str:
        """What a condition term is, as egglog compares it: an int, an int list or a dtype."""
        if isinstance(t, Fn):
            return _FN_SORT[t.name]
        if isinstance(t, Var):
            sort = self.sorts[t.name]
            if sort not in _VAR_SORT:
                raise self.fail(f"?{t.name} ({sort}) cannot be compared in a condition: compare "
                                f"shape(?x), rank(?x), dim(?x, i), size(?x), dtype(?x), or an "
                                f"attribute variable (repeat a tensor variable on the left to "
                                f"ask for equal values)", t)
            return _VAR_SORT[sort]
        if isinstance(t, str) and t in DTYPES:
            return "dtype"
        if isinstance(t, int) and not isinstance(t, bool):
            return "int"
        if _int_list(t):
            return "ints"
        raise self.fail(f"a condition compares shape(?x), rank(?x), dim(?x, i), size(?x), "
                        f"dtype(?x), len(?p), ?variables, integers, int lists like [4,4] or "
                        f"dtype names, not {t!r}", self.rule)


# What a condition compares: a term's sort in egglog (i64, IntVec, String)
_FN_SORT = {"shape": "ints", "rank": "int", "dim": "int", "size": "int", "dtype": "dtype",
            "len": "int"}
_VAR_SORT = {"int": "int", "ints": "ints", "dtype": "dtype"}
_A_SORT = {"int": "an integer", "ints": "an int list", "dtype": "a dtype"}


def _kind(d: DType) -> str:
    return "float" if d.is_float else "bool" if d is DType.bool else "int"


def schema_sort(fn: str) -> str:
    from .lang import COND_FNS

    return COND_FNS[fn]


# Rules whose right side types alike wherever their left side does (the built-in families,
# every one of which passes `check`, which reports any instance where a rule's sides do not
# type together): optimize unions them as plain rewrites, without the typed step that every
# other rule's instances go through.
_WELL_TYPED: set[Rule] = set()


def declare_well_typed(rules: RuleSet) -> RuleSet:
    """`rules`, each recorded as typing alike on both sides wherever its left side types:
    compiled without the typed step (which costs analysis rules typing the kernels it makes,
    a fifth to a third of a small program's optimize for the built-in set); a set of such
    rules alone also gets the type analysis that does not check (`schema.prelude`). A rule
    declared so that is not makes egglog refuse a merge, or leaves a term typed wrongly that
    the extracted module's verification refuses: optimize keeps its input."""
    _WELL_TYPED.update(rules)
    for r in rules:
        r.__dict__["well_typed"] = True  # compile asks per rule, twice an optimize: no hashing
    return rules


def is_well_typed(rule: Rule) -> bool:
    """Whether `rule`, or a rule equal to it, was declared well-typed (`declare_well_typed`)."""
    return rule.__dict__.get("well_typed", False) or rule in _WELL_TYPED


def check_rule(rule: Rule) -> dict[str, str]:
    """Check a rule; returns the sort of each variable (tensor, ints, int, value, dtype)."""
    if rule.kind not in ("rewrite", "analysis"):
        raise _err(f"unknown rule kind {rule.kind!r}", rule, rule)
    if not isinstance(rule.lhs, Node):
        raise _err("the left-hand side must be an op pattern, not a bare variable", rule.lhs,
                   rule)
    if rule.kind == "analysis" and not (isinstance(rule.rhs, Node) and rule.rhs.op == "const"):
        # analysis rules run to their fixpoint, which Limits cannot bound: only folds end
        raise _err("an analysis rule must fold to a constant (const(...) on the right): it "
                   "runs to a fixpoint that no limit bounds; write `rule` for other rewrites",
                   rule.rhs, rule)
    c = _Checker(rule)
    for _ in range(2):  # a second pass sees kinds that later operands constrained
        lhs_kind = c.pattern(rule.lhs, lhs=True)
    rhs_kind = c.pattern(rule.rhs, lhs=False)
    if not lhs_kind & rhs_kind:
        raise _err("type error: the two sides have different dtype kinds", rule.rhs, rule)
    for cond in rule.conds:
        c.cond(cond)
    return dict(c.sorts)
