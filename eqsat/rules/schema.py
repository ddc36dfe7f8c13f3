"""The egglog vocabulary, derived from the IR op table, and the type analysis as egglog rules.

Every IR op becomes one egglog constructor `Op_<name>` whose arguments are read from its
`OpDef`: its operands (a cons list `TList` for variadic ops), then its attributes by kind, then
(for ops whose result type is written in the text) the written dtype and shape. Two tables,
`shape` and `dtype`, hold the type of every e-class; they are filled at load time from the IR and
by the analysis rules below for nodes that rewrites create. They have no merge function, so an
e-class that would get two shapes stops the run loudly instead of going ill-typed. The analysis
types a node only where the op's type rule holds for its operands' types (one dtype and shape
for an add, a bool condition for a select, fitting matmul dims, a kernel's body typing on its
operands' dtypes), so a node that would not type stays untyped, and so does every node above
it. A user rule adds its right side to `typed-union` instead of unioning it: the union follows
once both sides have the same shape and dtype, so an instance that would not type is skipped,
not a failed run nor an ill-typed node that extraction may pick.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..ir.ops import CALLEE, INT, INTS, OPS, OpDef, OpTypeError
from ..ir.types import DType, TensorType
from .schema_helpers import helpers

# Attribute kind -> egglog sort. Later op families register kinds of their own here.
ATTR_SORTS: dict[str, str] = {INTS: "IntVec", INT: "i64", CALLEE: "String"}
# String-encoded attribute kinds: kind -> (value -> text, text -> value).
ATTR_CODECS: dict[str, tuple[Callable, Callable]] = {}
# Ops typed only at load time (no analysis rule yet): they may be matched, not created.
LOAD_ONLY: set[str] = set()


def _register_fused() -> None:
    try:
        from ..ir import fused
        from ..ir.scalar_expr import BodyTexts
    except ImportError:
        return
    ATTR_SORTS[fused.BODY] = ATTR_SORTS[fused.REDUCER] = "String"
    # every serialization decodes each body again, most of them written by this process
    texts = BodyTexts()
    ATTR_CODECS[fused.BODY] = (texts.text, texts.body)
    ATTR_CODECS[fused.REDUCER] = (str, str)

ANALYSIS = "analysis"  # egglog ruleset: types, plus analysis-kind user rules (constant folding)
REWRITE = "rewrite"  # egglog ruleset: every rewrite rule


def ctor(op: str) -> str:
    """The egglog constructor name of an IR op."""
    return "Op_" + op


def op_of_ctor(name: str) -> str | None:
    """The IR op of an egglog constructor name, or None for other symbols."""
    return name[3:] if name.startswith("Op_") else None


@dataclass(frozen=True)
class Encoding:
    """How one op sits in egglog: operand slots, attribute slots and written-type slots."""

    op: str
    variadic: bool
    n_operands: int
    attrs: tuple[tuple[str, str], ...]  # (attribute name, kind)
    written: bool

    @property
    def sorts(self) -> list[str]:
        operands = ["TList"] if self.variadic else ["T"] * self.n_operands
        attrs = [ATTR_SORTS[kind] for _, kind in self.attrs]
        return operands + attrs + (["String", "IntVec"] if self.written else [])


def encoding(op: OpDef) -> Encoding | None:
    """The encoding of an op, or None for ops that are not plain constructors (const, call)."""
    if op.name in ("const", "call"):
        return None
    for _, kind in op.attrs:
        if kind not in ATTR_SORTS:
            return None
    return Encoding(op.name, op.arity is None, op.arity or 0, tuple(op.attrs), op.written_type)


_encodings_memo: list = [None, {}]  # [the tables it was computed from, the result]


def encodings() -> dict[str, Encoding]:
    """Encodings of every op currently in the table that egglog can hold."""
    # Called for every rule pattern and e-graph load (~500 times per optimize); recomputed
    # only when the op table or the shape rules changed since the last call.
    key = (tuple(OPS.items()), tuple(SHAPE_RULES.items()))
    if _encodings_memo[0] != key:
        out = {}
        for op in OPS.values():
            enc = encoding(op)
            if enc is not None and shape_rule(op) is not None:
                out[op.name] = enc
        _encodings_memo[:] = [key, out]
    return dict(_encodings_memo[1])


# ---------------------------------------------------------------- type analysis rules



# The egglog twin of each rule-language shape function (lang.SHAPE_FNS): the function that
# holds its value, and the action that asks the analysis to compute it for arguments {0}, {1}.
SHAPE_FN_EGGLOG: dict[str, tuple[str, str]] = {
    "permute": ("permuted", "(perm-go {0} {1} 0 (vec-empty))"),
    "inverse": ("inverted", "(inv-go {0} 0 {0})"),
    "lpad": ("padded", "(pad-go {0} {1} (vec-empty))"),
}


def _args(enc: Encoding) -> tuple[list[str], dict[str, str]]:
    """Variable names for a constructor's slots: operand names, and named attribute slots."""
    names = ["l"] if enc.variadic else [f"x{i}" for i in range(enc.n_operands)]
    slots = {name: f"a_{name}" for name, _ in enc.attrs}
    names += list(slots.values())
    if enc.written:
        slots.update(dtype="wd", shape="ws")
        names += ["wd", "ws"]
    return names, slots


