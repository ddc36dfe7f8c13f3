"""The verifier: every name, arity, attribute, type, call and gradient rule of the IR.

Errors are `VerifyError`s with the line and column of the offending text. A module built in
Python has no source positions; its errors are located in its canonical printed text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ParseError, VerifyError
from .module import GRAD_KINDS, Function, GradDecl, Item, Loc, Module, Param, Stmt
from .ops import CALLEE, INT, INTS, LITERAL, OPS, OpTypeError
from .types import DType, TensorType, shape_problem

# What the text format can hold after a sigil (the parser's %name and @name tokens).
_NAME = re.compile(r"[A-Za-z0-9_.]+\Z")


@dataclass(frozen=True)
class Signature:
    """What a caller sees of a function or an expanded gradient declaration."""

    params: tuple[Param, ...]
    results: tuple[TensorType, ...]


def seed_names(params: tuple[Param, ...], count: int) -> tuple[str, ...]:
    """Names of a vjp function's seed parameters (`seed.0`, ...), clear of the primal's names."""
    taken = {p.name for p in params}
    prefix = "seed"
    while any(f"{prefix}.{i}" in taken for i in range(count)):
        prefix = "_" + prefix
    return tuple(f"{prefix}.{i}" for i in range(count))


def decl_signature(decl: GradDecl, of: Signature) -> Signature:
    """The signature a gradient declaration expands to, from the signature of its function."""
    by_name = {p.name: p.type for p in of.params}
    wrt_types = tuple(by_name[w] for w in decl.wrt)
    if decl.kind == "grad":
        return Signature(of.params, wrt_types)
    if decl.kind == "value_and_grad":
        return Signature(of.params, of.results + wrt_types)
    seeds = tuple(Param(n, t) for n, t in zip(seed_names(of.params, len(of.results)), of.results))
    return Signature(of.params + seeds, wrt_types)


def verify(module: Module) -> Module:
    """Check a module; returns it unchanged or raises a located VerifyError.

    Modules are immutable, so a module that passed once is remembered and not checked again.
    """
    if getattr(module, "_verified", False):
        return module
    try:
        _Checker(module).run()
    except VerifyError as e:
        if e.line or not _unlocated(module):
            raise
        raise _relocate(module, e) from None
    object.__setattr__(module, "_verified", True)
    return module


def plain_module(module: Module, who: str) -> Module:
    """A verified module without gradient declarations, as code generators need it."""
    if module.grad_decls:
        names = ", ".join("@" + d.name for d in module.grad_decls)
        raise VerifyError(f"{who} takes plain functions; expand the gradient declarations "
                          f"({names}) with eqsat.differentiate first")
    return verify(module)


def signatures(module: Module) -> dict[str, Signature]:
    """The signature of every item of a verified module, declarations included."""
    checker = _Checker(module)
    checker.check_items()
    return checker.sigs


def _unlocated(module: Module) -> bool:
    return any(it.loc is None for it in module.items)


def _relocate(module: Module, original: VerifyError) -> VerifyError:
    """The same error, located in the module's printed text."""
    from .parser import parse_module
    from .printer import print_module

    try:
        text = print_module(module)
    except (TypeError, AttributeError, ValueError):  # parts that have no text at all
        return original
    try:
        located = parse_module(text, source="<printed module>")
        _Checker(located).run()
    except VerifyError as e:
        if not e.message.startswith(original.message):  # read back as another module (%1 for 1)
            return original
        return VerifyError(e.message, e.line, e.col, "<printed module>")
    except ParseError:  # a malformed attribute value prints as text that cannot be read back
        return original
    return original


