"""Immutable program values: statements, functions, gradient declarations, modules.

Equality is structural (names, ops, attributes, types); source locations ride along for error
messages but never take part in comparisons.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Union

import numpy as np

from ..errors import Error, UnknownFunction
from .ops import OPS
from .types import TensorType

GRAD_KINDS = ("grad", "value_and_grad", "vjp")

_NAN = float("nan")


Where = Union[int, tuple[int, int]]  # a column on the statement's line, or (line, column)


@dataclass(frozen=True, slots=True)
class Loc:
    """Where something was written: 1-based line and column, and where its parts are (a column
    on that line, or a (line, column) pair as the parser records them)."""

    line: int
    col: int
    operand_cols: tuple[Where, ...] = ()
    attr_cols: tuple[tuple[str, Where], ...] = ()
    type_col: Where = 0

    def attr_col(self, name: str) -> Where:
        return dict(self.attr_cols).get(name, self.col)


class _NegativeZero(float):
    """-0.0 as an attribute's value: equal only to another -0.0, so that statements (and
    modules) differing in a zero's sign differ (numpy's 1 / x tells them apart; `==` on floats
    does not, and modules are cache keys)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        # float(): `other == 0.0` on another -0.0 would call this method again, on 0.0
        return isinstance(other, float) and float(other) == 0.0 and math.copysign(1.0, other) < 0

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash("-0.0")

    def __repr__(self) -> str:
        return "-0.0"


_NEG_ZERO = _NegativeZero(-0.0)