def _rule(enc: Encoding, facts: str, actions: str) -> str:
    names, _ = _args(enc)
    node = f"({ctor(enc.op)} {' '.join(names)})" if names else f"({ctor(enc.op)})"
    return f"(rule ((= t {node}) {facts}) ({actions}) :ruleset {ANALYSIS})"


_TYPED = "(set (shape t) s) (set (dtype t) d)"

# The dtype sets an op's type rule may ask of its operands, as the fact that dtype {} is one.
# (Every table, even a small relation, slows egglog's push and pop of a kept e-graph.)
_DTYPE_SETS = {frozenset(DType): "", frozenset(d for d in DType if d.is_float): "(float-dtype {})",
               frozenset(d for d in DType if d.is_numeric): '(!= {} "bool")'}


def _takes(op: str, var: str, rank: int = 0) -> str:
    """The fact that dtype `var` is one `op` takes, all its operands of that dtype and rank
    `rank` (one element each): probed from the op's own type rule, as the IR checks it."""
    opdef = OPS[op]
    attrs = {"axes": (0,)} if opdef.family == "reduce" else {}
    ok = []
    for d in DType:
        try:
            opdef.infer([TensorType(d, (1,) * rank)] * (opdef.arity or 1), attrs, None)
            ok.append(d)
        except OpTypeError:
            pass
    fact = _DTYPE_SETS.get(frozenset(ok))
    if fact is None:
        raise ValueError(f"{op} takes the dtypes {ok}: the e-graph has no fact for them")
    return fact.format(var)


def _elementwise(enc: Encoding) -> list[str]:
    """Operands of one shape and dtype (one it takes): the result has them, a compare's is
    bool, a select's its branches' (its condition bool, of their shape)."""
    ins = [f"x{i}" for i in range(enc.n_operands)]
    if enc.op == "select":
        ins = ins[1:]
    same = " ".join(f"(= s (shape {x})) (= d (dtype {x}))" for x in ins)
    if enc.op == "select":
        return [_rule(enc, f'{same} (= s (shape x0)) (= (dtype x0) "bool")', _TYPED)]
    if OPS[enc.op].family == "compare":
        return [_rule(enc, same, '(set (shape t) s) (set (dtype t) "bool")')]
    return [_rule(enc, f"{same} {_takes(enc.op, 'd')}", _TYPED)]


_WRITTEN = "(set (shape t) ws) (set (dtype t) wd)"


