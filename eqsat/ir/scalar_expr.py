"""The scalar body language of fused kernels: `tanh(add(mul($0, $1), 0.5))`.

A body is an immutable, hashable tree of `Arg` (`$i`, the i-th input's element), `Lit` (a
constant) and `App` (an elementwise op of the table applied to sub-bodies). Which ops may
appear is read from the op table (`body_op_names`), and every op is typed and evaluated by its
own `OpDef`, so a body means exactly what the equivalent core-op program means.

Literals carry no dtype in the text; they take it from where they stand: the dtype of the other
operands of their op (for `select`, of the other branch; a condition is bool), or, when those
are literals too, the dtype their position expects (the parent's dtype where the parent computes
in its operands' dtype, and at the root the kernel's expected dtype). A literal whose dtype
nothing fixes (`gt(1.0, 2.0)`) is a type error.
"""

from __future__ import annotations

import difflib
import functools
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

import numpy as np

from .op_costs import element_costs
from .ops import OPS, OpTypeError, literal_fits
from .printer import format_literal
from .types import DType, TensorType

# Deeper bodies are refused when parsed or verified: every walk over a body is recursive.
MAX_DEPTH = 200


@dataclass(frozen=True, slots=True)
class Arg:
    """`$i`: the element of the kernel's i-th input."""

    index: int

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, (int, np.integer)):
            raise TypeError(f"Arg index must be an int, got {self.index!r}")
        if self.index < 0:
            raise ValueError(f"Arg index must be >= 0, got {self.index}")
        object.__setattr__(self, "index", int(self.index))


@dataclass(frozen=True, slots=True)
class Lit:
    """A constant; equal literals have equal text (so nan equals nan, and -0.0 differs from 0.0)."""

    value: bool | int | float = field(compare=False)
    text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        v = self.value
        if isinstance(v, (bool, np.bool_)):
            v = bool(v)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
        elif isinstance(v, (float, np.floating)):
            v = float(v)
        else:
            raise TypeError(f"a literal is a bool, int or float, got {v!r}")
        object.__setattr__(self, "value", v)
        object.__setattr__(self, "text", format_literal(v))


@dataclass(frozen=True, slots=True)
class App:
    """`op(a, b, ...)`: an elementwise op of the table applied to sub-bodies. The inputs it
    reads and its hash are computed once: the fusion pass asks for both of every subterm of
    thousands of bodies, which recomputed them recursively each time."""

    op: str
    args: tuple[Expr, ...]
    reads: frozenset[int] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.op, str):
            raise TypeError(f"an op name is a str, got {self.op!r}")
        args = tuple(self.args)
        object.__setattr__(self, "args", args)
        # one pass over the operands (the fusion pass builds ~70k of these per saturation)
        reads: set[int] = set()
        for a in args:
            if isinstance(a, App):
                reads.update(a.reads)
            elif isinstance(a, Arg):
                reads.add(a.index)
            elif not isinstance(a, Lit):
                raise TypeError(f"operands of {self.op}(...) must be Arg, Lit or App, got {a!r}")
        object.__setattr__(self, "reads", frozenset(reads))
        object.__setattr__(self, "_hash", hash((self.op, args)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type, tuple[str, tuple[Expr, ...]]]:
        # built anew where unpickled: a str's hash differs between processes
        return App, (self.op, self.args)


Expr = Union[Arg, Lit, App]
V = TypeVar("V")


def body_op_names() -> frozenset[str]:
    """Ops a body may use: the table's elementwise ops with fixed arity, no attributes and no
    written type (so `cast` stays outside kernels); read at call time."""
    return frozenset(
        name for name, op in OPS.items()
        if "elementwise" in op.traits and "fused" not in op.traits and not op.written_type
        and op.arity is not None and not op.attrs
    )


def body_cost(body: Any, varying: Collection[int] | None = None,
              dtype: DType | None = None) -> float:
    """The cost of one evaluation of a body computing in `dtype` (f32 when not given), its
    ops' `element_cost`s summed; with `varying`, of only the subterms that read one of those
    inputs (the rest is the same for every element of a loop along which only `varying`
    change, and compilers hoist it)."""
    # the table is chosen once and `varying` made a set once, not once per op of the body
    table, other = element_costs(dtype)
    vary = None if varying is None else frozenset(varying)
    total, stack = 0.0, [body]
    while stack:
        e = stack.pop()
        if isinstance(e, App) and (vary is None or not e.reads.isdisjoint(vary)):
            total += table.get(e.op, other)
            stack.extend(e.args)
    return total


def elementwise_body(op: str) -> App:
    """The body of `op` applied to the kernel's inputs in order: `add($0, $1)`."""
    return App(op, tuple(Arg(i) for i in range(OPS[op].arity or 0)))


# ---------------------------------------------------------------- text


def format_body(e: Expr) -> str:
    """The canonical text of a body: `tanh(add(mul($0, $1), 0.5))`."""
    # Iterative, so that even a Python-built body too deep to verify can be printed in errors.
    out: list[str] = []
    stack: list[Expr | str] = [e]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Arg):
            out.append(f"${item.index}")
        elif isinstance(item, Lit):
            out.append(item.text)
        else:
            out.append(f"{item.op}(")
            parts: list[Expr | str] = []
            for i, a in enumerate(item.args):
                parts += [", ", a] if i else [a]
            stack.extend(reversed(parts + [")"]))
    return "".join(out)