def _canonical(value: Any) -> Any:
    """One object for NaN, so statements holding `const nan` compare equal, and one for -0.0,
    which then differs from 0.0; numpy scalars as the Python values the parser reads (a
    np.float64 printed as `np.float64(0.5)`), lists as tuples."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return _NAN
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return _NEG_ZERO
    if isinstance(value, (list, tuple)):
        if all(type(v) is int for v in value):  # the common case: an int list as the parser reads
            return tuple(value)
        return tuple(_canonical(v) for v in value)
    return value


def _in_table_order(op: Any, attrs: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """The attributes in the order of the op's table entry, as the parser stores and the printer
    writes them (so `slice` with stop before start equals its own printed text); unknown keys
    last, for the verifier to name."""
    if len(attrs) < 2:
        return attrs
    names = _ATTR_NAMES.get(op) if isinstance(op, str) else None
    if names is None:
        opdef = OPS.get(op) if isinstance(op, str) else None
        if opdef is None:
            return attrs
        names = _ATTR_NAMES[op] = tuple(k for k, _ in opdef.attrs)
    if tuple(k for k, _ in attrs) == names:
        return attrs
    return tuple(sorted(attrs, key=lambda kv: names.index(kv[0]) if kv[0] in names
                        else len(names)))


# op name -> its attribute names in table order (an op's entry never changes once registered)
_ATTR_NAMES: dict[str, tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True)
class Stmt:
    """`%r0, ... = op operands, attr=value, ... : types`; names are stored without `%`."""

    results: tuple[str, ...]
    op: str
    operands: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...]
    types: tuple[TensorType, ...]
    loc: Loc | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "results", tuple(self.results))
        object.__setattr__(self, "operands", tuple(self.operands))
        object.__setattr__(self, "types", tuple(self.types))
        attrs = self.attrs.items() if isinstance(self.attrs, dict) else self.attrs
        attrs = tuple((k, _canonical(v)) for k, v in attrs)
        object.__setattr__(self, "attrs", _in_table_order(self.op, attrs))

    @property
    def attr(self) -> dict[str, Any]:
        """The attributes as a dict."""
        return dict(self.attrs)

    @property
    def type(self) -> TensorType:
        """The type of a single-result statement."""
        return self.types[0]


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: TensorType
    loc: Loc | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True, slots=True)
class Function:
    """A function: typed parameters, a straight-line body, returned values."""

    name: str
    params: tuple[Param, ...]
    result_types: tuple[TensorType, ...]
    body: tuple[Stmt, ...]
    returns: tuple[str, ...]
    loc: Loc | None = field(default=None, compare=False, hash=False, repr=False)
    return_loc: Loc | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("params", "result_types", "body", "returns"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def param_types(self) -> tuple[TensorType, ...]:
        return tuple(p.type for p in self.params)

    def __str__(self) -> str:
        from .printer import format_function

        return "\n".join(format_function(self)) + "\n"

    def types(self) -> dict[str, TensorType]:
        """The type of every value by name: parameters and statement results."""
        env = {p.name: p.type for p in self.params}
        for s in self.body:
            env.update(zip(s.results, s.types))
        return env


@dataclass(frozen=True, slots=True)
class GradDecl:
    """`func @name = kind @of wrt %a, %b`: a gradient kept as a declaration until expanded."""

    name: str
    kind: str
    of: str
    wrt: tuple[str, ...]
    loc: Loc | None = field(default=None, compare=False, hash=False, repr=False)
    wrt_cols: tuple[int, ...] = field(default=(), compare=False, hash=False, repr=False)
    of_col: int = field(default=0, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        # One name alone is one parameter, not its letters (wrt="xy" read as %x, %y).
        wrt = (self.wrt,) if isinstance(self.wrt, str) else tuple(self.wrt)
        object.__setattr__(self, "wrt", wrt)


Item = Union[Function, GradDecl]


class Names:
    """A set of taken names that hands out fresh ones (`base`, `base.1`, `base.2`, ...)."""

    def __init__(self, taken: set[str] | None = None):
        self.taken: set[str] = set(taken or ())
        # The k each base last got: names are only ever added, so every `base.j` below it is
        # still taken, and a base asked for n times costs O(n) in all, not O(n^2).
        self._last: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        """`base`, or the first free `base.k`; the result is taken from now on."""
        k = self._last.get(base, 0)
        name = f"{base}.{k}" if k else base
        while name in self.taken:
            k += 1
            name = f"{base}.{k}"
        self._last[base] = k
        self.taken.add(name)
        return name


class Module:
    """An immutable, ordered collection of functions and gradient declarations.

    `Module(f, g, name="m")` accepts `Function`s, `GradDecl`s and functions traced with
    `@eqsat.function` (whose callees come along); `m["f"]` looks an item up by name. Identical
    items under one name are one item; a later, different item of a name already taken is
    renamed `name_2`, `name_3`, ... (see `merge_items`).
    """

    __slots__ = ("name", "items", "_index", "_verified")

    def __init__(self, *items: Any, name: str = "main"):
        index: dict[str, Item] = {}
        for item in items:
            merge_items(index, _expand(item))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "items", tuple(index.values()))
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_verified", False)

    @classmethod
    def of(cls, name: str, items: tuple[Item, ...] | list[Item]) -> Module:
        """A module from items exactly as given (duplicate names kept for the verifier)."""
        m = cls.__new__(cls)
        object.__setattr__(m, "name", name)
        object.__setattr__(m, "items", tuple(items))
        object.__setattr__(m, "_index", {})
        object.__setattr__(m, "_verified", False)
        for it in m.items:
            m._index.setdefault(it.name, it)
        return m

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("Module is immutable; build a new one with replace() or Module(...)")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and copied by name and items (pickle's default sets the slots one by one,
        which __setattr__ refuses): a module can go to another process."""
        return (Module.of, (self.name, self.items))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Module) and (self.name, self.items) == (other.name, other.items)

    def __hash__(self) -> int:
        return hash((self.name, self.items))

    def __getitem__(self, name: str) -> Item:
        try:
            return self._index[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise UnknownFunction.among(f"module @{self.name}", name, self._index) from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def functions(self) -> tuple[Function, ...]:
        """The plain functions (gradient declarations left out)."""
        return tuple(it for it in self.items if isinstance(it, Function))

    @property
    def grad_decls(self) -> tuple[GradDecl, ...]:
        return tuple(it for it in self.items if isinstance(it, GradDecl))

    def callees_first(self) -> list[Function]:
        """The plain functions, each after every function it calls (see `callees_first`)."""
        return callees_first({f.name: f for f in self.functions})

    def replace(self, items: list[Item] | tuple[Item, ...] | None = None,
                name: str | None = None) -> Module:
        """A copy with other items or another name."""
        return Module.of(self.name if name is None else name,
                         self.items if items is None else items)

    def __str__(self) -> str:
        from .printer import print_module

        return print_module(self)

    def __repr__(self) -> str:
        return f"<eqsat.Module @{self.name}: {', '.join('@' + it.name for it in self.items)}>"


def callees_first(functions: Mapping[str, Function]) -> list[Function]:
    """`functions`, each after every one it calls (calls that name none of them are left to
    the verifier, which also refuses recursion). Iterative: call chains may be thousands
    deep."""
    order: list[Function] = []
    seen: set[str] = set()
    for root in functions:
        stack = [(root, False)]
        while stack:
            name, finished = stack.pop()
            if finished:
                order.append(functions[name])
                continue
            if name in seen:
                continue
            seen.add(name)
            stack.append((name, True))
            stack.extend((c, False) for s in functions[name].body if s.op == "call"
                         and (c := s.attr["callee"]) in functions and c not in seen)
    return order


def inlined_totals(functions: Mapping[str, Function], own: Callable[[Function], float]
                   ) -> dict[str, float]:
    """Each function's `own(f)` plus its callees' totals, a callee counted at every call (as
    if calls were inlined), computed without inlining: a chain of functions that each call
    the one before twice doubles its total at every level."""
    totals: dict[str, float] = {}
    for f in callees_first(functions):
        totals[f.name] = own(f) + sum(totals.get(s.attr["callee"], 0)
                                      for s in f.body if s.op == "call")
    return totals


def inlined_sizes(functions: Mapping[str, Function]) -> dict[str, int]:
    """How many statements other than calls each function runs with its calls inlined."""
    return inlined_totals(functions, lambda f: sum(s.op != "call" for s in f.body))


def _expand(item: Any) -> list[Item]:
    """The IR items a constructor argument stands for (a traced function brings its callees)."""
    if isinstance(item, (Function, GradDecl)):
        return [item]
    items = getattr(item, "__eqsat_items__", None)
    if items is not None:
        return list(items())
    raise Error(f"Module() takes functions traced with @eqsat.function, Functions or GradDecls, "
                f"not {type(item).__name__}")


def retarget(item: Item, renamed: dict[str, str]) -> Item:
    """`item` with its calls (or its declaration's target) following `renamed`."""
    if not renamed:
        return item
    if isinstance(item, GradDecl):
        return replace(item, of=renamed.get(item.of, item.of))
    body = tuple(replace(s, attrs=tuple(
        (k, renamed.get(v, v) if k == "callee" else v) for k, v in s.attrs))
        if s.op == "call" else s for s in item.body)
    return replace(item, body=body)


def merge_items(index: dict[str, Item], closure: Iterable[Item],
                reserved: frozenset[str] | set[str] = frozenset()) -> dict[str, str]:
    """Add `closure` (items that call each other by name, callees first) to `index`, in place.

    Names are unique per module, not per process: an item whose name a different item (or
    `reserved`) holds gets the first free `name_2`, `name_3`, ..., and the calls of the items
    after it follow; an item equal to the one holding a name is that item. Returns the renames.
    """
    renamed: dict[str, str] = {}
    for item in closure:
        moved = retarget(item, renamed)
        name, k = item.name, 1
        while True:
            candidate = moved if k == 1 else replace(moved, name=name)
            held = index.get(name)
            if held is None and name not in reserved:
                index[name] = candidate
                break
            if held == candidate:
                break
            k += 1
            name = f"{item.name}_{k}"
        if name != item.name:
            renamed[item.name] = name
    return renamed


_SUFFIXED = re.compile(r"(.+)_[0-9]+\Z")


def find_copies(items: Iterable[Item], closure: Iterable[Item]) -> dict[str, list[str]]:
    """For each item of `closure` (items that call each other by name, callees first), the
    names of its copies among `items`, in their order: items equal to it up to names, as
    merge_items renames them (its name or that name with any suffix `_k`, its calls going to
    copies of its callees)."""
    by_base: dict[str, list[Item]] = {}
    for held in items:
        by_base.setdefault(held.name, []).append(held)
        if suffixed := _SUFFIXED.match(held.name):
            by_base.setdefault(suffixed.group(1), []).append(held)
    copies: dict[str, list[str]] = {}
    for item in closure:
        copies[item.name] = [held.name for held in by_base.get(item.name, ())
                             if _is_copy(held, item, copies)]
    return copies


def _is_copy(held: Item, item: Item, copies: dict[str, list[str]]) -> bool:
    """Whether `held` is `item` up to its name and its callees' (each one of their `copies`)."""
    if isinstance(item, GradDecl):
        return isinstance(held, GradDecl) and held.of in copies.get(item.of, ()) \
            and replace(held, name=item.name, of=item.of) == item
    if not isinstance(held, Function) or len(held.body) != len(item.body):
        return False
    for s, h in zip(item.body, held.body):
        if s.op == "call" and h.op == "call":
            callee = s.attr["callee"]
            if h.attr["callee"] not in copies.get(callee, ()):
                return False
            h = replace(h, attrs=tuple((k, callee if k == "callee" else v) for k, v in h.attrs))
        if h != s:
            return False
    return replace(held, name=item.name, body=item.body) == item