def _broadcast(enc: Encoding) -> list[str]:
    """The operand's dtype, and a shape that broadcasts to the written one (numpy's rule)."""
    return [_rule(enc, "(= s (shape x0))", "(bc-need s ws)"),
            _rule(enc, "(= wd (dtype x0)) (= s (shape x0)) (= ws (bcast s ws))", _WRITTEN)]


def _reshape(enc: Encoding) -> list[str]:
    """The operand's dtype and element count."""
    return [_rule(enc, "", "(numel-go ws 0 1)"),
            _rule(enc, "(= wd (dtype x0)) (= s (shape x0)) (= n (numel s)) (= n (numel ws))",
                  _WRITTEN)]


def _cast(enc: Encoding) -> list[str]:
    """Any dtype to any other, the shape kept."""
    return [_rule(enc, "(= ws (shape x0)) (= d (dtype x0))", _WRITTEN)]


def _map(enc: Encoding) -> list[str]:
    """The operands broadcast together (`dom`) to the written shape, so each one does, and the
    body computes the written dtype from the operands' dtypes (`body-types`, which rules that
    make a map add per body: compile.py; the fusion pass makes one by union with a typed
    e-class)."""
    return [_rule(enc, "(body-types l a_body wd wd)", "(dom-need l)"),
            _rule(enc, "(= s (dom l))", "(bc-need s ws)"),
            _rule(enc, "(body-types l a_body wd wd) (= s (dom l)) (= ws (bcast s ws))",
                  _WRITTEN)]


# Facts that the int list `a` of node `t` holds distinct axes of shape `s`: each drops a dim.
_AXES = "(= r (reduced s {a})) (= (vec-length s) (+ (vec-length r) (vec-length {a})))"


def _reduce(enc: Encoding) -> list[str]:
    """Distinct axes in range, a dtype the op takes and, where its type rule asks (max and
    min: no identity), no reduced axis of length 0."""
    try:
        OPS[enc.op].infer([TensorType(DType.f32, (0,))], {"axes": (0,)}, None)
        empty = ""
    except OpTypeError:
        empty = "(= g (permuted s a_axes)) (> (numel g) 0)"
    facts = f"(= s (shape x0)) {_AXES.format(a='a_axes')} (= d (dtype x0)) " \
            f"{_takes(enc.op, 'd', 1)} {empty}"
    demands = "(red-go s a_axes 0 (vec-empty))"
    rules = [_rule(enc, "(= s (shape x0))", demands)]
    if empty:
        rules += [_rule(enc, "(= s (shape x0))", "(perm-go s a_axes 0 (vec-empty))"),
                  _rule(enc, "(= s (shape x0)) (= g (permuted s a_axes))", "(numel-go g 0 1)")]
    return rules + [_rule(enc, facts, "(set (shape t) r) (set (dtype t) d)")]


def _flipped(v: str, flag: str) -> str:
    """`v` with its last two dims swapped where `flag` is 1 (kept where it is 0): one rule for
    both, indexing by the flag (every rule slows egglog's push and pop of a kept e-graph)."""
    if flag == "0":
        return v
    return (f"(vec-set (vec-set {v} (- n 2) (vec-get {v} (+ (- n 2) {flag}))) (- n 1) "
            f"(vec-get {v} (- (- n 1) {flag})))")


def _product(enc: Encoding, ta: str = "0", tb: str = "0") -> str:
    """Facts binding `p`, the shape of op(a) @ op(b) (op swapping the last two dims where the
    flag, 0 or 1, is 1) and `d` its dtype, where the matmul's type rule holds: one dtype it
    takes, rank >= 2, the batch dims equal and the inner ones."""
    flags = " ".join(f"(>= {f} 0) (<= {f} 1)" for f in (ta, tb) if f != "0")
    operands = "(= l (TCons x0 (TCons x1 rest)))" if enc.variadic else ""
    return (f"{operands} {flags} (= sa (shape x0)) (= sb (shape x1)) (= d (dtype x0)) "
            f"(= d (dtype x1)) {_takes('matmul', 'd', 2)} (= n (vec-length sa)) (>= n 2) "
            f"(= a2 {_flipped('sa', ta)}) (= b2 {_flipped('sb', tb)}) "
            f"(= b2 (vec-set (vec-set a2 (- n 2) (vec-get a2 (- n 1))) (- n 1) "
            f"(vec-get b2 (- n 1)))) (= p (vec-set a2 (- n 1) (vec-get b2 (- n 1))))")