def read_body(p: Any, name: str) -> Expr:
    """Read a body at the parser's position (the ATTR_PARSERS hook); unknown ops are ParseErrors."""
    return _read(p, name, 1, body_op_names())


def _read(p: Any, name: str, depth: int, allowed: frozenset[str]) -> Expr:
    tok = p.tok
    if depth > MAX_DEPTH:
        raise p.error(f"body {name!r} is nested deeper than {MAX_DEPTH} levels")
    if tok.kind == "arg":
        p.next()
        return Arg(int(tok.text[1:]))
    following = p.toks[p.i + 1] if p.i + 1 < len(p.toks) else tok
    if tok.kind == "ident" and following.kind == "punct" and following.text == "(":
        if tok.text not in allowed:
            raise p.error(_unknown_op(tok.text, allowed), tok)
        p.next()
        p.punct("(", f"'(' and the operands of {tok.text}")
        args = [_read(p, name, depth + 1, allowed)]
        while p.accept("punct", ","):
            args.append(_read(p, name, depth + 1, allowed))
        p.punct(")", f"')' or ',' in the operands of {tok.text}")
        return App(tok.text, tuple(args))
    if tok.kind in ("number", "ident"):
        return Lit(p.literal()[0])
    raise p.error(f"expected a body expression ($i, a constant or op(...)) in {name!r}, found "
                  f"{tok.describe()}")