class _Checker:
    def __init__(self, module: Module):
        self.module = module
        self.items: dict[str, Item] = {}
        self.sigs: dict[str, Signature] = {}

    def fail(self, message: str, loc: Loc | None, col: int | tuple[int, int] | None = None
             ) -> VerifyError:
        """A located error: at `col` of the statement's line, or at `col` = (line, col), as the
        parser records the parts of a statement (which may span lines)."""
        line = loc.line if loc else 0
        if isinstance(col, tuple):
            line, col = col
        return VerifyError(message, line, col if col is not None else (loc.col if loc else 0))

    def run(self) -> None:
        self.check_items()
        for item in self.module.items:
            if isinstance(item, Function):
                self.check_function(item)

    # ---------------------------------------------------------------- module level

    def check_name(self, name: object, what: str, loc: Loc | None) -> None:
        """A name the text format can print and read back (`%` or `@` and [A-Za-z0-9_.]+)."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.fail(f"{what} {name!r} is not a valid name (names are letters, digits, "
                            f"'_' and '.')", loc)

    def check_names(self) -> None:
        """Every name and kind of a module built in Python is one its printed text can hold."""
        self.check_name(self.module.name, "the module name", None)
        for item in self.module.items:
            if not isinstance(item, (Function, GradDecl)):
                raise self.fail(f"a module holds Functions and GradDecls, not "
                                f"{type(item).__name__}", None)
            self.check_name(item.name, "the function name", item.loc)
            if isinstance(item, GradDecl):
                if item.kind not in GRAD_KINDS:
                    raise self.fail(f"unknown gradient kind {item.kind!r}; expected one of "
                                    f"{', '.join(GRAD_KINDS)}", item.loc)
                self.check_name(item.of, "the differentiated function", item.loc)
                for w in item.wrt:
                    self.check_name(w, "the parameter", item.loc)
                continue
            for what, parts, kind in (("parameters", item.params, Param),
                                      ("statements", item.body, Stmt)):
                for part in parts:
                    if not isinstance(part, kind):
                        raise self.fail(f"the {what} of @{item.name} are {kind.__name__}s, not "
                                        f"{type(part).__name__}", item.loc)
            for p in item.params:
                self.check_name(p.name, "the parameter", p.loc)
            for st in item.body:
                for r in (*st.results, *st.operands):
                    self.check_name(r, "the value", st.loc)
            for r in item.returns:
                self.check_name(r, "the returned value", item.return_loc or item.loc)

    def check_items(self) -> None:
        self.check_names()
        for item in self.module.items:
            if item.name in self.items:
                first = self.items[item.name].loc
                where = f" (first at line {first.line})" if first else ""
                raise self.fail(f"@{item.name} is defined twice{where}", item.loc)
            self.items[item.name] = item
        for name in self.callees_first():
            item = self.items[name]
            if isinstance(item, Function):
                self.sigs[name] = self.function_signature(item)
            else:
                self.sigs[name] = self.check_grad_decl(item)

    def edges(self, item: Item) -> list[tuple[str, Loc | None, int | None]]:
        """The items `item` refers to, with where it refers to them."""
        if isinstance(item, GradDecl):
            return [(item.of, item.loc, item.of_col or None)]
        out = []
        for s in item.body:
            if s.op == "call":
                callee = s.attr.get("callee")
                out.append((callee, s.loc, s.loc.attr_col("callee") if s.loc else None))
        return out

    def callees_first(self) -> list[str]:
        """The items' names, each after every item it refers to; refuses recursion and
        references to undefined items (an iterative DFS: call chains may be thousands deep)."""
        state: dict[str, int] = {}  # 1 on the stack, 2 done
        order: list[str] = []
        for root in self.items:
            if root in state:
                continue
            stack = [(root, iter(self.edges(self.items[root])))]
            path = [root]
            state[root] = 1
            while stack:
                name, it = stack[-1]
                for callee, loc, col in it:
                    if callee not in self.items:
                        what = ("differentiates" if isinstance(self.items[name], GradDecl)
                                else "calls")
                        raise self.fail(f"@{name} {what} @{callee}, which is not defined", loc, col)
                    if state.get(callee) == 1:
                        cycle = path[path.index(callee):] + [callee]
                        raise self.fail("recursion is not supported: " +
                                        " -> ".join("@" + c for c in cycle), loc, col)
                    if callee not in state:
                        state[callee] = 1
                        path.append(callee)
                        stack.append((callee, iter(self.edges(self.items[callee]))))
                        break
                else:
                    state[name] = 2
                    order.append(name)
                    path.pop()
                    stack.pop()
        return order

    def function_signature(self, f: Function) -> Signature:
        seen: set[str] = set()
        for p in f.params:
            if p.name in seen:
                raise self.fail(f"parameter %{p.name} of @{f.name} is declared twice", p.loc)
            seen.add(p.name)
            self.check_type(p.type, p.loc)
        if not f.result_types:
            raise self.fail(f"@{f.name} returns nothing; a function returns at least one value",
                            f.loc)
        for t in f.result_types:
            self.check_type(t, f.loc)
        return Signature(f.params, f.result_types)

    def check_type(self, t: TensorType, loc: Loc | None, col: int | None = None) -> None:
        if (not isinstance(t, TensorType) or not isinstance(t.dtype, DType)
                or not isinstance(t.shape, tuple)
                or not all(type(d) is int for d in t.shape)):
            shown = (f"TensorType({t.dtype!r}, {t.shape!r})" if isinstance(t, TensorType)
                     else repr(t))
            raise self.fail(f"expected a tensor type, got {shown}", loc, col)
        problem = shape_problem(t.shape)
        if problem:
            raise self.fail(problem, loc, col)

    def check_grad_decl(self, d: GradDecl) -> Signature:
        of = self.sigs[d.of]
        if not d.wrt:
            raise self.fail(f"{d.kind} @{d.of} needs at least one parameter after 'wrt'", d.loc)
        params = {p.name: p.type for p in of.params}
        seen: set[str] = set()
        for i, w in enumerate(d.wrt):
            col = d.wrt_cols[i] if i < len(d.wrt_cols) else None
            if w not in params:
                names = ", ".join("%" + p.name for p in of.params) or "none"
                raise self.fail(f"@{d.of} has no parameter %{w} (its parameters: {names})",
                                d.loc, col)
            if w in seen:
                raise self.fail(f"%{w} is listed twice after 'wrt'", d.loc, col)
            seen.add(w)
            if not params[w].dtype.is_float:
                raise self.fail(f"cannot differentiate with respect to %{w}: its type "
                                f"{params[w]} is not a float type", d.loc, col)
        if d.kind in ("grad", "value_and_grad"):
            r = of.results
            if len(r) != 1 or r[0].shape != () or not r[0].dtype.is_float:
                got = ", ".join(map(str, r))
                raise self.fail(f"{d.kind} needs @{d.of} to return one float scalar (f32[] or "
                                f"f64[]), but it returns {got}; use vjp for other results",
                                d.loc, d.of_col or None)
        return decl_signature(d, of)

    # ---------------------------------------------------------------- function bodies

    def check_function(self, f: Function) -> None:
        env: dict[str, TensorType] = {p.name: p.type for p in f.params}
        for s in f.body:
            self.check_stmt(f, s, env)
        rl = f.return_loc
        if len(f.returns) != len(f.result_types):
            raise self.fail(f"@{f.name} declares {len(f.result_types)} result(s) but returns "
                            f"{len(f.returns)}", rl or f.loc)
        for i, (r, t) in enumerate(zip(f.returns, f.result_types)):
            col = rl.operand_cols[i] if rl and i < len(rl.operand_cols) else None
            if r not in env:
                raise self.fail(f"returned value %{r} is not defined", rl or f.loc, col)
            if env[r] != t:
                raise self.fail(f"@{f.name} returns %{r} of type {env[r]} where its signature "
                                f"says {t}", rl or f.loc, col)

    def check_stmt(self, f: Function, s: Stmt, env: dict[str, TensorType]) -> None:
        loc = s.loc
        op = OPS.get(s.op)
        if op is None:
            raise self.fail(f"unknown op {s.op!r}", loc)
        for i, name in enumerate(s.operands):
            if name not in env:
                col = loc.operand_cols[i] if loc and i < len(loc.operand_cols) else None
                later = any(name in t.results for t in f.body)
                why = "is used before it is defined" if later else "is not defined"
                raise self.fail(f"%{name} {why}", loc, col)
        for t in s.types:
            self.check_type(t, loc, loc.type_col if loc else None)
        self.check_attrs(s, op.attrs, loc)
        ins = [env[o] for o in s.operands]
        if s.op == "call":
            results = self.check_call(s, ins)
        else:
            results = (self.infer_one(s, op, ins),)
        if len(s.results) != len(results):
            raise self.fail(f"{s.op} gives {len(results)} result(s) but {len(s.results)} "
                            f"name(s) are written", loc)
        if len(s.types) != len(results):
            raise self.fail(f"{s.op} gives {len(results)} result(s) but {len(s.types)} type(s) "
                            f"are written", loc, loc.type_col if loc else None)
        for name, written, inferred in zip(s.results, s.types, results):
            if written != inferred:
                raise self.fail(f"%{name} = {s.op} has type {inferred}, but {written} is written",
                                loc, loc.type_col if loc else None)
            if name in env:
                raise self.fail(f"%{name} is defined twice (names are defined once)", loc)
            env[name] = written

    def check_attrs(self, s: Stmt, specs: tuple[tuple[str, str], ...], loc: Loc | None) -> None:
        given = s.attr
        kinds = dict(specs)
        for key, value in s.attrs:
            col = loc.attr_col(key) if loc else None
            if key not in kinds:
                raise self.fail(f"{s.op} has no attribute {key!r}", loc, col)
            kind = kinds[key]
            ok = {
                INTS: lambda v: isinstance(v, tuple) and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in v),
                INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
                LITERAL: lambda v: isinstance(v, (bool, int, float)),
                CALLEE: lambda v: isinstance(v, str),
            }.get(kind, lambda v: True)(value)
            if not ok:
                raise self.fail(f"attribute {key!r} of {s.op} has a malformed value {value!r}",
                                loc, col)
        for key, _ in specs:
            if key not in given:
                raise self.fail(f"{s.op} needs the attribute {key!r}", loc)

    def infer_one(self, s: Stmt, op, ins: list[TensorType]) -> TensorType:
        loc = s.loc
        if op.arity is None and not ins:
            raise self.fail(f"{s.op} needs at least one operand", loc)
        if op.arity is not None and len(ins) != op.arity:
            raise self.fail(f"{s.op} takes {op.arity} operand(s), got {len(ins)}", loc)
        written = s.types[0] if op.written_type and s.types else None
        try:
            return op.infer(ins, s.attr, written)
        except OpTypeError as e:
            col = None
            if loc and e.operand is not None and e.operand < len(loc.operand_cols):
                col = loc.operand_cols[e.operand]
            elif loc and e.attr is not None:
                col = loc.attr_col(e.attr)
            raise self.fail(e.message, loc, col) from None
        except (TypeError, ValueError, IndexError, KeyError, OverflowError) as e:
            raise self.fail(f"{s.op}: malformed statement ({e})", loc) from None

    def check_call(self, s: Stmt, ins: list[TensorType]) -> tuple[TensorType, ...]:
        loc = s.loc
        callee = s.attr["callee"]
        sig = self.sigs.get(callee)
        if sig is None:
            raise self.fail(f"call of @{callee}, which is not defined", loc)
        if len(ins) != len(sig.params):
            raise self.fail(f"@{callee} takes {len(sig.params)} argument(s), got {len(ins)}",
                            loc, loc.attr_col("callee") if loc else None)
        for i, (t, p) in enumerate(zip(ins, sig.params)):
            if t != p.type:
                col = loc.operand_cols[i] if loc and i < len(loc.operand_cols) else None
                raise self.fail(f"argument {i + 1} of @{callee} (%{p.name}) must be {p.type}, "
                                f"got {t}", loc, col)
        return sig.results