def _matmul(enc: Encoding) -> list[str]:
    return [_rule(enc, _product(enc), "(set (shape t) p) (set (dtype t) d)")]


def _transpose(enc: Encoding) -> list[str]:
    """A permutation of the operand's axes: as many distinct axes as it has, all in range."""
    facts = (f"(= s (shape x0)) (= (vec-length a_perm) (vec-length s)) "
             f"{_AXES.format(a='a_perm')} (= p (permuted s a_perm)) (= d (dtype x0))")
    return [_rule(enc, "(= s (shape x0))",
                  "(perm-go s a_perm 0 (vec-empty)) (red-go s a_perm 0 (vec-empty))"),
            _rule(enc, facts, "(set (shape t) p) (set (dtype t) d)")]


def _slice(enc: Encoding) -> list[str]:
    """A start and a stop per axis, 0 <= start <= stop <= the axis's length (slice-go)."""
    ranks = "(= s (shape x0)) (= (vec-length a_start) (vec-length s)) " \
            "(= (vec-length a_stop) (vec-length s))"
    return [_rule(enc, ranks, "(slice-go s a_start a_stop 0 (vec-empty))"),
            _rule(enc, "(= s (shape x0)) (= r (sliced s a_start a_stop)) (= d (dtype x0))",
                  "(set (shape t) r) (set (dtype t) d)")]


def _concat(enc: Encoding) -> list[str]:
    """An axis in range, the operands of the first one's dtype and dims but along it."""
    first = ("(= l (TCons x0 rest)) (= s (shape x0)) (= d (dtype x0)) (>= a_axis 0) "
             "(< a_axis (vec-length s))")
    return [_rule(enc, first, "(cat-need l a_axis (vec-set s a_axis 0) d)"),
            _rule(enc, first + " (= n (cat-len l a_axis (vec-set s a_axis 0) d))",
                  "(set (shape t) (vec-set s a_axis n)) (set (dtype t) d)")]


def _matmul_t(enc: Encoding) -> list[str]:
    """op(a) @ op(b) (a flag other than 0 or 1 is no matmul_t); a matmul_epi's further
    operands broadcast to the product, and its body computes its dtype from the product's and
    theirs (`body-types`, as a map's)."""
    facts = _product(enc, "a_ta", "a_tb")
    if enc.op == "matmul_t":
        return [_rule(enc, facts, "(set (shape t) p) (set (dtype t) d)")]
    typed = '(= l (TCons x0 (TCons x1 rest))) (body-types l a_body "" r)'
    return [_rule(enc, typed, "(dom-need rest)"),
            _rule(enc, f"{facts} (= e (dom rest))", "(bc-need e p)"),
            _rule(enc, f"{facts} {typed} (= e (dom rest)) (= p (bcast e p))",
                  "(set (shape t) p) (set (dtype t) r)")]


def _map_reduce(enc: Encoding) -> list[str]:
    """Its operands broadcast together (`dom`), less the reduced axes; only where the axes are
    distinct and in range (each one then drops a dim) and, for max and min, none has length 0,
    as the IR's type rule asks. Its dtype is its body's (`body-types`, as a map's), numeric
    for a sum."""
    valid = f'(= s (dom l)) {_AXES.format(a="a_axes")} (body-types l a_body "" d)'
    return [_rule(enc, "", "(dom-need l)"),
            _rule(enc, "(= s (dom l))",
                  "(red-go s a_axes 0 (vec-empty)) (perm-go s a_axes 0 (vec-empty))"),
            _rule(enc, "(= s (dom l)) (= g (permuted s a_axes))", "(numel-go g 0 1)"),
            _rule(enc, f'(= a_reduce "sum") {valid} (!= d "bool")',
                  "(set (shape t) r) (set (dtype t) d)"),
            _rule(enc, f'(!= a_reduce "sum") {valid} (= g (permuted s a_axes)) (> (numel g) 0)',
                  "(set (shape t) r) (set (dtype t) d)")]