def _unknown_op(op: str, allowed: frozenset[str]) -> str:
    if op in OPS:
        return (f"{op} cannot appear in a body; a body uses the elementwise ops "
                f"{', '.join(sorted(allowed))}")
    close = difflib.get_close_matches(op, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown op {op!r} in a body{hint}"


def parse_body(text: str) -> Expr:
    """A body from its text alone; raises ParseError (with line and col in `text`)."""
    from .parser import _Parser

    p = _Parser(text, None)
    e = read_body(p, "body")
    p.expect("eof", what="the end of the body")
    return e


class BodyTexts:
    """Bodies and their canonical texts, both ways, remembered (the most recent `size`): the
    e-graph stores a body as its text, and every serialization reads each body back. Most of
    those texts were written by this process a moment before (a fusion round writes about a
    thousand new bodies, each read back by every later serialization), so a text written
    through `text` is read back by `body` without parsing it again (0.05-0.2 ms a body; a
    VAE's value_and_grad parsed 1100 of them)."""

    def __init__(self, size: int = 1 << 14):
        self.size = size
        self._body: OrderedDict[str, Expr] = OrderedDict()
        self._text: dict[Expr, str] = {}

    def text(self, e: Expr) -> str:
        """`format_body(e)`, remembered for `body`."""
        t = self._text.get(e)
        if t is None:
            t = format_body(e)
            self._remember(t, e)
        return t

    def body(self, text: str) -> Expr:
        """`parse_body(text)`, without parsing a text this object wrote or read recently."""
        e = self._body.get(text)
        if e is None:
            e = parse_body(text)
            self._remember(text, e)
        return e

    def _remember(self, t: str, e: Expr) -> None:
        if t in self._body:
            return
        self._body[t] = e
        self._text[e] = t
        if len(self._body) > self.size:
            _, old = self._body.popitem(last=False)
            self._text.pop(old, None)


# ---------------------------------------------------------------- structure


def body_ops(e: Expr) -> frozenset[str]:
    """The names of the ops a body applies."""
    if isinstance(e, App):
        return frozenset({e.op}).union(*(body_ops(a) for a in e.args))
    return frozenset()


def body_args(e: Expr) -> frozenset[int]:
    """The input indices a body reads."""
    if isinstance(e, Arg):
        return frozenset({e.index})
    if isinstance(e, App):
        return e.reads
    return frozenset()


def depth(e: Expr) -> int:
    """Nesting depth (a leaf is 1), computed without recursion so any Python-built body works."""
    best, stack = 0, [(e, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        if isinstance(node, App):
            stack.extend((a, d + 1) for a in node.args)
    return best


def substitute(e: Expr, mapping: Mapping[int, Expr]) -> Expr:
    """`e` with every `$i` in `mapping` replaced by `mapping[i]` (simultaneously)."""
    # `$i -> $i` changes nothing: left out, a subterm reading only such inputs is not rebuilt
    # (a renumbering keeps most inputs where they are)
    live = {i: v for i, v in mapping.items() if not (isinstance(v, Arg) and v.index == i)}
    return _substitute(e, live, live.keys()) if live else e


def _substitute(e: Expr, mapping: Mapping[int, Expr], keys: Collection[int]) -> Expr:
    if isinstance(e, Arg):
        return mapping.get(e.index, e)
    if isinstance(e, App) and not keys.isdisjoint(e.reads):
        return App(e.op, tuple(_substitute(a, mapping, keys) for a in e.args))
    return e


def merge(consumer: Expr, k: int, producer: Expr, n_consumer: int) -> Expr:
    """Inline a producer kernel into input `k` of a consumer kernel with `n_consumer` inputs.

    The merged kernel's inputs are the consumer's without input k, then the producer's:
    `consumer_inputs[:k] + consumer_inputs[k+1:] + producer_inputs`.
    """
    if not 0 <= k < n_consumer:
        raise ValueError(f"input {k} is out of range for a consumer with {n_consumer} inputs")
    shifted = substitute(producer, {i: Arg(n_consumer - 1 + i) for i in body_args(producer)})
    mapping: dict[int, Expr] = {j: Arg(j - 1) for j in range(k + 1, n_consumer)}
    mapping[k] = shifted
    return substitute(consumer, mapping)


# ---------------------------------------------------------------- typing and evaluation


@functools.cache
def operand_roles(op: str) -> tuple[tuple[bool, ...], bool]:
    """Which operands of `op` are bool conditions, and whether its result has its (other)
    operands' dtype; probed from the op's own type rule so no second table is kept."""
    opdef = OPS[op]
    n = opdef.arity or 0

    def result(dtypes: list[DType]) -> DType | None:
        try:
            return opdef.infer([TensorType(d, ()) for d in dtypes], {}, None).dtype
        except OpTypeError:
            return None

    f = DType.f64
    conds = tuple(
        n > 1 and result([f] * n) is None
        and result([DType.bool if j == i else f for j in range(n)]) is not None
        for i in range(n)
    )
    same = result([DType.bool if c else f for c in conds]) is f
    return conds, same


def _has_arg(e: Expr) -> bool:
    return isinstance(e, Arg) or (isinstance(e, App) and bool(e.reads))


def fold(e: Expr, args: Sequence[V], dtype_of: Callable[[V], DType],
         lit: Callable[[Lit, DType], V], app: Callable[[App, list[V]], V],
         expected: DType | None = None, what: str = "body") -> V:
    """Evaluate a body bottom-up in any domain of values (dtypes, arrays, IR names).

    `args[i]` is `$i`'s value, `lit(l, dtype)` makes a literal's value once its dtype is known
    (the rule in the module docstring), `app(node, values)` applies an op. Unknown ops, wrong
    arities and `$i` out of range raise OpTypeError(attr="body") naming `what`.
    """
    # the table is read once per body, not once per op applied in it
    return _fold(e, args, dtype_of, lit, app, expected, what, body_op_names())


def _fold(e: Expr, args: Sequence[V], dtype_of: Callable[[V], DType],
          lit: Callable[[Lit, DType], V], app: Callable[[App, list[V]], V],
          expected: DType | None, what: str, allowed: frozenset[str]) -> V:
    if isinstance(e, Arg):
        if e.index >= len(args):
            have = f"$0..${len(args) - 1}" if args else "none"
            raise OpTypeError(f"{what}: ${e.index} is out of range; it has {len(args)} "
                              f"input(s) ({have})", attr="body")
        return args[e.index]
    if isinstance(e, Lit):
        if expected is None:
            raise OpTypeError(f"{what}: nothing fixes the dtype of the constant {e.text} (no "
                              f"operand or result beside it has one); use an input instead",
                              attr="body")
        return lit(e, expected)
    if not isinstance(e, App):
        raise OpTypeError(f"{what}: {e!r} is not a body expression", attr="body")
    if e.op not in allowed:
        raise OpTypeError(f"{what}: {_unknown_op(e.op, allowed)}", attr="body")
    arity = OPS[e.op].arity
    if len(e.args) != arity:
        raise OpTypeError(f"{what}: {e.op} takes {arity} operand(s), got {len(e.args)} in "
                          f"{format_body(e)}", attr="body")
    conds, same = operand_roles(e.op)
    values: list[Any] = [None] * len(e.args)
    peer: DType | None = None
    # Inputs first: they fix the dtype that constant siblings take.
    for i, a in enumerate(e.args):
        if _has_arg(a):
            hint = DType.bool if conds[i] else (expected if same else None)
            values[i] = _fold(a, args, dtype_of, lit, app, hint, what, allowed)
            if not conds[i] and peer is None:
                peer = dtype_of(values[i])
    for i, a in enumerate(e.args):
        if not _has_arg(a):
            hint = DType.bool if conds[i] else (peer or (expected if same else None))
            values[i] = _fold(a, args, dtype_of, lit, app, hint, what, allowed)
    return app(e, values)


def _scalar(d: DType) -> TensorType:
    return TensorType(d, ())


def _type_app(what: str) -> Callable[[App, list[DType]], DType]:
    def app(node: App, dtypes: list[DType]) -> DType:
        try:
            return OPS[node.op].infer([_scalar(d) for d in dtypes], {}, None).dtype
        except OpTypeError as err:
            raise OpTypeError(f"{what}: in {format_body(node)}: {err.message}",
                              attr="body") from None
    return app


def lit_value(node: Lit, dtype: DType) -> Any:
    """The value literal `node` stands for as a `dtype`: an integer literal where a float is
    expected means that float (`add($0, 1)` on f32 adds 1.0, as `const 1 : f32[]` is 1.0);
    one too large for a float stays an int, for literal_fits to refuse."""
    v = node.value
    if dtype.is_float and type(v) is int:
        try:
            return float(v)
        except OverflowError:
            return v
    return v


def _type_lit(what: str) -> Callable[[Lit, DType], DType]:
    def lit(node: Lit, dtype: DType) -> DType:
        problem = literal_fits(lit_value(node, dtype), dtype)
        if problem:
            raise OpTypeError(f"{what}: constant {node.text} stands where a {dtype} is "
                              f"expected: {problem}", attr="body")
        return dtype
    return lit


def check_body(e: Any, in_dtypes: Sequence[DType], expected: DType | None = None,
               what: str = "body") -> DType:
    """The dtype a body computes from inputs of `in_dtypes`; OpTypeError(attr="body") if the
    body is ill-typed. `expected` only types constants that nothing else fixes."""
    if not isinstance(e, (Arg, Lit, App)):
        raise OpTypeError(f"{what} must be a body expression, got {e!r}", attr="body")
    if depth(e) > MAX_DEPTH:
        raise OpTypeError(f"{what} is nested deeper than {MAX_DEPTH} levels", attr="body")
    return fold(e, list(in_dtypes), lambda d: d, _type_lit(what), _type_app(what), expected, what)


def eval_body(e: Expr, arrays: Sequence[np.ndarray], dtype: DType | None = None,
              shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A body on whole arrays, with each op's table impl; the result has the body's dtype.

    Without `shape`, inputs combine by numpy broadcasting. With `shape`, every input and
    constant is first made a full array of that shape, so each op runs on exactly the arrays
    the unfused program would give it (bitwise the same results). `dtype` is the expected
    result dtype: it types constants that nothing else fixes.
    """
    arrays = [np.asarray(a) for a in arrays]
    check_body(e, [DType.of(a.dtype) for a in arrays], dtype)
    if shape is not None:
        used = body_args(e)
        arrays = [np.broadcast_to(a, shape).copy() if i in used else a
                  for i, a in enumerate(arrays)]

    def lit(node: Lit, d: DType) -> np.ndarray:
        return np.full(() if shape is None else shape, lit_value(node, d), dtype=d.np)

    def app(node: App, values: list[np.ndarray]) -> np.ndarray:
        op = OPS[node.op]
        full = np.broadcast_shapes(*(v.shape for v in values))
        t = op.infer([_scalar(DType.of(v.dtype)) for v in values], {}, None).with_shape(full)
        return np.asarray(op.impl(values, {}, t)).astype(t.dtype.np, copy=False)

    return fold(e, arrays, lambda a: DType.of(a.dtype), lit, app, dtype)