ShapeRule = Callable[[Encoding], list[str]]

# Type analysis per op family (per op where the family is too coarse). Fused-op families add
# their entries here; an op without an entry stays out of the e-graph (it cannot be typed).
SHAPE_RULES: dict[str, ShapeRule] = {
    "unary": _elementwise,
    "binary": _elementwise,
    "compare": _elementwise,
    "select": _elementwise,
    "broadcast": _broadcast,
    "reshape": _reshape,
    "cast": _cast,
    "reduce": _reduce,
    "matmul": _matmul,
    "transpose": _transpose,
    "slice": _slice,
    "concat": _concat,
}


def _loaded_only(enc: Encoding) -> list[str]:
    LOAD_ONLY.add(enc.op)
    return []


# A fused op of a later family without a rule of its own is typed only where it is loaded or
# unioned with a typed e-class (fusion's Python pass).
SHAPE_RULES["fused"] = _loaded_only
SHAPE_RULES["map"] = _map
SHAPE_RULES["map_reduce"] = _map_reduce
SHAPE_RULES["matmul_t"] = _matmul_t
SHAPE_RULES["matmul_epi"] = _matmul_t
_register_fused()


# ---------------------------------------------------------------- the unchecked analysis

# For a rule set whose rules are all declared well-typed (`typing.declare_well_typed`: the
# built-in families) every term in the e-graph is one the IR types: the module's own, the
# rules' right sides (which type wherever their left sides do), the fusion pass's kernels
# (typed by the op table before they join their class). There the analysis need not check
# an op's type rule, only compute the type it gives: the same types on the same terms, for
# fewer joins per analysis run and none of the walks that only the checks need (a broadcast's
# compatibility, a transpose's distinct axes, a reshape's element count). Every operand must
# still be typed, as the checks ask. A kernel (map, map_reduce, matmul_epi) is typed by its
# body's `body-types`, which only rules taking the typed step add: none in such a set, so the
# kernels get no rule at all (they are typed where they join a typed class, as before).


def _operands_typed(enc: Encoding) -> str:
    return " ".join(f"(= s{i} (shape x{i}))" for i in range(enc.n_operands))


def _elementwise_unchecked(enc: Encoding) -> list[str]:
    if OPS[enc.op].family == "compare":
        return [_rule(enc, _operands_typed(enc), '(set (shape t) s0) (set (dtype t) "bool")')]
    x = "x1" if enc.op == "select" else "x0"
    return [_rule(enc, f"{_operands_typed(enc)} (= d (dtype {x}))",
                  "(set (shape t) s0) (set (dtype t) d)")]


def _written_unchecked(enc: Encoding) -> list[str]:
    return [_rule(enc, "(= s (shape x0))", _WRITTEN)]


def _reduce_unchecked(enc: Encoding) -> list[str]:
    return [_rule(enc, "(= s (shape x0))", "(red-go s a_axes 0 (vec-empty))"),
            _rule(enc, "(= s (shape x0)) (= r (reduced s a_axes)) (= d (dtype x0))",
                  "(set (shape t) r) (set (dtype t) d)")]


def _product_unchecked(enc: Encoding, ta: str = "0", tb: str = "0") -> list[str]:
    facts = (f"(= sa (shape x0)) (= sb (shape x1)) (= d (dtype x0)) (= n (vec-length sa)) "
             f"(>= n 2) (= a2 {_flipped('sa', ta)}) (= b2 {_flipped('sb', tb)})")
    return [_rule(enc, facts, "(set (shape t) (vec-set a2 (- n 1) (vec-get b2 (- n 1)))) "
                              "(set (dtype t) d)")]


def _transpose_unchecked(enc: Encoding) -> list[str]:
    return [_rule(enc, "(= s (shape x0))", "(perm-go s a_perm 0 (vec-empty))"),
            _rule(enc, "(= s (shape x0)) (= p (permuted s a_perm)) (= d (dtype x0))",
                  "(set (shape t) p) (set (dtype t) d)")]


def _slice_unchecked(enc: Encoding) -> list[str]:
    return [_rule(enc, "(= s (shape x0))", "(slice-go s a_start a_stop 0 (vec-empty))"),
            _rule(enc, "(= s (shape x0)) (= r (sliced s a_start a_stop)) (= d (dtype x0))",
                  "(set (shape t) r) (set (dtype t) d)")]


def _concat_unchecked(enc: Encoding) -> list[str]:
    first = "(= l (TCons x0 rest)) (= s (shape x0)) (= d (dtype x0))"
    return [_rule(enc, first, "(cat-need l a_axis (vec-set s a_axis 0) d)"),
            _rule(enc, first + " (= n (cat-len l a_axis (vec-set s a_axis 0) d))",
                  "(set (shape t) (vec-set s a_axis n)) (set (dtype t) d)")]


def _matmul_t_unchecked(enc: Encoding) -> list[str]:
    return _product_unchecked(enc, "a_ta", "a_tb") if enc.op == "matmul_t" else []


# The unchecked twin of each checked rule factory; an op whose factory has none here (a later
# family's, until it says how to skip its checks) gets its checked rules.
UNCHECKED_RULES: dict[ShapeRule, ShapeRule] = {
    _elementwise: _elementwise_unchecked,
    _broadcast: _written_unchecked,
    _reshape: _written_unchecked,
    _cast: _written_unchecked,
    _reduce: _reduce_unchecked,
    _matmul: _product_unchecked,
    _transpose: _transpose_unchecked,
    _slice: _slice_unchecked,
    _concat: _concat_unchecked,
    _loaded_only: _loaded_only,
    _map: lambda enc: [],
    _map_reduce: lambda enc: [],
    _matmul_t: _matmul_t_unchecked,
}


def shape_rule(op: OpDef) -> ShapeRule | None:
    """The analysis rule factory of an op (by name first, then by family)."""
    rule = SHAPE_RULES.get(op.name) or SHAPE_RULES.get(op.family)
    if rule is _loaded_only:
        LOAD_ONLY.add(op.name)
    return rule


def prelude(checks: bool = True) -> str:
    """The egglog declarations and type-analysis rules for the whole current op table; with
    `checks=False` the analysis computes types without checking them (UNCHECKED_RULES), for
    rule sets whose rules are all declared well-typed."""
    encs = encodings()
    lines = [
        "(sort IntVec (Vec i64))",
        "(sort T)",
        "(sort TList)",
        "(constructor TNil () TList)",
        "(constructor TCons (T TList) TList)",
        "(constructor Param (String String) T)",
        "(constructor ConstF (f64 String IntVec) T)",
        "(constructor ConstI (i64 String IntVec) T)",
        "(constructor Op_call (String TList i64) T)",
        "(function shape (T) IntVec :no-merge)",
        "(function dtype (T) String :no-merge)",
        f"(ruleset {ANALYSIS})",
        f"(ruleset {REWRITE})",
    ]
    for enc in encs.values():
        lines.append(f"(constructor {ctor(enc.op)} ({' '.join(enc.sorts)}) T)")
    lines.append(helpers(ANALYSIS))
    for kind in ("ConstF", "ConstI"):
        lines.append(f"(rule ((= t ({kind} v d s))) ((set (shape t) s) (set (dtype t) d)) "
                     f":ruleset {ANALYSIS})")
    for enc in encs.values():
        rule = shape_rule(OPS[enc.op])
        lines += (rule if checks else UNCHECKED_RULES.get(rule, rule))(enc)
    return "\n".join(lines)
